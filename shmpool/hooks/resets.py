"""Hooks that ask the worker to start something afresh: ``Resample`` redraws ``dist`` parameters
every few steps of an episode, ``Reset`` resets the envs that events address."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .context import HookContext


class Resample:
    """Draws new values of ``dist`` parameters for every env every ``every`` steps of its episode (a
    ``when="reset"`` parameter's from the arguments its episode began with)."""

    def __init__(self, params: Sequence[str], *, every: int, name: str | None = None) -> None:
        if every < 1:
            raise ValueError(f"Resample(every=...) must be >= 1, got {every}")
        self.names, self.every, self.name = list(params), every, name or "Resample"

    def on_launch(self, ctx: HookContext) -> None:
        """Checks that every name is a ``dist`` parameter of the pool (a redraw of no env: the one
        check there is), so that a typo fails the launch, not the step of the first redraw."""
        ctx.resample(self.names, np.zeros(0, dtype=np.int64))

    def before_step(self, ctx: HookContext) -> None:
        """Redraws for the envs whose step count is a multiple of ``every``."""
        due = ctx.due_every(self.every)
        if len(due):
            due = due[~ctx.resetting[due]]
            if len(due):
                ctx.resample(self.names, due)


class Reset:
    """Resets the envs it receives in events, in place of their next step (reward 0, not done)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or "Reset"

    def before_step(self, ctx: HookContext) -> None:
        """Turns this step of the addressed envs into a reset."""
        for event in ctx.events:
            ctx.request_reset(ctx.rows(event.env_ids))
