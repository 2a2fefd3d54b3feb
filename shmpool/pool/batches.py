"""EnvPool-style asynchronous batches over a pool: ``async_reset``, ``send(actions, env_ids)`` and
``recv()``, so that the trainer runs its policy on one batch while workers step the others.

Why and how: ``docs/internals.md``, "shmpool/pool/batches.py".
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..interrupts import interrupts_deferred
from ..layout import CMD_RESET, CMD_STEP
from ..options import check_env_ids
from ..spaces import ActionCheckers
from ..system import monotonic, usable_cores
from .lifecycle import Parts
from .results import SlotSet
from .waiting import TRAINER_POLL_INTERVAL, TRAINER_SPIN

IDLE, BUSY, READY, RETURNED = range(4)


class Handout(NamedTuple):
    """One batch that ``recv`` marked as returned, with what undoes that."""

    results: tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]
    workers: tuple[int, ...]  # in the order they left the ready queue
    slot_set: SlotSet
    returned_before: SlotSet | None  # what send's default was before


class Batches:
    """The async state of one pool: which worker is where, and the calls that move them."""

    def __init__(self, parts: Parts, action_views: list[np.ndarray], action_space: Any) -> None:
        config = self._config = parts.config
        self._lifecycle = parts.lifecycle
        self._waiter = parts.waiter
        self._results = parts.results
        self._action_views = action_views
        self._slots = config.slots
        self.batch_size: int = config.batch_size  # type: ignore[assignment]
        num_workers = len(self._slots)
        # Every env makes one batch of every worker, whatever the slots' sizes (they may differ).
        whole = self.batch_size == config.num_envs
        self._workers_per_batch = num_workers if whole else self.batch_size // (self._slots[0][1] - self._slots[0][0])
        self._state = [IDLE] * num_workers
        self._seq = [0] * num_workers  # the sequence number of each worker's command in flight
        self._sent_at = [0.0] * num_workers  # when it was sent (monotonic): its timeout counts from there
        #: When recv next checks the workers in flight for death and lateness even if enough others are
        #: ready: a loop fed by the other workers would otherwise never notice a dead or hung one.
        self._next_check = 0.0
        self._was_reset = [False] * num_workers  # whether that command is a reset
        self._ready: collections.deque[int] = collections.deque()
        self._in_sent_order = config.recv_order == "sent"
        self.checkers = ActionCheckers(action_space, parts.config.env_label)
        self._cores = usable_cores()
        self._worker_of = config.worker_of
        #: The slots the last recv returned, while some await their actions: ``send``'s default.
        self._returned: SlotSet | None = None
        self._slot_sets: dict[tuple[int, ...], SlotSet] = {}
        #: Whether any worker is between a send (or async_reset) and the send after its recv.
        self.in_flight = False

    def unreturned(self, env_ids: np.ndarray) -> list[int]:
        """Those of ``env_ids`` whose worker has a command in flight or results no recv returned yet."""
        return [int(e) for e in env_ids if self._state[self._worker_of[e]] in (BUSY, READY)]

    def start_reset(self, seq: int) -> None:
        """Sends the reset the pool has just prepared in the segment (flags, seeds, options) to every
        worker, once ``discard`` has ended what was in flight; ``recv`` returns its observations
        batch by batch."""
        self._issue(seq, CMD_RESET, list(range(len(self._slots))))  # Ctrl-C held back by the caller (see _issue)

    def send(self, actions: Any, env_ids: Any, seq: Callable[[], int]) -> int:
        """Writes ``actions`` (one row per env id) and starts the step of the envs' workers; returns
        how many envs it sent. Call it with Ctrl-C held back (``Pool.send`` does)."""
        returned = self._returned
        if returned is not None and (env_ids is None or env_ids is returned.env_id):
            # The ids the last recv handed out (read-only, so unchanged): checked when they were made.
            workers, index, ids = returned.workers, returned.index, returned.rows
            self._check_returned(workers)
        else:
            if env_ids is None:
                raise RuntimeError(
                    "send: no env ids given and no recv() returned any yet; call async_reset() and recv()"
                )
            ids = check_env_ids(env_ids, len(self._worker_of), "send", unique=True)
            if not len(ids):
                raise ValueError("send: no env ids")
            workers = tuple(np.unique(self._worker_of[ids]).tolist())
            self._check_returned(workers)
            if len(ids) != sum(self._slots[k][1] - self._slots[k][0] for k in workers):
                raise ValueError(
                    f"send: the env ids must cover whole slots (a worker steps all its envs at once): "
                    f"{[f'{self._slots[k][0]}..{self._slots[k][1] - 1}' for k in workers]}, got {len(ids)} ids"
                )
            index = ids
        for view, part in zip(self._action_views, self.checkers.check(actions, ids)):
            view[index] = part
        self._issue(seq(), CMD_STEP, workers)
        if returned is not None and all(self._state[k] != RETURNED for k in returned.workers):
            self._returned = None
        return len(ids)

    def _check_returned(self, workers: Sequence[int]) -> None:
        for worker_id in workers:
            if self._state[worker_id] != RETURNED:
                start, stop = self._slots[worker_id]
                raise RuntimeError(
                    f"send: envs {start}..{stop - 1} (worker {worker_id}) have no results returned by recv() "
                    f"awaiting actions ({_STATE_NAMES[self._state[worker_id]]}); send actions only for the "
                    f"env ids of infos['env_id'] of a recv()"
                )

    def recv(self, held: interrupts_deferred) -> Handout:
        """Hands out the results of the first ``batch_size`` envs to finish (with ``recv_order="sent"``:
        whose commands went out first), with ``infos["env_id"]``.
        Ctrl-C interrupts the wait; from the handing out on, ``held`` holds it back for the caller to
        release once it has nothing left to do but return (see ``Pool.recv``)."""
        ready, needed = self._ready, self._workers_per_batch
        now = monotonic()
        if now >= self._next_check:
            self._next_check = now + TRAINER_POLL_INTERVAL
            busy = self._busy()  # dead or late workers in flight, whether or not others have results ready
            if busy:
                self._waiter.check_pending(busy, self._sent_at, "recv", now)
        in_sent_order = self._in_sent_order
        if len(ready) < needed or in_sent_order:
            busy = self._busy()
            if len(ready) + len(busy) < needed:
                raise RuntimeError(
                    f"recv needs {self.batch_size} envs in flight, but only "
                    f"{sum(self._slots[k][1] - self._slots[k][0] for k in (*ready, *busy))} are: call "
                    f"async_reset() first, and send() the actions of the envs each recv() returns"
                )
            # Spinning takes a core: only when one is free of stepping workers (see TRAINER_SPIN).
            spin = TRAINER_SPIN if len(busy) < self._cores else 0
            watched = busy  # every worker in flight: a death is reported while others are waited for
            if in_sent_order:  # the oldest commands, whether they finished or not; wait for those only
                oldest = sorted((*ready, *busy), key=lambda k: (self._seq[k], k))[:needed]
                busy = {k: busy[k] for k in oldest if k in busy}
                waiting = lambda: bool(busy)  # noqa: E731
            else:
                waiting = lambda: len(ready) < needed  # noqa: E731
            while waiting():  # the deadline of the workers still stepping, after each wait
                finished = self._waiter.wait_some(busy, "recv", self._deadline(busy), spin, watched)
                self._mark_ready(finished, busy)
        self._waiter.raise_failures("recv")
        order = oldest if in_sent_order else [ready[k] for k in range(needed)]
        # In worker order within the batch: a batch of every env is in env order.
        chosen = tuple(sorted(order))
        slot_set = self._slot_sets.get(chosen)
        if slot_set is None:
            slot_set = self._slot_sets[chosen] = SlotSet(self._slots, chosen)
        # Read before anything changes: Ctrl-C here leaves the batch queued for the next recv.
        results = self._results.batch(slot_set, [self._was_reset[k] for k in chosen])
        handout = Handout(results, tuple(order), slot_set, self._returned)
        held.hold()
        for worker_id in order:
            ready.remove(worker_id)
            self._state[worker_id] = RETURNED
        self._returned = slot_set
        return handout

    def take_back(self, handout: Handout) -> None:
        """Queues a batch that ``recv`` handed out but the caller never got (Ctrl-C) for the next
        ``recv``, first in line; does nothing if it is back already. Call it with Ctrl-C held back."""
        if self._returned is not handout.slot_set or any(self._state[k] != RETURNED for k in handout.workers):
            return
        for worker_id in reversed(handout.workers):
            self._state[worker_id] = READY
            self._ready.appendleft(worker_id)
        self._returned = handout.returned_before

    def _busy(self) -> dict[int, int]:
        """The workers with a command in flight: worker id -> the sequence number of that command."""
        return {k: self._seq[k] for k, state in enumerate(self._state) if state == BUSY}

    def _deadline(self, busy: dict[int, int]) -> float | None:
        """When the first of the ``busy`` workers passes the pool's ``timeout`` (None: no timeout).
        Worked out again after every wait: a worker that finished long ago but was not collected
        yet must not lend its deadline to one sent just now."""
        limit = self._config.timeout
        return None if limit is None else min(self._sent_at[k] for k in busy) + limit

    def _mark_ready(self, finished: list[int], busy: dict[int, int]) -> None:
        """Moves the workers that ``wait_some`` found finished from ``busy`` to the ready queue."""
        with interrupts_deferred():  # state and queue must agree: a worker in one but not the other is lost
            for worker_id in finished:
                self._state[worker_id] = READY
                self._ready.append(worker_id)
                del busy[worker_id]

    def settle(self) -> None:
        """Waits until no worker is stepping (before a control call); their results stay for recv."""
        busy = self._busy()
        while busy:
            self._mark_ready(self._waiter.wait_some(busy, "a batch in flight", self._deadline(busy)), busy)
        self._waiter.raise_failures("a batch in flight")

    def discard(self) -> None:
        """Ends async mode before a reset: waits for the workers in flight and forgets every result
        not yet returned."""
        if not self.in_flight:
            return
        self.settle()
        self._ready.clear()
        self._state = [IDLE] * len(self._slots)
        self._returned = None
        self.in_flight = False

    def _issue(self, seq: int, command: int, workers: Sequence[int]) -> None:
        """Sends ``command`` and marks its workers busy. Call it with Ctrl-C held back
        (``interrupts_deferred``): the states must say exactly which workers got the command.
        ``Pool.send`` holds it over the whole send, which also counts the step."""
        self._lifecycle.send(seq, command, workers)
        sent_at = monotonic()
        for worker_id in workers:
            self._state[worker_id], self._seq[worker_id] = BUSY, seq
            self._sent_at[worker_id] = sent_at
            self._was_reset[worker_id] = command == CMD_RESET
        self.in_flight = True


_STATE_NAMES = {IDLE: "not started", BUSY: "still stepping", READY: "not yet returned by recv", RETURNED: ""}
