"""What a hook sees and how it is addressed: ``HookContext``, the phases, ``hook_name``.

The hook contract itself (which methods a hook may have and when each runs) is in ``shmpool.hooks``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from ..events import Event


class _ChangedInPlace:
    """A result array of the slot (``ctx.rewards``, ...): hooks change it in place. Rebinding it would
    give the hook a private array, which neither the envs' results nor the later hooks would see."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name, self._slot = name, "_" + name

    def __get__(self, ctx: Any, owner: type | None = None) -> Any:
        return self if ctx is None else getattr(ctx, self._slot)

    def __set__(self, ctx: Any, value: Any) -> None:
        if value is not getattr(ctx, self._slot, None):  # ``ctx.rewards *= 2`` sets back the same array
            raise AttributeError(
                f"ctx.{self._name} holds the slot's results: change it in place (ctx.{self._name}[:] = ..., "
                f"ctx.{self._name} *= 2); a new array would reach neither the results nor the later hooks"
            )


class HookContext:
    """What a hook sees: numpy views of its worker's slot, and the slot's envs.

    Attributes:
        env_ids: the pool-wide ids of the slot's envs (row ``i`` of every array is env ``env_ids[i]``).
        envs: the slot's gymnasium envs, for physics-level hooks. With ``engine="python"`` a hook may
            patch an env's ``step`` or put an env in a new wrapper in this list: the env's next step
            runs through the change. With ``engine="mujoco"`` a batch holds their physics: a hook of
            the user's that touches an env's ``unwrapped.data`` during a step raises (change the
            physics through ``shmpool.mujoco``'s bindings and ``Push``).
        actions: in ``before_step``, the slot's actions (a writable copy; structured like the action
            space for Dict/Tuple spaces); None in the other phases.
        observations, rewards, terminations, truncations: the slot's rows of the results, changed in
            place (assigning a new array to one raises: it would reach neither the results nor later hooks).
        resetting: in ``before_step``, which envs reset instead of stepping this step (those that
            hooks earlier in the chain asked to reset included).
        stepped: in ``after_step``, which envs stepped (False: they reset this step instead).
        reset_rows: in ``on_reset``, the rows of the envs that just reset.
        params: the slot's parameter records as the worker last read them whole and accepted them
            (read-only; never a half-written record); None without params.
        applied: the slot's rows of the applied block (None without params).
        step_counts: steps taken in the current episode, per env.
        episode_indices: the index of the current episode, per env.
        global_step: the index of the current step of the pool (0 for the first step).
        rng: a ``numpy.random.Generator`` per worker, seeded from the pool seed and the worker id.
        seed: the pool's seed.
        events: the events addressed to the running hook and due this step.
        observation_space, action_space: one env's spaces.
        engine: the engine stepping the slot: ``"python"``, ``"numba"`` or ``"mujoco"``.
        kernel: with ``engine="numba"``, the slot's ``shmpool.kernels.BatchKernel``; else None.
        state: with ``engine="numba"``, the slot's kernel state, ``(envs, kernel.state_size)``
            float64 (row ``i`` is ``envs[i].state``); else None.
    """

    env_ids: np.ndarray
    envs: list[Any]
    actions: Any
    observations = _ChangedInPlace()
    rewards = _ChangedInPlace()
    terminations = _ChangedInPlace()
    truncations = _ChangedInPlace()
    reset_rows: np.ndarray
    params: np.ndarray | None
    applied: np.ndarray | None
    episode_indices: np.ndarray
    global_step: int
    rng: np.random.Generator
    seed: int
    events: list[Event]
    action_space: spaces.Space[Any]
    observation_space: spaces.Space[Any]
    engine: str = "python"
    kernel: Any = None
    state: np.ndarray | None = None

    def __init__(
        self, request_reset: Callable[[np.ndarray], None], resample: Callable[[list[str], np.ndarray], None]
    ) -> None:
        self._request_reset = request_reset
        self._resample = resample
        self.events = []
        self.begin_phase([], [], [])
        self._steps = 0  # the slot's steps so far: what ``due_every``'s schedules count in
        self._schedules: dict[int, tuple[int, int]] = {}  # every -> (step looked at, first step any can be due)

    def bind_results(
        self, observations: Any, rewards: np.ndarray, terminations: np.ndarray, truncations: np.ndarray
    ) -> None:
        """Gives the context the slot's rows of the results, once (hooks change them in place)."""
        self._observations, self._rewards = observations, rewards
        self._terminations, self._truncations = terminations, truncations

    def begin_step(self, global_step: int) -> None:
        """Called by the worker as each step of the slot begins."""
        self.global_step = global_step
        self._steps += 1

    def begin_phase(self, lengths: list[int], resetting: list[bool], stepped: list[bool], phase: str = "") -> None:
        """Sets the per-env flags of the coming phase (one of ``PHASES``); they become arrays only if
        a hook reads them."""
        self._lists = (lengths, resetting, stepped)
        self._arrays: dict[int, np.ndarray] = {}
        self._phase = phase

    def _array(self, which: int) -> np.ndarray:
        array = self._arrays.get(which)
        if array is None:
            array = self._arrays[which] = np.array(self._lists[which])
        return array

    @property
    def step_counts(self) -> np.ndarray:
        """Steps taken in the current episode, per env."""
        return self._array(0)

    @property
    def resetting(self) -> np.ndarray:
        """In ``before_step``: which envs reset instead of stepping this step (those that hooks earlier
        in the chain asked to reset included: read it again after ``request_reset``)."""
        return self._array(1)

    @property
    def stepped(self) -> np.ndarray:
        """In ``after_step``: which envs stepped (False: they reset this step instead)."""
        return self._array(2)

    def due_every(self, every: int) -> np.ndarray:
        """The rows whose step count is a positive multiple of ``every`` (those resetting included).
        In ``before_step`` it keeps a schedule: a count rises by at most one per step and restarts at
        0, so once the counts are looked at, no row can be due until the smallest
        ``every - count % every`` steps later, and the steps before that return no rows without
        looking. In the other phases it looks every time."""
        steps, seen = self._steps, self._schedules.get(every)
        scheduled = self._phase == "before_step"  # other phases see counts the step already raised
        if scheduled and seen is not None and seen[0] != steps and steps < seen[1]:
            return _NO_ROWS
        counts = self.step_counts
        phases = counts % every
        if scheduled:
            self._schedules[every] = (steps, steps + int((every - phases).min(initial=every)))
        return np.flatnonzero((counts > 0) & (phases == 0))

    def rows(self, env_ids: np.ndarray) -> np.ndarray:
        """The rows of the slot's arrays that hold the given pool-wide env ids."""
        return np.asarray(env_ids) - self.env_ids[0]

    def request_reset(self, rows: np.ndarray) -> None:
        """In ``before_step``: reset the envs at ``rows`` (row indices, or a boolean mask over the slot)
        instead of stepping them this step."""
        rows, count = np.asarray(rows), len(self.env_ids)
        if not rows.size:  # nothing due: an empty list is float64 to numpy
            rows = np.zeros(0, np.intp)
        elif rows.dtype == np.bool_ and rows.shape == (count,):
            rows = np.flatnonzero(rows)
        elif rows.dtype.kind not in "iu" or rows.ndim > 1 or not 0 <= rows.min() <= rows.max() < count:
            # A negative row would reset an env at the slot's other end; every engine refuses it alike.
            raise ValueError(
                f"request_reset: rows must be row indices of the slot's {count} envs (0 to {count - 1}) or a "
                f"boolean mask of shape ({count},), got {rows!r:.80}"
            )
        self._request_reset(rows)
        self._arrays.pop(1, None)  # the flags changed: the next read of ``resetting`` shows the new resets

    def resample(self, names: list[str], rows: np.ndarray) -> None:
        """Draws new values of the named ``dist`` parameters for the envs at ``rows``, now."""
        self._resample(list(names), np.asarray(rows))


PHASES = ("before_step", "after_step", "on_reset")

_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.flags.writeable = False


def hook_name(hook: Any) -> str:
    """The name that events use to address ``hook``."""
    return str(getattr(hook, "name", None) or type(hook).__name__)
