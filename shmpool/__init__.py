"""shmpool: multi-process gymnasium env pools whose parameters any process can change while they run.

``import shmpool`` is cheap: it starts nothing and prints nothing; the pool machinery (numpy,
gymnasium, multiprocess) is imported on first use of ``launch`` or ``Pool``.

Example:
    >>> import shmpool
    >>> with shmpool.launch("CartPole-v1", num_envs=8, num_workers=2, seed=0) as pool:
    ...     observations, infos = pool.reset()
    ...     observations, rewards, terminations, truncations, infos = pool.step(pool.action_space.sample())
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    EventQueueFullError,
    ForeignProcessError,
    KernelAttributeError,
    LayoutMismatchError,
    PoolBrokenError,
    PoolClosedError,
    PoolExistsError,
    PoolNotFoundError,
    PoolTimeoutError,
    RemoteTraceback,
    ShmpoolError,
    StepSentInterrupt,
    WorkerDiedError,
    WorkerError,
    WriterLockReentryError,
    WriterLockTimeoutError,
    deprecated_name,
)

if TYPE_CHECKING:
    from .handle import PoolHandle, attach
    from .param_block import ParamBlock
    from .params import Param
    from .pool import Pool, launch

__version__ = "0.1.0"

_LAZY = {
    "launch": "pool",
    "Pool": "pool",
    "Param": "params",
    "ParamBlock": "param_block",
    "attach": "handle",
    "PoolHandle": "handle",
}


_SUBMODULES = {
    "hooks",
    "curricula",
    "params",
    "episodes",
    "events",
    "mujoco",
    "env_families",
    "classic_control",
    "adapters",  # env_families' old name: deprecated (it warns on import) until the next release
}


def __getattr__(name: str) -> Any:
    from importlib import import_module

    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)
    return deprecated_name(__name__, name)


__all__ = [
    "EventQueueFullError",
    "ForeignProcessError",
    "KernelAttributeError",
    "LayoutMismatchError",
    "Param",
    "ParamBlock",
    "Pool",
    "PoolHandle",
    "PoolBrokenError",
    "PoolClosedError",
    "PoolExistsError",
    "PoolNotFoundError",
    "PoolTimeoutError",
    "RemoteTraceback",
    "ShmpoolError",
    "StepSentInterrupt",
    "WorkerDiedError",
    "WorkerError",
    "WriterLockReentryError",
    "WriterLockTimeoutError",
    "attach",
    "launch",
]
