"""The entry point of a worker process: join the segment, build the slot's envs, serve commands.

A worker never exits on its own while its owner lives: after a failure it reports the traceback and
waits for the trainer's close command. When the owner dies (noticed in every bounded wait, and by
the parent-death signal), it removes the pool's segment and doorbells so nothing outlives it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from shmpool.config import WorkerConfig
from shmpool.infos import InfoWriter
from shmpool.layout import (
    CMD_CLOSE,
    CMD_RESET,
    CMD_STEP,
    CTL_COMMAND,
    CTL_DONE,
    CTL_ERROR_ENV,
    CTL_ERROR_LENGTH,
    CTL_NUM_DONE,
    CTL_NUM_INFO,
    CTL_PID,
    CTL_STATUS,
    WORKER_CLOSED,
    WORKER_FAILED,
    WORKER_READY,
    Layout,
    split_command_word,
)
from shmpool.system import (
    Doorbell,
    ProcessWatch,
    Segment,
    ignore_interrupts,
    set_parent_death_signal,
    unlink_doorbell,
)
from workers.envs import EnvSlice
from workers.hooks import HookFailed, HookRunner
from workers.params import ParamApplier


class OwnerGone(BaseException):
    """The trainer that owns the pool has died; derived from BaseException so env code cannot swallow it."""


def run(config: WorkerConfig) -> None:
    """Runs one worker until the trainer closes the pool or dies."""
    ignore_interrupts()
    owner = ProcessWatch(config.owner_pid, config.owner_start_ticks)

    def on_parent_death(signum: int, frame: Any) -> None:
        # The signal comes while the parent is still exiting: give it a moment to be gone. If it
        # stays alive, the signal meant only that the thread which started us exited.
        for _ in range(50):
            if not owner.alive():
                raise OwnerGone()
            time.sleep(0.01)

    signal.signal(signal.SIGUSR1, on_parent_death)
    set_parent_death_signal(signal.SIGUSR1)
    segment = Segment.open(config.pool_name)
    layout, _ = Layout.read(segment.buffer)
    views = layout.views(segment.buffer)
    doorbell = Doorbell.open(config.doorbell)
    trainer_doorbell = Doorbell.open(config.trainer_doorbell)
    worker = Worker(config, views, doorbell, trainer_doorbell, owner)
    try:
        if not owner.alive():
            raise OwnerGone()
        worker.serve()
    except OwnerGone:
        worker.close_envs()
        for path in config.all_doorbells:
            unlink_doorbell(path)
        segment.unlink()
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        worker.close_envs()
        del worker, views
        doorbell.close()
        trainer_doorbell.close()
        owner.close()
        segment.close()


class Worker:
    """Serves the trainer's commands for one slot."""

    def __init__(
        self,
        config: WorkerConfig,
        views: dict[str, np.ndarray],
        doorbell: Doorbell,
        trainer_doorbell: Doorbell,
        owner: ProcessWatch,
    ) -> None:
        self._config = config
        self._views = views
        self._control = views["control"][config.worker_id]
        self._words = memoryview(self._control.data).cast("B").cast("q")
        self._doorbell = doorbell
        self._trainer_doorbell = trainer_doorbell
        self._owner = owner
        self._failed = False
        self.envs: EnvSlice | None = None
        start, stop = config.env_ids
        self._info = InfoWriter(
            views["info_keys"][config.worker_id],
            views["info_values"][start:stop],
            views["info_mask"][start:stop],
            self._control,
        )

    def serve(self) -> None:
        """Builds the envs, reports ready (or the failure), then runs commands until close."""
        words = self._words
        words[CTL_PID] = os.getpid()
        config = self._config
        try:
            params = (
                ParamApplier(
                    list(config.params),
                    self._views,
                    config.env_ids,
                    config.worker_id,
                    config.param_seed,
                    self._control,
                    config.env_label,
                )
                if config.params
                else None
            )
            self.envs = envs = EnvSlice(config, self._views, self._info, params)
            envs.build()
            if config.hooks:
                envs.hooks = HookRunner(
                    list(config.hooks),
                    self._views,
                    config.worker_id,
                    config.env_ids,
                    config.param_seed,
                    envs.envs,
                    config.observation_space,
                    config.action_space,
                    envs.request_reset,
                    envs.resample,
                )
        except Exception:  # noqa: BLE001 - any failure is reported to the trainer, not lost
            self._fail(None if self.envs is None else self.envs.current_env)
        else:
            words[CTL_STATUS] = WORKER_READY
        self._trainer_doorbell.ring()

        def command_after(seq: int) -> Callable[[], bool]:
            return lambda: words[CTL_COMMAND] >> 8 != seq

        last_seq = 0
        while True:
            self._doorbell.wait_until(
                command_after(last_seq),
                spin=self._config.spin,
                poll_interval=self._config.poll_interval,
                on_idle=self._check_owner,
            )
            seq, command = split_command_word(words[CTL_COMMAND])
            last_seq = seq
            if command == CMD_CLOSE:
                words[CTL_STATUS] = WORKER_CLOSED
                words[CTL_DONE] = seq
                self._trainer_doorbell.ring()
                return
            if not self._failed and self.envs is not None:
                try:
                    if command == CMD_STEP:
                        words[CTL_NUM_DONE] = self.envs.step()
                    elif command == CMD_RESET:
                        self.envs.reset()
                        words[CTL_NUM_DONE] = 0
                    words[CTL_NUM_INFO] = self._info.dirty
                except Exception:  # noqa: BLE001
                    self._fail(self.envs.current_env)
            words[CTL_DONE] = seq  # published last: the trainer reads results after seeing it
            self._trainer_doorbell.ring()

    def _check_owner(self) -> None:
        if not self._owner.alive():
            raise OwnerGone()

    def _fail(self, env_id: int | None) -> None:
        """Publishes where it failed (first line) and the current exception's traceback; the
        trainer raises them as a WorkerError."""
        failure = sys.exc_info()[1]
        if isinstance(failure, HookFailed):
            where, env_id = f"hook {failure.name!r} (envs {failure.env_ids[0]}..{failure.env_ids[1] - 1})", None
        elif env_id is not None:
            where = f"env {env_id}"
        else:
            start, stop = self._config.env_ids
            where = f"envs {start}..{stop - 1}"
        text = (where + "\n" + traceback.format_exc()).encode("utf-8", errors="replace")
        errors_row = self._views["errors"][self._config.worker_id]
        if len(text) > len(errors_row):
            text = b"...(truncated)\n" + text[-(len(errors_row) - 16) :]
        errors_row[: len(text)] = np.frombuffer(text, dtype=np.uint8)
        self._words[CTL_ERROR_LENGTH] = len(text)
        self._words[CTL_ERROR_ENV] = -1 if env_id is None else env_id
        self._words[CTL_STATUS] = WORKER_FAILED
        self._failed = True

    def close_envs(self) -> None:
        """Closes the slot's envs once."""
        if self.envs is not None:
            envs, self.envs = self.envs, None
            envs.close()
