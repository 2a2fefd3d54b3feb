"""The writers' lock of a pool's shared records: ``WriterLock``.

It excludes writers across processes *and* threads *and* forked children: a thread lock inside each
process, then a ``flock`` on a file description that each process (re)opens for itself (a forked
child gets its own, instead of sharing its parent's). The kernel drops a ``flock`` when its holder
dies; a stopped holder (Ctrl-Z) makes waiters time out with an error naming it, never hang. The
channels it guards (``.seqlock``, ``.rings``) register their rollback with
``WriterLock.on_acquire``, so that the next holder undoes a half write before anything else.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import PoolClosedError, WriterLockTimeoutError
from ..interrupts import DeferredInterrupt
from ..system import process_state
from .words import W_HOLDER


class WriterLock:
    """Excludes the writers of one pool's shared records: threads, processes and forked children.

    Acquire with ``hold``. Channels register a ``recover`` callable with ``on_acquire``; it
    runs inside every acquisition and must be a no-op (one word compare) unless an earlier holder
    left a journal behind.
    """

    def __init__(self, path: str, words: np.ndarray, identity: tuple[int, int] | None = None) -> None:
        self._path = path
        self._identity = identity  # (st_dev, st_ino) of the segment this lock guards, when known
        self._words = words
        self._recoveries: list[Callable[[], None]] = []
        self._pid = -1
        self._thread_lock = threading.Lock()
        self._fd = _Descriptor()
        self._closed = False
        _LOCKS.add(self)

    def on_acquire(self, recover: Callable[[], None]) -> None:
        """Runs ``recover`` (roll back what a dead or interrupted holder left half done) on every
        acquisition and after a critical section that raised."""
        self._recoveries.append(recover)

    def _own_fd(self, pid: int) -> int:
        """This process's (``pid``'s) file description of the lock file, opened on first use in each
        process."""
        if self._pid != pid:
            with _OPENING:  # two threads' first uses must not both open (one would never unlock)
                if self._pid != pid:
                    try:
                        fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
                    except FileNotFoundError as exc:
                        raise PoolClosedError(f"the pool's segment {self._path} is gone: the pool was closed") from exc
                    info = os.fstat(fd)
                    if self._identity is not None and (info.st_dev, info.st_ino) != self._identity:
                        os.close(fd)  # a new pool took the name: locking its file would not exclude ours
                        raise PoolClosedError(
                            f"the pool's segment {self._path} was replaced by another pool of the same name: "
                            f"this one was closed"
                        )
                    self._fd.value = fd
                    self._pid = pid
        return self._fd.value

    def _forget_after_fork(self) -> None:
        """In a forked child: drops the inherited description. Sharing it with the parent would share
        the parent's lock instead of being excluded by it, and would keep the lock held after the
        parent dies holding it (the kernel releases a ``flock`` when its last descriptor closes)."""
        self._fd.close()
        self._pid = -1
        self._thread_lock = threading.Lock()  # the fork copied it, maybe held by a thread not copied

    def hold(self, timeout: float | None, check_open: Callable[[], None]) -> _Held:
        """A context manager holding the lock; waits up to ``timeout`` seconds (None: as long as the
        pool is open), then raises ``WriterLockTimeoutError`` naming the holder."""
        return _Held(self, timeout, check_open)

    def _acquire(self, timeout: float | None, check_open: Callable[[], None]) -> None:
        if self._closed:
            raise PoolClosedError(f"the writer lock of {self._path} is closed")
        pid = os.getpid()
        fd = self._own_fd(pid)
        deadline = None if timeout is None else time.monotonic() + timeout
        thread_lock = self._thread_lock
        if not thread_lock.acquire(False):  # a free lock (the common case) without the timed wait's cost
            while not thread_lock.acquire(timeout=0.05):
                self._check_deadline(deadline, check_open)
        try:
            delay = 0.0001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    self._check_deadline(deadline, check_open)
                    time.sleep(delay)
                    delay = min(delay * 2, 0.005)
            try:
                for recover in self._recoveries:
                    recover()
                self._words[W_HOLDER] = pid
            except BaseException:
                fcntl.flock(fd, fcntl.LOCK_UN)
                raise
        except BaseException:
            thread_lock.release()
            raise

    def _release(self, failed: bool) -> None:
        try:
            if failed:  # interrupted mid-write (Ctrl-C, an error): never leave a half write behind
                self._recover()
            self._words[W_HOLDER] = 0
        finally:
            fcntl.flock(self._fd.value, fcntl.LOCK_UN)
            self._thread_lock.release()

    def _recover(self) -> None:
        for recover in self._recoveries:
            recover()

    def _check_deadline(self, deadline: float | None, check_open: Callable[[], None]) -> None:
        check_open()
        if deadline is not None and time.monotonic() >= deadline:
            holder = int(self._words[W_HOLDER])
            state = process_state(holder) if holder else "?"
            what = f"pid {holder}" + (" (stopped: Ctrl-Z or SIGSTOP)" if state in ("T", "t") else "")
            raise WriterLockTimeoutError(
                f"another writer ({what if holder else 'unknown'}) has held the writer lock of "
                f"{self._path} for too long; resume or stop that process, or retry",
                holder_pid=holder or None,
            )

    def close(self) -> None:
        """Refuses later acquisitions; the file description closes when the lock is collected (a
        thread still inside a critical section keeps it until then)."""
        self._closed = True


class _Descriptor:
    """A file descriptor closed exactly once: at collection, or when a forked child drops it."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = -1

    # ``os.close`` bound now: a pool collected while the interpreter exits runs this after the
    # module's globals are gone.
    def close(self, _close: Callable[[int], None] = os.close) -> None:
        if self.value >= 0:
            fd, self.value = self.value, -1
            _close(fd)

    def __del__(self) -> None:
        self.close()


#: Every writer lock of this process, so that a forked child can drop their inherited descriptors.
_LOCKS: weakref.WeakSet[WriterLock] = weakref.WeakSet()
_OPENING = threading.Lock()


def _after_fork_in_child() -> None:
    global _OPENING
    _OPENING = threading.Lock()
    for lock in list(_LOCKS):
        lock._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Held:
    """The context manager of ``WriterLock.hold``.

    Ctrl-C is held back from acquisition to release: a ``KeyboardInterrupt`` raised between a lock
    call returning and the bookkeeping after it would leave the thread lock or the ``flock`` held
    for good. It is raised once the lock is free again (the write itself completes or rolls back),
    or, while still waiting for the lock, at the next check of the wait (nothing is held then).
    """

    __slots__ = ("_lock", "_timeout", "_check_open", "_deferral")

    def __init__(self, lock: WriterLock, timeout: float | None, check_open: Callable[[], None]) -> None:
        self._lock, self._timeout, self._check_open = lock, timeout, check_open
        self._deferral: DeferredInterrupt | None = None

    def __enter__(self) -> None:
        self._deferral = DeferredInterrupt.begin()
        try:
            self._lock._acquire(self._timeout, self._check_while_waiting)
        except BaseException:
            self._end_deferral()
            raise

    def _check_while_waiting(self) -> None:
        deferral = self._deferral
        if deferral is not None and deferral.received:
            deferral.received = False  # raised here, so not again when the deferral ends
            raise KeyboardInterrupt
        self._check_open()

    def __exit__(self, exc_type: Any, *exc_info: Any) -> None:
        try:
            self._lock._release(exc_type is not None)
        finally:
            self._end_deferral()

    def _end_deferral(self) -> None:
        deferral, self._deferral = self._deferral, None
        if deferral is not None:
            deferral.end()
