"""One-shot events for hooks, through one ring per worker in the segment.

Why and how: ``docs/internals.md``, "shmpool/events.py".
"""

from __future__ import annotations

import math
import struct
import sys
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import EventQueueFullError
from .options import deadline_after
from .protocol import EventRings, WriterLock

#: The shortest wait for the writers' lock, even with ``wait=0``: a live holder keeps it for
#: microseconds, so only a stopped or stuck one makes a sender wait this long.
LOCK_GRACE = 0.25

NOT_SCHEDULED = -1

#: The fixed start of a record (the first fields of ``event_dtype``): ticket, hook, at_step,
#: payload_size. The payload's float64s follow, then the env mask.
RECORD_HEAD = struct.Struct("<4q")

#: Payload items that ``float()`` converts exactly as ``np.asarray(..., dtype=np.float64)`` does, with
#: the same error (an int beyond float's range); anything else (arrays, strings, nested lists) goes
#: through numpy.
_PLAIN_NUMBERS = frozenset((float, int))

#: The payload's dtype, made once: ``np.frombuffer`` takes a dtype object quicker than a type.
_FLOAT64 = np.dtype(np.float64)

#: The most ``at_step`` a record holds (an int64).
_LAST_STEP = (1 << 63) - 1


def event_dtype(payload_size: int, mask_bytes: int) -> np.dtype[Any]:
    """The record of one event in a worker's ring."""
    return np.dtype(
        [
            ("ticket", "<i8"),
            ("hook", "<i8"),
            ("at_step", "<i8"),
            ("payload_size", "<i8"),
            ("payload", "<f8", (payload_size,)),
            ("mask", "u1", (mask_bytes,)),
        ]
    )


