"""A params write as one compiled call: ``write`` (numba).

Why and how: ``docs/internals.md``, "shmpool/protocol/compiled.py".
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import types
from numba.core.extending import intrinsic, overload

from .lock import EBUSY, EOWNERDEAD
from .words import W_EVENTS_JOURNAL, W_HOLDER, W_MUTEX, W_PARAMS_GENERATION, W_PARAMS_JOURNAL

BUSY, RECOVER, INVALID = -1, -2, -3

_MUTEX_CALL: Any = types.int32(types.uint64)  # int f(pthread_mutex_t *), the pointer as an integer
_trylock: Any = types.ExternalFunction("pthread_mutex_trylock", _MUTEX_CALL)
_unlock: Any = types.ExternalFunction("pthread_mutex_unlock", _MUTEX_CALL)
_consistent: Any = types.ExternalFunction("pthread_mutex_consistent", _MUTEX_CALL)


def _fence_typing(typingctx: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.fence("acq_rel")
        return context.get_dummy_value()

    return types.void(), codegen


#: A compiler barrier: no load or store moves across it (on x86-64 it emits no instruction, the CPU
#: keeping the order of stores, and of loads: ``shmpool.protocol.check_memory_model``).
compiler_fence: Any = intrinsic(_fence_typing)


@numba.njit(cache=True)
def _take(mutex: int, words: np.ndarray, pid: int) -> int:
    """Takes the mutex and marks ``pid`` its holder, or returns BUSY or RECOVER holding nothing."""
    code = _trylock(mutex)
    if code != 0:
        if code == EOWNERDEAD:  # held now, by us: usable again, then left to the general path
            _consistent(mutex)
            _unlock(mutex)
        elif code != EBUSY:
            return RECOVER  # an unusable mutex: the general path reports it
        return BUSY
    compiler_fence()
    if words[W_PARAMS_JOURNAL] != 0 or words[W_EVENTS_JOURNAL] != 0:
        compiler_fence()
        _unlock(mutex)
        return RECOVER
    words[W_HOLDER] = pid
    return 0


@numba.njit(cache=True)
def _begin(words: np.ndarray, block: np.ndarray, undo: np.ndarray, seq: np.ndarray, start: int, stop: int) -> int:
    """``Seqlock.write`` up to the stores: journal, then the generation and the rows made odd."""
    generation = words[W_PARAMS_GENERATION]
    for row in range(start, stop):
        for word in range(block.shape[1]):
            undo[row, word] = block[row, word]
    compiler_fence()
    words[W_PARAMS_JOURNAL] = 1  # after the journal is whole: a rollback restores from it
    compiler_fence()
    words[W_PARAMS_GENERATION] = generation + 1
    compiler_fence()
    for row in range(start, stop):
        seq[row] += 1
    compiler_fence()
    return generation


@numba.njit(cache=True)
def _end(mutex: int, words: np.ndarray, seq: np.ndarray, start: int, stop: int, generation: int) -> int:
    """``Seqlock.write`` after the stores (rows even, generation even, journal cleared), then the
    mutex dropped; returns the write's version."""
    compiler_fence()
    for row in range(start, stop):
        seq[row] += 1
    compiler_fence()
    words[W_PARAMS_GENERATION] = generation + 2
    compiler_fence()
    words[W_PARAMS_JOURNAL] = 0
    words[W_HOLDER] = 0
    compiler_fence()
    _unlock(mutex)
    return (generation + 2) // 2


#: The words of ``plan``, the int64 array that describes a block to the writes (addresses as integers:
#: numba unboxes each array argument at a cost that is a good part of a write's, so there is one,
#: not five).
P_MUTEX, P_WORDS, P_BLOCK, P_UNDO, P_SEQ, P_ENVS, P_RECORD_WORDS = range(7)
PLAN_WORDS = 7


def _pointer_typing(typingctx: Any, address: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))

    return types.voidptr(types.int64), codegen


#: An integer address as a ``void *``, for ``numba.carray``.
_address_as_pointer: Any = intrinsic(_pointer_typing)


