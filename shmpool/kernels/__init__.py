"""Compiled batch envs: ``launch(env_id, num_envs, engine="numba")`` steps each worker's whole slot in
one numba-jitted call instead of env by env in Python.

A ``BatchKernel`` describes one such env: its spaces, the float64 state it keeps per env, the
parameters it reads (by their gymnasium attribute names, with nominal values), a jitted ``step`` over
the slot and a Python ``reset`` for one env. A worker keeps the slot's state as an ``(envs, state_size)``
array and the parameters as an ``(envs, len(params))`` matrix; parameters are read, validated, drawn
and published exactly as with the Python engine (``shmpool.workers.param_applier``), but an
accepted value lands in its matrix column instead of an env attribute, and the kernel reads the
matrix each step.
Values an env caches from its parameters (CartPole's ``total_mass`` and ``polemass_length``) are
parameters too, recomputed by the kernel's ``refresh`` wherever the Python engine's adapter recomputes
them, and nowhere else: as on gymnasium's env, ``set_attr("masspole", ...)`` leaves them as they were.
Resets run the kernel's Python ``reset``, from each env's own ``np_random`` seeded as
gymnasium seeds it, so the same seeds give the same initial states. A kernel whose episodes are short
(CartPole's last about 20 random steps: a reset per step in every worker) may also give ``draw`` and
``start``: the workers then draw each env's next option-less resets ahead, several at a time, and
autoreset in one compiled call (see ``BatchKernel``); the env's ``np_random`` is rewound to where
gymnasium's would be whenever Python code asks for it.

Built-in kernels (``shmpool.kernels.builtin``) reproduce gymnasium's ``CartPole-v1``,
``Pendulum-v1``, ``MountainCar-v0``, ``MountainCarContinuous-v0`` and ``Acrobot-v1`` bit for bit
(``gymnasium.make`` of them, ``TimeLimit`` included). Register one of your own with ``register``::

    import math

    import numba
    import numpy as np
    from gymnasium import spaces

    import shmpool
    from shmpool.kernels import BatchKernel


    @numba.njit(cache=True)
    def drift_step(state, params, actions, stepping, observations, rewards, terminations):
        for i in range(state.shape[0]):
            if stepping[i]:  # rows that reset this step are not stepped
                state[i, 0] += params[i, 0] * (actions[i] - 0.5)  # params[:, 0] is "speed"
                observations[i, 0] = state[i, 0]
                rewards[i] = -abs(state[i, 0])
                terminations[i] = abs(state[i, 0]) > 1.0


    def drift_reset(rng, params, options, state, observation):
        state[0] = rng.uniform(-0.5, 0.5)
        observation[0] = state[0]


    DRIFT = BatchKernel(
        observation_space=spaces.Box(-math.inf, math.inf, (1,), np.float32),
        action_space=spaces.Discrete(2),
        state_size=1,
        params={"speed": 0.1},
        step=drift_step,
        reset=drift_reset,
        max_episode_steps=100,
        velocities=(),
    )
    shmpool.kernels.register("Drift-v0", DRIFT)
    pool = shmpool.launch("Drift-v0", 64, engine="numba", params={"speed": shmpool.Param(low=0, high=1)})

Control calls (``get_attr``, ``set_attr``, ``call``, ``env_apply``) see each env as a
``KernelEnv``, which does with an attribute what gymnasium's env does, or refuses it: its
parameters are read and written in the parameter matrix, ``state`` is the env's state in gymnasium's
shape, ``_max_episode_steps`` and ``_elapsed_steps`` are ``TimeLimit``'s (a new limit holds from the
next step), and writing an attribute of the gymnasium env that the kernel does not model
(``BatchKernel.unsupported``: CartPole's ``kinematics_integrator``, rendering attributes, ...) raises
``KernelAttributeError`` naming the alternatives, instead of being ignored. Other names are
plain attributes, as on a gymnasium env.

Where each part lives: ``BatchKernel`` in ``shmpool.kernels.batch_kernel``, ``KernelEnv``
in ``shmpool.kernels.env``, the built-in kernels in ``shmpool.kernels.builtin`` (one module
each), the workers' compiled bookkeeping around a kernel's ``step`` in ``shmpool.kernels.slot``.
This module holds the registry (``register``, ``find``, ``load``, ``check_options``)
and gives the others their ``shmpool.kernels`` names (``shmpool.kernels.BatchKernel``, ``KernelEnv``,
``NO_LIMIT``).

This package imports neither numba nor any kernel: the registry holds import strings (or your
objects) and ``load`` imports a kernel only when a pool uses it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from .batch_kernel import MODELED, BatchKernel, Draw, Kick, Refresh, Reset, SetState, Step
from .env import ADAPTERS, NO_LIMIT, KernelAdapter, KernelEnv

#: The extra that installs numba.
NUMBA_EXTRA = 'pip install "shmpool[numba]"'

#: The built-in kernels, by gymnasium id: import strings, imported on first use.
BUILTIN: dict[str, str] = {
    "CartPole-v1": "shmpool.kernels.builtin.cartpole:CARTPOLE",
    "Pendulum-v1": "shmpool.kernels.builtin.pendulum:PENDULUM",
    "MountainCar-v0": "shmpool.kernels.builtin.mountain_car:MOUNTAIN_CAR",
    "MountainCarContinuous-v0": "shmpool.kernels.builtin.mountain_car:MOUNTAIN_CAR_CONTINUOUS",
    "Acrobot-v1": "shmpool.kernels.builtin.acrobot:ACROBOT",
}
_registered: dict[str, BatchKernel | str] = {}


def register(env_id: str, kernel: BatchKernel | str) -> None:
    """Makes ``launch(env_id, ..., engine="numba")`` run ``kernel``.

    ``kernel`` is a ``BatchKernel``, or the import string ``"module:NAME"`` of one, which the
    workers import themselves (the form that works with every start method; an object is inherited by
    forked workers and pickled for the others). Registration is per process: register in the process
    that launches the pool. A built-in id registered again runs your kernel instead.
    """
    if not isinstance(env_id, str) or not env_id:
        raise TypeError(f"register: env_id must be a non-empty str, got {env_id!r}")
    if isinstance(kernel, str):
        if ":" not in kernel:
            raise ValueError(f"register: a kernel import string is 'module:NAME', got {kernel!r}")
    elif not isinstance(kernel, BatchKernel):
        raise TypeError(f"register: kernel must be a BatchKernel or a 'module:NAME' string, got {kernel!r:.80}")
    _registered[env_id] = kernel


def compiled_ids() -> list[str]:
    """The env ids that ``engine="numba"`` runs: the built-in ones and those registered here."""
    return sorted({*BUILTIN, *_registered})


def find(env_id: Any) -> BatchKernel | str:
    """The registered kernel (or its import string) of ``env_id``; ``ValueError`` listing the compiled ids."""
    if not isinstance(env_id, str) or env_id not in _registered and env_id not in BUILTIN:
        what = repr(env_id) if isinstance(env_id, str) else f"a {type(env_id).__name__} (not a registered id)"
        raise ValueError(
            f"engine='numba' has no compiled kernel for {what}; compiled ids: {', '.join(compiled_ids())} "
            f"(register your own with shmpool.kernels.register, or use engine='python')"
        )
    return _registered.get(env_id) or BUILTIN[env_id]


def require_numba() -> None:
    """Raises ``ImportError`` naming the extra when numba is not installed."""
    try:
        import numba  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"engine='numba' needs numba, which is not installed: {NUMBA_EXTRA}") from exc


def load(kernel: BatchKernel | str) -> BatchKernel:
    """The kernel itself: ``kernel``, or the object its import string names (imported now)."""
    if isinstance(kernel, BatchKernel):
        return kernel
    require_numba()
    module_name, _, attribute = kernel.partition(":")
    found = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(found, BatchKernel):
        raise TypeError(f"{kernel!r} is not a shmpool.kernels.BatchKernel (got {type(found).__name__})")
    return found


def check_options(kernel: BatchKernel, env_id: str, specs: Sequence[Any], env_kwargs: Mapping[str, Any]) -> None:
    """Checks at launch that the declared parameters and ``env_kwargs`` are ones the kernel reads.

    A parameter must bind (by its name or a ``bind`` path) to one of the kernel's parameters, as a
    scalar; or be ``bind=False`` (values only hooks read). ``env_kwargs`` may hold
    ``max_episode_steps`` and the kernel's constructor parameters.
    """
    known = ", ".join(kernel.params)
    for spec in specs:
        if spec.bind is False:
            continue
        target = spec.name if spec.bind is None else spec.bind
        if not isinstance(target, str) or target not in kernel.params:
            shown = f"binds {target!r}" if isinstance(target, str) else "binds through a function or object"
            raise ValueError(
                f"engine='numba': params[{spec.name!r}] {shown}, which the {env_id} kernel does not read; its "
                f"parameters are {known} (bind=False declares a value only hooks read)"
            )
        if spec.shape:
            raise ValueError(f"engine='numba': params[{spec.name!r}] must be a scalar, got shape {spec.shape}")
        if spec.when == "rebuild" and target not in kernel.constructor:
            raise ValueError(
                f"engine='numba': params[{spec.name!r}] is when='rebuild', but {target!r} is not a constructor "
                f"keyword of {env_id} ({', '.join(kernel.constructor) or 'none'})"
            )
    allowed = {"max_episode_steps", "render_mode", *kernel.constructor}
    for key, value in env_kwargs.items():
        if key not in allowed:
            raise ValueError(
                f"engine='numba': env_kwargs[{key!r}] is not something the {env_id} kernel takes; it takes "
                f"{', '.join(sorted(allowed))}"
            )
        if key == "render_mode" and value is not None:
            raise ValueError("engine='numba': compiled envs do not render; render_mode must be None")


class KernelFactory:
    """Makes the standalone ``KernelEnv`` of a registered kernel (the trainer's probe at launch);
    picklable, as env factories are."""

    def __init__(self, kernel: BatchKernel | str) -> None:
        self.kernel = kernel

    def __call__(self, **kwargs: Any) -> KernelEnv:
        return KernelEnv(load(self.kernel), **kwargs)


__all__ = [
    "ADAPTERS",
    "BUILTIN",
    "MODELED",
    "NO_LIMIT",
    "NUMBA_EXTRA",
    "BatchKernel",
    "Draw",
    "Kick",
    "KernelAdapter",
    "KernelEnv",
    "KernelFactory",
    "Refresh",
    "Reset",
    "SetState",
    "Step",
    "check_options",
    "compiled_ids",
    "find",
    "load",
    "register",
    "require_numba",
]