def mask_bytes(slots: Sequence[tuple[int, int]]) -> int:
    """Bytes of the per-event env mask: one bit per env of the largest slot, rounded to 8 bytes."""
    largest = max(stop - start for start, stop in slots)
    return max(8, (largest + 63) // 64 * 8)


@dataclass(frozen=True)
class Event:
    """One event as a hook sees it in ``ctx.events``."""

    env_ids: np.ndarray  # the env ids (pool-wide) of this worker's slot that the event concerns
    payload: np.ndarray  # float64, as sent
    step: int  # the global step at which it is delivered


class EventSender:
    """Sends events to hooks by name: the ``events`` of a pool and of every handle attached to it."""

    def __init__(
        self,
        hook_names: Sequence[str],
        rings: EventRings,
        slots: Sequence[tuple[int, int]],
        lock: WriterLock,
        env_label: str,
        check_open: Callable[[], None],
    ) -> None:
        self.hook_names = list(hook_names)
        self._hook_indices: dict[Any, int] = {}
        for index, name in enumerate(self.hook_names):
            self._hook_indices.setdefault(name, index)  # the first of equal names, as list.index finds
        self._rings = rings
        self._slots = list(slots)
        self._starts = [start for start, _ in slots]
        self._lock = lock
        self._label = env_label
        self._check_open = check_open
        self.capacity = rings.capacity
        self.payload_size = rings.records.dtype["payload"].shape[0]
        self.num_envs = self._slots[-1][1]
        self._mask_bytes = rings.records.dtype["mask"].shape[0]
        # One layout per payload length: the numbers sent, zeros up to payload_size, then the mask.
        # The ticket (first) is left 0: publish() stamps it under the lock.
        self._records = [
            struct.Struct(f"<4q{count}d{8 * (self.payload_size - count)}x{self._mask_bytes}s")
            for count in range(self.payload_size + 1)
        ]
        self._every_env = [
            (worker, self._mask(worker, np.arange(start, stop)))
            for worker, (start, stop) in enumerate(slots)
            if stop > start
        ]

    def send(
        self,
        hook: str,
        env_ids: int | Sequence[int] | np.ndarray | None,
        payload: Any = None,
        *,
        at_step: int | None = None,
        wait: float | None = 0.0,
    ) -> None:
        """Queues a one-shot event for ``hook`` (its name) concerning ``env_ids`` (ids, a slice, or
        None: every env).

        It is delivered once, in send order, to that hook's ``ctx.events`` at the next step, or at
        global step ``at_step``. ``payload``: up to ``event_payload`` numbers. When a ring is full,
        waits up to ``wait`` seconds (0: not at all; None: as long as it takes), then raises
        ``EventQueueFullError``.
        """
        self._check_open()
        try:
            hook_index = self._hook_indices[hook]
        except (KeyError, TypeError):  # TypeError: unhashable; list.index still compares it by ==
            hook_index = self._hook_index(hook)
        masks = self._masks(env_ids)
        if payload is None:
            values: Sequence[float] = ()
        elif (
            type(payload) in (list, tuple)
            and len(payload) <= self.payload_size
            and _PLAIN_NUMBERS.issuperset(map(type, payload))
        ):
            values = list(map(float, payload))
        else:
            try:
                if isinstance(payload, (str, bytes)):  # numpy would read "1.5" as a number
                    raise TypeError(f"a {type(payload).__name__}")
                array = np.asarray(payload, dtype=np.float64).ravel()
            except (TypeError, ValueError) as error:
                raise (TypeError if isinstance(error, TypeError) else ValueError)(
                    f"{self._label}: the payload of an event for {hook!r} must be numbers, "
                    f"got {payload!r:.80} ({error})"
                ) from error
            if array.size > self.payload_size:
                raise ValueError(
                    f"payload has {array.size} numbers; launch(event_payload=...) allows {self.payload_size}"
                )
            values = array.tolist()
        if not all(map(math.isfinite, values)):  # a NaN pushed into an env's state never leaves it
            raise ValueError(
                f"{self._label}: the payload of an event for {hook!r} (envs {env_ids!r:.60}) must be finite, "
                f"got {values!r:.80}"
            )
        if at_step is not None and (
            not isinstance(at_step, (int, np.integer)) or isinstance(at_step, bool) or not 0 <= at_step <= _LAST_STEP
        ):
            raise ValueError(f"at_step must be a non-negative int, got {at_step!r}")
        parts = [(worker, self._record(hook_index, values, at_step, mask)) for worker, mask in masks]
        workers = [worker for worker, _ in parts]
        deadline = deadline_after(wait, f"{self._label}: events.send")
        lock_wait = None if wait is None else max(wait, LOCK_GRACE)
        while True:
            full = self._lock.run(lock_wait, self._check_open, self._publish, workers, parts)
            if not full:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise EventQueueFullError(
                    f"{self._label}: the event ring of worker {full[0]} is full ({self.capacity} events "
                    f"waiting); send with a wait, or launch with a larger event_capacity"
                )
            time.sleep(0.0005)
            self._check_open()  # a sender waiting for room stops when the pool closes

    def _publish(self, workers: list[int], parts: list[tuple[int, bytes]]) -> list[int]:
        """Publishes ``parts`` unless a ring of ``workers`` is full; returns the full ones. Under the lock."""
        full = self._rings.full(workers)
        if not full:
            self._rings.publish(parts)
        return full

    def _hook_index(self, hook: Any) -> int:
        try:
            return self.hook_names.index(hook)
        except ValueError:
            raise KeyError(f"no hook named {hook!r}; the pool's hooks are {self.hook_names}") from None

    def _masks(self, env_ids: Any) -> list[tuple[int, bytes]]:
        """Each concerned worker with the env mask of its slot."""
        if env_ids is None:
            return self._every_env
        if type(env_ids) is int or isinstance(env_ids, np.integer):  # one env: the common event
            plain: Any = [int(env_ids)]
        elif isinstance(env_ids, slice):  # as params.write takes them
            plain = list(range(self.num_envs))[env_ids]
        elif isinstance(env_ids, np.ndarray) and env_ids.ndim == 1:
            plain = env_ids.tolist()
        else:
            plain = env_ids
        if type(plain) in (list, tuple) and 0 < len(plain) <= 64:  # a few envs: ints are quicker than numpy
            num_envs = self.num_envs
            if all(type(env) is int and 0 <= env < num_envs for env in plain):
                starts = self._starts
                bits: dict[int, int] = {}  # worker -> its slot's mask
                for env in plain:
                    worker = bisect_right(starts, env) - 1
                    bits[worker] = bits.get(worker, 0) | 1 << (env - starts[worker])
                return [(worker, bits[worker].to_bytes(self._mask_bytes, "little")) for worker in sorted(bits)]
        ids = np.atleast_1d(np.asarray(plain if isinstance(env_ids, slice) else env_ids))
        if ids.size > 1:
            ids = np.unique(ids)
        if ids.dtype.kind not in "iu" or ids.ndim != 1 or not ids.size:
            raise ValueError(f"env_ids must be one or more env ids (or None for all), got {env_ids!r:.100}")
        if ids.min() < 0 or ids.max() >= self.num_envs:
            raise ValueError(f"env_ids {ids.tolist()} out of range for num_envs={self.num_envs}")
        owners = np.searchsorted(self._starts, ids, side="right") - 1
        workers = owners.tolist() if owners.size == 1 else np.unique(owners).tolist()
        return [(worker, self._mask(worker, ids[owners == worker])) for worker in workers]

    def _mask(self, worker_id: int, ids: np.ndarray) -> bytes:
        """The env mask of one worker's record: bit ``i`` for env ``start + i`` of its slot."""
        bits = np.zeros(self._mask_bytes * 8, dtype=np.bool_)
        bits[ids - self._slots[worker_id][0]] = True
        return np.packbits(bits, bitorder="little").tobytes()

    def _record(self, hook_index: int, values: Sequence[float], at_step: int | None, mask: bytes) -> bytes:
        """An event's record for one worker's ring, as ``EventRings.publish`` takes it (ticket 0)."""
        due = NOT_SCHEDULED if at_step is None else at_step
        return self._records[len(values)].pack(0, hook_index, due, len(values), *values, mask)

    def _filler(
        self, worker_id: int, hook_index: int, ids: np.ndarray, values: Sequence[float], at_step: int | None
    ) -> bytes:
        """``_record`` for the envs ``ids`` of one worker (tests build half-done sends from it)."""
        return self._record(hook_index, values, at_step, self._mask(worker_id, ids))


class EventReader:
    """Worker side: takes this worker's events out of its ring and hands them out when due."""

    def __init__(self, rings: EventRings, worker_id: int, slot: tuple[int, int]) -> None:
        dtype = rings.records.dtype
        self._rings = rings
        self._ring = worker_id
        self._heads, self._tails = rings.head_words, rings.tail_words
        self._start, stop = slot
        self._count = stop - self._start
        self._env_ids_of_slot = np.arange(self._start, stop)
        self._one_env_below = 1 << self._count  # a one-bit mask below it names an env of the slot
        self._size = dtype.itemsize
        self._payload_size = dtype["payload"].shape[0]
        self._mask_bytes = dtype["mask"].shape[0]
        self._mask_offset = self._size - self._mask_bytes  # the mask ends a record (event_dtype)
        # Slots of up to 64 envs (most pools) have a one-word mask, read with one unpack.
        self._mask_word = struct.Struct("<Q") if self._mask_bytes == 8 else None
        self._waiting: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # taken out, due later
        self._next_due = sys.maxsize  # the earliest at_step in _waiting

    def due(self, step: int) -> dict[int, list[Event]] | None:
        """The events due at global step ``step`` by hook index, each hook's in send order; None when
        none is. A step with an empty ring and nothing scheduled costs two integer compares."""
        ring = self._ring
        fresh = self._heads[ring] != self._tails[ring]
        if not fresh and step < self._next_due:
            return None
        due: dict[int, list[Event]] = {}
        if step >= self._next_due:  # taken out earlier, so sent before anything still in the ring
            waiting, self._waiting, self._next_due = self._waiting, [], sys.maxsize
            for hook, at_step, env_ids, payload in waiting:
                if at_step > step:
                    self._wait(hook, at_step, env_ids, payload)
                else:
                    due.setdefault(hook, []).append(Event(env_ids, payload, step))
        if fresh:
            data = self._rings.take(ring)
            payload_size = self._payload_size
            for offset in range(0, len(data), self._size):
                _, hook, at_step, count = RECORD_HEAD.unpack_from(data, offset)
                env_ids = self._env_ids(data, offset + self._mask_offset)
                if not 0 <= count <= payload_size:  # only a broken writer gets here: never read past the payload
                    count = 0 if count < 0 else payload_size
                # A view of this batch's own copy of the records: no other event shares these bytes.
                payload = np.frombuffer(data, _FLOAT64, count, offset + RECORD_HEAD.size)
                if at_step > step:
                    self._wait(hook, at_step, env_ids, payload)
                    continue
                event = Event(env_ids, payload, step)
                events = due.get(hook)
                if events is None:
                    due[hook] = [event]
                else:
                    events.append(event)
        return due or None

    def _wait(self, hook: int, at_step: int, env_ids: np.ndarray, payload: np.ndarray) -> None:
        """Keeps an event taken out of the ring until its step."""
        self._waiting.append((hook, at_step, env_ids, payload))
        self._next_due = min(self._next_due, at_step)

    def _env_ids(self, data: bytearray, offset: int) -> np.ndarray:
        """The pool-wide env ids of the mask at ``offset`` (bits beyond the slot are ignored)."""
        if self._mask_word is not None:
            bits = self._mask_word.unpack_from(data, offset)[0]
        else:
            bits = int.from_bytes(memoryview(data)[offset : offset + self._mask_bytes], "little")
        if bits and not bits & (bits - 1) and bits < self._one_env_below:  # one env: the common event
            index = bits.bit_length() - 1
            return self._env_ids_of_slot[index : index + 1].copy()
        unpacked = np.unpackbits(np.frombuffer(data, np.uint8, self._mask_bytes, offset), bitorder="little")
        return self._env_ids_of_slot[unpacked[: self._count].view(np.bool_)]
