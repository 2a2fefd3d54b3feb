"""Every launch option in one frozen object (``PoolConfig``), what a worker is told at launch
(``WorkerConfig``, shipped once with ``multiprocess``), and how an env is made."""

from __future__ import annotations

import functools
import os
import secrets
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import gymnasium
import multiprocess
import numpy as np
from gymnasium.vector import AutoresetMode

from .options import MAX_COUNT, autoreset_mode, batch_size_problem, count, mapping, seconds
from .params import Param, ParamSpec, check_rebuild_binds, compile_specs, merged_declarations
from .system import POOL_NAME_PATTERN, is_pool_name, usable_cores

EnvFactory = str | Callable[..., gymnasium.Env]
#: What ``launch`` takes as ``env``: one factory for every env, or one callable per env (``env_fns``).
EnvSpec = EnvFactory | Sequence[Callable[..., gymnasium.Env]]

#: The dotted name of the function every worker process runs; shmpool never imports it itself.
WORKER_ENTRY_POINT = "shmpool.workers.main:run"
#: The class that steps the trainer's own slot (``trainer_slot=True``) in the trainer's process.
LOCAL_SLOT_ENTRY_POINT = "shmpool.workers.local:LocalSlot"


def make_env(factory: EnvFactory, env_kwargs: dict[str, Any]) -> gymnasium.Env:
    """Builds one env from a registered id (``gymnasium.make``) or a callable."""
    env = gymnasium.make(factory, **env_kwargs) if isinstance(factory, str) else factory(**env_kwargs)
    if not isinstance(env, gymnasium.Env):
        raise TypeError(f"the env factory returned {type(env).__name__}, not a gymnasium.Env")
    return env


def describe_factory(factory: EnvSpec) -> str:
    """A short human name for an env factory (or a sequence of them), used in messages."""
    if isinstance(factory, str):
        return factory
    if isinstance(factory, tuple):
        names = sorted({describe_factory(f) for f in factory})
        return names[0] if len(names) == 1 else f"{names[0]} (and {len(names) - 1} other env_fns)"
    return getattr(factory, "__qualname__", None) or type(factory).__name__


