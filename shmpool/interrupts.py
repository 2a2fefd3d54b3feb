"""Ctrl-C held back for work that must not stop halfway: ``interrupts_deferred``; and ``CallLock``,
a pool's call lock, which refuses a call from inside another of the same thread (a signal handler's).

This is about signals, not shared memory. The pool, its async batches, its waits, the trainer's slot
and the compiled writes' load hold Ctrl-C back around work that could not be run again. The
writers' lock needs no such hold: no signal's handler can leave it held (``shmpool.protocol.lock``).
"""

from __future__ import annotations

import _signal  # the C module: signal.getsignal/signal wrap it in enums at several microseconds a call
import signal
import threading
from collections.abc import Callable
from typing import Any


class interrupts_deferred:  # noqa: N801 - used as a function: ``with interrupts_deferred():``
    """Holds back Ctrl-C (in the main thread) for the block, and raises it after: for work that must
    not stop halfway, such as releasing a pool. A class rather than a generator-based context
    manager: async ``send``/``recv`` enter it on every call, and this costs a third as much."""

    __slots__ = ("_deferral",)

    def __init__(self) -> None:
        self._deferral: DeferredInterrupt | None = None

    def __enter__(self) -> None:
        self._deferral = DeferredInterrupt.begin()

    def __exit__(self, *exc_info: object) -> None:
        deferral, self._deferral = self._deferral, None
        if deferral is not None:
            deferral.end()

    #: For a hold that outlives a ``with`` block (a lock's release included): ``hold()`` ... ``release()``.
    #: ``release`` is idempotent and raises the held-back ``KeyboardInterrupt``, if any.
    hold = __enter__

    release = __exit__  # ends the hold; raises ``KeyboardInterrupt`` if Ctrl-C came during it

    @property
    def pending(self) -> bool:
        """Whether a Ctrl-C has come during the hold so far (it is raised at ``release``)."""
        return self._deferral is not None and self._deferral.received


class DeferredInterrupt:
    """Holds back SIGINT's Python handler in the main thread (the only thread a ``KeyboardInterrupt``
    is raised in) and runs it at ``end``. Blocking the signal would not do: another thread can
    take it, and the main thread still runs the handler at its next bytecode."""

    __slots__ = ("_previous", "received")

    def __init__(self, previous: Any) -> None:
        self._previous = previous
        self.received = False

    @classmethod
    def begin(cls) -> DeferredInterrupt | None:
        """Starts holding back Ctrl-C, or returns None off the main thread or without a Python handler."""
        if threading.get_ident() != threading.main_thread().ident:
            return None
        previous = _signal.getsignal(signal.SIGINT)
        if not callable(previous):  # SIG_IGN, or SIG_DFL (the kernel ends the process: nothing leaks)
            return None
        deferral = cls(previous)
        _signal.signal(signal.SIGINT, deferral._note)
        return deferral

    def _note(self, signum: int, frame: Any) -> None:
        self.received = True

    def end(self) -> None:
        """Puts the handler back and runs it if Ctrl-C came meanwhile (raising ``KeyboardInterrupt``)."""
        _signal.signal(signal.SIGINT, self._previous)
        if self.received:
            self._previous(signal.SIGINT, None)


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

    def once_free(self, function: Callable[[], None]) -> threading.Event:
        """Runs ``function`` holding the lock, in a thread of its own, once this thread's call lets go;
        returns the event set once it ran. Not a daemon thread: an exit right after the call (a
        preemption handler's ``close(); sys.exit()``) waits for it instead of cutting it short."""
        done = threading.Event()

        def run() -> None:
            try:
                with self.checked():
                    function()
            finally:
                done.set()

        threading.Thread(target=run, name=f"{self._what}: once free").start()
        return done
