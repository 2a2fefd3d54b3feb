"""The common params writes as one compiled call each: ``CompiledWrites``, which ``ParamBlock``
loads once a process writes often (``COMPILED_AFTER``), and what keeps that load safe.

The compiled function itself is ``shmpool.protocol.compiled``. Loading it imports numba and loads
or compiles the function, a fraction of a second: a fork meanwhile waits for it (``docs/internals.md``,
"Why no signal leaves the writers' lock held"), and an exception that a signal's handler raises
during it is the caller's, not a numba failure.
"""

from __future__ import annotations

import importlib.util
import logging  # noqa: F401 - before our fork hook: see below
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .interrupts import interrupts_deferred
from .params import ParamSpec, in_float64_words, is_plain_float64
from .protocol import Seqlock, WriterLock
from .system import this_pid

#: Writes to every env or to one (those the compiled path takes) a block makes through the general
#: path before it loads the compiled one (numba's import and the functions' load from its cache cost
#: a fraction of a second, which a process that writes a handful of times should not pay; one that
#: writes every step pays it once).
COMPILED_AFTER = 16


#: Held while this process imports or compiles the compiled writes (numba's import and compiler
#: locks): a fork waits until it is free, for up to ``FORK_WAIT`` seconds. A child forked mid-import
#: would inherit those locks held by a thread it does not have, and hang at its own first compiled
#: write. Ctrl-C waits for the load too (a fraction of a second, once): an import cut short leaves
#: the import machinery's state half done, and a storm of them would leave it broken.
_COMPILING = threading.RLock()
FORK_WAIT = 30.0
_forking = threading.local()  # whether this thread's fork holds _COMPILING


def _fork_after_compiling() -> None:
    # A handler's exception here would be lost (CPython ignores a fork hook's) and the fork would go
    # on mid-load: the wait goes on instead, in slices, until its deadline.
    deadline = time.monotonic() + FORK_WAIT
    while not getattr(_forking, "holds", False) and time.monotonic() < deadline:
        try:
            _forking.holds = _COMPILING.acquire(timeout=0.05)
        except BaseException:  # noqa: BLE001, S110 - see above
            pass


def _compiling_in_parent() -> None:
    if getattr(_forking, "holds", False):
        _forking.holds = False
        _COMPILING.release()


def _compiling_in_child() -> None:
    global _COMPILING, _forking
    _COMPILING = threading.RLock()  # the parent's, held for the fork, by a thread the child may not have
    _forking = threading.local()


# Fork hooks run before a fork in the reverse order of their registration. logging's takes its lock,
# which the load may need (numba logs): logging is imported first, so that ours waits before it does.
os.register_at_fork(
    before=_fork_after_compiling, after_in_parent=_compiling_in_parent, after_in_child=_compiling_in_child
)


_FLOAT64 = np.dtype(np.float64)
_NUMPY_FLOAT, _NDARRAY = np.float64, np.ndarray  # module globals: one lookup each on the write path


