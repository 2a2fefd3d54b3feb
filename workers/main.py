"""The entry point of a worker process: join the segment, build the slot's envs, serve commands.

Why and how: ``docs/internals.md``, "workers/main.py".
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from shmpool.calls import decode, failure_answer, serve_call
from shmpool.compiler_warnings import compiler_warnings
from shmpool.config import WorkerConfig
from shmpool.infos import InfoWriter
from shmpool.layout import (
    CMD_CALL,
    CMD_CLOSE,
    CMD_RESET,
    CMD_STEP,
    CMD_STEP_SOME,
    CTL_COMMAND,
    CTL_DONE,
    CTL_ERROR_ENV,
    CTL_ERROR_LENGTH,
    CTL_FINISHED_AT,
    CTL_NUM_DONE,
    CTL_NUM_INFO,
    CTL_PID,
    CTL_START_TICKS,
    CTL_STATUS,
    WORKER_CLOSED,
    WORKER_FAILED,
    WORKER_READY,
    Layout,
    split_command_word,
)
from shmpool.profiling import WORKER_PHASES, PhaseClock
from shmpool.system import (
    Doorbell,
    FileIdentity,
    ProcessWatch,
    Segment,
    doorbell_file,
    file_identity,
    ignore_interrupts,
    process_start_ticks,
    segment_file,
    set_parent_death_signal,
    this_pid,
    unlink_if_same,
)
from shmpool.workers.env_slot import EnvSlot
from shmpool.workers.envs import Slot
from shmpool.workers.hook_runner import HookError, HookRunner
from shmpool.workers.kernels import KernelSlot
from shmpool.workers.mujoco_batch import BatchTargets, MujocoSlot
from shmpool.workers.param_applier import ParamApplier
from shmpool.workers.targets import EnvTargets

#: The slot of each engine (``PoolConfig.engine``).
_SLICES: dict[str, type[Slot]] = {"python": EnvSlot, "numba": KernelSlot, "mujoco": MujocoSlot}
#: Where each engine's parameter values land (the numba engine's, its kernel's columns, once the slot
#: has made its matrix: ``KernelSlot.build``).
_TARGETS: dict[str, type[EnvTargets] | None] = {"python": EnvTargets, "numba": None, "mujoco": BatchTargets}


class OwnerGone(BaseException):
    """The trainer that owns the pool has died; derived from BaseException so env code cannot swallow it."""


#: Seconds the watchdog lets the main thread unwind (close envs, remove the pool) before it ends the
#: process itself; the whole exit stays well within the ~2 s the troubleshooting page promises.
OWNER_GONE_GRACE = 1.0
#: Exit status of a worker that the watchdog ended because its owner died.
EXIT_OWNER_GONE = 70


def run(config: WorkerConfig, call_pipe: Any, fault_pipe: Any) -> None:
    """Runs one worker until the trainer closes the pool or dies; ``call_pipe`` is this worker's end
    of its private pipe for control calls (``shmpool.calls``), ``fault_pipe`` the write end of
    the pipe where a crash in native code leaves the worker's Python stack for the trainer."""
    drop_inherited_signal_handlers()  # the trainer's handlers are not this process's to run
    # A segmentation fault or abort kills the worker before any except clause runs: faulthandler,
    # from its signal handler, is what can still tell the trainer where each thread was.
    # Non-blocking: a dump larger than the pipe is cut short instead of blocking the dying worker.
    os.set_blocking(fault_pipe.fileno(), False)
    faulthandler.enable(file=fault_pipe.fileno(), all_threads=True)
    # A forked worker starts with the collector off (Lifecycle.start_workers): what it inherited is
    # the trainer's to collect, so it is frozen, never collected here, before the collector runs.
    gc.freeze()
    gc.enable()
    ignore_interrupts()
    _keep_helper_fds_from_children()
    owner = ProcessWatch(config.owner_pid, config.owner_start_ticks)
    # OwnerGone is raised from the signal handler only inside the try below (armed), and only once
    # (leaving): a second signal must not interrupt the cleanup the first one started.
    armed, leaving = threading.Event(), threading.Event()

    def on_owner_death(signum: int, frame: Any) -> None:
        # The signal comes while the parent is still exiting: give it a moment to be gone. If it
        # stays alive, the signal meant only that the thread which started us exited.
        if not armed.is_set() or leaving.is_set():
            return
        for _ in range(50):
            if not owner.alive():
                leaving.set()
                raise OwnerGone()
            time.sleep(0.01)

    signal.signal(signal.SIGUSR1, on_owner_death)
    set_parent_death_signal(signal.SIGUSR1)
    segment = Segment.open(config.pool_name)
    owned = _pool_files(config, segment)
    watchdog = OwnerWatchdog(config.owner_pid, config.owner_start_ticks, lambda: remove_pool_files(owned))
    worker: Worker | None = None
    doorbells: list[Doorbell] = []
    try:
        armed.set()
        if not owner.alive():  # died before the handler was armed: the check that cannot miss it
            raise OwnerGone()
        layout, _ = Layout.read(segment.buffer)
        views = layout.views(segment.buffer)
        doorbells.append(Doorbell.open(config.doorbell))
        doorbells.append(Doorbell.open(config.trainer_doorbell))
        worker = Worker(config, views, doorbells[0], doorbells[1], owner, call_pipe)
        del views
        worker.serve()
    except OwnerGone:
        pass  # cleaned up below, where a second signal can no longer interrupt it
    finally:
        leaving.set()
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        if worker is not None:
            worker.close_envs()
        if not owner.alive():
            remove_pool_files(owned)  # nobody else will: the owner is gone
        watchdog.stop()  # after the cleanup: until then it still ends the process if closing envs hangs
        worker = None
        for doorbell in doorbells:
            doorbell.close()
        owner.close()
        call_pipe.close()
        segment.close()


