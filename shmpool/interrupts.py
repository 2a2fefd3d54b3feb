"""Ctrl-C held back for work that must not stop halfway: ``interrupts_deferred``.

This is about signals, not shared memory. The pool, its async batches, its waits, the trainer's slot
and the compiled writes' load hold Ctrl-C back around work that could not be run again. The
writers' lock needs no such hold: no signal's handler can leave it held (``shmpool.protocol.lock``).
"""

from __future__ import annotations

import _signal  # the C module: signal.getsignal/signal wrap it in enums at several microseconds a call
import signal
import threading
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

    def release(self) -> None:
        """Ends the hold; raises ``KeyboardInterrupt`` if Ctrl-C came during it."""
        self.__exit__()

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
