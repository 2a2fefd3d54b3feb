"""One env of a compiled kernel's slot as a gymnasium env (``KernelEnv``), and its adapter (the
default kick of ``hooks.Perturb``)."""

from __future__ import annotations

import numbers
import sys
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
import numpy as np

from ..env_families import EnvAdapter
from ..errors import KernelAttributeError
from .batch_kernel import BatchKernel

#: ``_max_episode_steps`` of an env without a time limit, in the slot's ``limits`` array: a count no
#: episode reaches, so that the compiled time limit needs no test for "none".
NO_LIMIT = np.iinfo(np.int64).max


def time_limit(max_episode_steps: Any, where: str) -> int | None:
    """``gymnasium.make``'s ``max_episode_steps`` (-1: none), checked as ``TimeLimit`` checks it;
    ``where`` begins the messages."""
    if isinstance(max_episode_steps, (bool, np.bool_)) or not isinstance(max_episode_steps, numbers.Integral):
        raise TypeError(f"{where}: max_episode_steps must be an int, got {max_episode_steps!r:.80}")
    if max_episode_steps == -1:
        return None
    if max_episode_steps <= 0:
        raise ValueError(f"{where}: max_episode_steps must be positive, or -1 for no limit; got {max_episode_steps}")
    return int(max_episode_steps)