def _pool_files(config: WorkerConfig, segment: Segment) -> dict[str, FileIdentity]:
    """The pool's segment and doorbell files as this worker found them: all that it may ever remove.

    The doorbells are looked at after the segment was opened; if the segment file is still the one
    that was opened afterwards, the pool was not replaced in between, so they are this pool's too
    (a pool creates its segment first and removes it last).
    """
    files = {doorbell_file(path): file_identity(doorbell_file(path)) for path in config.all_doorbells}
    if segment.identity is None or file_identity(segment_file(config.pool_name)) != segment.identity:
        return {}  # replaced before this worker even started: nothing under the name is ours
    owned = {path: identity for path, identity in files.items() if identity is not None}
    owned[segment_file(config.pool_name)] = segment.identity  # last: the segment goes last
    return owned


def remove_pool_files(owned: dict[str, FileIdentity]) -> None:
    """Unlinks the files in ``owned`` (doorbells, then the segment) that are still the ones recorded."""
    for path, identity in owned.items():
        unlink_if_same(path, identity)


def drop_inherited_signal_handlers() -> None:
    """Restores the default action of every signal that a handler inherited from the forking
    process catches: a Python handler (the trainer's own ``SIGTERM`` handler, say) or a
    ``faulthandler.register`` dump (absl registers one on ``SIGTERM``). Those are the trainer's:
    in a worker they would run the trainer's code, or print a stack dump each time a failed pool
    stops its workers. The crash handlers of ``faulthandler.enable`` are left alone."""
    for signum in signal.valid_signals():
        try:
            faulthandler.unregister(signum)
        except (RuntimeError, ValueError, OSError):  # enable()'s own signals, or none that can be
            pass
        try:
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
        except (ValueError, OSError, TypeError):  # SIGKILL, SIGSTOP and the like
            pass


def _keep_helper_fds_from_children() -> None:
    """Marks the multiprocess helpers' pipes that a forkserver worker inherits as close-on-exec.

    A forkserver child holds the write end of the forkserver's "alive" pipe and of the resource
    tracker's pipe (received over a socket, so inheritable); those helpers exit only when every
    holder has closed them. Programs that env code starts must not hold them: they would keep the
    forkserver and the tracker running long after the trainer and its workers are gone.
    """
    for module_name in ("multiprocess", "multiprocessing"):
        forkserver = sys.modules.get(f"{module_name}.forkserver")
        tracker = sys.modules.get(f"{module_name}.resource_tracker")
        fds = [
            getattr(getattr(forkserver, "_forkserver", None), "_forkserver_alive_fd", None),
            getattr(getattr(tracker, "_resource_tracker", None), "_fd", None),
        ]
        for fd in fds:
            if isinstance(fd, int):
                try:
                    os.set_inheritable(fd, False)
                except OSError:
                    pass


