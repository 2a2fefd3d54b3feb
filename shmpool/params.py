"""Declared env parameters: what a declaration may say, how it is validated, the record types of the ``params`` and
``applied`` blocks, and the rules a value must satisfy to be applied.

Writers write the ``params`` block through ``shmpool.param_block.ParamBlock``; workers read it on every step, validate
what changed and apply it per each parameter's ``when`` (``shmpool.workers.param_applier``, through
``shmpool.bindings``, drawing ``dist`` values with ``shmpool.draws``), and publish what each env really uses in the
``applied`` block, which only workers write.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .errors import LayoutMismatchError

WHEN = ("step", "reset", "rebuild")
DISTRIBUTIONS: dict[str, tuple[str, str]] = {
    "uniform": ("low", "high"),
    "loguniform": ("low", "high"),
    "normal": ("mean", "std"),
}
Binder = Callable[[Any, Any], None]


class BindTarget(Protocol):
    """A binding object: resolves, once per env, to functions that read and write the value."""

    def resolve(self, env: Any, name: str) -> tuple[Callable[[], Any], Callable[[Any], None]]: ...  # pragma: no cover


#: One refusal message per worker and parameter, as plain bytes in the segment.
REFUSAL_TEXT_DTYPE = np.dtype("S240")


@dataclass(frozen=True)
class Param:
    """Declares one env parameter; pass a dict of them as ``launch(..., params=...)``.

    Args:
        default: the initial value for every env; None reads the nominal value from a fresh env. For a ``dist``
            parameter, a dict of the distribution's arguments (by default ``low``/``high`` are the hard bounds,
            ``mean`` the nominal value and ``std`` 0).
        low: the hard lower bound; a value below it, or not finite, is never applied.
        high: the hard upper bound.
        dtype: of one env's value.
        shape: of one env's value.
        when: ``"step"`` (from the env's next step), ``"reset"`` (from its next reset, autoresets included) or
            ``"rebuild"`` (a constructor keyword; the env is re-made at its next reset when the value changed).
        bind: where the value goes: a dotted path on ``env.unwrapped`` with optional indexing (``"gravity"``,
            ``"model.opt.gravity[2]"``), a callable ``bind(env, value)``, or a binding object with
            ``resolve(env, name) -> (read, write)`` such as ``shmpool.mujoco.body_mass("torso")``. Default: the
            parameter's name as an attribute of ``env.unwrapped``. False: nowhere on the env; hooks read it from
            ``ctx.applied`` (the built-in hooks declare theirs this way).
        dist: None, ``"uniform"``, ``"loguniform"`` or ``"normal"``: the block then holds the distribution's
            arguments per env and a value is drawn at each reset of the env (each step with ``when="step"``).

    Examples:
        >>> import shmpool
        >>> spec = {"length": shmpool.Param(low=0.1, high=2.0), "gravity": shmpool.Param(9.8, when="reset")}
    """

    default: Any = None
    low: float | Sequence[float] | None = field(default=None, kw_only=True)
    high: float | Sequence[float] | None = field(default=None, kw_only=True)
    dtype: str = field(default="float64", kw_only=True)
    shape: tuple[int, ...] = field(default=(), kw_only=True)
    when: str = field(default="step", kw_only=True)
    bind: str | Binder | BindTarget | bool | None = field(default=None, kw_only=True)
    dist: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class ParamSpec:
    """A declared parameter after validation: plain data (but for a callable ``bind``)."""

    name: str
    index: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    low: np.ndarray
    high: np.ndarray
    when: str
    bind: str | Binder | BindTarget | bool | None
    dist: str | None

    @functools.cached_property
    def bounds(self) -> tuple[float, float]:
        """The loosest (low, high) over the parameter's elements, for a quick first check."""
        return float(self.low.min(initial=math.inf)), float(self.high.max(initial=-math.inf))

    @property
    def arguments(self) -> tuple[str, ...]:
        """The fields of this parameter's record in the block: its distribution's, or none."""
        return DISTRIBUTIONS[self.dist] if self.dist else ()

    def to_json(self) -> dict[str, Any]:
        """The description stored in the segment's table (``bind`` as text; infinities as null)."""
        return {
            "name": self.name,
            "dtype": self.dtype.str,
            "shape": list(self.shape),
            "low": [None if math.isinf(v) else v for v in self.low.ravel().tolist()],
            "high": [None if math.isinf(v) else v for v in self.high.ravel().tolist()],
            "when": self.when,
            "dist": self.dist,
            "bind": self.bind
            if isinstance(self.bind, (str, bool)) or self.bind is None
            else getattr(self.bind, "__qualname__", repr(self.bind)),
        }

    @classmethod
    def from_json(cls, index: int, data: Mapping[str, Any]) -> ParamSpec:
        """Rebuilds a spec from a segment's table, validating every field."""
        try:
            dtype = np.dtype(data["dtype"])
            shape = tuple(int(n) for n in data["shape"])
            if dtype.kind not in "biuf" or any(n < 1 for n in shape):
                raise ValueError(f"bad dtype or shape {dtype} {shape}")
            low = np.array([-math.inf if v is None else float(v) for v in data["low"]]).reshape(shape)
            high = np.array([math.inf if v is None else float(v) for v in data["high"]]).reshape(shape)
            when, dist = data["when"], data["dist"]
            if when not in WHEN or (dist is not None and dist not in DISTRIBUTIONS):
                raise ValueError(f"bad when/dist {when!r}/{dist!r}")
            return cls(str(data["name"]), index, dtype, shape, low, high, when, data.get("bind"), dist)
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutMismatchError(f"bad parameter description {data!r:.200}: {exc}") from exc


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def compile_specs(params: Mapping[str, Param]) -> list[ParamSpec]:
    """Validates declarations; raises ``ValueError``/``TypeError`` naming the parameter."""
    specs = []
    for index, (name, param) in enumerate(params.items()):
        if not isinstance(param, Param):
            raise TypeError(f"params[{name!r}] must be a shmpool.Param, got {type(param).__name__}")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"parameter name {name!r} must be a Python identifier")
        if param.when not in WHEN:
            raise ValueError(f"params[{name!r}]: when must be one of {WHEN}, got {param.when!r}")
        if param.dist is not None and param.dist not in DISTRIBUTIONS:
            raise ValueError(f"params[{name!r}]: dist must be None or one of {list(DISTRIBUTIONS)}, got {param.dist!r}")
        if param.dist is not None and param.when == "rebuild":
            raise ValueError(f"params[{name!r}]: a rebuild parameter cannot have a dist")
        try:
            dtype = np.dtype(param.dtype)
        except TypeError as exc:
            raise TypeError(f"params[{name!r}]: bad dtype {param.dtype!r}") from exc
        if dtype.kind not in "biuf":
            raise TypeError(f"params[{name!r}]: dtype must be a numeric numpy dtype, got {dtype}")
        if param.dist is not None and dtype.kind != "f":
            raise TypeError(f"params[{name!r}]: a dist parameter must have a float dtype, got {dtype}")
        shape = _shape(name, param.shape)
        low = _declared_bound(name, "low", param.low, -math.inf, shape)
        high = _declared_bound(name, "high", param.high, math.inf, shape)
        if np.any(low > high):
            raise ValueError(f"params[{name!r}]: low {param.low} must not exceed high {param.high}")
        if dtype.kind == "f" and dtype.itemsize < 8:
            # Values are checked as the block stores them, so the bounds are too: a float32 0.1 must
            # fit high=0.1.
            with np.errstate(over="ignore"):
                low, high = low.astype(dtype).astype(np.float64), high.astype(dtype).astype(np.float64)
        if param.dist == "loguniform" and np.any(low <= 0) and param.low is not None:
            raise ValueError(f"params[{name!r}]: a loguniform parameter needs low > 0, got {param.low}")
        bind = param.bind
        if not (bind is None or bind is False or isinstance(bind, str) or callable(bind) or hasattr(bind, "resolve")):
            raise TypeError(
                f"params[{name!r}]: bind must be a path string, a callable, a binding object or False, got {bind!r}"
            )
        specs.append(ParamSpec(name, index, dtype, shape, low, high, param.when, param.bind, param.dist))
    return specs