class CompiledWrites:
    """The common writes as one compiled call each (``shmpool.protocol.compiled``): numbers, or
    float64 arrays of one value per env, for plain float64 parameters, to every env or to one.
    ``write`` returns the version, or a negative code when the general path must do the write (any
    other value or env ids, a value it must refuse, a busy lock, a journal to roll back)."""

    def __init__(self, specs: Mapping[str, ParamSpec], seqlock: Seqlock, lock: WriterLock, functions: Any) -> None:
        records = seqlock.block
        count = len(records)
        self._count = count
        self._functions = functions
        self._invalid = functions.INVALID
        #: The compiled writes by number of parameters, of numbers and of arrays (made on first use).
        self._numbers: dict[int, Callable[..., int]] = {}
        self._arrays: dict[int, Callable[..., int]] = {}
        # The arrays whose addresses ``plan`` holds: kept, so that their memory stays mapped.
        self._mapped = (seqlock.words, records, seqlock.undo, seqlock.seq)
        plan = np.zeros(functions.PLAN_WORDS, dtype=np.int64)
        plan[functions.P_MUTEX] = lock.address
        for word, array in zip((functions.P_WORDS, functions.P_BLOCK, functions.P_UNDO, functions.P_SEQ), self._mapped):
            plan[word] = array.ctypes.data
        plan[functions.P_ENVS], plan[functions.P_RECORD_WORDS] = count, records.dtype.itemsize // 8
        plain = [spec for spec in specs.values() if is_plain_float64(spec)]
        self._index = {spec.name: k for k, spec in enumerate(plain)}
        bounds = np.array(
            [
                [records.dtype.fields[spec.name][1] // 8 for spec in plain],  # type: ignore[index]
                [spec.bounds[0] for spec in plain],
                [spec.bounds[1] for spec in plain],
            ],
            dtype=np.float64,
        )
        self._plan_words, self._bounds = plan, bounds
        self._plans: dict[tuple[str, ...], tuple[int, ...] | None] = {}

    @staticmethod
    def possible(specs: Sequence[ParamSpec], records: np.ndarray) -> bool:
        """Whether ``records`` suit the compiled writes: all 8-byte words, a plain float64 parameter."""
        return (
            in_float64_words(records.dtype)
            and records.flags.c_contiguous
            and any(is_plain_float64(spec) for spec in specs)
            and importlib.util.find_spec("numba") is not None
        )

    @classmethod
    def load(cls, specs: Mapping[str, ParamSpec], seqlock: Seqlock, lock: WriterLock) -> CompiledWrites | None:
        """The compiled writes (importing numba, loading or compiling the functions), or None, with a
        warning when numba is installed but fails: writes then keep the general path."""
        handlers = _handler_codes()
        try:
            with _COMPILING, interrupts_deferred():  # see _COMPILING
                from .protocol import compiled

                return cls(specs, seqlock, lock, compiled)
        except Exception as exc:  # noqa: BLE001 - any numba failure: the general path still writes
            if _raised_by_a_handler(exc, handlers):
                raise
            _warn_uncompiled(exc, stacklevel=4)
            return None

    def write(self, env_ids: Any, values: dict[str, Any]) -> int:
        """The write's version, or a negative code: see the class."""
        if env_ids is None:
            start, stop = 0, self._count
        elif type(env_ids) is int and 0 <= env_ids < self._count:
            start, stop = env_ids, env_ids + 1
        else:
            return self._invalid
        names = tuple(values)
        indices = self._plans.get(names, _UNPLANNED)
        if indices is _UNPLANNED:
            indices = self._plans[names] = self._plan(names)
        if indices is None:
            return self._invalid
        given = tuple(values.values())
        kind = type(given[0])
        if kind is float or kind is _NUMPY_FLOAT:
            for value in given:
                kind = type(value)
                if kind is not float and kind is not _NUMPY_FLOAT:
                    return self._invalid
            entry = self._numbers.get(len(given)) or self._load("numbers", len(given))
        else:
            for value in given:
                # ``is``: numpy's float64 dtype is one object (another equal one only takes the general path)
                if type(value) is not _NDARRAY or value.dtype is not _FLOAT64 or value.ndim != 1:
                    return self._invalid
            entry = self._arrays.get(len(given)) or self._load("arrays", len(given))
        return entry(self._plan_words, self._bounds, indices, given, start, stop, this_pid())  # type: ignore[no-any-return]

    def _load(self, kind: str, count: int) -> Callable[..., int]:
        """The compiled write of ``count`` parameters' numbers or arrays (``kind``), loaded once; if
        numba fails to compile it, one that always leaves the write to the general path."""
        entries = self._numbers if kind == "numbers" else self._arrays
        handlers = _handler_codes()
        try:
            with _COMPILING, interrupts_deferred():
                entry: Callable[..., int] = self._functions.write_entry(kind, count)
        except Exception as exc:  # noqa: BLE001 - any numba failure: the general path still writes
            if _raised_by_a_handler(exc, handlers):
                raise
            _warn_uncompiled(exc, stacklevel=5)
            invalid = self._invalid
            entry = lambda *arguments: invalid  # noqa: E731
        entries[count] = entry
        return entry

    def _plan(self, names: tuple[str, ...]) -> tuple[int, ...] | None:
        """The ``bounds`` columns of parameters ``names``; None when one is not plain (or names none)."""
        if not names or any(name not in self._index for name in names):
            return None
        return tuple(self._index[name] for name in names)


_UNPLANNED = object()


def _handler_codes() -> set[Any]:
    """The code of every Python signal handler installed now (a ``functools.partial``'s function, a
    callable object's ``__call__``): taken before a load, since a one-shot handler resets itself."""
    codes = set()
    for signum in signal.valid_signals():
        handler = signal.getsignal(signum)
        if callable(handler):
            function = getattr(handler, "func", handler)  # functools.partial
            function = getattr(function, "__func__", function)  # a bound method
            if not hasattr(function, "__code__"):  # a callable object: its class's __call__
                function = type(function).__call__
            code = getattr(function, "__code__", None)
            if code is not None:
                codes.add(code)
    return codes


def _raised_by_a_handler(exc: BaseException, handlers: set[Any]) -> bool:
    """Whether ``exc``, or an exception it was raised from or during, passed through one of the signal
    handlers ``handlers`` (their code): that one is the caller's to see, not a failure of numba, and
    the load is tried again at the next write."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        frame = current.__traceback__
        while frame is not None:
            if frame.tb_frame.f_code in handlers:
                return True
            frame = frame.tb_next
        pending += [current.__cause__, current.__context__]
    return False


def _warn_uncompiled(exc: Exception, stacklevel: int) -> None:
    """Says that numba failed (``stacklevel``: the user's call of ``params.write``, seen from here)."""
    warnings.warn(
        f"shmpool's compiled params writes are unavailable ({type(exc).__name__}: {exc}); "
        f"params.write takes its general path, with the same results",
        RuntimeWarning,
        stacklevel=stacklevel,
    )
