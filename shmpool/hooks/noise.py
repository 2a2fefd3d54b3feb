"""Gaussian noise on observations (``ObservationNoise``) and actions (``ActionNoise``), std
per env from a parameter."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from ..params import Param
from .compiled import _FLOATS, _compiled_functions, _width
from .context import HookContext
from .param_hook import ParamHook
from .streams import EnvStreams


def _box_leaf(space: spaces.Space[Any], what: str, hook: str) -> spaces.Box:
    if not isinstance(space, spaces.Box) or space.dtype.kind != "f":
        raise TypeError(f"{hook} needs a float Box {what} space, got {space}")
    return space


class ObservationNoise(ParamHook):
    """Adds Gaussian noise to observations; std per env from the parameter ``param``.

    Float Box observation spaces; noise is added to observations after each step and after resets.
    ``compiled``: None (compiled with ``engine="numba"``), True or False; see ``shmpool.hooks.compiled``.
    """

    def __init__(
        self,
        std: float = 0.0,
        *,
        param: str = "observation_noise",
        name: str | None = None,
        compiled: bool | None = None,
    ) -> None:
        super().__init__("ObservationNoise", param=param, name=name, compiled=compiled)
        self.std = std

    def _declaration(self) -> Param:
        """The noise std (``>= 0``)."""
        return Param(self.std, low=0.0, bind=False)

    def on_launch(self, ctx: HookContext) -> None:
        """Checks the space, makes the noise streams and, to run compiled, compiles now."""
        box = _box_leaf(ctx.observation_space, "observation", self.name)
        streams = self._make_streams(ctx, box.shape, "normal")
        self._std = ctx.applied[self.param].reshape((-1,) + (1,) * len(box.shape))  # type: ignore[index]
        observations = ctx.observations
        misfit = None
        if observations.dtype not in _FLOATS or not observations.flags.c_contiguous:
            misfit = f"observations of dtype {observations.dtype} (it takes contiguous float32 or float64 ones)"
        functions = _compiled_functions(self, ctx, misfit)
        if functions is None:
            return
        count = len(observations)
        std = ctx.applied[self.param]  # type: ignore[index]
        function, rows = functions.observation_noise, np.arange(count)
        observations = observations.reshape(count, -1)  # a view: the array is contiguous
        noise = streams.values.reshape(count, EnvStreams.BLOCK, -1)
        function(observations, noise, 0, std, rows[:0])  # compiles (or loads) it now; no rows: changes nothing
        self._compiled = (function, observations, noise, std, rows)

    def _add_noise(self, ctx: HookContext, rows: np.ndarray | None) -> None:
        """Adds noise to the observations at ``rows`` (None: every row)."""
        streams, compiled = self._streams, self._compiled
        assert streams is not None  # made by on_launch
        if compiled is not None:
            function, observations, noise, std, every_row = compiled
            function(observations, noise, streams.index(ctx.global_step), std, every_row if rows is None else rows)
            return
        std, noise = self._std, streams.at(ctx.global_step)
        if rows is None:
            ctx.observations += noise * std
        else:
            ctx.observations[rows] += noise[rows] * std[rows]

    def after_step(self, ctx: HookContext) -> None:
        """Noise on every observation of the step (first observations of envs that reset included)."""
        self._add_noise(ctx, None)

    def on_reset(self, ctx: HookContext) -> None:
        """Noise on the first observations of envs reset by ``pool.reset()`` or a same-step autoreset."""
        self._add_noise(ctx, ctx.reset_rows)


class ActionNoise(ParamHook):
    """Adds Gaussian noise to actions before the envs step; std per env from ``param``.

    Float Box action spaces; envs clip to their bounds as usual. ``compiled``: None (compiled with
    ``engine="numba"``), True or False; see ``shmpool.hooks.compiled``.
    """

    def __init__(
        self, std: float = 0.0, *, param: str = "action_noise", name: str | None = None, compiled: bool | None = None
    ) -> None:
        super().__init__("ActionNoise", param=param, name=name, compiled=compiled)
        self.std = std

    def _declaration(self) -> Param:
        """The noise std (``>= 0``)."""
        return Param(self.std, low=0.0, bind=False)

    def on_launch(self, ctx: HookContext) -> None:
        """Checks the space, makes the noise streams and, to run compiled, compiles now."""
        box = _box_leaf(ctx.action_space, "action", self.name)
        streams = self._make_streams(ctx, box.shape, "normal")
        dtype = np.dtype(ctx.action_space.dtype)
        misfit = None if dtype in _FLOATS else f"actions of dtype {dtype} (it takes float32 or float64 ones)"
        functions = _compiled_functions(self, ctx, misfit)
        if functions is None:
            return
        count, width = len(ctx.env_ids), _width(ctx.action_space.shape)  # type: ignore[arg-type]
        function, std, cast = functions.action_noise, ctx.applied[self.param], np.zeros(1, dtype)  # type: ignore[index]
        noise = streams.values.reshape(count, EnvStreams.BLOCK, width)
        # A step's actions are a fresh (envs, width) array of the space's dtype: compiled for that now.
        function(np.zeros((0, width), dtype), noise, 0, std, cast)
        self._compiled = (function, noise, std, cast)

    def before_step(self, ctx: HookContext) -> None:
        """Noise on this step's actions."""
        streams, actions, compiled = self._streams, ctx.actions, self._compiled
        assert streams is not None  # made by on_launch
        if compiled is not None:
            function, noise, std, cast = compiled
            rows = actions if actions.ndim == 2 else actions.reshape(len(actions), -1)  # a view: a fresh copy
            function(rows, noise, streams.index(ctx.global_step), std, cast)
            return
        std = ctx.applied[self.param]  # type: ignore[index]
        noise = streams.at(ctx.global_step) * std.reshape(-1, *([1] * (actions.ndim - 1)))
        actions += noise.astype(actions.dtype)