def check_rebuild_binds(specs: Sequence[ParamSpec], engine: str, env_label: str) -> None:
    """Refuses a rebuild parameter's ``bind`` other than its own name (``bind=False`` included): its value
    goes to the env's constructor as the keyword of that name, where no other bind leads (the mujoco
    engine refuses rebuild parameters, with its own message)."""
    for spec in specs:
        if engine != "mujoco" and spec.when == "rebuild" and spec.bind not in (None, spec.name):
            raise ValueError(
                f"params[{spec.name!r}] of {env_label}: when='rebuild' passes the value to the env's constructor "
                f"as the keyword {spec.name!r}, so bind={spec.bind!r} would go unused; leave bind out, or use "
                f"when='reset' to set it through bind at each reset"
            )


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    """A declaration's ``shape`` as a tuple of positive ints, or an error naming the parameter."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"params[{name!r}]: shape must be a tuple of ints, got {shape!r}") from None
    if not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1 for n in dims):
        raise ValueError(f"params[{name!r}]: shape must be a tuple of positive ints, got {shape!r}")
    return tuple(int(n) for n in dims)


def _declared_bound(name: str, which: str, value: Any, missing: float, shape: tuple[int, ...]) -> np.ndarray:
    """A declaration's ``low`` or ``high`` (``which``; None: ``missing``) as float64 of ``shape``,
    or an error naming the parameter and the value."""
    try:
        bound = np.asarray(missing if value is None else value, dtype=np.float64)
        bound = np.broadcast_to(bound, shape).copy()
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            f"params[{name!r}]: {which} must be a number or one per element of shape {shape}, got {value!r:.80}"
        ) from None
    if np.isnan(bound).any():
        raise ValueError(f"params[{name!r}]: {which} must be a number (or None for no bound), got {value!r:.80}")
    return bound


def is_plain_float64(spec: ParamSpec) -> bool:
    """Whether ``spec`` is one float64 value per env (no distribution, no shape): what the compiled
    writes and syncs take."""
    return not spec.dist and not spec.shape and spec.dtype == np.float64


def in_float64_words(record: np.dtype[Any]) -> bool:
    """Whether every field of ``record`` is whole 8-byte words at an 8-byte offset, so that records
    can be seen as rows of float64 words (what the compiled writes and syncs index)."""
    fields: Mapping[str, Any] = record.fields or {}
    return record.itemsize % 8 == 0 and all(
        offset % 8 == 0 and leaf.itemsize % 8 == 0 for leaf, offset, *_ in fields.values()
    )


def block_dtype(specs: Sequence[ParamSpec]) -> np.dtype[Any]:
    """The record of the ``params`` block: a value, or a distribution's arguments, per parameter."""
    fields: list[Any] = []
    for spec in specs:
        if spec.dist:
            fields.append((spec.name, [(argument, spec.dtype, spec.shape) for argument in spec.arguments]))
        else:
            fields.append((spec.name, spec.dtype, spec.shape))
    return np.dtype(fields)