def factory_of(factory: EnvFactory | tuple[EnvFactory, ...], env_id: int) -> EnvFactory:
    """The factory of env ``env_id`` (``factory`` is one for all, or a tuple with one per env)."""
    return factory[env_id] if isinstance(factory, tuple) else factory


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to join its pool; pickled once at launch, never per step."""

    pool_name: str
    worker_id: int
    env_ids: tuple[int, int]  # the slot: env ids start (inclusive) to stop (exclusive)
    env_factory: EnvFactory | tuple[EnvFactory, ...]  # a tuple: one callable per env of the slot
    env_kwargs: dict[str, Any]
    env_label: str
    autoreset_mode: AutoresetMode
    owner_pid: int
    owner_start_ticks: int
    observation_space: gymnasium.Space[Any]
    action_space: gymnasium.Space[Any]
    doorbell: str  # this worker's
    trainer_doorbell: str
    all_doorbells: tuple[str, ...] = field(default=())  # removed by a worker that outlives the owner
    params: tuple[ParamSpec, ...] = ()
    param_seed: int = 0
    hooks: tuple[Any, ...] = ()
    episode_metrics: dict[str, str] = field(default_factory=dict)
    spin: int = 200
    poll_interval: float = 0.2
    worker_init: Callable[[], Any] | None = None  # run before the envs are made
    same_observation_spaces: bool = True  # False: envs' observation spaces need equal shapes and dtypes only
    engine: str = "python"  # "numba": the slot is stepped by a compiled kernel (shmpool.workers.kernels)
    kernel: Any = None  # with engine="numba": the BatchKernel, or its "module:NAME" import string
    threads: int = 1  # with engine="mujoco": the threads of the slot's mujoco.batch.Batch (the worker's own included)


@dataclass(frozen=True)
class PoolConfig:
    """Every option of ``shmpool.launch``: its default, its check and its meaning, in one place.

    ``launch(env, num_envs, **options)`` builds one (raising ``TypeError``/``ValueError`` naming the
    option for a bad value); every part of the pool reads it. A new option is a new field here.
    """

    env: EnvSpec
    """A registered gymnasium id, a callable returning a ``gymnasium.Env`` (lambdas and closures
    work: they are shipped once with ``multiprocess``), or a sequence of such callables, one per env
    (gymnasium's and SB3's ``env_fns``: envs may then differ, but their spaces must agree)."""
    num_envs: int = None  # type: ignore[assignment]  # settled to an int by __post_init__
    """How many envs the pool runs; None only when ``env`` is a sequence (its length)."""
    num_workers: int | None = None
    """Worker processes; None: the usable cores, at most ``num_envs`` (and one, the trainer's own
    slot, where ``trainer_slot``'s default steps every env in the trainer)."""
    seed: int | None = None
    """Used by the first ``reset()`` that gets no seed (env ``i`` gets ``seed + i``) and by the
    parameter draws; None draws a random seed for those."""
    name: str | None = None
    """The pool's name, by which other processes find it; None: a unique one."""
    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP
    """``NEXT_STEP``, ``SAME_STEP`` or ``DISABLED`` (envs reset only by ``reset``, e.g. with
    ``options={"reset_mask": ...}``), with gymnasium's semantics."""
    start_method: str | None = None
    """``"fork"``, ``"spawn"`` or ``"forkserver"``; None: the platform's default."""
    env_kwargs: Mapping[str, Any] | None = None
    """Keyword arguments for ``gymnasium.make`` (or for the callable)."""
    copy: bool = True
    """Return copies of the shared arrays (True) or views that the next call overwrites (``step`` and
    ``reset``; ``recv`` always returns copies: its rows are gathered from several slots)."""
    timeout: float | None = 60.0
    """Seconds a reset or step may take before ``PoolTimeoutError``; None waits forever (dead
    workers are still detected)."""
    launch_timeout: float = 120.0
    """Seconds the workers may take to start and build their envs."""
    info_keys: int = 32
    """Distinct info keys each worker can report."""
    info_bytes: int = 64
    """The largest numeric info value, in bytes (a multiple of 8)."""
    params: Mapping[str, Param] | None = None
    """Env parameters any process can change while the pool runs, by name (see
    ``shmpool.Param``); ``pool.params`` and ``pool.applied`` hold them."""
    info_params: bool = False
    """Also return the applied parameter values as ``infos["params"]``."""
    hooks: Sequence[Any] = ()
    """Objects whose ``before_step``/``after_step``/``on_reset`` run in the workers over each slot
    (see ``shmpool.hooks``); the parameters they declare join ``params``."""
    event_capacity: int = 1024
    """Events each worker's ring holds before ``pool.events.send`` waits or raises."""
    event_payload: int = 8
    """The most numbers one event's payload carries."""
    episode_metrics: Mapping[str, str] | None = None
    """Numbers recorded with every finished episode, by name: the info key (``"a/b"`` for nested)
    read from the env's info at the episode's last step."""
    episode_capacity: int = 4096
    """Finished-episode records each worker's ring keeps for readers."""
    observation_mode: str | tuple[gymnasium.Space[Any], gymnasium.Space[Any]] = "same"
    """As gymnasium's vector envs: ``"same"`` (every env's observation space equal), ``"different"``
    (equal shapes and dtypes, bounds may differ: ``observation_space`` batches each env's), or a
    pair ``(observation_space, single_observation_space)`` to use as given."""
    batch_size: int | None = None
    """Envs per ``recv()`` of the async API (``async_reset``/``send``/``recv``, EnvPool's); None:
    ``num_envs``. A multiple of the slot size, with equal slots (see ``shmpool.pool.batches``)."""
    recv_order: str = "finished"
    """Which envs a ``recv()`` of async batches returns: ``"finished"``, the first to finish their
    step (a slow or descheduled worker is passed over, and with ``trainer_slot=True`` the trainer's
    own slot, stepped while it waits, can come round far more often than the workers'); ``"sent"``,
    those whose step was sent first (it waits for them), so that every env comes round once per
    ``num_envs / batch_size`` recvs, as EnvPool's queue order gives with envs of equal cost
    (``shmpool.envpool`` uses it)."""
    trainer_slot: bool | None = None
    """Step the last slot in the trainer's process instead of a worker process's, while the workers
    step theirs: one process fewer, for machines with fewer cores than workers plus the trainer
    (see ``shmpool.workers.local`` for what it costs: an env that hangs or crashes there stops
    the trainer). None (the default) chooses it when no core is left for the trainer (usable
    cores <= workers, and 2 workers or more), the pool steps all envs at once (no async
    ``batch_size``), and only library code would run there: gymnasium's
    pure-Python envs (classic control, toy text) on the python or numba engine, with shmpool's own
    hooks and bindings and no ``worker_init``. Your own code stays in worker processes, where a hang
    or a crash is caught, except functions given to ``env_apply`` or ``call``, which run where their
    env is; and a signal handler that raises mid-step cuts the slot's step short, breaking the pool.
    On up to 2 cores, with torch loaded in the trainer on a thread per core (its default) and
    ``num_workers`` not given, that slot takes every env: no worker process."""
    episode_statistics: bool = True
    """Add ``infos["episode"]`` (return ``r``, length ``l``, time ``t``) and ``infos["_episode"]`` at
    each episode's end. False leaves the key to a gymnasium ``RecordEpisodeStatistics`` wrapper
    around the pool. An env that reports its own ``episode`` info keeps it: the pool warns once
    and does not add its own that step."""
    profile: bool = False
    """Time every phase of a step, in the trainer and the workers, for ``pool.phase_profile()``; off,
    nothing is timed and the step pays nothing."""
    worker_init: Callable[[], Any] | None = None
    """Called once in each worker process before its envs are made (thread counts, logging,
    ``shmpool.mujoco.log_to_python``); it must be picklable for ``spawn`` and ``forkserver``. Not
    called for the trainer's own slot (``trainer_slot``), which the default never picks with it."""
    engine: str = "python"
    """How a worker steps its slot: ``"python"``, env by env (any gymnasium env); ``"numba"``, the
    whole slot in one compiled call of a batch kernel (``shmpool.kernels``: CartPole-v1,
    Pendulum-v1, MountainCar-v0, MountainCarContinuous-v0, Acrobot-v1 and registered ones; needs
    ``pip install "shmpool[numba]"``); or ``"mujoco"``, the slot's physics in one
    ``mujoco.batch.Batch`` on C threads (gymnasium's MuJoCo v5 envs, ``shmpool.mujoco_tasks``;
    needs ``pip install "shmpool[mujoco]"``). Every engine gives the same results, parameters and
    hooks as ``"python"``."""

    param_seed: int = field(init=False)
    """The seed of the parameter draws: ``seed``, or a random one."""
    kernel: Any = field(init=False, default=None)
    """With ``engine="numba"``: the env's registered kernel (a ``BatchKernel`` or its import string)."""

    def __post_init__(self) -> None:
        def settle(name: str, value: Any) -> None:  # frozen: normalized values are set once, here
            object.__setattr__(self, name, value)

        if isinstance(self.env, Sequence) and not isinstance(self.env, str):
            settle("env", _env_fns(self.env, self.num_envs))
            settle("num_envs", len(self.env))
        elif not isinstance(self.env, str) and not callable(self.env):
            raise TypeError(
                f"env must be a registered gymnasium id, a callable returning an env or a sequence of such "
                f"callables, got {self.env!r:.80}"
            )
        elif self.num_envs is None:
            raise TypeError("num_envs is required unless env is a sequence of env constructors")
        settle("num_envs", count("num_envs", self.num_envs, 1))
        workers_by_default = self.num_workers is None
        workers = _default_workers(self) if self.num_workers is None else self.num_workers
        settle("num_workers", count("num_workers", workers, 1, self.num_envs))
        try:
            mode = autoreset_mode(self.autoreset_mode)
        except (ValueError, KeyError):
            raise ValueError(
                f"autoreset_mode must be an AutoresetMode or one of its values "
                f"{[mode.value for mode in AutoresetMode]}, got {self.autoreset_mode!r}"
            ) from None
        settle("autoreset_mode", mode)
        name = f"{os.getpid()}-{secrets.token_hex(4)}" if self.name is None else self.name
        if not is_pool_name(name):
            raise ValueError(f"pool name must match {POOL_NAME_PATTERN.pattern}, got {name!r}")
        settle("name", name)
        if self.seed is not None:
            # Non-negative, as gymnasium's seeds: the first reset seeds env i with seed + i.
            settle("seed", count("seed", self.seed, 0, (1 << 63) - 1))
        settle("param_seed", secrets.randbits(63) if self.seed is None else self.seed)
        settle("env_kwargs", dict(mapping("env_kwargs", self.env_kwargs)))
        if self.timeout is not None:
            settle("timeout", seconds("timeout", self.timeout))
        settle("launch_timeout", seconds("launch_timeout", self.launch_timeout))
        settle("info_keys", count("info_keys", self.info_keys, 1, MAX_COUNT))
        settle("info_bytes", count("info_bytes", self.info_bytes, 8, MAX_COUNT))
        if self.info_bytes % 8:
            raise ValueError(f"info_bytes must be a multiple of 8, got {self.info_bytes}")
        methods = multiprocess.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise ValueError(f"start_method must be None or one of {methods}, got {self.start_method!r}")
        for option in ("copy", "info_params", "episode_statistics", "profile"):
            if not isinstance(getattr(self, option), (bool, np.bool_)):
                raise TypeError(f"{option} must be True or False, got {getattr(self, option)!r}")
        if isinstance(self.hooks, (str, bytes)) or not isinstance(self.hooks, Iterable):
            raise TypeError(f"hooks must be a sequence of hook objects, got {self.hooks!r:.80}")
        settle("hooks", tuple(self.hooks))
        from .hooks import PHASES

        for hook in self.hooks:
            if not any(callable(getattr(hook, method, None)) for method in (*PHASES, "params")):
                raise TypeError(f"hooks: {hook!r:.80} has none of {', '.join(PHASES)} or params(); see shmpool.hooks")
        settle("event_capacity", count("event_capacity", self.event_capacity, 1, MAX_COUNT))
        settle("event_payload", count("event_payload", self.event_payload, 0, MAX_COUNT))
        metrics = mapping("episode_metrics", self.episode_metrics)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metrics.items()):
            raise TypeError(f"episode_metrics maps names to info keys, both str, got {metrics!r:.80}")
        settle("episode_metrics", dict(metrics))
        batch = self.num_envs if self.batch_size is None else count("batch_size", self.batch_size, 1, self.num_envs)
        if batch != self.num_envs and (self.num_envs % workers or batch % (self.num_envs // workers)):
            raise ValueError(batch_size_problem(self.num_envs, workers, batch, workers_by_default))
        settle("batch_size", batch)
        if self.recv_order not in ("finished", "sent"):
            raise ValueError(f"recv_order must be 'finished' or 'sent', got {self.recv_order!r}")
        if batch != self.num_envs and mode == AutoresetMode.DISABLED:
            raise ValueError("batch_size: async batches autoreset envs (NEXT_STEP or SAME_STEP), not DISABLED")
        if self.trainer_slot is None:
            settle("trainer_slot", _default_trainer_slot(self))  # after batch_size: see there
            if self.trainer_slot and workers_by_default and _trainer_computes_on_every_core():
                settle("num_workers", 1)  # every env in the trainer's own slot
        elif not isinstance(self.trainer_slot, (bool, np.bool_)):
            raise TypeError(f"trainer_slot must be True, False or None, got {self.trainer_slot!r}")
        mode_ok = (
            all(isinstance(space, gymnasium.Space) for space in self.observation_mode)
            if isinstance(self.observation_mode, tuple) and len(self.observation_mode) == 2
            else self.observation_mode in ("same", "different")
        )
        if not mode_ok:
            raise ValueError(
                f"observation_mode must be 'same', 'different' or a (batched, single) pair of spaces, "
                f"got {self.observation_mode!r:.80}"
            )
        settle("episode_capacity", count("episode_capacity", self.episode_capacity, 1, MAX_COUNT))
        if self.params is not None:
            mapping("params", self.params)
        if self.worker_init is not None and not callable(self.worker_init):
            raise TypeError(f"worker_init must be a callable or None, got {self.worker_init!r}")
        names = self.hook_names
        if len(set(names)) != len(names):
            raise ValueError(f"hook names must be unique (events address hooks by name), got {names}")
        check_rebuild_binds(self.param_specs, self.engine, self.env_label)  # compiles (so checks) them now
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {list(ENGINES)}, got {self.engine!r}")
        if self.engine == "numba":
            settle("kernel", _compiled_kernel(self))
        if self.engine == "mujoco":
            _check_mujoco_engine(self)

    @functools.cached_property
    def env_label(self) -> str:
        """A short human name for the env, used in messages."""
        return describe_factory(self.env)

    @functools.cached_property
    def slots(self) -> list[tuple[int, int]]:
        """Each worker's contiguous env range, the first ``num_envs % num_workers`` one env longer."""
        assert self.num_workers is not None
        base, extra = divmod(self.num_envs, self.num_workers)
        slots, start = [], 0
        for worker_id in range(self.num_workers):
            stop = start + base + (worker_id < extra)
            slots.append((start, stop))
            start = stop
        return slots

    @property
    def same_step(self) -> bool:
        """Whether finished envs reset within the step that ended them."""
        return self.autoreset_mode == AutoresetMode.SAME_STEP

    @functools.cached_property
    def worker_of(self) -> np.ndarray:
        """The worker of each env id."""
        return np.repeat(np.arange(len(self.slots)), [stop - start for start, stop in self.slots])

    def factory_of(self, env_id: int) -> EnvFactory:
        """The factory that makes env ``env_id`` (with the numba engine, its compiled env)."""
        if self.engine == "numba":
            from .kernels import KernelFactory

            return KernelFactory(self.kernel)
        return factory_of(self.env, env_id)  # type: ignore[arg-type]  # a tuple once settled

    @functools.cached_property
    def hook_names(self) -> list[str]:
        """The hooks' names, by which events address them."""
        from .hooks import hook_name

        return [hook_name(hook) for hook in self.hooks]

    @functools.cached_property
    def declared_params(self) -> dict[str, Param]:
        """The hooks' parameter declarations, then the user's (which may narrow a hook's, not widen it)."""
        named = zip(self.hook_names, self.hooks)
        hooks = [(name, hook.params()) for name, hook in named if callable(getattr(hook, "params", None))]
        return merged_declarations(hooks, self.params or {})

    @functools.cached_property
    def param_specs(self) -> list[ParamSpec]:
        """The validated parameter declarations, in block order."""
        return compile_specs(self.declared_params)

    def __repr__(self) -> str:
        changed = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.init
            and f.name not in ("env", "num_envs")
            and getattr(self, f.name) not in (f.default, {}, ())
            and not (f.name == "batch_size" and self.batch_size == self.num_envs)
        ]
        return f"PoolConfig({self.env_label!r}, {self.num_envs}{''.join(', ' + c for c in changed)})"


#: The values of ``PoolConfig.engine``.
ENGINES = ("python", "numba", "mujoco")


def _default_workers(config: PoolConfig) -> int:
    """One worker per usable core, except under ``engine="mujoco"``: there one worker whose batch
    steps on every core, the faster on 2 cores, unless the task computes per env in Python after
    the physics (Ant's and Humanoid's contact forces), which a worker per core does in parallel."""
    assert config.num_envs is not None
    cores = min(usable_cores(), config.num_envs)
    if config.engine == "mujoco" and isinstance(config.env, str):
        from .mujoco_tasks import TASKS

        task = TASKS.get(config.env)
        if task is not None and not task.contact_forces:
            return 1
    return cores


#: The gymnasium envs that the default placement may step in the trainer's process: pure Python,
#: they neither hang nor crash (Box2D's and MuJoCo's native code can abort the process).
TRAINER_SAFE_ENVS = ("gymnasium.envs.classic_control.", "gymnasium.envs.toy_text.")


def _default_trainer_slot(config: PoolConfig) -> bool:
    """Whether the trainer steps a slot itself (``trainer_slot=None``): when the workers take every usable
    core (the trainer would only take turns with them), without async batches (they overlap its policy
    with the steps), and only library code would run there (a hang or crash of the user's is caught only
    in a worker process): gymnasium's pure-Python envs, shmpool's hooks and bindings, no ``worker_init``."""
    assert config.num_workers is not None
    if config.num_workers < 2 or usable_cores() > config.num_workers or config.engine not in ("python", "numba"):
        return False
    if config.batch_size != config.num_envs:
        return False  # async batches overlap the trainer's policy with steps: a slot it steps cannot
    if not isinstance(config.env, str) or config.worker_init is not None:
        return False
    binds = [getattr(param, "bind", None) for param in (config.params or {}).values()]
    if not all(library_code(thing) for thing in (*config.hooks, *binds)):
        return False
    try:
        entry_point = gymnasium.spec(config.env).entry_point
    except gymnasium.error.Error:
        return False  # an unknown id fails later, with gymnasium's message
    module = entry_point if isinstance(entry_point, str) else getattr(entry_point, "__module__", None)
    return isinstance(module, str) and module.startswith(TRAINER_SAFE_ENVS)


#: Up to how many usable cores a trainer that computes on all of them steps every env itself (measured
#: on 2; with more, the workers' parallel steps may win: the default there is as before).
TRAINER_ONLY_MAX_CORES = 2


def _trainer_computes_on_every_core() -> bool:
    """Whether the trainer computes on every core of a machine of few cores: torch loaded with as
    many threads as cores (its default). Its OpenMP threads spin for a while after each parallel
    region (a policy's forward), so a worker process stepping on one of those cores runs at about
    half speed, and a training loop on a default pool lost to ``SyncVectorEnv``; with every env in
    the trainer's slot it does not (``docs/benchmarks.md``, "CleanRL's PPO loop")."""
    torch = sys.modules.get("torch")
    threads = getattr(torch, "get_num_threads", None)
    cores = usable_cores()
    return cores <= TRAINER_ONLY_MAX_CORES and callable(threads) and threads() >= cores


def library_code(thing: Any) -> bool:
    """Whether ``thing`` (a hook, a binding) runs only shmpool's code: a name, a flag, or an object
    of one of shmpool's classes whose callables (a ``Perturb``'s kick, say) are shmpool's too."""
    if thing is None or isinstance(thing, (str, bool)):
        return True
    carried = [value for value in getattr(thing, "__dict__", {}).values() if callable(value)]
    return _of_shmpool(type(thing)) and all(
        _of_shmpool(value) if hasattr(value, "__qualname__") else library_code(value) for value in carried
    )


def _of_shmpool(defined: Any) -> bool:
    """Whether ``defined`` (a class, a function) is shmpool's."""
    return str(getattr(defined, "__module__", "")).startswith("shmpool.")


def _check_mujoco_engine(config: PoolConfig) -> None:
    """That ``engine="mujoco"`` can run ``config``: a supported id, MuJoCo's batch stepper installed,
    parameters bound through ``shmpool.mujoco`` (or read by hooks only), none that rebuilds envs
    (the simulations of a batch share one model layout)."""
    from .mujoco_tasks import task_of

    task_of(config.env)
    try:
        import mujoco.batch  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"engine='mujoco' needs mujoco>=4.0 (mujoco.batch): pip install \"shmpool[mujoco]\" ({exc})"
        ) from None
    unbound = [  # shmpool.mujoco's bindings can write a batch's simulation (resolve_in_batch); no other can
        spec.name
        for spec in config.param_specs
        if spec.when != "rebuild" and spec.bind is not False and not hasattr(spec.bind, "resolve_in_batch")
    ]
    if unbound:
        raise ValueError(
            f"engine='mujoco' applies parameters through shmpool.mujoco's bindings (body_mass, gravity, ...), "
            f"which it writes into the batch's per-simulation model; {unbound} bind to env attributes or paths, "
            f"which its steps never read: bind them with shmpool.mujoco, give them bind=False (read by hooks "
            f"only), or use engine='python'"
        )
    rebuilt = [spec.name for spec in config.param_specs if spec.when == "rebuild"]
    if rebuilt:
        raise ValueError(
            f"engine='mujoco' refuses parameters with when='rebuild' ({rebuilt}): the simulations of a batch "
            f"share one model; bind them to model fields (shmpool.mujoco) or use engine='python'"
        )


def _compiled_kernel(config: PoolConfig) -> Any:
    """The registered kernel of ``config.env`` for the numba engine, after checking that numba is
    installed and that the parameters and ``env_kwargs`` are ones the kernel reads."""
    from . import kernels

    found = kernels.find(config.env)
    kernels.require_numba()
    kernels.check_options(kernels.load(found), str(config.env), config.param_specs, config.env_kwargs or {})
    return found


def _env_fns(env_fns: Sequence[Any], num_envs: Any) -> tuple[Callable[..., gymnasium.Env], ...]:
    """``env_fns`` as a tuple of callables, checked against ``num_envs`` (None: its length)."""
    env_fns = tuple(env_fns)
    if not env_fns:
        raise ValueError("env: the sequence of env constructors is empty")
    for env_id, factory in enumerate(env_fns):
        if not callable(factory):
            raise TypeError(f"env[{env_id}] must be a callable returning a gymnasium.Env, got {factory!r:.80}")
    if num_envs is not None and num_envs != len(env_fns):
        raise ValueError(f"num_envs={num_envs!r} but env holds {len(env_fns)} env constructors; omit num_envs")
    return env_fns