class KernelEnv(gymnasium.Env[np.ndarray, Any]):
    """One env of a compiled kernel, as a gymnasium env: row ``row`` of a slot's arrays.

    Workers make one per env of their slot: hooks see them as ``ctx.envs``, control calls run on them, and ``reset``
    runs the kernel's Python reset from the env's own ``np_random``. Its attributes do what gymnasium's env
    (``TimeLimit`` included) does with them: each parameter the kernel reads lives in the parameter matrix, ``state`` is
    the env's state in gymnasium's shape, ``_max_episode_steps`` and ``_elapsed_steps`` are the time limit's; those the
    kernel does not model (``BatchKernel.unsupported``) raise ``KernelAttributeError``. Made without ``arrays`` it is a
    standalone env with arrays of its own (the trainer's probe at launch).
    """

    def __init__(
        self,
        kernel: BatchKernel,
        arrays: Mapping[str, np.ndarray] | None = None,
        row: int = 0,
        *,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        env_label: str | None = None,
        **constructor: Any,
    ) -> None:
        if render_mode is not None:
            raise ValueError("compiled envs do not render; render_mode must be None")
        unknown = set(constructor) - set(kernel.constructor)
        if unknown:
            raise TypeError(f"unexpected keywords {sorted(unknown)}; the kernel takes {list(kernel.constructor)}")
        if arrays is None:
            arrays = {
                **kernel.arrays(1),
                "elapsed": np.zeros(1, dtype=np.int64),
                "limits": np.zeros(1, dtype=np.int64),
            }
            arrays["params"][:] = kernel.nominal(1, constructor)
        # Set before any other attribute: __setattr__ and __getattr__ look them up.
        object.__setattr__(self, "_columns", kernel.columns)
        object.__setattr__(self, "_unsupported", frozenset(kernel.unsupported))
        self._kernel = kernel
        self._arrays = arrays
        self._row = row
        self._label = env_label or "this compiled env"
        limit = kernel.max_episode_steps if max_episode_steps is None else time_limit(max_episode_steps, self._label)
        arrays["limits"][row] = NO_LIMIT if limit is None else min(limit, NO_LIMIT - 1)
        self.observation_space = kernel.observation_space
        self.action_space = kernel.action_space
        self.metadata = dict(kernel.metadata)
        #: The generator's state before the resets drawn ahead into this row of ``arrays["draws"]``
        #: (a slot's autoresets, ``refill_draws``); None while none are.
        self._drawn_from: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        columns = self.__dict__.get("_columns", {})
        if name in columns:
            return float(self.__dict__["_arrays"]["params"][self.__dict__["_row"], columns[name]])
        if name in self.__dict__.get("_unsupported", ()):
            raise KernelAttributeError(self._not_modeled(name, "so it has no value to read"))
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        columns = self.__dict__.get("_columns", {})
        if name in columns:
            self._arrays["params"][self._row, columns[name]] = self._parameter(name, value)
        elif name in self.__dict__.get("_unsupported", ()):
            # Stored, it would be an attribute no step reads: gymnasium's env would act on it.
            raise KernelAttributeError(self._not_modeled(name, "so setting it is refused (the kernel would ignore it)"))
        else:
            object.__setattr__(self, name, value)

    def _not_modeled(self, name: str, what: str) -> str:
        """Why ``name`` is refused, and what to use instead."""
        return (
            f"{self._label} (engine='numba'): the compiled kernel does not model {name!r}, {what}; change "
            f"what it runs with through its parameters ({', '.join(self._columns)}: with set_attr, or declared "
            f"as a shmpool.Param in launch(params=...)), or use engine='python' to run gymnasium's own env"
        )

    def _parameter(self, name: str, value: Any) -> float:
        """``value`` for parameter ``name``, as the float64 the kernel computes with; ``TypeError`` for a
        value gymnasium's env would compute with differently (a float32 makes its arithmetic float32)."""
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if not isinstance(value, numbers.Real):
            raise TypeError(
                f"{self._label} (engine='numba'): {name} = {value!r:.80} refused: the kernel's parameters "
                f"are real numbers"
            )
        if isinstance(value, np.floating) and value.dtype.itemsize != 8:
            raise TypeError(
                f"{self._label} (engine='numba'): {name} = {value!r} refused: gymnasium's env may compute with "
                f"a {value.dtype} in {value.dtype} arithmetic, which the kernel does not reproduce; give a "
                f"Python float"
            )
        return float(value)

    @property
    def state(self) -> np.ndarray:
        """The env's state, as gymnasium's env holds it (a view of its row of the slot's state array:
        writing it changes the env); setting it takes gymnasium's shape."""
        return self._arrays["state"][self._row, : self._kernel.state_columns]

    @state.setter
    def state(self, value: Any) -> None:
        row = self._arrays["state"][self._row]
        size = len(self.state)
        try:
            values = np.asarray(value)
        except ValueError as exc:  # a ragged sequence
            raise ValueError(f"{self._label} (engine='numba'): state = {value!r:.80} refused: {exc}") from exc
        if values.shape != (size,) or values.dtype.kind not in "biuf":
            raise ValueError(
                f"{self._label} (engine='numba'): state = {value!r:.80} refused: gymnasium's state of this env "
                f"is {size} real numbers, got shape {values.shape} of {values.dtype}"
            )
        try:
            if self._kernel.set_state is None:
                row[:size] = values
            else:
                self._kernel.set_state(row, values)
        except ValueError as exc:
            raise ValueError(f"{self._label} (engine='numba'): state = {value!r:.80} refused: {exc}") from exc

    @property
    def _max_episode_steps(self) -> int | None:
        """``TimeLimit``'s limit: the env's episodes are truncated at this many steps (None: never)."""
        limit = int(self._arrays["limits"][self._row])
        return None if limit == NO_LIMIT else limit

    @_max_episode_steps.setter
    def _max_episode_steps(self, value: Any) -> None:
        # Compared with the step count from the next step on, as TimeLimit compares it.
        self._arrays["limits"][self._row] = min(self._count("_max_episode_steps", value), NO_LIMIT - 1)

    @property
    def _elapsed_steps(self) -> int:
        """``TimeLimit``'s count: the steps of the env's episode so far."""
        return int(self._arrays["elapsed"][self._row])

    @_elapsed_steps.setter
    def _elapsed_steps(self, value: Any) -> None:
        self._arrays["elapsed"][self._row] = self._count("_elapsed_steps", value)

    def _count(self, name: str, value: Any) -> int:
        """``value`` as ``TimeLimit``'s ``name`` (an int, clipped to int64); ``TypeError`` for anything
        else (gymnasium's TimeLimit would fail at the next step)."""
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{self._label} (engine='numba'): {name} = {value!r:.80} refused: it must be an int")
        return max(min(int(value), NO_LIMIT), -NO_LIMIT)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Seeds ``np_random`` as gymnasium does, runs the kernel's reset and restarts the time limit."""
        if seed is not None:
            self._settle_draws()  # the generator it replaces is left where gymnasium's would be
        super().reset(seed=seed)
        row, arrays = self._row, self._arrays
        observation = arrays["observations"][row]
        self._kernel.reset(self.np_random, arrays["params"][row], options, arrays["state"][row], observation)
        arrays["elapsed"][row] = 0
        if "draws" in arrays:
            self.refill_draws()
        return observation.copy(), {}

    @property  # type: ignore[override]
    def np_random(self) -> np.random.Generator:
        """The env's generator, exactly where gymnasium's would be: resets drawn ahead and not used
        are given back first."""
        self._settle_draws()
        return gymnasium.Env.np_random.fget(self)  # type: ignore[attr-defined,no-any-return]

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._settle_draws()
        gymnasium.Env.np_random.fset(self, value)  # type: ignore[attr-defined]

    def refill_draws(self) -> None:
        """Draws the env's next option-less resets ahead (the kernel's ``draw``) into its row of the
        slot's ``draws``, for the slot's compiled autoresets; draws nothing (its resets then run in
        Python) while anything else holds its generator: another env given the same one, or a hook
        that kept it and draws from it, would get different numbers than with gymnasium."""
        self._settle_draws()
        gymnasium.Env.np_random.fget(self)  # type: ignore[attr-defined]  # made, if it was not yet
        if not _held_by_owner_only(self):
            return
        rng, draws = self._np_random, self._arrays["draws"]
        assert rng is not None and self._kernel.draw is not None
        self._drawn_from = dict(rng.bit_generator.state)
        draws[self._row] = self._kernel.draw(rng, draws.shape[1])
        self._arrays["cursor"][self._row] = 0

    def _settle_draws(self) -> None:
        """Puts the generator where the resets used so far would have left it, and forgets the rest."""
        saved = self._drawn_from
        if saved is None:
            return
        cursor, size = self._arrays["cursor"], self._arrays["draws"].shape[1]
        used = int(cursor[self._row])
        if used < size:  # all used: the generator is already there
            rng = gymnasium.Env.np_random.fget(self)  # type: ignore[attr-defined]
            rng.bit_generator.state = saved
            if used:
                assert self._kernel.draw is not None
                self._kernel.draw(rng, used)
        self._drop_draws()

    def _drop_draws(self) -> None:
        if self._drawn_from is not None:
            self._drawn_from = None
            self._arrays["cursor"][self._row] = self._arrays["draws"].shape[1]

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Steps this env alone, time limit included (workers step whole slots with the kernel instead)."""
        arrays, row = self._arrays, self._row
        work = self._kernel.arrays(len(arrays["state"]))  # only this row steps
        work["actions"][row] = action
        work["stepping"][row] = True
        self._kernel.step(
            arrays["state"],
            arrays["params"],
            work["actions"],
            work["stepping"],
            arrays["observations"],
            work["rewards"],
            work["terminations"],
        )
        arrays["elapsed"][row] += 1
        truncated = bool(arrays["elapsed"][row] >= arrays["limits"][row])
        observation = arrays["observations"][row].copy()
        return observation, float(work["rewards"][row]), bool(work["terminations"][row]), truncated, {}

    def kick(self, amounts: np.ndarray) -> None:
        """``hooks.Perturb``'s default kick: adds ``amounts`` to the env's velocities."""
        state = self._arrays["state"][self._row]
        if self._kernel.kick is not None:
            self._kernel.kick(state, np.asarray(amounts, dtype=np.float64))
            return
        velocities = list(self._kernel.velocities)
        state[velocities] += np.asarray(amounts, dtype=np.float64)[: len(velocities)]

    def render(self) -> Any:
        """Compiled envs do not render."""
        raise NotImplementedError("compiled envs (engine='numba') do not render; use engine='python' to render")


def _references(owner: Any) -> tuple[int, int]:
    """How many references ``owner._np_random`` and its bit generator have, counted the same way for
    every owner (the counts include this function's own)."""
    return sys.getrefcount(owner._np_random), sys.getrefcount(owner._np_random.bit_generator)


class _Owner:
    def __init__(self) -> None:
        self._np_random = np.random.default_rng(0)


#: What ``_references`` counts for a generator that one attribute alone refers to; None where
#: Python keeps no reference counts (PyPy): nothing is drawn ahead there.
_SOLE_OWNER = _references(_Owner()) if hasattr(sys, "getrefcount") else None


def _held_by_owner_only(owner: Any) -> bool:
    """Whether ``owner._np_random`` is a ``numpy.random.Generator`` that nothing but ``owner`` refers
    to, and likewise its bit generator (CPython reference counts)."""
    if _SOLE_OWNER is None or type(owner._np_random) is not np.random.Generator:
        return False
    generator, bit_generator = _references(owner)
    return generator <= _SOLE_OWNER[0] and bit_generator <= _SOLE_OWNER[1]


class KernelAdapter(EnvAdapter):
    """What shmpool's generic code needs to know about ``KernelEnv``: ``hooks.Perturb``'s kick, and the
    parameters its kernel's ``refresh`` derives."""

    name = "compiled kernel"
    classes = ("shmpool.kernels.env:KernelEnv",)

    def derived(self, env: Any) -> tuple[frozenset[str], frozenset[str]]:
        """The parameters the env's kernel's ``refresh`` writes, and those it reads."""
        kernel = env.unwrapped._kernel
        return frozenset(kernel.refresh_outputs), frozenset(kernel.refresh_inputs)

    def kicker(self, env: Any) -> Callable[[np.ndarray], None] | None:
        """Adds ``amounts`` to the velocities the env's kernel declares."""
        unwrapped = env.unwrapped
        if not unwrapped._kernel.velocities and unwrapped._kernel.kick is None:
            raise TypeError(
                "Perturb has no default kick for this compiled kernel: it declares no velocities and no kick"
            )
        return unwrapped.kick  # type: ignore[no-any-return]


#: Found by ``shmpool.env_families.adapter_for`` (this module is one of its families).
ADAPTERS = [KernelAdapter()]
