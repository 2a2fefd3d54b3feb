"""Reward scaling: each env's reward times a parameter (``RewardScale``)."""

from __future__ import annotations

import numpy as np

from ..params import Param
from .compiled import _compiled_functions
from .context import HookContext
from .param_hook import ParamHook


class RewardScale(ParamHook):
    """Multiplies each env's reward by the parameter ``param`` (per env).

    ``compiled``: None (compiled with ``engine="numba"``), True or False; see ``shmpool.hooks.compiled``.
    """

    def __init__(
        self, scale: float = 1.0, *, param: str = "reward_scale", name: str | None = None, compiled: bool | None = None
    ) -> None:
        super().__init__("RewardScale", param=param, name=name, compiled=compiled)
        self.scale = scale
        self._scale = np.zeros(0)  # each env's scale: its column of ``applied``, found at launch

    def _declaration(self) -> Param:
        """The scale."""
        return Param(self.scale, bind=False)

    def on_launch(self, ctx: HookContext) -> None:
        """To run compiled, compiles now."""
        self._scale = ctx.applied[self.param]  # type: ignore[index]
        functions = _compiled_functions(self, ctx, None)
        if functions is not None:
            functions.reward_scale(ctx.rewards[:0], self._scale)  # compiles (or loads) it now; no rows: changes nothing
            self._compiled = (functions.reward_scale, self._scale)

    def after_step(self, ctx: HookContext) -> None:
        """Scales this step's rewards."""
        compiled = self._compiled
        if compiled is not None:
            compiled[0](ctx.rewards, compiled[1])
        else:
            ctx.rewards *= self._scale
