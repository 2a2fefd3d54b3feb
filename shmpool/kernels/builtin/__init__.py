"""The built-in compiled kernels: gymnasium's classic-control envs as numba batch kernels,
bit-identical to ``gymnasium.make`` of them, one module per env (``cartpole``, ``pendulum``,
``mountain_car`` with MountainCarContinuous, ``acrobot``) and their shared helpers in ``common``.

Why and how: ``docs/internals.md``, "shmpool/kernels/builtin/__init__.py".
"""

from __future__ import annotations

from .acrobot import ACROBOT
from .cartpole import CARTPOLE
from .mountain_car import MOUNTAIN_CAR, MOUNTAIN_CAR_CONTINUOUS
from .pendulum import PENDULUM

__all__ = ["ACROBOT", "CARTPOLE", "MOUNTAIN_CAR", "MOUNTAIN_CAR_CONTINUOUS", "PENDULUM"]
