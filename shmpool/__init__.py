"""shmpool: multi-process gymnasium env pools whose parameters any process can change while they run.

``import shmpool`` is cheap: it starts nothing, prints nothing and imports nothing heavy; each public
name (the pool machinery with numpy, gymnasium and multiprocess, the errors) is imported on first use.

Examples:
    >>> import shmpool
    >>> with shmpool.launch("CartPole-v1", num_envs=8, num_workers=2, seed=0) as pool:
    ...     observations, infos = pool.reset()
    ...     observations, rewards, terminations, truncations, infos = pool.step(pool.action_space.sample())
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    )
    from .evaluation import Evaluation, evaluate
    from .handle import PoolHandle, attach
    from .param_block import ParamBlock
    from .params import Param
    from .pool import Pool, launch

__version__ = "0.1.0"

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
    "evaluate",
    "Evaluation",
    "launch",
]

#: Each public name with the module that defines it, imported on first use: the errors derive from
#: gymnasium's, and gymnasium alone takes a third of a second to import.
_LAZY = {
    **dict.fromkeys([name for name in __all__ if name.endswith(("Error", "Interrupt", "Traceback"))], "errors"),
    **dict.fromkeys(["launch", "Pool"], "pool"),
    **dict.fromkeys(["attach", "PoolHandle"], "handle"),
    **dict.fromkeys(["evaluate", "Evaluation"], "evaluation"),
    "Param": "params",
    "ParamBlock": "param_block",
}


_SUBMODULES = {"hooks", "curricula", "params", "episodes", "events", "mujoco", "env_families", "classic_control"}


def __getattr__(name: str) -> Any:
    from importlib import import_module

    if name in _LAZY:
        import_module(f".{_LAZY[name]}", __name__)
        bind_lazy_names(_LAZY[name])
        return globals()[name]
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def bind_lazy_names(module: str) -> None:
    """Makes the public names of submodule ``module`` (imported) plain attributes of the package.

    Then looking one up runs no Python code: ``except shmpool.StepSentInterrupt:`` must not be a
    place where a Ctrl-C can land (Python raises it only where Python code runs), or a step that
    went out would surface as a plain ``KeyboardInterrupt``. ``shmpool.errors`` binds its names as
    it is imported, so they are plain attributes before any pool exists.
    """
    imported = vars(__import__(f"{__name__}.{module}", fromlist=["_"]))
    globals().update({name: imported[name] for name, home in _LAZY.items() if home == module})


def __dir__() -> list[str]:
    """The public names too, which are imported on first use (so that tab completion offers them)."""
    return sorted({*globals(), *__all__, *_SUBMODULES})
