"""Action delay: each env acts on the action of a given number of steps ago (``ActionDelay``)."""

from __future__ import annotations

import numpy as np

from ..params import Param
from ..spaces import is_leaf, leaves
from .compiled import _NUMBERS, _compiled_functions, _width
from .context import HookContext
from .param_hook import ParamHook


class ActionDelay(ParamHook):
    """Delays each env's actions by ``param`` steps (an int per env, up to ``max_steps``).

    Until an episode has had that many actions, the env repeats the episode's first action: with a
    delay of 2 an env receives a0, a0, a0, a1, a2, ... Array action spaces (Box, Discrete,
    MultiDiscrete, MultiBinary). ``compiled``: None (compiled with ``engine="numba"``), True or
    False; see ``shmpool.hooks.compiled``.
    """

    def __init__(
        self,
        steps: int = 1,
        *,
        max_steps: int | None = None,
        param: str = "action_delay",
        name: str | None = None,
        compiled: bool | None = None,
    ) -> None:
        self.steps = int(steps)
        self.max_steps = int(max_steps if max_steps is not None else steps)
        if not 0 <= self.steps <= self.max_steps:
            raise ValueError(f"ActionDelay needs 0 <= steps <= max_steps, got {steps}, {max_steps}")
        super().__init__("ActionDelay", param=param, name=name, compiled=compiled)
        self._history = np.zeros(0)
        self._count = np.zeros(0, dtype=np.int64)
        self._episodes = np.zeros(0, dtype=np.int64)  # each env's episode index at its last action
        self._episodes_seen = b""  # the same as bytes
        self._delay = np.zeros(0, dtype=np.int64)  # each env's delay: its column of ``applied``, found at launch

    def _declaration(self) -> Param:
        """The delay in steps (an int in ``[0, max_steps]``)."""
        return Param(self.steps, low=0, high=self.max_steps, dtype="int64", bind=False)

    def on_launch(self, ctx: HookContext) -> None:
        """Checks the space, makes the shift registers and, to run compiled, compiles now."""
        if not is_leaf(ctx.action_space):
            raise TypeError(f"{self.name} needs an array action space (Box, Discrete, MultiDiscrete, MultiBinary)")
        (leaf,) = leaves(ctx.action_space)
        count, width = len(ctx.env_ids), _width(leaf.shape)
        self._history = np.zeros((count, self.max_steps + 1, *leaf.shape), dtype=leaf.dtype)
        self._count = np.zeros(count, dtype=np.int64)
        self._rows = np.arange(count)
        self._episodes = ctx.episode_indices.copy()
        self._episodes_seen = self._episodes.tobytes()
        self._delay = ctx.applied[self.param]  # type: ignore[index]
        misfit = None if leaf.dtype in _NUMBERS else f"actions of dtype {leaf.dtype}"
        functions = _compiled_functions(self, ctx, misfit)
        if functions is None:
            return
        history = self._history.reshape(count, self.max_steps + 1, width)
        arguments = (history, self._count, self._episodes, ctx.episode_indices, self._delay, self.max_steps)
        # A step's actions are a fresh (envs, width) array of the leaf's dtype: compiled for that now.
        functions.action_delay(np.zeros((0, width), leaf.dtype), *arguments)
        self._compiled = (functions.action_delay, *arguments)

    def before_step(self, ctx: HookContext) -> None:
        """Records this step's actions and replaces them with the delayed ones."""
        actions, compiled = ctx.actions, self._compiled
        if compiled is not None:
            rows = actions if actions.ndim == 2 else actions.reshape(len(actions), -1)  # a view: a fresh copy
            compiled[0](rows, *compiled[1:])
            return
        episodes = ctx.episode_indices
        # A shift register per env: column j holds the action of j steps ago; column ``count`` holds
        # the episode's first action, which stands in for actions older than the episode.
        history, count = self._history, self._count
        # An env whose episode changed since its last action (however it reset, whichever hook asked
        # and in whatever order) starts afresh: this action is its episode's first. (Compared as
        # bytes: most steps start no episode, and this is a third of an array compare and any().)
        seen = episodes.tobytes()
        if seen != self._episodes_seen:
            new = episodes != self._episodes
            count[new] = 0
            self._episodes[new] = episodes[new]
            self._episodes_seen = seen
        history[:, 1:] = history[:, :-1]
        history[:, 0] = actions
        actions[...] = history[self._rows, np.minimum(self._delay, count)]
        count += 1  # past max_steps too: the delay, at most max_steps, caps the column it picks
