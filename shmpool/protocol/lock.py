"""The writers' lock of a pool's shared records: ``WriterLock``, and ``init_writer_mutex``.

The lock is a process-shared *robust* POSIX mutex kept in the segment's ``writers`` words (from
``W_MUTEX`` on), made once by the pool's owner (``init_writer_mutex``). That one object gives what
the writers need:

* **Exclusion of processes, threads and forked children alike.** A mutex is owned by a thread, so
  two threads of one process exclude each other as two processes do, and a forked child is just
  another owner.
* **No system call in the common case.** Taking a free mutex and dropping one nobody waits on are
  atomic instructions in user space (no waiter ever sleeps in the kernel: takers poll with
  ``pthread_mutex_trylock``). So compiled code takes it too: ``shmpool.protocol.compiled`` holds it
  for a whole params write inside one compiled call.
* **A dead holder never blocks.** The kernel marks a robust mutex whose owner dies (its robust
  futex list); the next taker gets ``EOWNERDEAD``, rolls back the dead holder's journals (the
  ``on_acquire`` recoveries, which run at every acquisition anyway), and marks it consistent. Unlike
  a pid in a lock word, a reused pid cannot pass for the dead holder.
* **A stopped holder (Ctrl-Z) never hangs a waiter:** waits time out with an error naming it.

Before this, the lock was a thread lock plus a ``flock`` on the segment's file: correct too, but two
system calls per write (1.3 us), and Python had to hold Ctrl-C back around them (1.2 us), which made
them most of a params write's cost. ``W_HOLDER`` still names the holder's pid, for those errors.
Linux only (glibc's or musl's pthreads, through ``ctypes``), as the rest of shmpool.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import PoolClosedError, ShmpoolError, WriterLockTimeoutError
from ..interrupts import DeferredInterrupt
from ..system import process_state
from .words import MUTEX_BYTES, W_HOLDER, W_MUTEX

_LIBC = ctypes.CDLL(None, use_errno=True)  # the process's own C library: its pthreads
#: The mutex calls, taking its address as an integer (a pointer and a uint64 travel alike on 64-bit
#: Linux), as ``shmpool.protocol.compiled`` declares the same libc functions for compiled code.
_BY_ADDRESS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64)


def _by_address(name: str) -> Any:
    address = ctypes.cast(getattr(_LIBC, name), ctypes.c_void_p).value
    if address is None:
        raise ShmpoolError(f"this C library has no {name}, which the writers' lock needs")
    return _BY_ADDRESS(address)


MUTEX_TRYLOCK, MUTEX_UNLOCK, MUTEX_CONSISTENT = (
    _by_address(name) for name in ("pthread_mutex_trylock", "pthread_mutex_unlock", "pthread_mutex_consistent")
)
#: ``MUTEX_TRYLOCK``'s results besides 0 (taken): held by another thread; taken, but its owner died.
EBUSY, EOWNERDEAD = errno.EBUSY, errno.EOWNERDEAD
_PTHREAD_PROCESS_SHARED, _PTHREAD_MUTEX_ROBUST = 1, 1


def mutex_address(words: np.ndarray) -> int:
    """The address of the writers' mutex inside ``words`` (a segment's ``writers`` field)."""
    if words.dtype != np.int64 or words.shape[0] * 8 < W_MUTEX * 8 + MUTEX_BYTES or not words.flags.c_contiguous:
        raise ShmpoolError(f"the writers' words {words.dtype}{words.shape} have no room for the writers' mutex")
    return int(words.ctypes.data) + W_MUTEX * 8


def init_writer_mutex(words: np.ndarray) -> None:
    """Makes the writers' mutex in ``words``: once, by the segment's creator, before anyone attaches."""
    address = mutex_address(words)
    attributes = ctypes.create_string_buffer(64)  # pthread_mutexattr_t: 4 bytes on Linux; room to spare
    calls = (
        ("pthread_mutexattr_init", (attributes,)),
        ("pthread_mutexattr_setpshared", (attributes, _PTHREAD_PROCESS_SHARED)),
        ("pthread_mutexattr_setrobust", (attributes, _PTHREAD_MUTEX_ROBUST)),
        ("pthread_mutex_init", (ctypes.c_void_p(address), attributes)),
        ("pthread_mutexattr_destroy", (attributes,)),
    )
    for name, arguments in calls:
        code = getattr(_LIBC, name)(*arguments)
        if code:
            raise OSError(code, f"{name}: {os.strerror(code)}")


class WriterLock:
    """Excludes the writers of one pool's shared records: threads, processes and forked children.

    Acquire with ``hold``. Channels register a ``recover`` callable with ``on_acquire``; it
    runs inside every acquisition and must be a no-op (one word compare) unless an earlier holder
    left a journal behind. ``label`` names the lock in errors (the segment's file).
    """

    def __init__(self, words: np.ndarray, label: str) -> None:
        self._label = label
        self._words = words
        self.address = mutex_address(words)
        self._recoveries: list[Callable[[], None]] = []
        self._closed = False

    def on_acquire(self, recover: Callable[[], None]) -> None:
        """Runs ``recover`` (roll back what a dead or interrupted holder left half done) on every
        acquisition and after a critical section that raised."""
        self._recoveries.append(recover)

    def hold(self, timeout: float | None, check_open: Callable[[], None]) -> _Held:
        """A context manager holding the lock; waits up to ``timeout`` seconds (None: as long as the
        pool is open), then raises ``WriterLockTimeoutError`` naming the holder."""
        return _Held(self, timeout, check_open)

    def _acquire(self, timeout: float | None, check_open: Callable[[], None]) -> None:
        if self._closed:
            raise PoolClosedError(f"the writer lock of {self._label} is closed")
        address = self.address
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0001
        while True:
            code = MUTEX_TRYLOCK(address)
            if code == 0 or code == EOWNERDEAD:
                break
            if code != EBUSY:
                raise ShmpoolError(f"the writer lock of {self._label} is unusable: {os.strerror(code)}")
            self._check_deadline(deadline, check_open)
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        try:
            if code == EOWNERDEAD:  # first: the mutex stays usable even if a recovery raises
                MUTEX_CONSISTENT(address)
            self._recover()
            self._words[W_HOLDER] = os.getpid()
        except BaseException:
            MUTEX_UNLOCK(address)
            raise

    def _release(self, failed: bool) -> None:
        try:
            if failed:  # interrupted mid-write (Ctrl-C, an error): never leave a half write behind
                self._recover()
            self._words[W_HOLDER] = 0
        finally:
            MUTEX_UNLOCK(self.address)

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
                f"{self._label} for too long; resume or stop that process, or retry",
                holder_pid=holder or None,
            )

    def close(self) -> None:
        """Refuses later acquisitions (the compiled writes need no check of their own: their pool or
        handle refuses writes before its lock is closed)."""
        self._closed = True


class _Held:
    """The context manager of ``WriterLock.hold``.

    Ctrl-C is held back from acquisition to release: a ``KeyboardInterrupt`` raised between the
    mutex call returning and the bookkeeping after it would leave the mutex held for good by a live
    process. It is raised once the lock is free again (the write itself completes or rolls back),
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
