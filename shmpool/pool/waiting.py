"""The trainer's wait on its workers, and turning what went wrong into the right exception.

Every wait spins briefly, then sleeps on the trainer's doorbell in bounded slices; between slices it
checks that the workers it still waits for are alive and that the deadline has not passed. A worker
that reported a failure becomes a ``WorkerError`` with its traceback; a dead one a
``WorkerDiedError``; a late one a ``PoolTimeoutError``.
"""

from __future__ import annotations

import functools
import math
import operator
import signal
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ..calls import IN_RESULT, Failure, decode_answer
from ..errors import PoolClosedError, PoolTimeoutError, WorkerDiedError, WorkerError
from ..interrupts import interrupts_deferred
from ..layout import (
    CONTROL_WORDS,
    CTL_DONE,
    CTL_ERROR_ENV,
    CTL_ERROR_LENGTH,
    CTL_FINISHED_AT,
    CTL_STATUS,
    ERROR_BYTES,
    WORKER_FAILED,
    WORKER_STARTING,
)
from ..system import monotonic
from .lifecycle import Parts

#: Polls while waiting for workers before sleeping; each poll yields the core (cheap when it is idle).
TRAINER_SPIN = 300
#: How often a sleeping trainer wakes to check that its workers are alive and its deadline not passed.
TRAINER_POLL_INTERVAL = 0.05


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, in words."""
    if exitcode is None:
        return "is gone"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class Waiter:
    """Waits for the workers of one pool and raises what they report or what became of them."""

    def __init__(self, parts: Parts) -> None:
        config = self._config = parts.config
        self._closing = parts.closing
        lifecycle = self._lifecycle = parts.lifecycle
        self._name = lifecycle.name
        self._slots = config.slots
        self.words = memoryview(lifecycle.views["control"].data).cast("B").cast("q")
        self._done = [k * CONTROL_WORDS + CTL_DONE for k in range(len(self._slots))]
        self._status = [k * CONTROL_WORDS + CTL_STATUS for k in range(len(self._slots))]
        #: The word that says the command done when every slot is the trainer's own: the slot ran the
        #: command in this thread before the wait, and nobody rings (None: worker processes run slots).
        self._trainer_done = self._done[0] if lifecycle.local_id == 0 else None
        #: The raw answers to control call ``_answers_seq`` read so far, by worker id.
        self._answers: dict[int, bytes] = {}
        self._answers_seq = 0

    def wait_ready(self) -> None:
        """Returns once every worker has built its envs; raises if one failed, died or is too slow."""
        words, status, limit = self.words, self._status, self._config.launch_timeout
        deadline = monotonic() + limit
        self._sleep_until(
            lambda: all(words[i] != WORKER_STARTING for i in status),
            spin=0,
            on_idle=lambda: self._check_workers(
                deadline, limit, "launch", lambda k: words[status[k]] != WORKER_STARTING
            ),
        )
        self.raise_failures("launch")

    def wait_done(self, seq: int, phase: str) -> None:
        """Returns once every worker has finished command ``seq``; raises if one died or the pool's
        ``timeout`` passed (failures the workers report are raised by ``raise_failures``)."""
        words, done, limit = self.words, self._done, self._config.timeout
        if self._trainer_done is not None and words[self._trainer_done] == seq:
            return
        deadline = None if limit is None else monotonic() + limit
        if len(done) == 2:  # the common case, without a generator per poll
            first, second = done
            ready = lambda: words[first] == seq and words[second] == seq  # noqa: E731
        else:
            ready = lambda: all(words[i] == seq for i in done)  # noqa: E731
        self._sleep_until(
            ready,
            spin=TRAINER_SPIN,
            on_idle=lambda: self._check_workers(deadline, limit, phase, lambda k: words[done[k]] == seq),
        )

    def wait_some(
        self,
        pending: dict[int, int],
        phase: str,
        deadline: float | None,
        spin: int = TRAINER_SPIN,
        watched: dict[int, int] | None = None,
    ) -> list[int]:
        """Waits until at least one worker in ``pending`` (worker id: the sequence number of its
        command) has finished; returns those that have, first finished first. Raises like
        ``wait_done``, for a death among ``watched`` too (default: ``pending``), so that a worker
        nobody waits for yet is not reported only once those waited for finish."""
        words, done, limit = self.words, self._done, self._config.timeout
        items = [(done[k], seq) for k, seq in pending.items()]
        watched = pending if watched is None else watched
        self._sleep_until(
            lambda: any(words[word] == seq for word, seq in items),
            spin=spin,
            on_idle=lambda: self._check_workers(
                deadline, limit, phase, lambda k: k not in watched or words[done[k]] == watched[k]
            ),
        )
        finished = [k for k, seq in pending.items() if words[done[k]] == seq]
        if len(finished) > 1:  # several at once: by the time each finished, so that none is passed over
            finished.sort(key=lambda k: words[k * CONTROL_WORDS + CTL_FINISHED_AT])
        return finished

    def check_pending(self, pending: dict[int, int], sent_at: Sequence[float], phase: str, now: float) -> None:
        """Raises if a worker in ``pending`` (worker id: the sequence number of its command, sent at
        ``sent_at[worker id]``) died before finishing it, or has not finished it within the pool's
        ``timeout`` by ``now``: the check of a wait, for workers nobody is waiting for yet."""
        words, done, limit = self.words, self._done, self._config.timeout
        running = {k for k, seq in pending.items() if words[done[k]] != seq}
        self._check_workers(None, limit, phase, lambda k: k not in running)
        late = {k for k in running if limit is not None and now > sent_at[k] + limit}
        if late:
            self._check_workers(-math.inf, limit, phase, lambda k: k not in late)

    def receive_calls(self, seq: int, phase: str) -> list[tuple[list[Any] | None, Failure | None]]:
        """Each worker's answer ``(results, failure)`` to control call ``seq`` (see
        ``shmpool.calls``), read while it comes; answers to older calls are dropped. Raises like
        ``wait_done`` if a worker dies or the pool's ``timeout`` passes.

        The answers read so far are kept until all are in, so that a call that Ctrl-C interrupted
        and that is finished again neither waits for an answer it already has nor loses one."""
        limit = self._config.timeout
        deadline = None if limit is None else monotonic() + limit
        if self._answers_seq != seq:
            self._answers_seq, self._answers = seq, {}
        # Worker processes only: the trainer's own slot (trainer_slot) answers in-process.
        answers = [
            self._receive_answer(worker_id, seq, phase, deadline)
            for worker_id in range(len(self._lifecycle.call_pipes))
        ]
        self._answers = {}  # a render's frames can be large: not kept past the call
        return answers

    def _receive_answer(
        self, worker_id: int, seq: int, phase: str, deadline: float | None
    ) -> tuple[list[Any] | None, Failure | None]:
        pipe = self._lifecycle.call_pipes[worker_id]
        answers, done = self._answers, self._done[worker_id]
        others_finished = functools.partial(operator.ne, worker_id)  # only this worker's death matters
        while True:
            data = answers.get(worker_id)
            if data is None:
                # What has come already is taken before any wait: a call that Ctrl-C interrupted is
                # finished again at once (Ctrl-C every 20 ms must not cut short a 50 ms wait forever).
                finished = self.words[done] == seq  # read before the pipe: a worker answers, then marks done
                if not pipe.poll(0):
                    if finished:  # done with nothing to read: a worker that failed earlier answers nothing
                        return None, None
                    if not pipe.poll(TRAINER_POLL_INTERVAL):
                        self._check_workers(deadline, self._config.timeout, phase, others_finished)
                    continue
                try:
                    with interrupts_deferred():  # a message half read, or read and not kept, would be lost
                        data = answers[worker_id] = pipe.recv_bytes()
                except EOFError:  # the worker died while answering: say so with its exit status
                    processes = self._lifecycle.processes  # emptied by a close (the exit's too): said below
                    if not self._closing() and worker_id < len(processes):
                        processes[worker_id].join(1.0)
                    self._check_workers(None, None, phase, others_finished)
                    raise
            try:
                answer_seq, results, failure = decode_answer(data)
            except Exception as exc:  # noqa: BLE001 - a damaged message: it fails the call, not the pool
                text = traceback.format_exc()
                return None, Failure(-1, IN_RESULT, None, type(exc).__name__, str(exc), text, "it is damaged")
            if answer_seq == seq:
                return results, failure
            del answers[worker_id]  # an answer to a call that Ctrl-C interrupted earlier

    def _sleep_until(self, ready: Callable[[], bool], *, spin: int, on_idle: Callable[[], None]) -> None:
        doorbell = self._lifecycle.trainer_doorbell
        assert doorbell is not None
        doorbell.wait_until(ready, spin=spin, poll_interval=TRAINER_POLL_INTERVAL, on_idle=on_idle)

    def _check_workers(
        self, deadline: float | None, limit: float | None, phase: str, finished: Callable[[int], bool]
    ) -> None:
        """Raises if the pool is being closed, if a worker that has not finished is dead, or if the
        deadline has passed."""
        if self._closing():
            raise PoolClosedError(f"pool {self._name!r} was closed (by another thread) during {phase}")
        processes = self._lifecycle.processes
        for worker_id, process in enumerate(processes):
            if not finished(worker_id) and process.exitcode is not None:
                start, stop = self._slots[worker_id]
                self.words[worker_id * CONTROL_WORDS + CTL_STATUS] = WORKER_FAILED  # as attached processes see it
                stack = self._lifecycle.fault_report(worker_id)
                cause = (
                    f"; its threads' Python stacks when it crashed (faulthandler):\n{stack}"
                    if stack
                    else "; likely causes: a kill from outside, running out of memory (see dmesg), "
                    "or a crash in native env code"
                )
                raise WorkerDiedError(
                    f"worker {worker_id} (pid {process.pid}, envs {start}..{stop - 1}) of pool {self._name!r} "
                    f"{describe_exit(process.exitcode)} during {phase}{cause}",
                    worker_id=worker_id,
                    exitcode=process.exitcode,
                )
        if deadline is not None and monotonic() > deadline:
            stuck = [k for k in range(len(self._slots)) if not finished(k)]
            raise PoolTimeoutError(
                f"pool {self._name!r}: worker(s) {stuck} did not finish {phase} within {limit} s "
                f"(envs {', '.join(f'{self._slots[k][0]}..{self._slots[k][1] - 1}' for k in stuck)}); "
                f"raise launch({'launch_timeout' if phase == 'launch' else 'timeout'}=...) if the env is this slow"
            )

    def raise_failures(self, phase: str) -> None:
        """Raises the ``WorkerError`` of the first worker that reported a failure, if any."""
        words = self.words
        for worker_id, status in enumerate(self._status):
            if words[status] == WORKER_FAILED:
                raise self._worker_error(worker_id, phase)

    def _worker_error(self, worker_id: int, phase: str) -> WorkerError:
        base = worker_id * CONTROL_WORDS
        length = min(int(self.words[base + CTL_ERROR_LENGTH]), ERROR_BYTES)
        errors_row = self._lifecycle.views["errors"][worker_id, :length]
        where, _, text = errors_row.tobytes().decode("utf-8", errors="replace").partition("\n")
        env_id = int(self.words[base + CTL_ERROR_ENV])
        lines = text.strip().splitlines()
        summary = lines[-1] if lines else "unknown error"
        return WorkerError(
            f"worker {worker_id} of pool {self._name!r} failed in {where} ({self._config.env_label}) during {phase}: "
            f"{summary}",
            worker_id=worker_id,
            env_id=env_id if env_id >= 0 else None,
            traceback_text=text,
        )
