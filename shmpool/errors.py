"""Exceptions raised by shmpool.

Every error derives from ``ShmpoolError``; the specific ones also derive from the builtin they
resemble, so ``except TimeoutError`` or ``except ValueError`` code keeps working. Each survives
pickling across processes with its attributes and notes intact (``ShmpoolError.__reduce__``).
"""

from __future__ import annotations

import queue
import sys
from typing import TYPE_CHECKING, Any

from gymnasium.error import ClosedEnvironmentError
from gymnasium.error import Error as GymnasiumError

if TYPE_CHECKING:
    import numpy as np


class StepSentInterrupt(KeyboardInterrupt):
    """The ``KeyboardInterrupt`` that ``Pool.send`` raises when Ctrl-C came after its step went out:
    those envs are stepping, and a later ``recv()`` returns them. A plain ``KeyboardInterrupt`` from
    ``send`` means that nothing was sent. Raised as a class (see ``Pool.send``): its text is here."""

    def __str__(self) -> str:
        return "Ctrl-C came after send() had sent the step: its envs are stepping, and recv() returns them"


class ShmpoolError(Exception):
    """Base class of every error shmpool raises."""

    #: The keyword arguments of ``__init__``, kept as attributes of the same names (for pickling).
    _keywords: tuple[str, ...] = ()

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild, (type(self), self.args, {k: getattr(self, k) for k in self._keywords}), self.__dict__)


def _rebuild(cls: type[ShmpoolError], args: tuple[Any, ...], keywords: dict[str, Any]) -> ShmpoolError:
    return cls(*args, **keywords)


class RemoteTraceback(Exception):
    """The traceback text of an exception raised in a worker process; set as ``__cause__``."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


class WorkerError(ShmpoolError, RuntimeError):
    """An env or worker-side code raised; the worker's traceback text is the ``__cause__``."""

    _keywords = ("worker_id", "env_id", "traceback_text")

    def __init__(self, message: str, *, worker_id: int, env_id: int | None, traceback_text: str = "") -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.env_id = env_id
        self.traceback_text = traceback_text
        if traceback_text:
            self.__cause__ = RemoteTraceback(traceback_text)


class WorkerDiedError(ShmpoolError, RuntimeError):
    """A worker process exited or was killed while the pool needed it."""

    _keywords = ("worker_id", "exitcode")

    def __init__(self, message: str, *, worker_id: int, exitcode: int | None) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.exitcode = exitcode


class PoolClosedError(ShmpoolError, ClosedEnvironmentError, RuntimeError):
    """A pool (or a handle on one) was used after it was closed (a gymnasium ``ClosedEnvironmentError``,
    itself an ``Exception``, as gymnasium's vector envs raise)."""


class SeedError(ShmpoolError, GymnasiumError, ValueError):
    """A reset seed gymnasium would refuse (not an int, negative), or one too large for the pool (2**256 or more)."""


class PoolTimeoutError(ShmpoolError, TimeoutError):
    """A wait on workers passed its deadline; the message names the workers that did not answer."""


class PoolBrokenError(ShmpoolError, RuntimeError):
    """The pool failed earlier (see ``__cause__``) and can only be closed."""


class LayoutMismatchError(ShmpoolError, ValueError):
    """A shared-memory object is not a shmpool segment of this layout version, or is damaged."""


class SegmentNotReadyError(LayoutMismatchError):
    """A segment with no header yet (empty, or its magic still zero): a pool being created, which
    ``attach(wait=...)`` waits for."""


class PoolNotFoundError(ShmpoolError, FileNotFoundError):
    """No live pool has the given name."""


class PoolExistsError(ShmpoolError, FileExistsError):
    """A live pool already uses the given name."""


class EventQueueFullError(ShmpoolError, queue.Full):
    """A worker's event ring had no room for an event within the sender's timeout."""


class WriterLockTimeoutError(ShmpoolError, TimeoutError):
    """Another writer held the pool's writer lock past the deadline (often a stopped process)."""

    _keywords = ("holder_pid",)

    def __init__(self, message: str, *, holder_pid: int | None = None) -> None:
        super().__init__(message)
        self.holder_pid = holder_pid


class WriterLockReentryError(ShmpoolError, RuntimeError):
    """A write began on a thread that already holds the pool's writer lock: a signal handler (or a
    finalizer) wrote while its thread was inside a write. Waiting would wait on itself."""


class KernelAttributeError(ShmpoolError, AttributeError):
    """An attribute of the gymnasium env that a compiled kernel does not model was set (or read) on a
    ``KernelEnv`` (``engine="numba"``): the kernel would ignore it, so the write is refused instead."""


class ForeignProcessError(ShmpoolError, RuntimeError):
    """A pool was used from a process that did not create it (a forked child); attach by name instead."""


class ClusterNodeError(ShmpoolError, RuntimeError):
    """A node of a Ray cluster pool (``shmpool.ray``) failed: its host actor died (``ray.kill``, a
    crash, its node went away) or stopped answering. The message names the node. From then on every
    call that needs that node raises this error: ``step``, ``reset``, ``episodes.read()``,
    ``applied``, ``stats``, reads of ``params`` and writes to its envs; writes to the other nodes'
    envs still land, and their pools stay usable (``shmpool.attach`` on their node) until ``close()``."""

    #: From ``episodes.read()`` when a node failed during the read: what the other nodes handed over.
    records: np.ndarray | None = None
    _keywords = ("node", "node_id")

    def __init__(self, message: str, *, node: int, node_id: str = "") -> None:
        super().__init__(message)
        self.node = node
        self.node_id = node_id


# The package's lazy names of this module become plain attributes now (see ``bind_lazy_names``);
# through sys.modules, as the package is always imported before its modules and nothing here may
# import the package (the layers of pyproject.toml).
sys.modules[__package__].bind_lazy_names("errors")
