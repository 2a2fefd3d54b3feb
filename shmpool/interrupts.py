"""Ctrl-C held back for work that must not stop halfway: ``interrupts_deferred``; and ``CallLock``,
a pool's call lock, which refuses a call from inside another of the same thread (a signal handler's).

This is about signals, not shared memory. The pool, its async batches, its waits, the trainer's slot
and the compiled writes' load hold Ctrl-C back around work that could not be run again. The
writers' lock needs no such hold: no signal's handler can leave it held (``shmpool.protocol.lock``).
"""

from __future__ import annotations

import threading
from _signal import SIGINT, getsignal  # the C module's: signal's wrap them in enums at microseconds a call
from _signal import signal as set_handler
from collections.abc import Callable
from threading import get_ident, main_thread
from typing import Any


class interrupts_deferred:  # noqa: N801 - used as a function: ``with interrupts_deferred():``
    """Holds back Ctrl-C (in the main thread) for the block, and raises it after: for work that must
    not stop halfway, such as releasing a pool.

    SIGINT's Python handler is swapped for one that only notes the signal, and run at the end if it
    came. Blocking the signal would not do: another thread can take it, and the main thread still
    runs the handler at its next bytecode. One plain class with the handler's state in its slots:
    the trainer's own slot enters it on every step, right after the policy's forward has left little
    of this code in the caches."""

    __slots__ = ("_previous", "_received")

    def __init__(self) -> None:
        self._previous: Any = None
        self._received = False

    def __enter__(self) -> None:
        self._received = False
        if get_ident() != main_thread().ident:  # a KeyboardInterrupt is raised in the main thread only
            return
        previous = getsignal(SIGINT)
        if callable(previous):  # not SIG_IGN or SIG_DFL (the kernel ends the process: nothing leaks)
            self._previous = previous
            try:
                set_handler(SIGINT, self._note)
            except BaseException:  # another signal's handler raised here: no hold, and no Ctrl-C lost
                self.__exit__()
                raise

    def _note(self, signum: int, frame: Any) -> None:
        self._received = True

    def __exit__(self, *exc_info: object) -> None:
        previous, self._previous = self._previous, None
        if previous is not None:
            set_handler(SIGINT, previous)
            if self._received:
                previous(SIGINT, None)

    #: For a hold that outlives a ``with`` block (a lock's release included): ``hold()`` ... ``release()``.
    #: ``release`` is idempotent and raises the held-back ``KeyboardInterrupt``, if any.
    hold = __enter__

    release = __exit__  # ends the hold; raises ``KeyboardInterrupt`` if Ctrl-C came during it

    @property
    def pending(self) -> bool:
        """Whether a Ctrl-C has come during the hold so far (it is raised at ``release``)."""
        return self._previous is not None and self._received


class CallLock:
    """The lock a pool's calls take one at a time (``with lock.checked():``), which refuses a call made from inside
    another call of the same thread (by a signal handler, or by a function the pool runs in this process, such as
    ``env_apply``'s in the trainer's slot) instead of letting it wait for itself forever.

    The lock is taken and given back by ``with`` in C: a Python ``__enter__`` or ``__exit__`` would run the signal
    handlers due between the lock's change and its own return, and one that raised there would leave the lock held for
    good. So the check comes first, in Python, and is exact: an ``RLock`` knows the thread that holds it."""

    __slots__ = ("_lock", "_what")

    def __init__(self, what: str) -> None:
        self._lock = threading.RLock()
        self._what = what

    def checked(self) -> Any:
        """The lock, to take with ``with``; ``RuntimeError`` if this thread's call holds it."""
        if self._lock._is_owned():  # type: ignore[attr-defined] # the C RLock's, which Condition uses too
            raise RuntimeError(
                f"{self._what} is in the middle of a call in this thread: a signal handler, or a "
                f"function that the pool runs (env_apply's, call's), cannot use it until that call returns"
            )
        return self._lock

    def held_here(self) -> bool:
        """Whether a call of this thread holds it (so that waiting for it would wait forever)."""
        return bool(self._lock._is_owned())  # type: ignore[attr-defined]

    def acquire(self, timeout: float) -> bool:
        """Takes it as a call would (not from inside one of this thread's); False after ``timeout`` s."""
        return bool(self._lock.acquire(timeout=timeout))

    def release(self) -> None:
        """Lets go of what ``acquire`` took."""
        self._lock.release()

    def once_free(self, function: Callable[[], None], *, daemon: bool = False) -> threading.Event:
        """Runs ``function`` holding the lock, in a thread of its own, once the call that holds it lets
        go; returns the event set once it ran. Not a daemon thread unless asked: an exit right after
        the call (a preemption handler's ``close(); sys.exit()``) waits for it instead of cutting it short."""
        done = threading.Event()

        def run() -> None:
            try:
                with self.checked():
                    function()
            finally:
                done.set()

        threading.Thread(target=run, name=f"{self._what}: once free", daemon=daemon).start()
        return done
