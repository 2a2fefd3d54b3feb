"""One-shot events for hooks, through one ring per worker in the segment.

A ring holds ``event_capacity`` fixed-size records (hook index, due step, payload, a bitmask of the
worker's envs it concerns, and the ticket that publishes it). Senders (the trainer and attached
processes, any of their threads) take the writers' lock and hand the records to
:class:`shmpool.protocol.EventRings`, which publishes an event to all the rings it touches with one
store, so a sender killed mid-send delivers to no worker rather than to some. The worker alone
advances its ring's ``tail`` after copying the records out, so it reads every event exactly once, in
send order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import EventQueueFull
from .protocol import EventRings, WriterLock

#: The shortest wait for the writers' lock, even with ``timeout=0``: a live holder keeps it for
#: microseconds, so only a stopped or stuck one makes a sender wait this long.
LOCK_GRACE = 0.25

NOT_SCHEDULED = -1


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
        self._rings = rings
        self._slots = list(slots)
        self._starts = np.array([start for start, _ in slots])
        self._lock = lock
        self._label = env_label
        self._check_open = check_open
        self.capacity = rings.capacity
        self.payload_size = rings.records.dtype["payload"].shape[0]
        self.num_envs = self._slots[-1][1]

    def send(
        self,
        hook: str,
        env_ids: int | Sequence[int] | np.ndarray | None,
        payload: Any = None,
        *,
        at_step: int | None = None,
        timeout: float | None = 0.0,
    ) -> None:
        """Queues a one-shot event for ``hook`` (its name) concerning ``env_ids`` (None: every env).

        It is delivered once, in send order, to that hook's ``ctx.events`` at the next step, or at
        global step ``at_step``. ``payload``: up to ``event_payload`` numbers. When a ring is full,
        waits up to ``timeout`` seconds (0: not at all; None: as long as it takes), then raises
        ``EventQueueFull``.
        """
        self._check_open()
        try:
            hook_index = self.hook_names.index(hook)
        except ValueError:
            raise KeyError(f"no hook named {hook!r}; the pool's hooks are {self.hook_names}") from None
        if env_ids is None:
            ids = np.arange(self.num_envs)
        else:
            ids = np.atleast_1d(np.asarray(env_ids))
            if ids.size > 1:  # one env (the common event) needs no sorting
                ids = np.unique(ids)
        if ids.dtype.kind not in "iu" or ids.ndim != 1 or not ids.size:
            raise ValueError(f"env_ids must be one or more env ids (or None for all), got {env_ids!r:.100}")
        if ids.min() < 0 or ids.max() >= self.num_envs:
            raise ValueError(f"env_ids {ids.tolist()} out of range for num_envs={self.num_envs}")
        values = np.zeros(0) if payload is None else np.asarray(payload, dtype=np.float64).ravel()
        if values.size > self.payload_size:
            raise ValueError(f"payload has {values.size} numbers; launch(event_payload=...) allows {self.payload_size}")
        if at_step is not None and (not isinstance(at_step, (int, np.integer)) or at_step < 0):
            raise ValueError(f"at_step must be a non-negative int, got {at_step!r}")
        owners = np.searchsorted(self._starts, ids, side="right") - 1
        workers = owners.tolist() if owners.size == 1 else np.unique(owners).tolist()
        deadline = None if timeout is None else time.monotonic() + timeout
        lock_wait = None if timeout is None else max(timeout, LOCK_GRACE)
        parts = [
            (worker_id, self._filler(worker_id, hook_index, ids[owners == worker_id], values, at_step))
            for worker_id in workers
        ]
        while True:
            with self._lock.hold(lock_wait, self._check_open):
                full = self._rings.full(workers)
                if not full:
                    self._rings.publish(parts)
                    return
            if deadline is not None and time.monotonic() >= deadline:
                raise EventQueueFull(
                    f"{self._label}: the event ring of worker {full[0]} is full ({self.capacity} events "
                    f"waiting); send with a timeout, or launch with a larger event_capacity"
                )
            time.sleep(0.0005)
            self._check_open()  # a sender waiting for room stops when the pool closes

    def _filler(
        self, worker_id: int, hook_index: int, ids: np.ndarray, values: np.ndarray, at_step: int | None
    ) -> Callable[[np.ndarray], None]:
        """What writes this event's record for one worker's ring (built before taking the lock)."""
        bits = np.zeros(self._rings.records.dtype["mask"].shape[0] * 8, dtype=np.bool_)
        bits[ids - self._slots[worker_id][0]] = True
        mask = np.packbits(bits, bitorder="little")

        def fill(record: np.ndarray) -> None:
            record["hook"] = hook_index
            record["at_step"] = NOT_SCHEDULED if at_step is None else at_step
            record["payload_size"] = values.size
            record["payload"][: values.size] = values
            record["mask"] = mask

        return fill


class EventReader:
    """Worker side: takes this worker's events out of its ring and hands them out when due."""

    def __init__(self, rings: EventRings, worker_id: int, slot: tuple[int, int]) -> None:
        self._rings = rings
        self._worker_id = worker_id
        self._start, stop = slot
        self._count = stop - self._start
        self._waiting: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # taken out, due later

    def due(self, step: int) -> list[tuple[int, Event]]:
        """The (hook index, event) pairs due at global step ``step``, in send order."""
        rings, ring = self._rings, self._worker_id
        if rings.heads[ring] != rings.tails[ring]:
            for record in rings.consume(ring):
                bits = np.unpackbits(record["mask"], bitorder="little")[: self._count].astype(np.bool_)
                payload = record["payload"][: int(record["payload_size"])].copy()
                self._waiting.append(
                    (int(record["hook"]), int(record["at_step"]), np.flatnonzero(bits) + self._start, payload)
                )
        if not self._waiting:
            return []
        ready: list[tuple[int, int, np.ndarray, np.ndarray]] = []
        later: list[tuple[int, int, np.ndarray, np.ndarray]] = []
        for item in self._waiting:
            (ready if item[1] <= step else later).append(item)
        self._waiting = later
        return [(hook, Event(env_ids, payload, step)) for hook, _, env_ids, payload in ready]
