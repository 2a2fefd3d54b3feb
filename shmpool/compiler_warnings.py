"""MuJoCo's compiler warnings, once per pool and through Python's ``warnings``.

MuJoCo prints what its compiler warns about from C, once per compile, and a pool compiles each model in the trainer
(probing the env at launch) and again in every worker. So the trainer's compile turns each message into one
``RuntimeWarning``, and a worker's compile of the same models keeps its messages to itself. Warnings while the envs
run (an unstable simulation) are MuJoCo's as before.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def may_compile_mujoco(env: Any, engine: str) -> bool:
    """Whether making ``env`` (a registered id or a factory) may compile MuJoCo models: the mujoco
    engine, a gymnasium MuJoCo id, or any env once ``mujoco`` is imported (a factory's own model)."""
    if engine == "mujoco" or "mujoco" in sys.modules:
        return True
    if isinstance(env, str):
        import gymnasium

        try:
            entry_point = gymnasium.spec(env).entry_point
        except gymnasium.error.Error:
            return False
        return "mujoco" in str(entry_point) and importlib.util.find_spec("mujoco") is not None
    return False


@contextmanager
def compiler_warnings(env: Any, engine: str, *, show: bool, where: str) -> Iterator[None]:
    """Collects MuJoCo's warnings while envs are made; then warns each distinct one (``show``, the
    trainer), or drops them (a worker, whose models the trainer has already compiled)."""
    if not may_compile_mujoco(env, engine):
        yield
        return
    import mujoco

    previous = mujoco.get_mju_user_warning()
    messages: list[str] = []
    mujoco.set_mju_user_warning(messages.append)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)
        if show:
            for message in dict.fromkeys(text.strip() for text in messages):
                warnings.warn(f"MuJoCo, compiling {where}: {message}", RuntimeWarning, stacklevel=6)  # launch's caller
