"""Where a parameter's value goes on an env: a path of attributes and indices, a setter, or a binding
object; and the first records of the blocks, read from a fresh env where no default is given."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from .env_families import adapter_for
from .params import Binder, Param, ParamSpec, applied_dtype, as_stored, block_dtype, did_you_mean, problem, show

_TOKEN = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[(-?\d+)\]")


def parse_path(path: str) -> list[str | int]:
    """Splits ``"model.opt.gravity[2]"`` into ``["model", "opt", "gravity", 2]``."""
    tokens: list[str | int] = []
    position = 0
    while position < len(path):
        match = _TOKEN.match(path, position)
        if match is None or (position == 0 and path.startswith(".")):
            raise ValueError(f"bad bind path {path!r} at {path[position:]!r}")
        tokens.append(match.group(1) if match.group(1) is not None else int(match.group(2)))
        position = match.end()
    if not tokens or not isinstance(tokens[0], str):
        raise ValueError(f"bad bind path {path!r}")
    return tokens


def _unbound(env: Any, value: Any) -> None:
    """The setter of a parameter that only hooks read."""


class Binding:
    """Reads and writes one parameter on one env, along a path resolved once."""

    def __init__(self, env: Any, spec: ParamSpec, env_label: str) -> None:
        self._spec = spec
        self._root = env.unwrapped
        self._setter: Binder | None = None
        self._tokens: list[str | int] = []
        self._simple: str | None = None  # a plain attribute of a scalar parameter: set directly
        self._getter: Callable[[], Any] | None = None
        if spec.bind is False:
            self._setter = _unbound
            return
        if hasattr(spec.bind, "resolve"):  # a binding object, e.g. shmpool.mujoco.body_mass("torso")
            self._getter, write = spec.bind.resolve(env, spec.name)  # type: ignore[union-attr]
            self._setter = lambda _env, value: write(value)
            return
        if callable(spec.bind):
            self._setter = spec.bind
            return
        path = spec.bind if isinstance(spec.bind, str) else spec.name
        self._tokens = parse_path(path)
        target = self._root
        for depth, token in enumerate(self._tokens):
            try:
                target = target[token] if isinstance(token, int) else getattr(target, token)
            except (AttributeError, IndexError, KeyError, TypeError) as exc:
                where = "".join(f"[{t}]" if isinstance(t, int) else f".{t}" for t in self._tokens[: depth + 1])
                known = [key for key in dir(target) if not key.startswith("__")] if isinstance(token, str) else []
                raise AttributeError(
                    f"params[{spec.name!r}]: {env_label} ({type(self._root).__name__}) has no {where.lstrip('.')!r}"
                    f"{did_you_mean(str(token), known)} (bind path {path!r}); shmpool never creates attributes"
                ) from exc
        if len(self._tokens) == 1 and not spec.shape:
            self._simple = str(self._tokens[0])

    def get(self) -> Any:
        """The current value on the env (None for a callable binding, which cannot be read)."""
        if self._getter is not None:
            return self._getter()
        if self._setter is not None:
            return None
        target = self._root
        for token in self._tokens:
            target = target[token] if isinstance(token, int) else getattr(target, token)
        return target

    @property
    def attribute(self) -> tuple[Any, str] | None:
        """(object, attribute name) when the value is a plain attribute set as is, else None: lets
        a caller that sets many envs skip the general path."""
        return (self._root, self._simple) if self._simple is not None else None

    def set(self, value: Any) -> None:
        """Applies one env's value: a Python scalar for shape (), an array assigned in place where the
        env holds a matching array."""
        if self._setter is not None:
            self._setter(self._root, value)
            return
        if self._simple is not None:
            setattr(self._root, self._simple, value)
            return
        parent = self._root
        for token in self._tokens[:-1]:
            parent = parent[token] if isinstance(token, int) else getattr(parent, token)
        last = self._tokens[-1]
        current = parent[last] if isinstance(last, int) else getattr(parent, last)
        if isinstance(current, np.ndarray) and current.ndim and current.shape == np.shape(value):
            current[...] = value
        elif isinstance(last, int):
            parent[last] = value
        else:
            setattr(parent, last, value)


def plain_values(values: np.ndarray) -> list[Any]:
    """Per-env values as ``Binding.set`` takes them: Python scalars, or arrays for shaped ones."""
    return values.tolist() if values.ndim == 1 else list(values)


def _nominal(spec: ParamSpec, binding: Binding | None, env_label: str) -> np.ndarray:
    """The value a freshly made env has for ``spec``, read through its binding."""
    if binding is None or (callable(spec.bind) and not hasattr(spec.bind, "resolve")) or spec.bind is False:
        raise ValueError(
            f"params[{spec.name!r}]: bind={spec.bind!r} cannot be read for a nominal value; give a default"
        )
    value = np.asarray(binding.get())
    if value.shape != spec.shape:
        raise ValueError(
            f"params[{spec.name!r}]: {env_label}'s nominal value {show(value)} has shape {value.shape}, "
            f"the parameter is declared with shape {spec.shape}"
        )
    return value


def refresher_follows(attribute: str | None, inputs: AbstractSet[str] | None) -> bool:
    """Whether an env's refresher must rerun after a parameter bound to ``attribute`` of the unwrapped
    env changes (None: bound through a path or a setter it cannot see), given its ``refresh_inputs``
    (None: it follows every parameter)."""
    return inputs is None or attribute is None or attribute in inputs


def refuse_derived(specs: Sequence[ParamSpec], probe: Any, env_label: str) -> None:
    """Refuses a parameter bound to a value the env derives from others (CartPole's ``total_mass``)
    declared beside one bound to such another: the env recomputes the first whenever the second
    changes, replacing its written value while ``applied`` still shows it."""
    outputs, inputs = adapter_for(probe).derived(probe)
    if not outputs:
        return
    derived, sources = [], []
    for spec in specs:
        if spec.when == "rebuild" or spec.bind is False:  # neither is set on the env between resets
            continue
        tokens = parse_path(spec.bind or spec.name) if spec.bind is None or isinstance(spec.bind, str) else []
        attribute = tokens[0] if len(tokens) == 1 and isinstance(tokens[0], str) else None  # None: a path, a setter
        if attribute in outputs:
            derived.append(spec.name)
        elif refresher_follows(attribute, inputs):
            sources.append(spec.name)
    if derived and sources:
        what = "any parameter" if inputs is None else ", ".join(sorted(inputs))
        raise ValueError(
            f"params[{derived[0]!r}] and params[{sources[0]!r}] cannot be declared together: {env_label} "
            f"({type(probe.unwrapped).__name__}) recomputes {' and '.join(sorted(outputs))} after a change of "
            f"{what} (or of a value bound through a path or a function), which would replace a value written to "
            f"params[{derived[0]!r}]; declare {derived[0]!r} without {sources[0]!r}, or the other way round"
        )


def initial_records(
    specs: Sequence[ParamSpec], declared: Mapping[str, Param], probe: Any, env_label: str, num_envs: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``params`` and ``applied`` records of every env, from the defaults or, where the
    default is None, from a freshly made env. Checks every bind path against that env."""
    refuse_derived(specs, probe, env_label)
    block = np.zeros(num_envs, dtype=block_dtype(specs))
    applied = np.zeros(num_envs, dtype=applied_dtype(specs))
    for spec in specs:
        param = declared[spec.name]
        # Resolving the binding fails here, at launch, for a bad path or name.
        binding = Binding(probe, spec, env_label) if spec.when != "rebuild" or param.default is None else None
        nominal = functools.partial(_nominal, spec, binding, env_label)
        if spec.dist:
            given = param.default if param.default is not None else {}
            if not isinstance(given, Mapping) or set(given) - set(spec.arguments):
                raise ValueError(
                    f"params[{spec.name!r}]: the default of a {spec.dist} parameter is a dict with keys "
                    f"{list(spec.arguments)}, got {param.default!r}"
                )
            fallback = {"low": spec.low, "high": spec.high, "std": np.zeros(spec.shape)}
            record = {}
            for argument in spec.arguments:
                value = given.get(argument)
                if value is None:
                    value = nominal() if argument == "mean" else fallback[argument]
                record[argument] = as_stored(spec, None, value, f"[{argument!r}] (at launch)", env_label)[0]
                block[spec.name][argument] = record[argument]
            applied[spec.name] = np.nan  # nothing drawn before the env's first reset
            reason, where = problem(spec, record), ""
        else:
            given, where = (
                (nominal(), " (the env's own value)") if param.default is None else (param.default, " (default)")
            )
            # Checked as a write to every env would be, named by no env: stored exactly as given, or refused.
            value = as_stored(spec, None, given, where, env_label)[0]
            block[spec.name] = value
            applied[spec.name] = value
            reason = problem(spec, value)
        if reason:
            raise ValueError(
                f"{env_label}: params[{spec.name!r}]: the initial value {show(block[spec.name][0])}{where} is "
                f"rejected: {reason}"
            )
    return block, applied