def applied_dtype(specs: Sequence[ParamSpec]) -> np.dtype[Any]:
    """The record of the ``applied`` block: the value each env uses, per parameter."""
    return np.dtype([(spec.name, spec.dtype, spec.shape) for spec in specs])


# -- validation -----------------------------------------------------------------------------------


Check = Callable[[dict[str, np.ndarray]], Any]  # -> a bool mask of the rows that fail


def _rules(spec: ParamSpec) -> list[tuple[str, Check]]:
    """What a value must satisfy to be applied: (reason, rows -> mask of the rows that fail), in the
    order messages name them. Rows are ``{"value": ...}``, or one entry per distribution argument."""
    bounds = f"outside [{_bound(spec.low)}, {_bound(spec.high)}]"
    if not spec.dist:
        return [
            ("not finite", functools.partial(_not_finite, "value")),
            (bounds, lambda rows: _outside_rows(spec, rows["value"])),
        ]
    rules: list[tuple[str, Check]] = [
        (f"{argument} is not finite", functools.partial(_not_finite, argument)) for argument in spec.arguments
    ]
    if spec.dist == "normal":
        return rules + [
            ("std is negative", lambda rows: (rows["std"] < 0).any(axis=1)),
            (f"mean {bounds}", lambda rows: _outside_rows(spec, rows["mean"])),
        ]
    rules.append(("low exceeds high", lambda rows: (rows["low"] > rows["high"]).any(axis=1)))
    if spec.dist == "loguniform":
        rules.append(("loguniform needs low > 0", lambda rows: (rows["low"] <= 0).any(axis=1)))
    return rules + [
        (f"low {bounds}", lambda rows: _outside_rows(spec, rows["low"])),
        (f"high {bounds}", lambda rows: _outside_rows(spec, rows["high"])),
    ]


