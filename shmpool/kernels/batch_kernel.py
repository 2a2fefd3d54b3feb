"""What a compiled batch env is: ``BatchKernel``, the description a kernel author writes (``docs/guides/engines.md``
has an example), and the checks that refuse an inconsistent one."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from ..episodes import episode_dtype

Step = Callable[..., None]
Reset = Callable[[np.random.Generator, np.ndarray, "dict[str, Any] | None", np.ndarray, np.ndarray], None]
Kick = Callable[[np.ndarray, np.ndarray], None]
Draw = Callable[[np.random.Generator, int], np.ndarray]
Refresh = Callable[[np.ndarray], None]
SetState = Callable[[np.ndarray, np.ndarray], None]

#: What a KernelEnv models besides its kernel's parameters: gymnasium's env's and ``TimeLimit``'s
#: attributes, and the ones every gymnasium env has.
MODELED = (
    "state",
    "_max_episode_steps",
    "_elapsed_steps",
    "observation_space",
    "action_space",
    "metadata",
    "spec",
    "np_random",
    "np_random_seed",
    "_np_random",
    "_np_random_seed",
)


@dataclass(frozen=True)
class BatchKernel:
    """A batch env compiled with numba: everything a worker needs to run a whole slot in one call.

    What each field must hold (shapes, dtypes, the rules a kernel keeps): ``docs/guides/engines.md``,
    "BatchKernel's fields".

    Attributes:
        observation_space: one env's observations: a 1-D float Box.
        action_space: one env's actions: ``Discrete`` or a 1-D Box.
        state_size: float64 numbers of state per env: the columns of the slot's state array.
        params: the parameters the kernel reads, in column order of the parameter matrix, with their nominal values.
        step: a numba-jitted ``step(state, params, actions, stepping, observations, rewards, terminations)`` over
            the slot.
        reset: a Python ``reset(rng, params, options, state, observation)`` for one env, from its ``np_random``.
        max_episode_steps: the time limit (``TimeLimit``); None: no limit.
        velocities: the state columns that ``hooks.Perturb``'s default kick adds to.
        constructor: parameters that are also constructor keywords of the env (``env_kwargs``, ``when="rebuild"``).
        kick: instead of adding to ``velocities``, a Python ``kick(state, amounts)`` for one env's state row.
        metadata: the env's ``metadata``.
        draw: with ``start``, a Python ``draw(rng, count)``: what ``count`` option-less resets would draw.
        start: a numba-jitted ``start(resetting, draws, params, state, observations)``: those resets, compiled.
        refresh: a Python ``refresh(params)`` recomputing the parameters the env derives once (CartPole's
            ``total_mass``).
        refresh_inputs: the parameters that ``refresh`` reads.
        refresh_outputs: the parameters that ``refresh`` writes (declaring one beside one of
            ``refresh_inputs`` is refused at launch).
        state_columns: how many leading state columns are the gymnasium env's ``state``; None: all of them.
        set_state: how a value assigned to ``KernelEnv.state`` is stored; None: as float64.
        unsupported: attributes of the gymnasium env the kernel does not model: setting one raises
            ``KernelAttributeError``.
    """

    observation_space: spaces.Box
    action_space: spaces.Discrete | spaces.Box
    state_size: int
    params: Mapping[str, float]
    step: Step
    reset: Reset
    max_episode_steps: int | None = None
    velocities: Sequence[int] = ()
    constructor: Sequence[str] = ()
    kick: Kick | None = None
    metadata: Mapping[str, Any] = field(default_factory=lambda: {"render_modes": []})
    draw: Draw | None = None
    start: Step | None = None
    refresh: Refresh | None = None
    refresh_inputs: Sequence[str] = ()
    refresh_outputs: Sequence[str] = ()
    state_columns: int | None = None
    set_state: SetState | None = None
    unsupported: Sequence[str] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.observation_space, spaces.Box) or len(self.observation_space.shape) != 1:
            raise TypeError(f"BatchKernel.observation_space must be a 1-D Box, got {self.observation_space}")
        if not isinstance(self.action_space, spaces.Discrete) and not (
            isinstance(self.action_space, spaces.Box) and len(self.action_space.shape) == 1
        ):
            raise TypeError(f"BatchKernel.action_space must be Discrete or a 1-D Box, got {self.action_space}")
        unknown = set(self.constructor) - set(self.params)
        if unknown:
            raise ValueError(f"BatchKernel.constructor names {sorted(unknown)}, which are not among its params")
        if (self.draw is None) != (self.start is None):
            raise ValueError("BatchKernel.draw and BatchKernel.start go together: give both or neither")
        if (self.refresh is None) != (not self.refresh_inputs):
            raise ValueError("BatchKernel.refresh and BatchKernel.refresh_inputs go together: give both or neither")
        if self.refresh is None and self.refresh_outputs:
            raise ValueError("BatchKernel.refresh_outputs needs BatchKernel.refresh, which writes them")
        for field_name in ("refresh_inputs", "refresh_outputs"):
            unknown = set(getattr(self, field_name)) - set(self.params)
            if unknown:
                raise ValueError(f"BatchKernel.{field_name} names {sorted(unknown)}, which are not among its params")
        if self.state_columns is not None and not 0 < self.state_columns <= self.state_size:
            raise ValueError(
                f"BatchKernel.state_columns must be within [1, state_size={self.state_size}], got {self.state_columns}"
            )
        clash = set(self.unsupported) & {*self.params, *MODELED}
        if clash:
            raise ValueError(f"BatchKernel.unsupported names {sorted(clash)}, which the kernel models")

    @property
    def columns(self) -> dict[str, int]:
        """Each parameter's column in the parameter matrix."""
        return {name: column for column, name in enumerate(self.params)}

    def nominal(self, count: int, overrides: Mapping[str, Any] | None = None) -> np.ndarray:
        """A C-contiguous ``(count, len(params))`` parameter matrix of nominal values, ``overrides``
        (constructor keywords) applied."""
        values = dict(self.params)
        values.update(overrides or {})
        matrix = np.ascontiguousarray(np.tile(np.array(list(values.values()), dtype=np.float64), (count, 1)))
        if self.refresh is not None:  # what __init__ derives from the constructor's values
            self.refresh(matrix)
        return matrix

    def arrays(self, count: int) -> dict[str, np.ndarray]:
        """Empty arrays of the types a worker passes to ``step`` for ``count`` envs (the warm-up
        compiles exactly the signature the workers call)."""
        if isinstance(self.action_space, spaces.Discrete):
            actions = np.zeros(count, dtype=np.int64)
        else:
            actions = np.zeros((count, *self.action_space.shape), dtype=self.action_space.dtype)
        return {
            "state": np.zeros((count, self.state_size), dtype=np.float64),
            "params": self.nominal(count),
            "actions": actions,
            "stepping": np.zeros(count, dtype=np.bool_),
            "observations": np.zeros((count, *self.observation_space.shape), dtype=self.observation_space.dtype),
            "rewards": np.zeros(count, dtype=np.float64),
            "terminations": np.zeros(count, dtype=np.bool_),
        }

    def warm_up(self) -> None:
        """Compiles ``step`` and the workers' bookkeeping around it for the workers' argument types
        (or loads them from numba's cache) by calling them over envs that do not step."""
        from . import slot

        arrays = self.arrays(1)
        self.step(*arrays.values())
        flags, numbers, counts = np.zeros(1, np.bool_), np.zeros(1), np.zeros(1, np.int64)
        slot.time_limit(counts, flags, counts, flags, flags)
        slot.add_step(flags, numbers, flags, flags, numbers, counts, flags)
        values, writers = np.zeros((1, 1)), np.zeros(8, np.int64)
        accepting = (values, counts, numbers, numbers, flags, counts, counts, values, values, flags, flags)
        slot.sync_scalars(values, values, values, writers, *accepting)
        if self.start is not None:  # compiled autoresets and episode ends
            slot.end_episodes(flags, numbers, counts, numbers, 0.0, numbers, counts, numbers, flags)
            ring = np.zeros(1, episode_dtype(None, ()))
            slot.record_episodes(flags, 0, counts, 0, numbers, counts, flags, flags, ring, 0)
            draws = np.zeros((1, 1, self.draw_width))
            episode = (numbers, counts, numbers, counts, counts, numbers, flags, flags)
            slot.restart(flags, flags, counts, draws, draws[0], 0.0, *episode)
            self.start(flags, draws[0], arrays["params"], arrays["state"], arrays["observations"])

    @functools.cached_property
    def draw_width(self) -> int:
        """How many values ``draw`` gives per reset (0 without ``draw``); ``ValueError`` if its result
        is not a ``(count, width)`` float array."""
        if self.draw is None:
            return 0
        drawn = self.draw(np.random.default_rng(0), 2)
        if not isinstance(drawn, np.ndarray) or drawn.ndim != 2 or len(drawn) != 2 or drawn.dtype.kind != "f":
            raise ValueError(
                f"BatchKernel.draw(rng, count) must return a (count, width) float array, got "
                f"{type(drawn).__name__} {getattr(drawn, 'shape', '')} for count=2"
            )
        return int(drawn.shape[1])
