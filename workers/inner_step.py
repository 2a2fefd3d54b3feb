"""What a worker steps under the wrappers ``gymnasium.make`` puts on every env: the step of what lies
beneath them, with the same results and the same wrapper state (``inner_step``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import gymnasium
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit


def _own_step(kind: type) -> Any:
    """``kind``'s ``step`` where it is the function gymnasium defines (its name and source file), else
    None: one patched on the class before this import is the patch's to run."""
    step = vars(kind).get("step")
    code = getattr(step, "__code__", None)
    module = sys.modules.get(kind.__module__)
    if (
        getattr(step, "__qualname__", None) == f"{kind.__name__}.step"
        and code is not None
        and code.co_filename == getattr(module, "__file__", None)
    ):
        return step
    return None


#: The step of each wrapper passed over, as gymnasium defines it: where the class's is another (patched
#: on the class), the walk stops there and steps it.
_OWN_STEPS = {kind: _own_step(kind) for kind in (TimeLimit, OrderEnforcing, PassiveEnvChecker)}


def inner_step(env: gymnasium.Env) -> tuple[Callable[[Any], Any], TimeLimit | None] | None:
    """What to step instead of ``env.step``: the step of what lies under the wrappers that ``gymnasium.make`` puts on
    top of every env, and the ``TimeLimit`` among them (whose count and truncation the caller then keeps), with the
    same results and the same wrapper state. None while the ``PassiveEnvChecker`` has checks left (the env's first two
    steps) or before the first reset.

    Why: those wrappers cost a noticeable share of a cheap env's step. Only their exact classes, with their own
    ``step`` and a state laid out as gymnasium 1.2 to 1.4 lay it out, are passed over; anything else is stepped
    through (``docs/internals.md``, "How a worker steps a gymnasium env").
    """
    limit: Any = None
    layer: Any = env
    while True:
        kind = type(layer)
        state = getattr(layer, "__dict__", {})
        if "step" in state:  # patched on the instance: what it does is its own
            return layer.step, limit
        if kind in _OWN_STEPS and vars(kind).get("step") is not _OWN_STEPS[kind]:
            return layer.step, limit  # patched on the class (before this import too: then None is kept)
        if kind is TimeLimit and limit is None:
            if "_elapsed_steps" not in state or "_max_episode_steps" not in state:
                return env.step, None  # an unknown layout: through every wrapper
            if state["_elapsed_steps"] is None:  # not reset yet
                return None
            limit = layer
        elif kind is OrderEnforcing:
            if not isinstance(state.get("_has_reset"), bool):
                return env.step, None  # an unknown layout: through every wrapper
            if not state["_has_reset"]:
                return None
        elif kind is PassiveEnvChecker:
            # The step's checks: one flag in gymnasium 1.1 and 1.2, two since 1.3.
            if "checked_step" not in state:
                return env.step, None  # an unknown layout: through every wrapper
            if not (state["checked_step"] and state.get("checked_data_reuse", True)):
                return None
        else:
            return layer.step, limit
        layer = layer.env
