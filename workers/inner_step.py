"""What a worker steps under the wrappers ``gymnasium.make`` puts on every env: the step of what lies
beneath them, with the same results and the same wrapper state (``inner_step``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import gymnasium
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit

from shmpool.env_families import defined_in


def _own_step(kind: type) -> Any:
    """``kind``'s ``step`` where it is the function gymnasium defines, else None (patched on the class)."""
    step = vars(kind).get("step")
    return step if defined_in(step, sys.modules[kind.__module__], f"{kind.__name__}.step") else None


#: The step of each wrapper passed over, as gymnasium defines it: where the class's is another (patched
#: on the class), the walk stops there and steps it. None where it was patched when first looked at.
#: ``Wrapper``'s too: ``OrderEnforcing.step`` calls it (``super().step``), the others call ``self.env.step``.
_OWN_STEPS: dict[type, Any] = {
    kind: _own_step(kind) for kind in (TimeLimit, OrderEnforcing, PassiveEnvChecker, gymnasium.Wrapper)
}


def _patched_on_the_class(kind: type) -> bool:
    """Whether ``kind``, whose ``step`` is not the one ``_OWN_STEPS`` holds, has one gymnasium did not define."""
    if _OWN_STEPS[kind] is None:  # patched when first looked at (before a slot was built, say): restored since?
        _OWN_STEPS[kind] = _own_step(kind)
        return _OWN_STEPS[kind] is None
    return True


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
        if kind in _OWN_STEPS and kind.step is not _OWN_STEPS[kind] and _patched_on_the_class(kind):
            return layer.step, limit  # (the identity inline: a call per layer would double the walk's cost)
        if kind is TimeLimit and limit is None:
            if "_elapsed_steps" not in state or "_max_episode_steps" not in state:
                return env.step, None  # an unknown layout: through every wrapper
            if state["_elapsed_steps"] is None:  # not reset yet
                return None
            limit = layer
        elif kind is OrderEnforcing:
            if gymnasium.Wrapper.step is not _OWN_STEPS[gymnasium.Wrapper] and _patched_on_the_class(gymnasium.Wrapper):
                return layer.step, limit
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
