"""The command channel: how the trainer has its workers run one command (a reset, a step, a control
call) and knows it done, even when Ctrl-C or a failure cuts the command short.

Every call of the pool goes through the states of ``CommandChannel``::

    usable ──run()──▶ pending ──finish()──▶ usable
                         │                     │
                  Ctrl-C │                     │ a failure (ShmpoolError)
                         ▼                     ▼
                     pending: the next     broken: every later enter()
                     enter() finishes it   raises PoolBrokenError from it

A command is pending from before its first control word is written until every worker has done it:
Ctrl-C anywhere in between leaves it pending, and the next call sends it again (same sequence
number: a worker runs each once) and waits for it before issuing another. Async batches are
commands too, each to some workers (``shmpool.batches``): a command to all, or a checkpoint,
first waits for those in flight. The channel also publishes what the commands did for attached
processes (``stats``): the global step and the env steps per second.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from .batches import Batches
from .config import PoolConfig
from .errors import PoolBrokenError, ShmpoolError
from .layout import CMD_CALL, CMD_STEP, H_GLOBAL_STEP, H_STEPS_PER_SECOND
from .lifecycle import Lifecycle
from .results import Results
from .system import monotonic
from .waiting import Waiter


class CommandChannel:
    """The commands of one pool: issues them to every worker, waits for them, records them done.

    ``check_open`` raises if the pool is closed or not this process's; ``closing`` says whether
    ``close()`` has begun (in another thread, maybe): neither holds the pool (see ``pool._weakly``).
    """

    def __init__(
        self,
        config: PoolConfig,
        lifecycle: Lifecycle,
        waiter: Waiter,
        results: Results,
        batches: Batches,
        check_open: Callable[[], None],
        closing: Callable[[], bool],
        recover_writers: Callable[[], None],
    ) -> None:
        self._config = config
        self._recover_writers = recover_writers
        self._name = lifecycle.name
        self._lifecycle = lifecycle
        self._waiter = waiter
        self._results = results
        self._batches = batches
        self._check_open = check_open
        self._closing = closing
        self._fields = lifecycle.views
        self._header: Any = lifecycle.header
        #: Whether a step may go straight to its command: nothing pending, not broken, not closing.
        self.usable = False
        #: The failure that broke the pool: every later call raises ``PoolBrokenError`` from it.
        self.broken: BaseException | None = None
        #: A command sent (or being sent) whose results are not in yet: (seq, command, global step
        #: once done). Set before the first control word is written, so Ctrl-C anywhere in a send
        #: leaves it set, and the next call completes that command before issuing another.
        self.pending: tuple[int, int, int] | None = None
        #: Steps the pool took (with async batches, sends), published in the header for ``stats``.
        self.global_step = 0
        #: With autoreset DISABLED: envs whose episode ended and that no reset has restarted yet
        #: (gymnasium's vector envs refuse to step them, and so does the pool); None otherwise.
        self.ended = np.zeros(config.num_envs, np.bool_) if config.autoreset_mode == AutoresetMode.DISABLED else None
        self.env_steps = 0  # env steps taken: num_envs per step, the envs sent per send
        self._rate_since = (monotonic(), 0)

    def enter(self) -> None:
        """Raises if the pool cannot be used; finishes a command that Ctrl-C interrupted."""
        self._check_open()
        if self.broken is not None:
            raise PoolBrokenError(
                f"pool {self._name!r} failed earlier ({type(self.broken).__name__}: {self.broken}); "
                f"close() it and launch a new one"
            ) from self.broken
        if self.pending is not None:  # a reset or step was interrupted: let the workers finish it
            self.finish("an interrupted call")
        self.usable = True

    def settle_batches(self, *, discard: bool = False) -> None:
        """Waits for async batches in flight (before a control call, a checkpoint or a reset, which
        also forgets their results with ``discard``); a failure they report breaks the pool."""
        try:
            if discard:
                self._batches.discard()
            else:
                self._batches.settle()
        except ShmpoolError as error:
            self.broken = error
            raise

    def prepare(self, command: int, seq: int | None = None) -> int:
        """Makes ``command`` pending, and returns its sequence number: from here on, it is sent and
        waited for by ``finish``, or by the next ``enter`` if Ctrl-C comes first."""
        self.usable = False
        steps = self.global_step + (command == CMD_STEP)
        seq = self._lifecycle.next_seq() if seq is None else seq
        self.pending = (seq, command, steps)
        return seq

    def run(self, command: int, phase: str, seq: int | None = None) -> None:
        """Sends ``command`` to every worker and, unless it is a call (whose requests go next), waits
        until all have done it."""
        seq = self.prepare(command, seq)
        if command == CMD_CALL:
            self._lifecycle.send(seq, command)
        else:
            self.finish(phase)

    def finish(self, phase: str) -> list[Any]:
        """Sends the pending command (again, if Ctrl-C cut its send short), waits, and records it done;
        returns a call's answers."""
        assert self.pending is not None
        seq, command, steps = self.pending
        self._lifecycle.send(seq, command)
        answers: list[Any] = []
        try:
            if command == CMD_CALL:
                answers = self._waiter.receive_calls(seq, phase)
            self._waiter.wait_done(seq, phase)
            if command == CMD_STEP and self.ended is not None:  # here: an interrupted step counts too
                self.ended |= self._fields["terminations"] | self._fields["truncations"]
            self.global_step = steps  # before clearing pending: a repeat after Ctrl-C here is harmless
            self._header[H_GLOBAL_STEP] = steps
            self.pending = None
            self.usable = not self._closing()  # close() from another thread clears it first
            self._waiter.raise_failures(phase)
        except ShmpoolError as error:
            self.broken = error
            self.usable = False
            raise
        if self._config.param_specs and command != CMD_CALL:
            self._results.warn_refusals()
        return answers

    def count_send(self) -> None:
        """Counts an async send that went out as one step of the pool, and publishes the count."""
        self.global_step += 1
        self._header[H_GLOBAL_STEP] = self.global_step

    def count_env_steps(self, env_steps: int) -> None:
        """Counts ``env_steps`` for ``stats``; every 64 steps (or sends) publishes the rate and rolls
        back what a dead writer left (its rows stay unread until then, unless another writer does)."""
        self.env_steps += env_steps
        if self.global_step % 64 == 0:
            self.publish_rate()
            self._recover_writers()

    def publish_rate(self) -> None:
        """Env steps per second over the last second or so, for attached processes (``stats``)."""
        now = monotonic()
        elapsed = now - self._rate_since[0]
        if elapsed >= 1.0:
            rate = (self.env_steps - self._rate_since[1]) / elapsed
            self._header[H_STEPS_PER_SECOND] = int(rate)
            self._rate_since = (now, self.env_steps)
