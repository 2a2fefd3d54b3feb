"""A pool's life: probing an env and planning its segment, creating it, starting the workers, sending
them commands, and stopping and releasing everything exactly once (by ``close()``, garbage
collection or exit).

``Lifecycle`` holds no reference to the ``Pool``, so a ``weakref.finalize`` can release it when
the pool is garbage collected.
"""

from __future__ import annotations

import copy
import gc
import importlib
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import multiprocess
import numpy as np

from ..bindings import initial_records
from ..compiler_warnings import compiler_warnings
from ..config import LOCAL_SLOT_ENTRY_POINT, WORKER_ENTRY_POINT, PoolConfig, WorkerConfig, make_env
from ..episodes import episode_dtype
from ..errors import PoolClosedError
from ..events import event_dtype, mask_bytes
from ..infos import INFO_KEY_DTYPE
from ..interrupts import CallLock, interrupts_deferred
from ..layout import (
    CMD_CLOSE,
    CONTROL_WORDS,
    CTL_COMMAND,
    ERROR_BYTES,
    H_STATE,
    RESET_OPTION_BYTES,
    SEED_WORDS,
    STATE_CLOSING,
    STATE_RUNNING,
    Layout,
    command_word,
    header_words,
)
from ..main_script import by_name_from_main
from ..params import REFUSAL_TEXT_DTYPE, applied_dtype, block_dtype, constructor_defaults
from ..profiling import WORKER_PHASES
from ..protocol import WRITERS_WORDS, init_writer_mutex
from ..spaces import Leaf
from ..system import Doorbell, Segment, doorbell_path, monotonic, process_start_ticks, usable_cores

if TYPE_CHECKING:
    from .batches import Batches
    from .results import Results
    from .waiting import Waiter

#: Polls a worker makes for its next command before sleeping; each poll yields the core. Only while
#: every worker has a core of its own (``num_workers <= usable cores``): beyond that, idle workers
#: that spin keep the cores from the ones stepping, and a sleeping worker's slot starves; with as
#: many workers as cores, spinning wins, since a wake-up costs more than a short spin
#: (``docs/benchmarks.md``, "Numbers behind design choices").
WORKER_SPIN = 300
#: How often a sleeping worker wakes to check that its owner is alive.
WORKER_POLL_INTERVAL = 0.2
#: How long close() waits for workers to leave by themselves before terminating, then killing, them.
CLOSE_GRACE = 2.0


def own_copies(hooks: Sequence[Any]) -> tuple[Any, ...]:
    """The trainer's slot's own copies of the pool's hooks, as a worker process gets its own (pickled
    or forked): a hook keeps per-slot state (random streams, compiled arrays, the rows it kicked),
    which the user's object, reused for another pool or shared by two, must not carry over. A hook
    that cannot be copied is used as given."""
    try:
        return tuple(copy.deepcopy(list(hooks)))
    except Exception:  # noqa: BLE001 - an uncopyable hook (a lock, a handle) is shared, as before
        return tuple(hooks)


class EnvProbe(NamedTuple):
    """What one env, made at launch and closed again, tells the pool before its segment is planned."""

    metadata: dict[str, Any]
    render_mode: str | None
    observation_space: Any
    action_space: Any
    #: The first ``params`` and ``applied`` records of every env; None without params.
    initial_params: tuple[np.ndarray, np.ndarray] | None


def probe_env(config: PoolConfig) -> EnvProbe:
    """Makes env 0 (with the params' constructor defaults), reads its metadata, render mode and
    spaces, then the params' first records (checking every bind path against it), and closes it."""
    declared = config.declared_params
    with compiler_warnings(config.env, config.engine, show=True, where=config.env_label):
        env = make_env(
            config.factory_of(0), {**(config.env_kwargs or {}), **constructor_defaults(config.param_specs, declared)}
        )
    try:
        metadata, render_mode = dict(env.metadata), env.render_mode
        observation_space, action_space = env.observation_space, env.action_space
        initial = (
            initial_records(config.param_specs, declared, env, config.env_label, config.num_envs) if declared else None
        )
    finally:
        env.close()
    return EnvProbe(metadata, render_mode, observation_space, action_space, initial)


