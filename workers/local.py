"""The trainer's own slot (``launch(trainer_slot=True)``): the last slot's envs, stepped in the
trainer's process by the same worker code, with the same segment rows, parameters, hooks, infos and
episode records as a worker process's.

On few cores a worker process per slot plus the trainer makes one process more than there are
cores; stepping one slot in the trainer instead leaves each process a core. The trainer steps its
slot right after it has started the worker processes on theirs, so that the steps overlap. What it
costs: the envs share the trainer's process, so an env that hangs stops the trainer (no timeout
applies), one that crashes in native code ends it, and Ctrl-C waits for the slot's step to finish.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmpool.calls import Request, decode_answer, serve_call
from shmpool.config import WorkerConfig
from shmpool.interrupts import interrupts_deferred
from shmpool.layout import CMD_CALL, CMD_CLOSE
from shmpool.workers.main import Worker


class _Silent:
    """A doorbell nobody waits on: the trainer reads its own slot's words directly."""

    def ring(self) -> None:
        pass


class LocalSlot:
    """Runs one slot's commands in the calling process, each sequence number once."""

    def __init__(self, config: WorkerConfig, views: dict[str, np.ndarray]) -> None:
        self._worker = Worker(config, views, _Silent(), _Silent(), None, None)  # type: ignore[arg-type]
        self._worker.build(in_own_process=False)
        self._last_seq = 0

    @property
    def hooks(self) -> tuple[Any, ...]:
        """The hook objects this slot runs: its own copies of the pool's, as a worker process has."""
        return self._worker._config.hooks

    def run(self, seq: int, command: int) -> None:
        """Runs command ``seq`` (again: nothing, so that a send repeated after Ctrl-C is harmless).
        A call's requests come through ``call`` instead."""
        if seq == self._last_seq or command == CMD_CALL:
            return
        with interrupts_deferred():  # a step cut short here could not be run again
            self._last_seq = seq
            if command == CMD_CLOSE:
                self.close()
                self._worker.publish_done(seq)
            else:
                try:
                    self._worker.run_command(seq, command)
                except BaseException:  # not an env's failure, which run_command reports: a signal
                    # handler's SystemExit, say, raised in this thread mid-step. The envs are part-stepped:
                    # finishing the command must say so, not wait forever for a done it never saw.
                    self._worker.fail_cut_short(seq)
                    raise

    def call(self, seq: int, requests: list[Request]) -> tuple[Any, Any]:
        """Runs this slot's part of control call ``seq``; returns ``(results, failure)`` as a worker
        process's answer carries them (so results are copies, and an exception the function raised,
        ``KeyboardInterrupt`` and ``SystemExit`` included, is the failure, raised once the call is over)."""
        envs = self._worker.envs
        if envs is None:  # failed to build: the pool is broken, and says so before any call
            raise RuntimeError("the trainer's slot has no envs")
        with interrupts_deferred():  # run whole: a call cut short is not run again
            try:
                answer = serve_call(envs, seq, requests)
            finally:
                # Done whatever happened: finishing the call waits for this word, which nothing
                # else would ever set.
                self._last_seq = seq
                self._worker.publish_done(seq)
            _, results, failure = decode_answer(answer)
        return results, failure

    def close(self) -> None:
        """Closes the slot's envs once."""
        self._worker.close_envs()
