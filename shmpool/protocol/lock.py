"""The writers' lock of a pool's shared records: ``WriterLock``, and ``init_writer_mutex``.

Why and how: ``docs/internals.md``, "shmpool/protocol/lock.py".
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..errors import PoolClosedError, ShmpoolError, WriterLockReentryError, WriterLockTimeoutError
from ..system import process_state, this_pid
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
#: The owner's thread id in a held robust mutex's lock word (the kernel's robust-futex protocol).
_TID_MASK = 0x3FFFFFFF
_T = TypeVar("_T")


def mutex_address(words: np.ndarray) -> int:
    """The address of the writers' mutex inside ``words`` (a segment's ``writers`` field)."""
    if words.dtype != np.int64 or words.shape[0] * 8 < W_MUTEX * 8 + MUTEX_BYTES or not words.flags.c_contiguous:
        raise ShmpoolError(f"the writers' words {words.dtype}{words.shape} have no room for the writers' mutex")
    return int(words.ctypes.data) + W_MUTEX * 8


def init_writer_mutex(words: np.ndarray) -> None:
    """Makes the writers' mutex in ``words``: once, by the segment's creator, before anyone attaches."""
    _init_mutex(mutex_address(words))


def _init_mutex(address: int) -> None:
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

    A critical section runs as ``run(timeout, check_open, body, *args)``. Channels register a
    ``recover`` callable with ``on_acquire``; it runs inside every acquisition, and on the way out of
    a body that raised, and must be a no-op (one word compare) unless a holder left a journal behind.
    ``label`` names the lock in errors (the segment's file).
    """

    def __init__(self, words: np.ndarray, label: str) -> None:
        self._label = label
        self._words = words
        self.address = mutex_address(words)
        #: The mutex's lock word, read without a call (see ``run``): its owner's thread id while held.
        self._owner = ctypes.c_int32.from_address(self.address + 4 * _OWNER_WORD)
        self._recoveries: list[Callable[[], None]] = []
        self._closed = False

    def on_acquire(self, recover: Callable[[], None]) -> None:
        """Runs ``recover`` (roll back what a dead or interrupted holder left half done) on every
        acquisition and after a critical section that raised."""
        self._recoveries.append(recover)

    def run(self, timeout: float | None, check_open: Callable[[], None], body: Callable[..., _T], *args: Any) -> _T:
        """Runs ``body(*args)`` holding the lock and returns what it returns; waits up to ``timeout``
        seconds for the lock (None: as long as the pool is open), then raises
        ``WriterLockTimeoutError`` naming the holder. A body that raises is rolled back.

        Raises ``WriterLockReentryError`` at once if this thread holds the lock already (a signal
        handler that writes, run while its thread was inside a write).
        """
        # Why no signal can leave the lock held: Python runs a signal's handler, which may raise,
        # only at a call, a function's entry or a backward jump, never inside a C call. So the
        # ``try`` begins before the mutex can be taken, and the ``finally`` tells whether this call
        # took it by reading the lock word (no call), then drops it with C calls first and last.
        # The thread-id check comes first: after it, a lock word naming this thread means this call.
        owner, tid = self._owner, threading.get_native_id()
        if owner.value & _TID_MASK == tid:
            raise WriterLockReentryError(
                f"a signal handler wrote while this thread held the writer lock of {self._label}: "
                "write from the handler's caller instead, or defer the write until the handler returns"
            )
        failed = True
        try:
            self._acquire(timeout, check_open)
            result = body(*args)
            failed = False
            return result
        finally:
            if owner.value & _TID_MASK == tid:
                try:
                    MUTEX_CONSISTENT(self.address)  # first: a dead holder's mark left on it (EINVAL if none)
                    if failed:  # interrupted mid-write (a signal, an error): no half write stays behind
                        self._recover()
                finally:
                    self._words[W_HOLDER] = 0
                    MUTEX_UNLOCK(self.address)

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
        if code == EOWNERDEAD:  # first: the mutex stays usable even if a recovery raises
            MUTEX_CONSISTENT(address)
        self._recover()
        self._words[W_HOLDER] = this_pid()

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


#: The scratch mutex of ``_find_owner_word``, kept for the process's life: a robust mutex is linked
#: into its holder thread's robust list while held, so its memory must outlive any hold.
_SCRATCH = (ctypes.c_int32 * (MUTEX_BYTES // 4))()


def _find_owner_word() -> int:
    """The index of the int32 word of a robust mutex that holds its owner's thread id (its lock word:
    0 in glibc, 1 in musl): the word that a free scratch mutex's taking sets to this thread's id."""
    address = ctypes.addressof(_SCRATCH)
    _init_mutex(address)
    free = list(_SCRATCH)
    try:  # before the take, as in WriterLock.run; the unlock is EPERM where the take did not happen
        if MUTEX_TRYLOCK(address):
            raise ShmpoolError("a fresh robust mutex could not be taken, which the writers' lock needs")
        held, tid = list(_SCRATCH), threading.get_native_id()
    finally:
        MUTEX_UNLOCK(address)
    for index, (before, word) in enumerate(zip(free, held)):
        if before != word and word & _TID_MASK == tid:
            return index
    raise ShmpoolError("this C library keeps no thread id in a held robust mutex, which the writers' lock needs")


_OWNER_WORD = _find_owner_word()