@numba.njit(cache=True)
def _views(plan: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The writers' words, the params block and its undo journal (float64 words, a row per env) and
    the per-env counters that ``plan`` describes."""
    envs, record = plan[P_ENVS], plan[P_RECORD_WORDS]
    words = numba.carray(_address_as_pointer(plan[P_WORDS]), (W_MUTEX,), np.int64)  # those before the mutex
    block = numba.carray(_address_as_pointer(plan[P_BLOCK]), (envs, record), np.float64)
    undo = numba.carray(_address_as_pointer(plan[P_UNDO]), (envs, record), np.float64)
    seq = numba.carray(_address_as_pointer(plan[P_SEQ]), (envs,), np.int64)
    return words, block, undo, seq


def _value_at(value: Any, row: int) -> float:
    """Row ``row``'s value of a write: ``value`` itself (a number) or ``value[row]`` (an array)."""
    return value if np.ndim(value) == 0 else float(value[row])


@overload(_value_at)
def _value_at_compiled(value, row):  # type: ignore[no-untyped-def] # unannotated: numba matches it to the lambdas
    if isinstance(value, types.Array):
        return lambda value, row: value[row]
    return lambda value, row: value


def _rows_of(value: Any, rows: int) -> int:
    """How many rows a write's value covers: all ``rows`` (a number), or its length (an array)."""
    return rows if np.ndim(value) == 0 else len(value)


@overload(_rows_of)
def _rows_of_compiled(value, rows):  # type: ignore[no-untyped-def] # unannotated: numba matches it to the lambdas
    if isinstance(value, types.Array):
        return lambda value, rows: value.shape[0]
    return lambda value, rows: rows


@numba.njit(cache=True)
def write(
    plan: np.ndarray,
    bounds: np.ndarray,
    indices: tuple[int, ...],
    values: tuple[Any, ...],
    start: int,
    stop: int,
    pid: int,
) -> int:
    """Writes ``values[k]`` (one number, or an array of one float64 per env) to parameter
    ``indices[k]`` of envs ``start`` to ``stop``; returns the version, or a code. ``bounds``: per
    parameter, its float64 word in the record, its low and its high bound."""
    count = stop - start
    for k in range(len(indices)):
        value, low, high = values[k], bounds[1, indices[k]], bounds[2, indices[k]]
        if _rows_of(value, count) != count:
            return INVALID
        for row in range(count):
            number = _value_at(value, row)
            if not (low <= number <= high) or not np.isfinite(number):
                return INVALID
    words, block, undo, seq = _views(plan)
    taken = _take(plan[P_MUTEX], words, pid)
    if taken != 0:
        return taken
    generation = _begin(words, block, undo, seq, start, stop)
    for k in range(len(indices)):
        word, value = np.int64(bounds[0, indices[k]]), values[k]
        for row in range(start, stop):
            block[row, word] = _value_at(value, row - start)
    return _end(plan[P_MUTEX], words, seq, start, stop, generation)


_PLAN, _BOUNDS = types.Array(types.int64, 1, "C"), types.Array(types.float64, 2, "C")
#: The type of one value of each write: a number, or an array of any strides.
_VALUE_TYPES = {"numbers": types.float64, "arrays": types.Array(types.float64, 1, "A")}


def write_entry(kind: str, count: int) -> Any:
    """``write`` of ``count`` parameters' numbers (``kind`` "numbers") or arrays ("arrays"), as
    ``entry_point`` gives it: the caller passes exactly that signature's types (plan, bounds, a
    tuple of ``count`` ints, one of ``count`` floats or float64 arrays, three ints)."""
    counts = (types.UniTuple(types.int64, count), types.UniTuple(_VALUE_TYPES[kind], count))
    return entry_point(write, (_PLAN, _BOUNDS, *counts, types.int64, types.int64, types.int64))


def entry_point(function: Any, signature: tuple[Any, ...]) -> Any:
    """The numba function ``function`` compiled for ``signature`` (numba types), or loaded from
    numba's cache, now, as the callable that skips numba's typing of the arguments (about half of a
    call's cost, more with many arrays): for a caller that passes exactly those types every time
    (an array of another dtype or number of dimensions would be misread). Where numba does not
    expose it, the dispatcher itself."""
    function.compile(signature)
    compiled = function.overloads.get(signature)
    return getattr(compiled, "entry_point", function)