def _not_finite(name: str, rows: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(~np.isfinite(rows[name]).all(axis=1))


def _as_rows(spec: ParamSpec, values: Any) -> dict[str, np.ndarray]:
    if spec.dist:
        return {argument: _rows(values[argument]) for argument in spec.arguments}
    return {"value": _rows(values)}


def problem(spec: ParamSpec, value: Any) -> str | None:
    """Why one env's ``value`` (or record of distribution arguments) may not be applied, or None."""
    if spec.dist:
        batch: Any = {argument: np.asarray(value[argument], dtype=np.float64)[None] for argument in spec.arguments}
    else:
        batch = np.asarray(value, dtype=np.float64)[None]
    rows = _as_rows(spec, batch)
    return next((reason for reason, fails in _rules(spec) if fails(rows)[0]), None)


def did_you_mean(name: str, names: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the names closest to a mistyped ``name``, or ``""``."""
    import difflib

    close = difflib.get_close_matches(name, [str(other) for other in names], n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(other) for other in close)}?)" if close else ""


def unknown_parameter(name: str, names: Sequence[str]) -> KeyError:
    """The error for a parameter ``name`` that the pool does not declare (``names``)."""
    return KeyError(f"no parameter {name!r}{did_you_mean(name, names)}; the pool has {list(names)}")


def show(value: Any) -> str:
    """A short text for a value or a record of distribution arguments, for messages."""
    if isinstance(value, np.void) and value.dtype.names:
        return "{" + ", ".join(f"{name}: {show(value[name])}" for name in value.dtype.names) + "}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{name}: {show(item)}" for name, item in value.items()) + "}"
    array = np.asarray(value)
    return repr(array.item()) if array.ndim == 0 else str(array.tolist())


def bad_rows(spec: ParamSpec, values: Any) -> np.ndarray:
    """A mask of the rows of ``values`` (one per env) that ``problem`` would refuse, vectorized.

    ``values`` is an array of ``(rows, *shape)`` values, or for a distribution a mapping (or
    structured array) of such arrays per argument.
    """
    if not spec.dist:
        array: np.ndarray = np.asarray(values, dtype=np.float64)
        if array.size:
            # Fast path: NaN propagates through min/max and fails every comparison.
            smallest, largest = float(array.min()), float(array.max())
            if (
                math.isfinite(smallest)
                and math.isfinite(largest)
                and smallest >= spec.bounds[0]
                and largest <= spec.bounds[1]
                and (spec.low.size <= 1 or not _outside_rows(spec, _rows(array)).any())
            ):
                return np.zeros(len(array), dtype=np.bool_)
        values = array
    rows = _as_rows(spec, values)
    bad = np.zeros(len(next(iter(rows.values()))), dtype=np.bool_)
    for _, fails in _rules(spec):
        bad |= fails(rows)
    return bad


def _rows(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    return array.reshape(len(array), -1)


def _outside_rows(spec: ParamSpec, rows: np.ndarray) -> np.ndarray:
    return np.asarray((rows < spec.low.ravel()).any(axis=1) | (rows > spec.high.ravel()).any(axis=1))


def _bound(array: np.ndarray) -> Any:
    return array.item() if array.ndim == 0 else array.tolist()


def constructor_defaults(specs: Sequence[ParamSpec], declared: Mapping[str, Param]) -> dict[str, Any]:
    """The ``rebuild`` parameters that have an explicit default, as constructor keywords."""
    return {
        s.name: declared[s.name].default for s in specs if s.when == "rebuild" and declared[s.name].default is not None
    }


def as_stored(spec: ParamSpec, ids: np.ndarray | None, value: Any, where: str, label: str) -> np.ndarray:
    """``value`` as rows of one env each (the envs ``ids``; None: one row, a launch value, which is
    every env's and is named by none), in the parameter's dtype; raises unless every number is
    stored exactly as given (integers in range and whole, bools 0 or 1, floats that do not
    overflow), so that what is validated is what the workers will read."""
    try:
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"dtype {array.dtype}")
        # A launch value is one row, every env's: what a write to every env takes, a leading axis of one included.
        shape = (1 if ids is None else len(ids), *spec.shape)
        if array.shape != shape:
            array = np.broadcast_to(array, shape)
    except (TypeError, ValueError) as exc:
        fit = f"the parameter (shape {spec.shape})" if ids is None else f"{len(ids)} env(s) of shape {spec.shape}"
        raise ValueError(f"{label}: params[{spec.name!r}]{where} = {value!r:.100} does not fit {fit}: {exc}") from exc
    if spec.dtype.kind == "f":
        if array.dtype == spec.dtype:  # the common case: float64 values for a float64 parameter
            return array
        with np.errstate(over="ignore"):  # an overflow becomes inf, refused as not finite
            return array.astype(spec.dtype, copy=False)
    low, high = (0, 1) if spec.dtype.kind == "b" else (np.iinfo(spec.dtype).min, np.iinfo(spec.dtype).max)
    with np.errstate(invalid="ignore"):
        if array.dtype.kind == "f":
            unfit = ~np.isfinite(array) | (array != np.round(array)) | (array < low) | (array > high)
        else:
            unfit = (array < low) | (array > high)
    if unfit.any():
        row = int(np.flatnonzero(unfit.reshape(len(array), -1).any(axis=1))[0])
        kind = "0 or 1" if spec.dtype.kind == "b" else f"a whole number in [{low}, {high}]"
        env = "" if ids is None else f"[{ids[row]}]"
        raise ValueError(
            f"{label}: params[{spec.name!r}]{env}{where} = {show(array[row])} rejected: "
            f"{spec.name!r} has dtype {spec.dtype}, which holds {kind}"
        )
    return array.astype(spec.dtype, copy=False)


def merged_declarations(
    hooks: Sequence[tuple[str, Mapping[str, Param]]], user: Mapping[str, Param]
) -> dict[str, Param]:
    """The hooks' parameter declarations (each hook's name with its own), then the user's. A user's
    declaration of a hook's parameter may change its default or narrow it, never widen it: it keeps
    the hook's dtype and shape, and bounds within the hook's (a wider one reaches the hook unchecked)."""
    declared: dict[str, Param] = {}
    owner: dict[str, str] = {}
    for hook, params in hooks:
        declared.update(params)
        owner.update(dict.fromkeys(params, hook))
    for name, param in user.items():
        if name in owner:  # compiled first: a bad declaration is refused by name, as any other
            ours, theirs = (compile_specs({name: p})[0] for p in (declared[name], param))
            kept = []
            if theirs.dtype != ours.dtype or theirs.shape != ours.shape:
                kept.append(f"dtype {ours.dtype} and shape {ours.shape}")
            if np.any(theirs.low < ours.low):
                kept.append(f"low >= {_bound(ours.low)}")
            if np.any(theirs.high > ours.high):
                kept.append(f"high <= {_bound(ours.high)}")
            if kept:
                raise ValueError(
                    f"params[{name!r}] belongs to hook {owner[name]!r}: a declaration of it must keep "
                    f"{', '.join(kept)}; got {param!r:.160}"
                )
        declared[name] = param
    return declared
