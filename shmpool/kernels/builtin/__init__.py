"""The built-in compiled kernels: gymnasium's classic-control envs as numba batch kernels,
bit-identical to ``gymnasium.make`` of them, one module per env (``cartpole``, ``pendulum``,
``mountain_car`` with MountainCarContinuous, ``acrobot``) and their shared helpers in ``common``.

Each ``step`` is gymnasium's arithmetic, operation for operation and in the same order, with the
same number types: numpy float32 scalars stay float32 where gymnasium's do (Pendulum's torque term,
MountainCarContinuous' state after its first step, compared in float32 as numpy compares a float32
with a Python float), and ``x ** 2`` calls libm's ``pow`` as numpy and Python do (see
``shmpool.kernels.builtin.common``). ``sin`` and ``cos`` are libm's on both sides. Resets are
gymnasium's own code paths, in numpy.

Parameters are gymnasium's attribute names; nominal values are read from a fresh env of each class,
and the time limits from gymnasium's registry. CartPole's ``total_mass`` and ``polemass_length``, which
its ``__init__`` computes once, are parameters the step reads as gymnasium's does (and ``refresh``
recomputes where the Python engine's adapter does). Every other attribute of each env (its rendering
state, CartPole's ``kinematics_integrator``, Acrobot's ``torque_noise_max``, ...) is ``unsupported``:
setting one on a compiled env is refused rather than ignored.

The registry (``shmpool.kernels.BUILTIN``) names each kernel by its import string; importing this
package imports numba and all five.
"""

from __future__ import annotations

from .acrobot import ACROBOT
from .cartpole import CARTPOLE
from .mountain_car import MOUNTAIN_CAR, MOUNTAIN_CAR_CONTINUOUS
from .pendulum import PENDULUM

__all__ = ["ACROBOT", "CARTPOLE", "MOUNTAIN_CAR", "MOUNTAIN_CAR_CONTINUOUS", "PENDULUM"]