class OwnerWatchdog:
    """A daemon thread that notices the owner's death at once, whatever the main thread is doing.

    It blocks on the owner's pidfd (polls every 0.5 s without pidfds). When the owner dies it sends SIGUSR1 to the main
    thread, whose handler raises ``OwnerGone`` out of the env code (a sleeping or waiting env returns to Python at
    once); if the process has not ended after ``OWNER_GONE_GRACE`` seconds (an env stuck in C code), it removes the
    pool's files itself and ends the process with ``os._exit``.
    """

    def __init__(self, owner_pid: int, owner_start_ticks: int, cleanup: Callable[[], None]) -> None:
        self._watch = ProcessWatch(owner_pid, owner_start_ticks)
        self._cleanup = cleanup
        self._stop_read, self._stop_write = os.pipe()
        self._stopped = threading.Event()
        self._main_thread = threading.main_thread().ident
        self._thread = threading.Thread(target=self._run, name="shmpool-owner-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if not self._watch.wait_gone(self._stop_read):
            return
        if self._stopped.is_set():
            return
        try:
            signal.pthread_kill(self._main_thread, signal.SIGUSR1)  # type: ignore[arg-type]
        except (OSError, ValueError):  # the main thread is already gone
            pass
        if self._stopped.wait(OWNER_GONE_GRACE):
            return  # the main thread unwound and cleaned up
        try:
            self._cleanup()
        finally:
            os._exit(EXIT_OWNER_GONE)

    def stop(self) -> None:
        """Ends the watch (the worker is leaving on its own); the pipe wakes the thread at once."""
        self._stopped.set()
        try:
            os.write(self._stop_write, b"\0")
        except OSError:
            pass
        self._thread.join(OWNER_GONE_GRACE + 1.0)
        if not self._thread.is_alive():  # never close fds under a thread still selecting on them
            os.close(self._stop_read)
            os.close(self._stop_write)
            self._watch.close()


class Worker:
    """Serves the trainer's commands for one slot."""

    def __init__(
        self,
        config: WorkerConfig,
        views: dict[str, np.ndarray],
        doorbell: Doorbell,
        trainer_doorbell: Doorbell,
        owner: ProcessWatch,
        call_pipe: Any,
    ) -> None:
        self._config = config
        self._call_pipe = call_pipe
        self._views = views
        self._control = views["control"][config.worker_id]
        self._words = memoryview(self._control.data).cast("B").cast("q")
        self._doorbell = doorbell
        self._trainer_doorbell = trainer_doorbell
        self._owner = owner
        self._failed = False
        self.envs: Slot | None = None
        start, stop = config.env_ids
        self._step_mask = views["step_mask"][start:stop]
        self._info = InfoWriter(
            views["info_keys"][config.worker_id],
            views["info_values"][start:stop],
            views["info_mask"][start:stop],
            self._control,
        )

    def serve(self) -> None:
        """Builds the envs, reports ready (or the failure), then runs commands until close."""
        words = self._words
        self.build(in_own_process=True)
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
            self.run_command(seq, command)

    def build(self, *, in_own_process: bool) -> None:
        """Makes the slot's envs, parameters and hooks, then marks the worker ready (or failed, with
        the traceback). ``in_own_process``: run ``worker_init`` first (not in the trainer's slot)."""
        config = self._config
        pid = this_pid()  # first: a worker killed while it builds shows as dead to monitors, not starting
        self._words[CTL_PID], self._words[CTL_START_TICKS] = pid, process_start_ticks(pid) or 0
        try:
            if in_own_process and config.worker_init is not None:
                config.worker_init()
                ignore_interrupts()  # again: the user's setup must not make Ctrl-C kill workers
            params = None
            if config.params:
                specs = list(config.params)
                targets = _TARGETS[config.engine]
                params = ParamApplier(
                    specs,
                    self._views,
                    config.env_ids,
                    config.worker_id,
                    config.param_seed,
                    self._control,
                    config.env_label,
                    None
                    if targets is None
                    else targets(specs, config.env_ids[1] - config.env_ids[0], config.env_label),
                )
            self.envs = envs = _SLICES[config.engine](config, self._views, self._info, params)
            with compiler_warnings(config.env_factory, config.engine, show=False, where=config.env_label):
                envs.build()  # the trainer's probe warned once of what the compiler says
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
                    None if params is None else params.accepted,
                )
                envs.hooks.on_launch(*envs.hook_engine())  # hooks make their arrays (and compile) now
            if "profile" in self._views:
                self._instrument(PhaseClock(WORKER_PHASES, self._views["profile"][config.worker_id]))
        except Exception:  # noqa: BLE001 - any failure is reported to the trainer, not lost
            self._fail(None if self.envs is None else self.envs.current_env)
        else:
            self._words[CTL_STATUS] = WORKER_READY

    def run_command(self, seq: int, command: int) -> None:
        """Runs step, reset or call ``seq`` and publishes it done (a failure is reported, not raised)."""
        words = self._words
        if not self._failed and self.envs is not None:
            try:
                if command == CMD_STEP:
                    words[CTL_NUM_DONE] = self.envs.step()
                elif command == CMD_STEP_SOME:
                    words[CTL_NUM_DONE] = self.envs.step(np.flatnonzero(self._step_mask).tolist())
                elif command == CMD_RESET:
                    self.envs.reset()
                    words[CTL_NUM_DONE] = 0
                elif command == CMD_CALL:
                    self._serve_call(seq)
                    return  # the call changes no results: the step's infos stay as they were
                words[CTL_NUM_INFO] = self._info.dirty
            except Exception:  # noqa: BLE001
                self._fail(self.envs.current_env)
        self.publish_done(seq)

    def publish_done(self, seq: int) -> None:
        """Marks command ``seq`` done (last: the trainer reads results after seeing it) and rings."""
        self._words[CTL_FINISHED_AT] = time.monotonic_ns()
        self._words[CTL_DONE] = seq
        self._trainer_doorbell.ring()

    def _serve_call(self, seq: int) -> None:
        """Runs control call ``seq``: reads its request from the pipe, answers there, then marks it done
        (the answer goes first: the trainer reads it while it waits, so a large one cannot stall)."""
        pipe, envs, words = self._call_pipe, self.envs, self._words
        assert envs is not None
        while True:
            while not pipe.poll(self._config.poll_interval):
                self._check_owner()
                if words[CTL_COMMAND] >> 8 != seq:  # the trainer gave up on this call (close, say)
                    return
            try:
                request_seq, requests = decode(pipe.recv_bytes())
            except Exception as exc:  # noqa: BLE001 - an argument this process cannot unpickle: the call fails, not the pool
                answer = failure_answer(seq, -1, exc, traceback.format_exc())
                break
            if request_seq == seq:
                answer = serve_call(envs, seq, requests)
                break
        pipe.send_bytes(answer)
        self.publish_done(seq)

    def _instrument(self, clock: PhaseClock) -> None:
        """Times each phase of a step (``launch(profile=True)`` only)."""
        envs = self.envs
        assert envs is not None
        for owner, attribute, phase in (
            (envs, "step", "whole step"),
            (envs, "_run_envs", "env loop"),
            (envs, "_account", "episode accounting"),
            (self._info, "add", "infos"),
            (envs._params, "sync", "params sync"),
            (envs._params, "before_step", "draws"),
            (envs.hooks, "begin_step", "events"),
            (envs.hooks, "before_step", "before_step"),
            (envs.hooks, "after_step", "after_step"),
        ):
            if owner is not None:
                clock.instrument(owner, attribute, phase)

    def _check_owner(self) -> None:
        if not self._owner.alive():
            raise OwnerGone()

    def fail_cut_short(self, seq: int) -> None:
        """In the trainer's slot: reports the exception that cut command ``seq`` short (not an env's
        failure: a signal handler's ``SystemExit``, say) as the slot's failure, and the command done."""
        self._fail(None if self.envs is None else self.envs.current_env, cut_short=True)
        self.publish_done(seq)

    def _fail(self, env_id: int | None, cut_short: bool = False) -> None:
        """Publishes where it failed (first line) and the current exception's traceback; the
        trainer raises them as a WorkerError."""
        failure = sys.exc_info()[1]
        if isinstance(failure, HookError):
            where, env_id = f"hook {failure.name!r} (envs {failure.env_ids[0]}..{failure.env_ids[1] - 1})", None
        elif env_id is not None:
            where = f"env {env_id}"
        else:
            start, stop = self._config.env_ids
            where = f"envs {start}..{stop - 1}"
        if cut_short:
            where += ", cut short in the trainer's process (by a signal handler's exception?)"
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