def plan_layout(config: PoolConfig, observation_leaves: Sequence[Leaf], action_leaves: Sequence[Leaf]) -> Layout:
    """The fields of the segment of a pool with this config and these spaces (see ``shmpool.layout``)."""
    n, w = config.num_envs, config.num_workers
    assert w is not None
    param_specs = config.param_specs
    specs: list[tuple[str, Any, tuple[int, ...]]] = [
        ("control", np.int64, (w, CONTROL_WORDS)),
        ("errors", np.uint8, (w, ERROR_BYTES)),
        ("writers", np.int64, (WRITERS_WORDS,)),
    ]
    specs += [(leaf.field_name("actions"), leaf.dtype, (n, *leaf.shape)) for leaf in action_leaves]
    prefixes = ["observations", "final_observations"] if config.same_step else ["observations"]
    specs += [(leaf.field_name(p), leaf.dtype, (n, *leaf.shape)) for p in prefixes for leaf in observation_leaves]
    specs += [
        ("rewards", np.float64, (n,)),
        ("terminations", np.bool_, (n,)),
        ("truncations", np.bool_, (n,)),
        ("episode_return", np.float64, (n,)),
        ("episode_length", np.int64, (n,)),
        ("episode_time", np.float64, (n,)),
        ("episode_index", np.int64, (n,)),
        ("reset_seed", np.uint64, (n, SEED_WORDS)),
        ("reset_flags", np.uint8, (n,)),
        ("reset_options", np.uint8, (RESET_OPTION_BYTES,)),
        ("reset_options_length", np.int64, (1,)),
        ("reset_global_step", np.int64, (1,)),
        ("step_mask", np.bool_, (n,)),
        ("info_keys", INFO_KEY_DTYPE, (w, config.info_keys)),
        ("info_values", np.uint8, (n, config.info_keys, config.info_bytes)),
        ("info_mask", np.bool_, (n, config.info_keys)),
    ]
    applied = applied_dtype(param_specs) if param_specs else None
    metrics = list(config.episode_metrics or {})
    specs += [
        ("episode_records", episode_dtype(applied, metrics), (w, config.episode_capacity)),
        ("episode_heads", np.int64, (w,)),
        ("episode_reserved", np.int64, (w,)),
    ]
    if config.hooks:
        specs += [
            ("events", event_dtype(config.event_payload, mask_bytes(config.slots)), (w, config.event_capacity)),
            ("event_heads", np.int64, (w,)),
            ("event_tails", np.int64, (w,)),
            ("event_undo_heads", np.int64, (w,)),
        ]
    if param_specs:
        specs += [
            ("params", block_dtype(param_specs), (n,)),
            ("params_seq", np.int64, (n,)),
            ("params_undo", block_dtype(param_specs), (n,)),
            ("applied", applied, (n,)),
            ("params_accepted", block_dtype(param_specs), (n,)),
            ("param_refusals", np.int64, (w, len(param_specs))),
            ("param_refusal_text", REFUSAL_TEXT_DTYPE, (w, len(param_specs))),
        ]
    if config.profile:
        specs.append(("profile", np.int64, (w, len(WORKER_PHASES), 2)))
    meta = {
        "num_envs": n,
        "num_workers": w,
        "slots": [list(slot) for slot in config.slots],
        "env": config.env_label,
        "autoreset_mode": config.autoreset_mode.value,  # type: ignore[union-attr]
        "params": [spec.to_json() for spec in param_specs],
        "param_seed": config.param_seed,
        "hooks": config.hook_names,
        "episode_metrics": config.episode_metrics,
        "created": time.time(),
    }
    return Layout.plan(specs, meta)


#: Held while a launch forks its workers with the garbage collector off (see ``start_workers``).
_FORKING = threading.Lock()


def _new_forking_lock() -> None:
    global _FORKING
    _FORKING = threading.Lock()  # a child forked while another thread launched must not inherit it held


os.register_at_fork(after_in_child=_new_forking_lock)


