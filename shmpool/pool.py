"""Launching a pool and driving it from the trainer: reset, step, crash detection, close."""

from __future__ import annotations

import importlib
import json
import os
import secrets
import signal
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import multiprocess
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from .config import WORKER_ENTRY_POINT, EnvFactory, WorkerConfig, describe_factory, make_env
from .episodes import EpisodeReader, episode_dtype
from .errors import (
    ForeignProcessError,
    PoolBrokenError,
    PoolClosedError,
    PoolTimeoutError,
    ShmpoolError,
    WorkerDiedError,
    WorkerError,
)
from .events import EventSender, event_dtype, mask_bytes
from .hooks import hook_name
from .infos import INFO_KEY_DTYPE, InfoReader
from .layout import (
    CMD_CLOSE,
    CMD_RESET,
    CMD_STEP,
    CONTROL_WORDS,
    CTL_COMMAND,
    CTL_DONE,
    CTL_ERROR_ENV,
    CTL_ERROR_LENGTH,
    CTL_NUM_DONE,
    CTL_NUM_INFO,
    CTL_PARAM_REFUSALS,
    CTL_STATUS,
    ERROR_BYTES,
    H_GLOBAL_STEP,
    H_STATE,
    H_STEPS_PER_SECOND,
    RESET_OPTION_BYTES,
    RESET_THIS_ENV,
    RESET_WITH_SEED,
    STATE_CLOSING,
    STATE_RUNNING,
    WORKER_FAILED,
    WORKER_STARTING,
    Layout,
    command_word,
    header_words,
)
from .params import (
    REFUSAL_TEXT_DTYPE,
    Param,
    ParamBlock,
    applied_dtype,
    block_dtype,
    compile_specs,
    constructor_defaults,
    initial_records,
)
from .protocol import WRITERS_WORDS, check_memory_model, event_rings, params_seqlock, writer_lock
from .registry import sweep_stale
from .spaces import ActionChecker, assemble, is_leaf, leaves
from .system import (
    POOL_NAME_PATTERN,
    Doorbell,
    Segment,
    doorbell_path,
    monotonic,
    process_start_ticks,
    segment_file,
    usable_cores,
)

#: Polls while waiting for workers before sleeping; each poll yields the core (~1 us when idle).
TRAINER_SPIN = 300
WORKER_SPIN = 300
#: How often a sleeping waiter wakes to check that its peers are alive and its deadline not passed.
TRAINER_POLL_INTERVAL = 0.05
WORKER_POLL_INTERVAL = 0.2
#: How long close() waits for workers to leave by themselves before terminating, then killing, them.
CLOSE_GRACE = 2.0


def launch(
    env: EnvFactory,
    num_envs: int,
    *,
    num_workers: int | None = None,
    seed: int | None = None,
    name: str | None = None,
    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
    start_method: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
    copy: bool = True,
    timeout: float | None = 60.0,
    launch_timeout: float = 120.0,
    info_keys: int = 16,
    info_bytes: int = 64,
    params: Mapping[str, Param] | None = None,
    info_params: bool = False,
    hooks: Sequence[Any] = (),
    event_capacity: int = 1024,
    event_payload: int = 8,
    episode_metrics: Mapping[str, str] | None = None,
    episode_capacity: int = 4096,
) -> Pool:
    """Starts ``num_workers`` processes that together run ``num_envs`` copies of ``env``.

    Args:
        env: a registered gymnasium id, or a callable returning a ``gymnasium.Env`` (lambdas and
            closures work: they are shipped once with ``multiprocess``).
        num_envs: how many envs the pool runs.
        num_workers: worker processes; defaults to the usable cores, at most ``num_envs``.
        seed: used by the first ``reset()`` that gets no seed (env ``i`` gets ``seed + i``).
        name: the pool's name, by which other processes find it; a unique one by default.
        autoreset_mode: ``NEXT_STEP`` or ``SAME_STEP``, with gymnasium's semantics.
        start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"``; the platform default if None.
        env_kwargs: keyword arguments for ``gymnasium.make`` (or for the callable).
        copy: return copies of the shared arrays (True) or views that the next call overwrites.
        timeout: seconds a reset or step may take before ``PoolTimeoutError``; None waits forever
            (dead workers are still detected).
        launch_timeout: seconds the workers may take to start and build their envs.
        info_keys: distinct info keys each worker can report.
        info_bytes: the largest numeric info value, in bytes.
        params: env parameters that any process can change while the pool runs, by name (see
            :class:`shmpool.Param`); ``pool.params`` and ``pool.applied`` hold them.
        info_params: also return the applied parameter values as ``infos["params"]``.
        hooks: objects whose ``before_step``/``after_step``/``on_reset`` run in the workers over each
            slot (see :mod:`shmpool.hooks`); the parameters they declare join ``params``.
        event_capacity: events each worker's ring holds before ``pool.events.send`` waits or raises.
        event_payload: the most numbers one event's payload carries.
        episode_metrics: numbers recorded with every finished episode, by name: the info key
            (``"a/b"`` for nested) read from the env's info at the episode's last step.
        episode_capacity: finished-episode records each worker's ring keeps for readers.

    Example:
        >>> import shmpool
        >>> with shmpool.launch("CartPole-v1", num_envs=4, num_workers=2, seed=0) as pool:
        ...     observations, infos = pool.reset()
        ...     observations, rewards, terminations, truncations, infos = pool.step([0, 1, 0, 1])
        >>> observations.shape
        (4, 4)
    """
    return Pool(
        env,
        num_envs,
        num_workers=num_workers,
        seed=seed,
        name=name,
        autoreset_mode=autoreset_mode,
        start_method=start_method,
        env_kwargs=env_kwargs,
        copy=copy,
        timeout=timeout,
        launch_timeout=launch_timeout,
        info_keys=info_keys,
        info_bytes=info_bytes,
        params=params,
        info_params=info_params,
        hooks=hooks,
        event_capacity=event_capacity,
        event_payload=event_payload,
        episode_metrics=episode_metrics,
        episode_capacity=episode_capacity,
    )


