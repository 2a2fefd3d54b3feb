"""Compiled batch envs: ``launch(env_id, num_envs, engine="numba")`` steps each worker's whole slot in one
numba-jitted call instead of env by env in Python.

A ``BatchKernel`` describes one such env; the built-in ones reproduce gymnasium's classic-control envs bit for bit,
and ``register`` adds your own. This module is the registry (``register``, ``find``, ``load``, ``check_options``); it
imports neither numba nor any kernel, whose import strings it holds until a pool uses one. How to write a kernel:
``docs/guides/engines.md``; where each part lives: ``docs/internals.md``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from .batch_kernel import MODELED, BatchKernel, Draw, Kick, Refresh, Reset, SetState, Step
from .env import ADAPTERS, NO_LIMIT, KernelAdapter, KernelEnv, time_limit

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
            raise ValueError(
                f"engine='numba': the compiled {env_id} does not render: env_kwargs['render_mode'] must be None, "
                f"got {value!r}"
            )
        if key == "max_episode_steps" and value is not None:
            time_limit(value, f"engine='numba': {env_id}: env_kwargs")


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
