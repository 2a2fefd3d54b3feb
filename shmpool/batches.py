"""EnvPool-style asynchronous batches over a pool: ``async_reset``, ``send(actions, env_ids)`` and
``recv()``, so that the trainer runs its policy on one batch while workers step the others.

The rule for ``batch_size``: a batch is made of whole slots. A worker steps its whole slot at
once (one command, its rows written together), so ``batch_size`` must be a multiple of the slot
size, and slots must be equal (``num_envs % num_workers == 0``). PufferLib has the same rule;
EnvPool lets any ``B`` through by stepping and returning single envs, which here would cost a
command and a wait per env instead of per slot. With ``batch_size == num_envs`` every worker is
one batch: the pool behaves as the synchronous one.

Each worker is in one of four states, and moves through them in order::

    IDLE ──send/async_reset──▶ BUSY ──DONE seen──▶ READY ──recv──▶ RETURNED ──send──▶ BUSY ...

``recv`` waits until ``batch_size / slot size`` workers are READY, takes the first to have finished
(whatever their ids) and returns their rows, in worker order, with ``infos["env_id"]``; ``send`` takes actions for
whole RETURNED slots. Each worker's command has its own sequence number, so one worker can start
a step while another is still on its previous one.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .config import PoolConfig
from .layout import CMD_RESET, CMD_STEP
from .lifecycle import Lifecycle
from .protocol import interrupts_deferred
from .results import Results
from .spaces import ActionChecker
from .waiting import Waiter

IDLE, BUSY, READY, RETURNED = range(4)


class Batches:
    """The async state of one pool: which worker is where, and the calls that move them."""

    def __init__(
        self,
        config: PoolConfig,
        lifecycle: Lifecycle,
        waiter: Waiter,
        results: Results,
        action_views: list[np.ndarray],
        action_space: Any,
    ) -> None:
        self._config = config
        self._lifecycle = lifecycle
        self._waiter = waiter
        self._results = results
        self._action_views = action_views
        self._action_space = action_space
        self._slots = config.slots
        self.batch_size: int = config.batch_size  # type: ignore[assignment]
        self._workers_per_batch = self.batch_size // (self._slots[0][1] - self._slots[0][0])
        num_workers = len(self._slots)
        self._state = [IDLE] * num_workers
        self._seq = [0] * num_workers  # the sequence number of each worker's command in flight
        self._was_reset = [False] * num_workers  # whether that command is a reset
        self._ready: collections.deque[int] = collections.deque()
        self._checkers: dict[int, ActionChecker] = {}
        self._worker_of = np.repeat(np.arange(num_workers), [stop - start for start, stop in self._slots])
        #: Env ids of the last recv, the default of ``send``.
        self.last_env_ids: np.ndarray | None = None
        #: Whether any worker is between a send (or async_reset) and the send after its recv.
        self.in_flight = False

    def start_reset(self, seq: int) -> None:
        """Sends the reset the pool has just prepared in the segment (flags, seeds, options) to every
        worker; ``recv`` returns its observations batch by batch."""
        self._discard()
        self._issue(seq, CMD_RESET, list(range(len(self._slots))))

    def send(self, actions: Any, env_ids: Any, seq: Callable[[], int]) -> None:
        """Writes ``actions`` (one row per env id) and starts the step of the envs' workers."""
        ids = self._check_env_ids(self.last_env_ids if env_ids is None else env_ids)
        workers = np.unique(self._worker_of[ids]).tolist()
        for worker_id in workers:
            start, stop = self._slots[worker_id]
            if self._state[worker_id] != RETURNED:
                raise RuntimeError(
                    f"send: envs {start}..{stop - 1} (worker {worker_id}) have no results returned by recv() "
                    f"awaiting actions ({_STATE_NAMES[self._state[worker_id]]}); send actions only for the "
                    f"env ids of infos['env_id'] of a recv()"
                )
        if len(ids) != sum(self._slots[k][1] - self._slots[k][0] for k in workers):
            raise ValueError(
                f"send: the env ids must cover whole slots (a worker steps all its envs at once): "
                f"{[f'{self._slots[k][0]}..{self._slots[k][1] - 1}' for k in workers]}, got {len(ids)} ids"
            )
        checker = self._checkers.get(len(ids))
        if checker is None:
            checker = self._checkers[len(ids)] = ActionChecker(self._action_space, len(ids), self._config.env_label)
        for view, part in zip(self._action_views, checker(actions, ids)):
            view[ids] = part
        self._issue(seq(), CMD_STEP, workers)

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The results of the first ``batch_size`` envs to finish, with ``infos["env_id"]``."""
        busy = {k: self._seq[k] for k, state in enumerate(self._state) if state == BUSY}
        if len(self._ready) + len(busy) < self._workers_per_batch:
            raise RuntimeError(
                f"recv needs {self.batch_size} envs in flight, but only "
                f"{(len(self._ready) + len(busy)) * self.batch_size // self._workers_per_batch} are: call "
                f"async_reset() first, and send() the actions of the envs each recv() returns"
            )
        while len(self._ready) < self._workers_per_batch:
            for worker_id in self._waiter.wait_some(busy, "recv"):
                self._state[worker_id] = READY
                self._ready.append(worker_id)
                del busy[worker_id]
        self._waiter.raise_failures("recv")
        # The first to finish, in worker order within the batch: a batch of every env is in env order.
        chosen = sorted(self._ready.popleft() for _ in range(self._workers_per_batch))
        for worker_id in chosen:
            self._state[worker_id] = RETURNED
        results = self._results.batch(chosen, [self._was_reset[k] for k in chosen])
        self.last_env_ids = results[4]["env_id"]
        return results

    def settle(self) -> None:
        """Waits until no worker is stepping (before a control call); their results stay for recv."""
        busy = {k: self._seq[k] for k, state in enumerate(self._state) if state == BUSY}
        while busy:
            for worker_id in self._waiter.wait_some(busy, "a batch in flight"):
                self._state[worker_id] = READY
                self._ready.append(worker_id)
                del busy[worker_id]
        self._waiter.raise_failures("a batch in flight")

    def _discard(self) -> None:
        """Waits for the workers in flight and forgets every result not yet returned (a reset follows)."""
        self.settle()
        self._ready.clear()
        self._state = [IDLE] * len(self._slots)
        self.last_env_ids = None
        self.in_flight = False

    def discard(self) -> None:
        """Ends async mode before a synchronous reset."""
        if self.in_flight:
            self._discard()

    def _issue(self, seq: int, command: int, workers: list[int]) -> None:
        with interrupts_deferred():  # the states must say exactly which workers got the command
            self._lifecycle.send(seq, command, workers)
            for worker_id in workers:
                self._state[worker_id], self._seq[worker_id] = BUSY, seq
                self._was_reset[worker_id] = command == CMD_RESET
            self.in_flight = True

    def _check_env_ids(self, env_ids: Any) -> np.ndarray:
        if env_ids is None:
            raise RuntimeError("send: no env ids given and no recv() returned any yet; call async_reset() and recv()")
        ids = np.asarray(env_ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"send: env_ids must be a 1-d array of ints (infos['env_id'] of recv), got {env_ids!r:.80}")
        if len(ids) and (ids.min() < 0 or ids.max() >= len(self._worker_of)):
            raise IndexError(f"send: env ids {ids.tolist()!r:.80} are outside 0..{len(self._worker_of) - 1}")
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"send: env ids repeat: {ids.tolist()!r:.80}")
        if not len(ids):
            raise ValueError("send: no env ids")
        return ids


_STATE_NAMES = {IDLE: "not started", BUSY: "still stepping", READY: "not yet returned by recv", RETURNED: ""}


def select_rows(infos: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """gymnasium vector infos (arrays over envs, nested dicts) cut down to ``rows``, in that order."""
    return {key: select_rows(value, rows) if isinstance(value, dict) else value[rows] for key, value in infos.items()}


def worker_rows(slots: Sequence[tuple[int, int]], workers: Sequence[int]) -> np.ndarray:
    """The env ids of the given workers' slots, worker after worker."""
    return np.concatenate([np.arange(*slots[k]) for k in workers])