class Lifecycle:
    """What a pool must release, and the calls that create, drive and release it."""

    def __init__(self, config: PoolConfig, calls: CallLock) -> None:
        self.config = config
        self._calls = calls  # the pool's call lock: a call that holds it may use this process's handles
        self.name: str = config.name  # type: ignore[assignment]
        self.owner_pid = os.getpid()
        self.owner_start_ticks = process_start_ticks(self.owner_pid) or 0
        self.segment: Segment | None = None
        self.views: dict[str, np.ndarray] = {}
        self.header: memoryview | None = None
        self.trainer_doorbell: Doorbell | None = None
        self.worker_doorbells: list[Doorbell] = []
        self.processes: list[Any] = []
        #: With ``trainer_slot``: the last slot, stepped in this process (shmpool.workers.local).
        self.local: Any = None
        self.local_id = len(config.slots) - 1 if config.trainer_slot else None
        #: The owner's end of each worker's private pipe, for control calls (see shmpool.calls).
        self.call_pipes: list[Any] = []
        #: The trainer's read end of each worker's fault pipe: what Python's faulthandler wrote there
        #: when the worker crashed in native code (its stack), for the error that reports the death.
        self.fault_pipes: list[Any] = []
        self._fault_reports: dict[int, str] = {}
        self._unlinked = False  # whether close() removed the names (see _unlink)
        #: Another thread's close waits for this one's; a signal handler's, inside it, returns at once.
        self._close_lock = threading.RLock()
        self.seq = 0

    def create(
        self, layout: Layout, initial_params: tuple[np.ndarray, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Creates the segment and the doorbells; returns the field views. ``initial_params``: the
        ``params`` and ``applied`` records, written before the header, whose magic comes last: a
        process that attaches meanwhile waits, rather than writing params that these would overwrite."""
        segment = self.segment = Segment.create(self.name, layout.size)
        self.views = layout.views(segment.buffer)
        init_writer_mutex(self.views["writers"])
        if initial_params is not None:
            self.views["params"][:], self.views["applied"][:] = initial_params
        layout.write_header(segment.buffer, owner_pid=self.owner_pid, owner_start_ticks=self.owner_start_ticks)
        self.header = header_words(segment.buffer)
        self.trainer_doorbell = Doorbell.create(doorbell_path(self.name, "t"))
        for worker_id in range(len(self.config.slots)):
            self.worker_doorbells.append(Doorbell.create(doorbell_path(self.name, f"w{worker_id}")))
        return self.views

    def start_workers(self, observation_space: Any, action_space: Any) -> None:
        """Starts one process per slot, each told what it needs in a ``WorkerConfig``."""
        config = self.config
        module_name, function_name = WORKER_ENTRY_POINT.split(":")
        entry_point: Callable[[WorkerConfig], None] = getattr(importlib.import_module(module_name), function_name)
        trainer_doorbell = self.trainer_doorbell
        assert trainer_doorbell is not None
        all_doorbells = (trainer_doorbell.path, *(d.path for d in self.worker_doorbells))
        context = multiprocess.get_context(config.start_method)
        if config.engine == "numba":
            # Compiled here, once, before the workers start: forked ones inherit the machine code,
            # the others load what this wrote to numba's cache.
            from ..kernels import load

            load(config.kernel).warm_up()
        # Workers must ignore Ctrl-C (the trainer stops them); block SIGINT while they start so that
        # none arrives before the worker has installed its handler. The mask is inherited. It holds
        # SIGINT in this thread only: one that another thread takes raises here between two calls,
        # and inside a fork it would lose the new worker, so it is held back until all are counted.
        held = interrupts_deferred()
        held.hold()
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        # A forked worker inherits the trainer's garbage too. Collected there, a finalizer of the
        # trainer's native objects (a Ray actor handle, a MuJoCo batch) runs against threads and
        # locks that the fork did not copy, and crashes or hangs the worker. So the forks happen with
        # the collector off, which the workers inherit, and a worker freezes what it inherited
        # before it turns the collector on (workers.main.run). One launch forks at a time: another
        # thread's launch must not turn the collector back on under these forks.
        forking = context.get_start_method() == "fork"
        if forking:
            _FORKING.acquire()
            collecting = gc.isenabled()
            gc.disable()
        local_config = None
        try:
            for worker_id, slot in enumerate(config.slots):
                factory: Any = config.env[slice(*slot)] if isinstance(config.env, tuple) else config.env
                worker_config = WorkerConfig(
                    pool_name=self.name,
                    worker_id=worker_id,
                    env_ids=slot,
                    env_factory=factory if forking else by_name_from_main(factory),
                    env_kwargs=dict(config.env_kwargs or {}),
                    env_label=config.env_label,
                    autoreset_mode=config.autoreset_mode,  # type: ignore[arg-type]
                    owner_pid=self.owner_pid,
                    owner_start_ticks=self.owner_start_ticks,
                    observation_space=observation_space,
                    action_space=action_space,
                    doorbell=self.worker_doorbells[worker_id].path,
                    trainer_doorbell=trainer_doorbell.path,
                    all_doorbells=all_doorbells,
                    params=tuple(config.param_specs),
                    param_seed=config.param_seed,
                    hooks=tuple(config.hooks),
                    episode_metrics=dict(config.episode_metrics or {}),
                    spin=WORKER_SPIN if len(config.slots) <= usable_cores() else 0,
                    poll_interval=WORKER_POLL_INTERVAL,
                    worker_init=config.worker_init,
                    same_observation_spaces=config.observation_mode == "same",
                    engine=config.engine,
                    kernel=config.kernel,
                    threads=max(1, usable_cores() // len(config.slots)),
                )
                if worker_id == self.local_id:
                    local_config = replace(worker_config, hooks=own_copies(config.hooks))
                    continue
                owner_end, worker_end = context.Pipe(duplex=True)
                self.call_pipes.append(owner_end)
                fault_reader, fault_writer = context.Pipe(duplex=False)
                self.fault_pipes.append(fault_reader)
                process = context.Process(
                    target=entry_point,
                    args=(worker_config, worker_end, fault_writer),
                    name=f"shmpool-{self.name}-w{worker_id}",
                    daemon=True,
                )
                try:
                    process.start()
                finally:
                    # the worker's own copies only: a later worker must not inherit them
                    worker_end.close()
                    fault_writer.close()
                self.processes.append(process)
        finally:
            if forking:
                if collecting:
                    gc.enable()
                _FORKING.release()
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
            held.release()  # raises a Ctrl-C held back meanwhile, every started worker now counted
        if local_config is not None:  # built while the workers build theirs
            module_name, class_name = LOCAL_SLOT_ENTRY_POINT.split(":")
            self.local = getattr(importlib.import_module(module_name), class_name)(local_config, self.views)

    def next_seq(self) -> int:
        """The sequence number of the next command (taken before sending, so that an interrupted
        send can be repeated with the same number)."""
        self.seq += 1
        return self.seq

    def send(self, seq: int, command: int, worker_ids: Sequence[int] | None = None) -> None:
        """Issues command ``seq`` to the given workers (all by default) and rings them.

        Idempotent: a worker runs each sequence number once, and surplus rings are only wake-ups,
        so a send that Ctrl-C cut short is completed by sending it again.
        """
        word = command_word(seq, command)
        control = self.views["control"]
        targets = range(len(self.worker_doorbells)) if worker_ids is None else worker_ids
        for worker_id in targets:
            control[worker_id, CTL_COMMAND] = word
        for worker_id in targets:
            if worker_id != self.local_id:
                self.worker_doorbells[worker_id].ring()
        if self.local is not None and self.local_id in targets:
            self.local.run(seq, command)  # after the workers started theirs: the steps overlap

    def mark_running(self) -> None:
        """Tells attached processes that the pool is up."""
        assert self.header is not None
        self.header[H_STATE] = STATE_RUNNING

    def disown(self) -> None:
        """In a forked child: forgets the parent's workers, so that multiprocess's exit handler in the
        child, which takes them for its own children, does not SIGTERM them."""
        children = getattr(multiprocess.process, "_children", None)
        if children is not None:
            for process in self.processes:
                children.discard(process)

    def close(self) -> None:
        """Stops the workers (close command, then SIGTERM, then SIGKILL) and unlinks everything. What this
        process uses (the slot's envs, the doorbells' semaphores) stays, until a later ``close``, while
        another thread's call holds the call lock (a call that outlasted close()'s wait; at exit, a daemon
        thread's step asleep on a doorbell, which a closed semaphore would leave on unmapped memory)."""
        # A forked child must not tear down its parent's pool.
        if os.getpid() != self.owner_pid or self._close_lock._is_owned():  # type: ignore[attr-defined]
            return
        with self._close_lock, interrupts_deferred():  # the garbage collector's and the exit's too
            acquired = False
            try:
                acquired = self._calls.acquire(timeout=0)
                self._stop_workers(keep_local=not acquired)
            finally:
                self._unlink()
                try:
                    if acquired:
                        self._release()
                finally:
                    if acquired:
                        self._calls.release()

    def _stop_workers(self, keep_local: bool) -> None:
        if self.local is not None and not keep_local:
            local, self.local = self.local, None
            local.close()
        if self.header is not None and "control" in self.views:
            self.header[H_STATE] = STATE_CLOSING
            alive = [k for k, process in enumerate(self.processes) if process.is_alive()]
            if alive:
                self.send(self.next_seq(), CMD_CLOSE, alive)
        for stop, grace in ((None, CLOSE_GRACE), ("terminate", 1.0), ("kill", 1.0)):
            lingering = [process for process in self.processes if process.is_alive()]
            if not lingering:
                break
            for process in lingering:
                if stop is not None:
                    getattr(process, stop)()
            deadline = monotonic() + grace
            for process in lingering:
                process.join(max(0.0, deadline - monotonic()))
        for process in self.processes:
            if process.exitcode is not None:
                process.close()
        self.processes = []

    def fault_report(self, worker_id: int) -> str:
        """What worker ``worker_id``'s faulthandler wrote when it crashed (its Python stack at a
        segmentation fault or abort), or "" if nothing; never waits."""
        if worker_id not in self._fault_reports and worker_id < len(self.fault_pipes):
            fd, chunks = self.fault_pipes[worker_id].fileno(), []
            os.set_blocking(fd, False)
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            self._fault_reports[worker_id] = b"".join(chunks).decode(errors="replace").strip()
        return self._fault_reports.get(worker_id, "")

    def _unlink(self) -> None:
        """Removes the names, once: a later pool of the same name may have taken them since."""
        if not self._unlinked:
            self._unlinked = True
            for doorbell in [*self.worker_doorbells, *filter(None, [self.trainer_doorbell])]:
                doorbell.unlink()
            if self.segment is not None:
                self.segment.unlink()

    def _release(self) -> None:
        for pipe in [*self.call_pipes, *self.fault_pipes]:
            pipe.close()
        self.call_pipes, self.fault_pipes = [], []
        for doorbell in [*self.worker_doorbells, *filter(None, [self.trainer_doorbell])]:
            doorbell.close()
        self.worker_doorbells, self.trainer_doorbell = [], None
        self.views, self.header = {}, None
        if self.segment is not None:
            self.segment.close()
            self.segment = None


@dataclass(eq=False)
class Parts:
    """One pool's parts, handed whole to each room that works with the others. ``Pool.__init__``
    builds the rooms in this order (each may use those before it). None of them holds the pool
    itself: a pool that only its parts referred to would wait for the cyclic garbage collector
    (see ``weak_checks``)."""

    config: PoolConfig
    lifecycle: Lifecycle
    #: Raises if the pool is closed or not this process's.
    check_open: Callable[[], None]
    #: Whether ``close()`` has begun (in another thread, maybe).
    closing: Callable[[], bool]
    #: Rolls back what a writer that died mid-write left (``PoolView.recover_writers``).
    recover_writers: Callable[[], None]
    waiter: Waiter = None  # type: ignore[assignment]
    results: Results = None  # type: ignore[assignment]
    batches: Batches = None  # type: ignore[assignment]


def weak_checks(pool: Any) -> tuple[Callable[[], None], Callable[[], bool]]:
    """``pool._check_open`` and whether it is closing, for its ``Parts``, through a weak
    reference: a part that held the pool itself would make a cycle, and a pool that nothing else
    refers to would then be released only by the cyclic garbage collector, some time later, instead
    of at once (its name stays taken until then)."""
    this = weakref.ref(pool)
    name = pool._name

    def check_open() -> None:
        alive = this()
        if alive is None:
            raise PoolClosedError(f"pool {name!r} is closed (released when no reference to it was left)")
        alive._check_open()

    def closing() -> bool:
        alive = this()
        return alive is None or alive._closing

    return check_open, closing
