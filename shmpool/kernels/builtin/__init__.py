"""The built-in compiled kernels: gymnasium's classic-control envs as numba batch kernels,
bit-identical to ``gymnasium.make`` of them, one module per env (``cartpole``, ``pendulum``,
``mountain_car`` with MountainCarContinuous, ``acrobot``) and their shared helpers in ``common``.

Why and how: ``docs/internals.md``, "shmpool/kernels/builtin/__init__.py".
"""