def _slots(num_envs: int, num_workers: int) -> list[tuple[int, int]]:
    """Contiguous env ranges, the first ``num_envs % num_workers`` one env longer."""
    base, extra = divmod(num_envs, num_workers)
    slots, start = [], 0
    for worker_id in range(num_workers):
        stop = start + base + (worker_id < extra)
        slots.append((start, stop))
        start = stop
    return slots


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "is gone"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class _Resources:
    """What a pool must release: processes, doorbells, the segment. Holds no reference to the Pool,
    so a ``weakref.finalize`` can release it when the Pool is garbage collected."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.owner_pid = os.getpid()
        self.segment: Segment | None = None
        self.views: dict[str, np.ndarray] = {}
        self.trainer_doorbell: Doorbell | None = None
        self.worker_doorbells: list[Doorbell] = []
        self.processes: list[Any] = []
        self.seq = 0

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
            self.worker_doorbells[worker_id].ring()

    def close(self) -> None:
        """Stops the workers (close command, then SIGTERM, then SIGKILL) and unlinks everything."""
        if os.getpid() != self.owner_pid:  # a forked child must not tear down its parent's pool
            return
        try:
            self._stop_workers()
        finally:
            self._release()

    def _stop_workers(self) -> None:
        if self.segment is not None and "control" in self.views:
            header_words(self.segment.buffer)[H_STATE] = STATE_CLOSING
            alive = [k for k, process in enumerate(self.processes) if process.is_alive()]
            if alive:
                self.send(self.next_seq(), CMD_CLOSE, alive)
        deadline = monotonic() + CLOSE_GRACE
        for process in self.processes:
            process.join(max(0.0, deadline - monotonic()))
        for stop, grace in (("terminate", 1.0), ("kill", 1.0)):
            lingering = [process for process in self.processes if process.is_alive()]
            if not lingering:
                break
            for process in lingering:
                getattr(process, stop)()
            deadline = monotonic() + grace
            for process in lingering:
                process.join(max(0.0, deadline - monotonic()))
        for process in self.processes:
            if process.exitcode is not None:
                process.close()
        self.processes = []

    def _release(self) -> None:
        for doorbell in [*self.worker_doorbells, *filter(None, [self.trainer_doorbell])]:
            doorbell.unlink()
            doorbell.close()
        self.worker_doorbells, self.trainer_doorbell = [], None
        self.views = {}
        if self.segment is not None:
            self.segment.unlink()
            self.segment.close()
            self.segment = None


class Pool(VectorEnv):
    """A gymnasium ``VectorEnv`` whose envs run in worker processes over one shared-memory segment.

    Made by :func:`launch`; use it as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        env: EnvFactory,
        num_envs: int,
        *,
        num_workers: int | None,
        seed: int | None,
        name: str | None,
        autoreset_mode: AutoresetMode | str,
        start_method: str | None,
        env_kwargs: dict[str, Any] | None,
        copy: bool,
        timeout: float | None,
        launch_timeout: float,
        info_keys: int,
        info_bytes: int,
        params: Mapping[str, Param] | None = None,
        info_params: bool = False,
        hooks: Sequence[Any] = (),
        event_capacity: int = 1024,
        event_payload: int = 8,
        episode_metrics: Mapping[str, str] | None = None,
        episode_capacity: int = 4096,
    ) -> None:
        self._usable = False
        self._resources: _Resources | None = None
        self._owner_pid = os.getpid()
        self._params: ParamBlock | None = None
        self._events: EventSender | None = None
        check_memory_model()
        if not isinstance(env, str) and not callable(env):
            raise TypeError(f"env must be a registered gymnasium id or a callable returning an env, got {env!r}")
        if not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        num_envs = int(num_envs)
        if num_workers is None:
            num_workers = min(usable_cores(), num_envs)
        if not isinstance(num_workers, (int, np.integer)) or not 1 <= num_workers <= num_envs:
            raise ValueError(f"num_workers must be between 1 and num_envs={num_envs}, got {num_workers!r}")
        try:
            self.autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError:
            raise ValueError(
                f"autoreset_mode must be AutoresetMode.NEXT_STEP or SAME_STEP (or their values), got {autoreset_mode!r}"
            ) from None
        if self.autoreset_mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            raise ValueError(f"shmpool supports NEXT_STEP and SAME_STEP autoreset, not {self.autoreset_mode}")
        if name is None:
            name = f"{os.getpid()}-{secrets.token_hex(4)}"
        if not isinstance(name, str) or not POOL_NAME_PATTERN.fullmatch(name):
            raise ValueError(f"pool name must match {POOL_NAME_PATTERN.pattern}, got {name!r}")
        if info_keys < 1 or info_bytes < 8 or info_bytes % 8:
            raise ValueError(f"info_keys must be >= 1 and info_bytes a multiple of 8, got {info_keys}, {info_bytes}")
        env_kwargs = dict(env_kwargs or {})
        context = multiprocess.get_context(start_method)
        self._hooks = list(hooks)
        self._hook_names = [hook_name(hook) for hook in self._hooks]
        if len(set(self._hook_names)) != len(self._hook_names):
            raise ValueError(f"hook names must be unique (events address hooks by name), got {self._hook_names}")
        if event_capacity < 1 or event_payload < 0:
            raise ValueError(
                f"event_capacity must be >= 1 and event_payload >= 0, got {event_capacity}, {event_payload}"
            )
        self._event_capacity, self._event_payload = int(event_capacity), int(event_payload)
        self._episode_metrics = {str(name): str(key) for name, key in (episode_metrics or {}).items()}
        if episode_capacity < 1:
            raise ValueError(f"episode_capacity must be >= 1, got {episode_capacity}")
        self._episode_capacity = int(episode_capacity)
        declared: dict[str, Param] = {}
        for hook in self._hooks:
            declared.update(hook.params() if callable(getattr(hook, "params", None)) else {})
        declared.update(params or {})  # the user's declarations win over a hook's defaults
        self._param_specs = compile_specs(declared)
        self._info_params = info_params and bool(self._param_specs)
        self._param_seed = secrets.randbits(63) if seed is None else int(seed)

        self.num_envs = num_envs
        self.num_workers = int(num_workers)
        self._name = name
        self._seed = seed
        self._copy = copy
        self._timeout = timeout
        self._env_label = describe_factory(env)
        self._broken: BaseException | None = None
        #: A command sent (or being sent) whose results are not in yet: (seq, command, global step
        #: once done). Set before the first control word is written, so Ctrl-C anywhere in a send
        #: leaves it set, and the next call completes that command before issuing another.
        self._pending: tuple[int, int, int] | None = None
        self._reset_once = False

        probe = make_env(env, {**env_kwargs, **constructor_defaults(self._param_specs, declared)})
        try:
            self.metadata = dict(probe.metadata)
            self.render_mode = probe.render_mode
            self.single_observation_space = probe.observation_space
            self.single_action_space = probe.action_space
            initial = (
                initial_records(self._param_specs, declared, probe, self._env_label, num_envs) if declared else None
            )
        finally:
            probe.close()
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self._obs_leaves = leaves(self.single_observation_space)
        self._obs_is_leaf = is_leaf(self.single_observation_space)
        self._act_leaves = leaves(self.single_action_space)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._check_actions = ActionChecker(self.single_action_space, num_envs, self._env_label)
        self._same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        self._slots = _slots(num_envs, self.num_workers)

        sweep_stale()
        layout = self._plan_layout(info_keys, info_bytes)
        resources = self._resources = _Resources(name)
        self._finalizer = weakref.finalize(self, resources.close)
        try:
            self._create(resources, layout, initial)
            self._start_workers(resources, context, env, env_kwargs)
            self._wait_ready(launch_timeout)
        except BaseException:
            self._finalizer()
            raise
        header_words(resources.segment.buffer)[H_STATE] = STATE_RUNNING  # type: ignore[union-attr]
        self._usable = True

    # -- launching -------------------------------------------------------------------------------

    def _plan_layout(self, info_keys: int, info_bytes: int) -> Layout:
        n, w = self.num_envs, self.num_workers
        specs: list[tuple[str, Any, tuple[int, ...]]] = [
            ("control", np.int64, (w, CONTROL_WORDS)),
            ("errors", np.uint8, (w, ERROR_BYTES)),
            ("writers", np.int64, (WRITERS_WORDS,)),
        ]
        specs += [(leaf.field_name("actions"), leaf.dtype, (n, *leaf.shape)) for leaf in self._act_leaves]
        prefixes = ["observations", "final_observations"] if self._same_step else ["observations"]
        specs += [(leaf.field_name(p), leaf.dtype, (n, *leaf.shape)) for p in prefixes for leaf in self._obs_leaves]
        specs += [
            ("rewards", np.float64, (n,)),
            ("terminations", np.bool_, (n,)),
            ("truncations", np.bool_, (n,)),
            ("episode_return", np.float64, (n,)),
            ("episode_length", np.int64, (n,)),
            ("episode_time", np.float64, (n,)),
            ("episode_index", np.int64, (n,)),
            ("reset_seed", np.int64, (n,)),
            ("reset_flags", np.uint8, (n,)),
            ("reset_options", np.uint8, (RESET_OPTION_BYTES,)),
            ("reset_options_length", np.int64, (1,)),
            ("info_keys", INFO_KEY_DTYPE, (w, info_keys)),
            ("info_values", np.uint8, (n, info_keys, info_bytes)),
            ("info_mask", np.bool_, (n, info_keys)),
        ]
        applied = applied_dtype(self._param_specs) if self._param_specs else None
        specs += [
            ("episode_records", episode_dtype(applied, list(self._episode_metrics)), (w, self._episode_capacity)),
            ("episode_heads", np.int64, (w,)),
        ]
        if self._hooks:
            specs += [
                ("events", event_dtype(self._event_payload, mask_bytes(self._slots)), (w, self._event_capacity)),
                ("event_heads", np.int64, (w,)),
                ("event_tails", np.int64, (w,)),
                ("event_undo_heads", np.int64, (w,)),
            ]
        if self._param_specs:
            specs += [
                ("params", block_dtype(self._param_specs), (n,)),
                ("params_seq", np.int64, (n,)),
                ("params_undo", block_dtype(self._param_specs), (n,)),
                ("applied", applied_dtype(self._param_specs), (n,)),
                ("param_refusals", np.int64, (w, len(self._param_specs))),
                ("param_refusal_text", REFUSAL_TEXT_DTYPE, (w, len(self._param_specs))),
            ]
        meta = {
            "num_envs": n,
            "num_workers": w,
            "slots": [list(slot) for slot in self._slots],
            "env": self._env_label,
            "autoreset_mode": self.autoreset_mode.value,
            "params": [spec.to_json() for spec in self._param_specs],
            "param_seed": self._param_seed,
            "hooks": self._hook_names,
            "episode_metrics": self._episode_metrics,
            "created": time.time(),
        }
        return Layout.plan(specs, meta)

    def _create(self, resources: _Resources, layout: Layout, initial: tuple[np.ndarray, np.ndarray] | None) -> None:
        resources.segment = Segment.create(self._name, layout.size)
        start_ticks = process_start_ticks(os.getpid()) or 0
        layout.write_header(
            resources.segment.buffer, owner_pid=os.getpid(), owner_start_ticks=start_ticks, owner_uid=os.getuid()
        )
        self._owner_start_ticks = start_ticks
        views = resources.views = layout.views(resources.segment.buffer)
        resources.trainer_doorbell = Doorbell.create(doorbell_path(self._name, "t"))
        for worker_id in range(self.num_workers):
            resources.worker_doorbells.append(Doorbell.create(doorbell_path(self._name, f"w{worker_id}")))
        self._views = views
        self._header = header_words(resources.segment.buffer)
        self._global_step = 0
        self._rate_since = (monotonic(), 0)
        self._control = views["control"]
        self._words = memoryview(views["control"].data).cast("B").cast("q")
        self._obs_views = [views[leaf.field_name("observations")] for leaf in self._obs_leaves]
        self._final_obs_views = [
            views[leaf.field_name("final_observations")] for leaf in self._obs_leaves if self._same_step
        ]
        self._action_views = [views[leaf.field_name("actions")] for leaf in self._act_leaves]
        self._infos = InfoReader(
            views["info_keys"], views["info_values"], views["info_mask"], self._control, self._slots
        )
        self._lock = writer_lock(segment_file(self._name), views)
        self._episodes = EpisodeReader(views, self._check_open)
        rings = event_rings(views)
        self._events = (
            EventSender(self._hook_names, rings, self._slots, self._lock, self._env_label, self._check_open)
            if rings is not None
            else None
        )
        seqlock = params_seqlock(views)
        if initial is not None and seqlock is not None:
            views["params"][:], views["applied"][:] = initial
            self._params = ParamBlock(self._param_specs, views, seqlock, self._lock, self._env_label, self._check_open)
            self._refusals_seen = [0] * self.num_workers
            self._refusals_warned: set[int] = set()
        _LIVE_POOLS.add(self)

    def _start_workers(self, resources: _Resources, context: Any, env: EnvFactory, env_kwargs: dict[str, Any]) -> None:
        module_name, function_name = WORKER_ENTRY_POINT.split(":")
        entry_point: Callable[[WorkerConfig], None] = getattr(importlib.import_module(module_name), function_name)
        all_doorbells = (resources.trainer_doorbell.path, *(d.path for d in resources.worker_doorbells))  # type: ignore[union-attr]
        # Workers must ignore Ctrl-C (the trainer stops them); block SIGINT while they start so that
        # none arrives before the worker has installed its handler. The mask is inherited.
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for worker_id, slot in enumerate(self._slots):
                config = WorkerConfig(
                    pool_name=self._name,
                    worker_id=worker_id,
                    env_ids=slot,
                    env_factory=env,
                    env_kwargs=env_kwargs,
                    env_label=self._env_label,
                    same_step_autoreset=self._same_step,
                    owner_pid=os.getpid(),
                    owner_start_ticks=self._owner_start_ticks,
                    observation_space=self.single_observation_space,
                    action_space=self.single_action_space,
                    doorbell=resources.worker_doorbells[worker_id].path,
                    trainer_doorbell=resources.trainer_doorbell.path,  # type: ignore[union-attr]
                    all_doorbells=all_doorbells,
                    params=tuple(self._param_specs),
                    param_seed=self._param_seed,
                    hooks=tuple(self._hooks),
                    episode_metrics=self._episode_metrics,
                    spin=WORKER_SPIN,
                    poll_interval=WORKER_POLL_INTERVAL,
                )
                process = context.Process(
                    target=entry_point,
                    args=(config,),
                    name=f"shmpool-{self._name}-w{worker_id}",
                    daemon=True,
                )
                process.start()
                resources.processes.append(process)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)

    def _wait_ready(self, launch_timeout: float) -> None:
        words, status = self._words, [k * CONTROL_WORDS + CTL_STATUS for k in range(self.num_workers)]
        deadline = monotonic() + launch_timeout
        self._trainer_doorbell.wait_until(
            lambda: all(words[i] != WORKER_STARTING for i in status),
            spin=0,
            poll_interval=TRAINER_POLL_INTERVAL,
            on_idle=lambda: self._check_workers(
                deadline, launch_timeout, "launch", lambda k: words[status[k]] != WORKER_STARTING
            ),
        )
        self._raise_failures("launch")

    # -- properties ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The pool's name, by which other processes attach to it."""
        return self._name

    @property
    def params(self) -> ParamBlock:
        """The parameter block: writable numpy views per parameter, and ``write()`` (see ParamBlock)."""
        self._check_open()
        if self._params is None:
            raise AttributeError(f"pool {self._name!r} was launched without params")
        return self._params

    @property
    def applied(self) -> np.ndarray:
        """What each env uses now, one read-only record per env (a drawn value for a ``dist`` one)."""
        return self.params.applied

    @property
    def events(self) -> EventSender:
        """Sends one-shot events to the pool's hooks (see EventSender.send)."""
        self._check_open()
        if self._events is None:
            raise AttributeError(f"pool {self._name!r} was launched without hooks, so it takes no events")
        return self._events

    @property
    def episodes(self) -> EpisodeReader:
        """Finished-episode records since this reader's last ``read()``."""
        self._check_open()
        return self._episodes

    def _check_open(self) -> None:
        if self.closed:
            raise PoolClosedError(f"pool {self._name!r} is closed")
        if os.getpid() != self._owner_pid:
            raise ForeignProcessError(
                f"pool {self._name!r} belongs to process {self._owner_pid}, which created it; this process "
                f"({os.getpid()}) was forked from it and must not drive its workers: call "
                f"shmpool.attach({self._name!r}) here to write params, send events or read episodes"
            )

    @property
    def global_step(self) -> int:
        """How many steps the pool has taken (``ctx.global_step`` of the next step)."""
        return self._global_step

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the workers (empty once closed)."""
        return [process.pid for process in self._resources.processes] if self._resources else []

    @property
    def _trainer_doorbell(self) -> Doorbell:
        return self._resources.trainer_doorbell  # type: ignore[union-attr,return-value]

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("broken" if self._broken else "running")
        return (
            f"Pool({self._env_label!r}, num_envs={self.num_envs}, num_workers={self.num_workers}, "
            f"name={self._name!r}, autoreset_mode={self.autoreset_mode.value}, seed={self._seed}, {state})"
        )

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- the trainer's calls ---------------------------------------------------------------------

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every env (or those in ``options["reset_mask"]``); returns observations and infos.

        ``seed``: an int (env ``i`` gets ``seed + i``), one seed (or None) per env, or None (the
        launch seed on the first reset, unseeded after). ``options`` must be plain JSON data apart
        from ``reset_mask``.
        """
        self._enter()
        n = self.num_envs
        if seed is None and not self._reset_once and self._seed is not None:
            seed = self._seed
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"reset got {len(seeds)} seeds for num_envs={n}")
        mask = np.ones(n, dtype=np.bool_)
        encoded = b""
        if options is not None:
            options = dict(options)
            if "reset_mask" in options:
                mask = self._check_reset_mask(options.pop("reset_mask"))
            try:
                encoded = json.dumps(options).encode()
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"reset options must be plain JSON data (shmpool pickles nothing): {exc}; got {options!r:.200}"
                ) from exc
            if len(encoded) > RESET_OPTION_BYTES:
                raise ValueError(f"reset options take {len(encoded)} bytes as JSON; at most {RESET_OPTION_BYTES} fit")
        views = self._views
        flags = views["reset_flags"]
        flags[:] = np.where(mask, RESET_THIS_ENV, 0)
        for env_id, env_seed in enumerate(seeds):
            if env_seed is not None and mask[env_id]:
                views["reset_seed"][env_id] = int(env_seed)
                flags[env_id] |= RESET_WITH_SEED
        views["reset_options"][: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
        views["reset_options_length"][0] = len(encoded) if options is not None else 0
        self._run(CMD_RESET, "reset")
        self._reset_once = True
        infos: dict[str, Any] = {}
        self._read_infos(infos)
        if self._info_params:
            self._add_param_infos(infos)
        return self._observations(), infos

    def _check_reset_mask(self, mask: Any) -> np.ndarray:
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
        if mask.shape != (self.num_envs,):
            raise ValueError(f"`options['reset_mask']` must have shape `({self.num_envs},)`, got {mask.shape}")
        if mask.dtype != np.bool_:
            raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
        if not mask.any():
            raise ValueError(f"`options['reset_mask']` must contain at least one True value, got {mask}")
        return mask

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every env with its action; returns observations, rewards, terminations, truncations, infos."""
        if not self._usable:
            self._enter()
        parts = self._check_actions(actions)
        for view, part in zip(self._action_views, parts):
            view[...] = part
        self._run(CMD_STEP, "step")
        if self._global_step % 64 == 0:
            self._publish_rate(self._header)
        views = self._views
        rewards = views["rewards"].copy()
        terminations = views["terminations"].copy()
        truncations = views["truncations"].copy()
        infos: dict[str, Any] = {}
        words = self._words
        if any(words[k * CONTROL_WORDS + CTL_NUM_INFO] for k in range(self.num_workers)):
            self._read_infos(infos)
        if any(words[k * CONTROL_WORDS + CTL_NUM_DONE] for k in range(self.num_workers)):
            self._add_episode_infos(infos, terminations | truncations)
        if self._info_params:
            self._add_param_infos(infos)
        return self._observations(), rewards, terminations, truncations, infos

    def _publish_rate(self, header: memoryview) -> None:
        """Env steps per second over the last second or so, for attached processes (``stats``)."""
        now = monotonic()
        elapsed = now - self._rate_since[0]
        if elapsed >= 1.0:
            header[H_STEPS_PER_SECOND] = int((self._global_step - self._rate_since[1]) * self.num_envs / elapsed)
            self._rate_since = (now, self._global_step)

    def _add_param_infos(self, infos: dict[str, Any]) -> None:
        applied = self._views["applied"]
        infos["params"] = {spec.name: applied[spec.name].copy() for spec in self._param_specs}

    def _observations(self) -> Any:
        arrays = [view.copy() for view in self._obs_views] if self._copy else self._obs_views
        if self._obs_is_leaf:
            return arrays[0]
        return assemble(self.single_observation_space, iter(arrays))

    def _read_infos(self, infos: dict[str, Any]) -> None:
        for worker_id in range(self.num_workers):
            if self._words[worker_id * CONTROL_WORDS + CTL_NUM_INFO]:
                self._infos.read_into(infos, worker_id)

    def _add_episode_infos(self, infos: dict[str, Any], dones: np.ndarray) -> None:
        views = self._views
        if self._same_step:
            final = np.full(self.num_envs, None, dtype=object)
            for env_id in np.flatnonzero(dones):
                final[env_id] = assemble(
                    self.single_observation_space, iter([view[env_id].copy() for view in self._final_obs_views])
                )
            infos["final_obs"], infos["_final_obs"] = final, dones.copy()
            infos.setdefault("final_info", {})
            infos["_final_info"] = dones.copy()
        infos["episode"] = {
            "r": np.where(dones, views["episode_return"], 0.0),
            "l": np.where(dones, views["episode_length"], 0),
            "t": np.where(dones, views["episode_time"], 0.0),
        }
        infos["_episode"] = dones

    # -- waiting on workers ----------------------------------------------------------------------

    def _run(self, command: int, phase: str) -> None:
        """Sends ``command`` to every worker and waits until all have done it."""
        self._usable = False
        steps = self._global_step + (command == CMD_STEP)
        self._pending = (self._resources.next_seq(), command, steps)  # type: ignore[union-attr]
        self._finish(phase)

    def _finish(self, phase: str) -> None:
        """Sends the pending command (again, if Ctrl-C cut its send short), waits, and records it done."""
        assert self._pending is not None and self._resources is not None
        seq, command, steps = self._pending
        self._resources.send(seq, command)
        self._wait(seq, phase)
        self._pending = None
        self._global_step = steps
        self._header[H_GLOBAL_STEP] = steps
        self._usable = True
        self._raise_failures(phase)
        if self._param_specs:
            self._warn_refusals()

    def _warn_refusals(self) -> None:
        """One warning per parameter the first time a worker refuses a raw write of it."""
        words = self._words
        for worker_id in range(self.num_workers):
            count = words[worker_id * CONTROL_WORDS + CTL_PARAM_REFUSALS]
            if count == self._refusals_seen[worker_id]:
                continue
            self._refusals_seen[worker_id] = count
            for spec in self._param_specs:
                if spec.index in self._refusals_warned or not self._views["param_refusals"][worker_id, spec.index]:
                    continue
                self._refusals_warned.add(spec.index)
                text = bytes(self._views["param_refusal_text"][worker_id, spec.index]).decode(errors="replace")
                warnings.warn(
                    f"{text} (further refusals of {spec.name!r} are counted in pool.params.refusals, not warned)",
                    RuntimeWarning,
                    stacklevel=4,
                )

    def _wait(self, seq: int, phase: str) -> None:
        words = self._words
        done = [k * CONTROL_WORDS + CTL_DONE for k in range(self.num_workers)]
        deadline = None if self._timeout is None else monotonic() + self._timeout
        if len(done) == 2:
            first, second = done
            ready = lambda: words[first] == seq and words[second] == seq  # noqa: E731
        else:
            ready = lambda: all(words[i] == seq for i in done)  # noqa: E731
        try:
            self._trainer_doorbell.wait_until(
                ready,
                spin=TRAINER_SPIN,
                poll_interval=TRAINER_POLL_INTERVAL,
                on_idle=lambda: self._check_workers(deadline, self._timeout, phase, lambda k: words[done[k]] == seq),
            )
        except ShmpoolError as exc:
            self._break(exc)
            raise

    def _check_workers(
        self, deadline: float | None, limit: float | None, phase: str, finished: Callable[[int], bool]
    ) -> None:
        """Raises if a worker that has not finished is dead, or if the deadline has passed."""
        processes = self._resources.processes  # type: ignore[union-attr]
        for worker_id, process in enumerate(processes):
            if not finished(worker_id) and process.exitcode is not None:
                start, stop = self._slots[worker_id]
                error = WorkerDiedError(
                    f"worker {worker_id} (pid {process.pid}, envs {start}..{stop - 1}) of pool {self._name!r} "
                    f"{_describe_exit(process.exitcode)} during {phase}; likely causes: a kill from outside, "
                    f"running out of memory (see dmesg), or a crash in native env code",
                    worker_id=worker_id,
                    exitcode=process.exitcode,
                )
                self._break(error)
                raise error
        if deadline is not None and monotonic() > deadline:
            stuck = [k for k in range(len(processes)) if not finished(k)]
            timeout = PoolTimeoutError(
                f"pool {self._name!r}: worker(s) {stuck} did not finish {phase} within {limit} s "
                f"(envs {', '.join(f'{self._slots[k][0]}..{self._slots[k][1] - 1}' for k in stuck)}); "
                f"raise launch(timeout=...) if the env is this slow"
            )
            self._break(timeout)
            raise timeout

    def _raise_failures(self, phase: str) -> None:
        words = self._words
        for worker_id in range(self.num_workers):
            if words[worker_id * CONTROL_WORDS + CTL_STATUS] == WORKER_FAILED:
                error = self._worker_error(worker_id, phase)
                self._break(error)
                raise error

    def _worker_error(self, worker_id: int, phase: str) -> WorkerError:
        base = worker_id * CONTROL_WORDS
        length = min(int(self._words[base + CTL_ERROR_LENGTH]), ERROR_BYTES)
        where, _, text = (
            self._views["errors"][worker_id, :length].tobytes().decode("utf-8", errors="replace").partition("\n")
        )
        env_id = int(self._words[base + CTL_ERROR_ENV])
        lines = text.strip().splitlines()
        summary = lines[-1] if lines else "unknown error"
        return WorkerError(
            f"worker {worker_id} of pool {self._name!r} failed in {where} ({self._env_label}) during {phase}: "
            f"{summary}",
            worker_id=worker_id,
            env_id=env_id if env_id >= 0 else None,
            traceback_text=text,
        )

    def _break(self, error: BaseException) -> None:
        self._broken = error
        self._usable = False

    def _enter(self) -> None:
        """Raises if the pool cannot be used; finishes a call that Ctrl-C interrupted."""
        self._check_open()
        if self._broken is not None:
            raise PoolBrokenError(
                f"pool {self._name!r} failed earlier ({type(self._broken).__name__}: {self._broken}); "
                f"close() it and launch a new one"
            ) from self._broken
        if self._pending is not None:  # a reset or step was interrupted: let the workers finish it
            self._finish("an interrupted call")
        self._usable = True

    def close_extras(self, **kwargs: Any) -> None:
        """Stops the workers and unlinks the segment and doorbells; safe to call more than once."""
        self._usable = False
        self._views = {}
        self._control = self._words = None  # type: ignore[assignment]
        self._obs_views, self._final_obs_views, self._action_views = [], [], []
        self._infos = None  # type: ignore[assignment]
        self._header = None  # type: ignore[assignment]
        self._params = self._events = None
        if getattr(self, "_lock", None) is not None:
            self._lock.close()
        if getattr(self, "_finalizer", None) is not None:
            self._finalizer()


#: Pools of this process, so that a forked child can disown them (see _after_fork_in_child).
_LIVE_POOLS: weakref.WeakSet[Pool] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Disowns the parent's pools in a forked child.

    The child's copies would otherwise drive the parent's workers (``step`` overwriting the
    parent's actions), and multiprocess's exit handler in the child would SIGTERM the parent's
    daemonic workers, which it wrongly takes for its own children. Every later use raises
    ``ForeignProcessError`` (see ``Pool._check_open``).
    """
    children = getattr(multiprocess.process, "_children", None)
    for pool in list(_LIVE_POOLS):
        pool._usable = False
        if pool._resources is not None and children is not None:
            for process in pool._resources.processes:
                children.discard(process)


os.register_at_fork(after_in_child=_after_fork_in_child)
