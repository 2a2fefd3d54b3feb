"""The trainer's pool: a gymnasium ``VectorEnv`` whose envs run in worker processes.

The pool is the public face; its rooms each do one job: :mod:`shmpool.config` (every option),
:mod:`shmpool.lifecycle` (segment, workers, commands, release), :mod:`shmpool.waiting` (the wait
and crash decoding), :mod:`shmpool.results` (what ``step`` and ``reset`` return) and
:mod:`shmpool.view` (params, events, episodes, stats: the same view an attached handle has).
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_differing_spaces, batch_space

from .batches import Batches
from .bindings import initial_records
from .calls import Failure, Request, encode, set_wrapper_attribute
from .config import PoolConfig, check_env_ids, launch_signature, make_env
from .errors import (
    ForeignProcessError,
    PoolBrokenError,
    PoolClosedError,
    RemoteTraceback,
    SeedError,
    ShmpoolError,
    StepSentInterrupt,
    WorkerError,
    WriterLockTimeout,
)
from .layout import (
    CMD_CALL,
    CMD_RESET,
    CMD_STEP,
    H_GLOBAL_STEP,
    H_STEPS_PER_SECOND,
    RESET_OPTION_BYTES,
    RESET_THIS_ENV,
    RESET_WITH_SEED,
    SEED_WORDS,
    seed_words,
)
from .lifecycle import Lifecycle, plan_layout
from .params import constructor_defaults
from .profiling import TRAINER_PHASES, PhaseClock, per_step, per_worker_step
from .protocol import W_EVENTS_JOURNAL, W_PARAMS_JOURNAL, check_memory_model, interrupts_deferred
from .registry import sweep_stale
from .results import Results
from .spaces import ActionChecker, leaves
from .system import monotonic
from .view import Channels, PoolView
from .waiting import Waiter

#: How long close() waits for a reset or step in flight in another thread to give up.
CLOSE_WAIT = 5.0


def _weakly(pool: Pool) -> tuple[Callable[[], None], Callable[[], bool]]:
    """``pool._check_open`` and whether it is closing, for the parts the pool holds, through a weak
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


def launch(env: Any, num_envs: int | None = None, **options: Any) -> Pool:
    """Starts worker processes that together run ``num_envs`` copies of ``env``; returns the pool.

    ``env`` is a registered gymnasium id, a callable returning a ``gymnasium.Env``, or a sequence of
    such callables, one per env (``num_envs`` is then its length). The options
    (``num_workers``, ``seed``, ``name``, ``params``, ``hooks``, ``timeout``, ...) are the fields of
    :class:`shmpool.config.PoolConfig`, where each one's default, check and meaning are written.

    Example:
        >>> import shmpool
        >>> with shmpool.launch("CartPole-v1", num_envs=4, num_workers=2, seed=0) as pool:
        ...     observations, infos = pool.reset()
        ...     observations, rewards, terminations, truncations, infos = pool.step([0, 1, 0, 1])
        >>> observations.shape
        (4, 4)
    """
    return Pool(PoolConfig(env, num_envs, **options))  # type: ignore[arg-type]


launch.__signature__ = launch_signature()  # type: ignore[attr-defined]


class Pool(Channels, VectorEnv):
    """A gymnasium ``VectorEnv`` whose envs run in worker processes over one shared-memory segment.

    Made by :func:`launch`; use it as a context manager or call :meth:`close`. ``params``,
    ``applied``, ``events``, ``episodes`` and ``stats`` are the same as on an attached handle.
    """

    def __init__(self, config: PoolConfig) -> None:
        self._usable = False
        self._owner_pid = os.getpid()
        #: Held by reset and step: close() from another thread waits for the call in flight, which
        #: stops waiting (PoolClosedError) once it sees ``_closing``, before anything is released.
        self._calls = threading.Lock()
        self._closing = False
        check_memory_model()
        self.config = config
        self.num_envs = config.num_envs
        self.num_workers: int = config.num_workers  # type: ignore[assignment]
        self.autoreset_mode: AutoresetMode = config.autoreset_mode  # type: ignore[assignment]
        self._name: str = config.name  # type: ignore[assignment]
        self._broken: BaseException | None = None
        #: A command sent (or being sent) whose results are not in yet: (seq, command, global step
        #: once done). Set before the first control word is written, so Ctrl-C anywhere in a send
        #: leaves it set, and the next call completes that command before issuing another.
        self._pending: tuple[int, int, int] | None = None
        #: Envs no reset has reached yet: the launch seed seeds each one's first reset.
        self._never_reset = np.ones(config.num_envs, dtype=np.bool_)
        #: With autoreset DISABLED: envs whose episode ended and that no reset has restarted yet
        #: (gymnasium's vector envs refuse to step them, and so does the pool).
        self._ended = np.zeros(config.num_envs, np.bool_) if config.autoreset_mode == AutoresetMode.DISABLED else None
        self._global_step = 0
        self._env_steps = 0  # env steps taken: num_envs per step, the envs sent per send
        self._profile_since = 0
        self._rate_since = (monotonic(), 0)

        declared = config.declared_params
        probe = make_env(
            config.factory_of(0), {**(config.env_kwargs or {}), **constructor_defaults(config.param_specs, declared)}
        )
        try:
            self.metadata = dict(probe.metadata)
            self.render_mode = probe.render_mode
            self.single_observation_space = probe.observation_space
            self.single_action_space = probe.action_space
            initial = (
                initial_records(config.param_specs, declared, probe, config.env_label, self.num_envs)
                if declared
                else None
            )
        finally:
            probe.close()
        self.metadata["autoreset_mode"] = self.autoreset_mode
        if isinstance(config.observation_mode, tuple):
            self.observation_space, self.single_observation_space = config.observation_mode
        else:
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        observation_leaves = leaves(self.single_observation_space)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._check_actions = ActionChecker(self.single_action_space, self.num_envs, config.env_label)

        sweep_stale()
        layout = plan_layout(config, observation_leaves, leaves(self.single_action_space))
        lifecycle = self._lifecycle = Lifecycle(config)
        self._finalizer = weakref.finalize(self, lifecycle.close)
        try:
            views = self._views = lifecycle.create(layout, initial)
            self._header = lifecycle.header
            assert lifecycle.segment is not None
            check_open, closing = _weakly(self)
            self._view = PoolView(self._name, lifecycle.segment, views, self._header, layout.meta, check_open)
            self._action_views = [views[leaf.field_name("actions")] for leaf in leaves(self.single_action_space)]
            self._waiter = Waiter(config, lifecycle, closing)
            self._results = Results(
                config, views, self._waiter.words, self.single_observation_space, observation_leaves
            )
            self._batches = Batches(
                config, lifecycle, self._waiter, self._results, self._action_views, self.single_action_space
            )
            self._trainer_times = np.zeros((len(TRAINER_PHASES), 2), dtype=np.int64)
            if config.profile:
                self._instrument(PhaseClock(TRAINER_PHASES, self._trainer_times))
            _LIVE_POOLS.add(self)
            lifecycle.start_workers(self.single_observation_space, self.single_action_space)
            self._waiter.wait_ready()
        except BaseException:
            with interrupts_deferred():  # a second Ctrl-C must not cut the cleanup short (as close())
                self._finalizer()
            raise
        lifecycle.mark_running()
        self._usable = True
        if config.observation_mode == "different":
            try:
                self.observation_space = batch_differing_spaces(self.get_attr("observation_space"))
            except BaseException:
                self.close()
                raise

    # -- properties ------------------------------------------------------------------------------

    @property
    def name(self) -> str:  # type: ignore[override]
        """The pool's name, by which other processes attach to it."""
        return self._name

    @property
    def global_step(self) -> int:
        """How many steps the pool has taken (``ctx.global_step`` of the next step); with async
        batches, how many sends (there each worker's ``ctx.global_step`` counts its own steps)."""
        return self._global_step

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the workers (empty once closed)."""
        return [process.pid for process in self._lifecycle.processes]

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("broken" if self._broken else "running")
        return f"Pool({self.config!r}, {state})"

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed or self._closing:
            raise PoolClosedError(f"pool {self._name!r} is closed")
        if os.getpid() != self._owner_pid:
            raise ForeignProcessError(
                f"pool {self._name!r} belongs to process {self._owner_pid}, which created it; this process "
                f"({os.getpid()}) was forked from it and must not drive its workers: call "
                f"shmpool.attach({self._name!r}) here to write params, send events or read episodes"
            )

    def phase_profile(self) -> dict[str, dict[str, float]]:
        """Microseconds per step of each phase, ``{"trainer": {...}, "workers": {...}}``, over the
        steps since the last reset; needs ``launch(profile=True)``. The trainer's are per ``step()``
        (in async mode per ``send()``, its wait and results those of ``recv()``); the workers' are
        per step of each worker, averaged over the workers. Nested phases (``infos``, ``episode
        stats``, ``whole step``) overlap the others, see :mod:`shmpool.profiling`."""
        self._check_open()
        if not self.config.profile:
            raise ValueError(f"pool {self._name!r} was launched without profile=True")
        steps = self._global_step - self._profile_since
        return {
            "trainer": per_step(self._trainer_times, TRAINER_PHASES, steps),
            "workers": per_worker_step(self._views["profile"]),
        }

    def _instrument(self, clock: PhaseClock) -> None:
        """Times each phase of the trainer's side of a step (``launch(profile=True)`` only)."""
        for owner, attribute, phase in (
            (self, "_check_actions", "action check"),
            (self._lifecycle, "send", "command"),
            (self._waiter, "wait_done", "wait"),
            (self._waiter, "wait_some", "wait"),  # recv's
            (self._results, "step", "results"),
            (self._results, "batch", "results"),  # recv's
            (self._results, "_read_infos", "infos"),
            (self._results, "_add_episode_infos", "episode stats"),
        ):
            clock.instrument(owner, attribute, phase)

    # -- the trainer's calls ---------------------------------------------------------------------

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every env (or those in ``options["reset_mask"]``); returns observations and infos.

        ``seed``: an int (env ``i`` gets ``seed + i``), one seed (or None) per env, or None (the
        launch seed on the first reset, unseeded after). ``options`` must be plain JSON data apart
        from ``reset_mask``.
        """
        with self._calls:
            return self._reset(seed, options)

    def _reset(
        self, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None
    ) -> tuple[Any, dict[str, Any]]:
        self._enter()
        if options is not None and "reset_mask" in options and self._batches.in_flight:
            # Step results not yet returned would be dropped for the envs it does not reset, and an
            # episode end among them never seen (next-step autoreset would then reset them).
            kept = np.flatnonzero(~self._check_reset_mask(options["reset_mask"]))
            dropped = self._batches.unreturned(kept)
            if dropped:
                raise RuntimeError(
                    f"pool {self._name!r}: this reset_mask leaves out envs {dropped}, whose async results no "
                    f"recv() returned yet: they would be dropped; recv() them first, or reset them too"
                )
        self._settle_batches(discard=True)
        self._prepare_reset(seed, options)
        self._run(CMD_RESET, "reset")
        observations, infos = self._results.reset()
        if self.config.profile:  # the profile covers steps since the last reset, not the reset itself
            self._trainer_times[:] = 0
            self._views["profile"][:] = 0  # the workers are idle: they only write it during a command
            self._profile_since = self._global_step
        return observations, infos

    def _prepare_reset(self, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None) -> None:
        """Writes the reset's flags, seeds and options to the segment, for the workers to read."""
        n = self.num_envs
        if seed is None and self.config.seed is not None and self._never_reset.any():
            # Masked resets too (SB3's ShmpoolVecEnv resets groups of envs with different options).
            seed = [self.config.seed + i if first else None for i, first in enumerate(self._never_reset.tolist())]
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, (int, np.integer)):
            seeds = [_check_seed(int(seed), "seed") + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"reset got {len(seeds)} seeds for num_envs={n}")
            seeds = [None if s is None else _check_seed(s, f"seed[{i}]") for i, s in enumerate(seeds)]
        if seeds[-1] is not None:
            _check_seed(seeds[-1], f"seed + {n - 1} (env {n - 1})")
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
        if self._ended is not None:
            self._ended[mask] = False
        views = self._views
        flags = views["reset_flags"]
        flags[:] = np.where(mask, RESET_THIS_ENV, 0)
        for env_id, env_seed in enumerate(seeds):
            if env_seed is not None and mask[env_id]:
                views["reset_seed"][env_id] = seed_words(env_seed)
                flags[env_id] |= RESET_WITH_SEED
        views["reset_options"][: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
        views["reset_options_length"][0] = len(encoded) if options is not None else 0
        # Workers restart their step count from the pool's: after async batches, where each worker
        # counted its own steps, hooks, events and records go back to the pool's numbering.
        views["reset_global_step"][0] = self._global_step
        self._never_reset[mask] = False  # before the command: a reset that Ctrl-C interrupts is still done later

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
        with self._calls:
            if not self._usable or self._batches.in_flight:
                self._enter()
                if self._batches.in_flight:
                    raise RuntimeError(
                        f"pool {self._name!r} has async batches in flight (async_reset/send/recv): keep using "
                        f"send() and recv(), or call reset() to go back to step()"
                    )
            parts = self._check_actions(actions)
            if self._ended is not None and self._ended.any():
                raise RuntimeError(
                    f"pool {self._name!r}: the episodes of envs {np.flatnonzero(self._ended).tolist()} ended; with "
                    f"autoreset_mode DISABLED, reset them with reset(options={{'reset_mask': mask}}) before stepping"
                )
            for view, part in zip(self._action_views, parts):
                view[...] = part
            self._run(CMD_STEP, "step")
            self._after_step(self.num_envs)
            return self._results.step()

    # -- async batches (EnvPool's API; see shmpool.batches) ----------------------------------------

    @property
    def batch_size(self) -> int:
        """Envs per ``recv()``: ``launch(batch_size=...)``, or ``num_envs``."""
        return self._batches.batch_size

    def async_reset(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Starts resetting every env (as :meth:`reset`, without waiting); each ``recv()`` then returns
        ``batch_size`` of their first observations.

        Example:
            >>> import shmpool
            >>> with shmpool.launch("CartPole-v1", 4, num_workers=2, batch_size=2) as pool:
            ...     pool.async_reset(seed=0)
            ...     for _ in range(10):
            ...         observations, rewards, terminations, truncations, infos = pool.recv()
            ...         pool.send(observations[:, 2] > 0, infos["env_id"])  # push toward the pole's lean
        """
        with self._calls:
            self._enter()
            if options is not None and "reset_mask" in options:
                raise ValueError("async_reset resets every env: reset_mask belongs to reset()")
            if self._ended is not None:
                raise ValueError("async batches autoreset their envs: launch with NEXT_STEP or SAME_STEP, not DISABLED")
            self._settle_batches(discard=True)
            self._prepare_reset(seed, options)
            self._batches.start_reset(self._lifecycle.next_seq())

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Starts stepping the envs ``env_ids`` (default: those the last ``recv()`` returned) with
        ``actions``, one row per env id in that order; returns at once.

        A Ctrl-C is never ambiguous: a plain ``KeyboardInterrupt`` means that nothing was sent, and
        :class:`~shmpool.errors.StepSentInterrupt` (a ``KeyboardInterrupt``) that the step went out."""
        held = interrupts_deferred()
        went_out = False
        try:
            with self._calls:
                self._enter()
                held.hold()  # a send that went out is counted, whenever Ctrl-C comes
                try:
                    sent = self._batches.send(actions, env_ids, self._lifecycle.next_seq)
                    went_out = True
                    self._global_step += 1
                    self._header[H_GLOBAL_STEP] = self._global_step  # type: ignore[index]
                    self._after_step(sent)
                except BaseException as error:
                    if isinstance(error, ShmpoolError):
                        self._broken = error
                    held.release()
                    raise
            # Past the lock's release: a Ctrl-C there would hide that the step went out. Nothing
            # after it may call anything (a call is where Python raises a pending Ctrl-C).
            held.release()
        except KeyboardInterrupt:
            if went_out:
                raise StepSentInterrupt from None  # the class: making an instance would be a call
            raise

    def _after_step(self, env_steps: int) -> None:
        """Counts ``env_steps`` for ``stats``; every 64 steps (or sends) publishes the rate and rolls
        back what a dead writer left."""
        self._env_steps += env_steps
        if self._global_step % 64 == 0:
            self._publish_rate()
            self._recover_writers()

    def _settle_batches(self, *, discard: bool = False) -> None:
        """Waits for async batches in flight (before a control call, a checkpoint or a reset, which
        also forgets their results with ``discard``); a failure they report breaks the pool."""
        try:
            if discard:
                self._batches.discard()
            else:
                self._batches.settle()
        except ShmpoolError as error:
            self._broken = error
            raise

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Waits for the first ``batch_size`` envs to finish their step (or reset) and returns their
        observations, rewards, terminations, truncations and infos, with ``infos["env_id"]`` (int32)
        saying which env each row is. One that raises ``KeyboardInterrupt`` has handed nothing out:
        the next ``recv()`` returns the batch."""
        with self._calls:
            self._enter()
            # Before the batch is handed out, not after: a Ctrl-C (or a warning made an error) in
            # between would lose it. A refusal in this batch's step is then warned at the next recv.
            if self.config.param_specs:
                self._results.warn_refusals()
            held = interrupts_deferred()
            try:
                handout = self._batches.recv(held)
            except ShmpoolError as error:
                self._broken = error
                raise
        # A Ctrl-C held back since the batch was handed out (the lock's release included) is raised
        # here, and the batch is queued again. Nothing after the release checks for signals (none of
        # its bytecodes do) before the caller has stored the batch: no window loses it.
        try:
            held.release()
        except KeyboardInterrupt:
            # Inline, not a method: a call's entry is where a second Ctrl-C (a storm) would land.
            # Ctrl-Cs meanwhile are one with the KeyboardInterrupt being raised.
            while True:
                try:
                    with interrupts_deferred(), self._calls:
                        self._batches.take_back(handout)  # idempotent: a retry after it ran does nothing
                    break
                except KeyboardInterrupt:
                    continue
            raise
        return handout.results

    # -- control calls (gymnasium's vector API; see shmpool.calls) -------------------------------------

    def env_apply(
        self,
        function: Callable[..., Any] | str,
        env_ids: Sequence[int] | None = None,
        *,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Runs ``function(env, *args, **kwargs)`` on each env in ``env_ids`` (None: all) inside the
        workers and returns the results in that order.

        ``function`` is a picklable callable given the env as made (wrappers included), or an
        attribute name, which is gymnasium's ``call``: the attribute, called with the arguments if
        callable. An exception an env raises is raised here with its type, its traceback as the
        cause and a note naming the env; the pool stays usable.
        """
        ids = self._env_id_list(env_ids)
        return self._apply([(env_id, function, tuple(args), dict(kwargs or {})) for env_id in ids], repr(function))

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` of every env with the arguments (or reads it, if not callable);
        returns the results, as gymnasium's ``VectorEnv.call``."""
        return tuple(self.env_apply(name, args=args, kwargs=kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env (found through its wrappers), as gymnasium's ``get_attr``."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Sets attribute ``name`` of every env: ``values`` holds one value per env if it is a list or
        tuple, else the one value for all, as gymnasium's ``set_attr``."""
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        self._apply(
            [(env_id, set_wrapper_attribute, (name, value), {}) for env_id, value in enumerate(values)],
            f"set_attr({name!r})",
        )

    def render(self) -> tuple[Any, ...] | None:  # type: ignore[override]
        """Every env's ``render()`` (launch with ``env_kwargs={"render_mode": "rgb_array"}`` for frames)."""
        return self.call("render")

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The seed of each env's random number generator, as gymnasium's Sync and Async report it."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """A copy of each env's random number generator (the envs keep their own)."""
        return self.get_attr("np_random")

    def _env_id_list(self, env_ids: Sequence[int] | None) -> list[int]:
        if env_ids is None:
            return list(range(self.num_envs))
        return check_env_ids(env_ids, self.num_envs, "env_apply", unique=False).tolist()

    def _apply(self, requests: list[Request], what: str) -> list[Any]:
        """Runs a control call's requests in the workers and returns the results in request order."""
        with self._calls:
            self._enter()
            self._settle_batches()  # a worker mid-step would take the call for its next command
            by_worker: list[list[Request]] = [[] for _ in self.config.slots]
            places: list[list[int]] = [[] for _ in self.config.slots]  # where each answer goes
            worker_of = self.config.worker_of
            for place, request in enumerate(requests):
                by_worker[worker_of[request[0]]].append(request)
                places[worker_of[request[0]]].append(place)
            seq = self._lifecycle.next_seq()
            messages = [encode((seq, part), f"the arguments of {what}") for part in by_worker]
            local, local_id = self._lifecycle.local, self._lifecycle.local_id
            # A request half-written to a pipe could not be sent again; and the trainer's own slot
            # (the last) runs its part in here too: a Ctrl-C held back until after the call is
            # pending must find that part done, or finishing the call would wait for it forever.
            # (Its envs' code runs with Ctrl-C held back anyway: the slot marks the call done only if run.)
            with interrupts_deferred():
                self._run(CMD_CALL, f"call {what}", seq)
                for worker_id, message in enumerate(messages):
                    if worker_id == local_id:
                        continue
                    try:
                        self._lifecycle.send_call(worker_id, message)
                    except OSError:  # its end of the pipe is gone: the worker died while idle
                        pass  # the wait below names it (WorkerDiedError)
                local_answer = local.call(seq, by_worker[-1]) if local is not None else None
            answers = self._finish(f"call {what}")
            if local is not None:
                answers.append(local_answer)
        results: list[Any] = [None] * len(requests)
        for worker_id, (values, failure) in enumerate(answers):
            if failure is not None:
                self._raise_call_failure(worker_id, failure, what)
            for place, value in zip(places[worker_id], values or ()):
                results[place] = value
        return results

    def _raise_call_failure(self, worker_id: int, failure: Failure, what: str) -> None:
        where = f"{failure.where(f'worker {worker_id}', self.config.env_label)} of pool {self._name!r} in {what}"
        error = failure.error
        if error is None:  # it could not be rebuilt here: its type, message and traceback text are what is left
            raise WorkerError(
                f"{failure.type_name}: {failure.message} (raised by {where}; {failure.problem}; the pool is "
                f"still usable)",
                worker_id=worker_id,
                env_id=failure.env_id if failure.env_id >= 0 else None,
                traceback_text=failure.text,
            )
        if hasattr(error, "add_note"):
            error.add_note(f"raised by {where}")
        raise error from RemoteTraceback(failure.text)

    def state_dict(self) -> Any:
        """As on an attached handle (see :meth:`shmpool.view.Channels.state_dict`), once no env is
        stepping (an interrupted step finished, async batches in flight waited for)."""
        with self._calls:
            self._enter()
            self._settle_batches()
            return super().state_dict()

    def load_state_dict(self, state: Any, *, same_draws: bool = True) -> None:
        """As on an attached handle (see :meth:`shmpool.view.Channels.load_state_dict`), once no env is
        stepping (an interrupted step finished, async batches in flight waited for), so that no env
        is resetting while the episode indices land."""
        with self._calls:
            self._enter()
            self._settle_batches()
            super().load_state_dict(state, same_draws=same_draws)

    def _recover_writers(self) -> None:
        """Rolls back what a writer that died mid-write left (its rows stay unread until then), unless
        the next writer does it first; a writer still at work keeps the lock, and is left alone."""
        writers = self._views["writers"]
        if writers[W_PARAMS_JOURNAL] or writers[W_EVENTS_JOURNAL]:
            try:
                with self._view.lock.hold(0.0, self._check_open):
                    pass  # taking the lock runs the recovery
            except WriterLockTimeout:
                pass

    def _publish_rate(self) -> None:
        """Env steps per second over the last second or so, for attached processes (``stats``)."""
        now = monotonic()
        elapsed = now - self._rate_since[0]
        if elapsed >= 1.0:
            rate = (self._env_steps - self._rate_since[1]) / elapsed
            self._header[H_STEPS_PER_SECOND] = int(rate)  # type: ignore[index]
            self._rate_since = (now, self._env_steps)

    # -- commands --------------------------------------------------------------------------------

    def _run(self, command: int, phase: str, seq: int | None = None) -> None:
        """Sends ``command`` to every worker and, unless it is a call (whose requests go next), waits
        until all have done it."""
        self._usable = False
        steps = self._global_step + (command == CMD_STEP)
        self._pending = (self._lifecycle.next_seq() if seq is None else seq, command, steps)
        if command == CMD_CALL:
            self._lifecycle.send(self._pending[0], command)
        else:
            self._finish(phase)

    def _finish(self, phase: str) -> list[Any]:
        """Sends the pending command (again, if Ctrl-C cut its send short), waits, and records it done;
        returns a call's answers."""
        assert self._pending is not None
        seq, command, steps = self._pending
        self._lifecycle.send(seq, command)
        answers: list[Any] = []
        try:
            if command == CMD_CALL:
                answers = self._waiter.receive_calls(seq, phase)
            self._waiter.wait_done(seq, phase)
            if command == CMD_STEP and self._ended is not None:  # here: an interrupted step counts too
                self._ended |= self._views["terminations"] | self._views["truncations"]
            self._global_step = steps  # before clearing _pending: a repeat after Ctrl-C here is harmless
            self._header[H_GLOBAL_STEP] = steps  # type: ignore[index]
            self._pending = None
            self._usable = not self._closing  # close() from another thread clears it first
            self._waiter.raise_failures(phase)
        except ShmpoolError as error:
            self._broken = error
            self._usable = False
            raise
        if self.config.param_specs and command != CMD_CALL:
            self._results.warn_refusals()
        return answers

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
        self._closing = True
        calls = getattr(self, "_calls", None)
        # A call in flight in another thread leaves within a poll interval; a bounded wait all the
        # same, in case close() runs inside that very call (a signal handler's).
        waited = calls is not None and calls.acquire(timeout=CLOSE_WAIT)
        try:
            with interrupts_deferred():  # a release cut short by Ctrl-C could not be run again
                self._release()
        finally:
            if waited:
                calls.release()  # type: ignore[union-attr]

    def _release(self) -> None:
        if getattr(self, "_view", None) is not None:
            self._view.close()
        if getattr(self, "_finalizer", None) is not None:
            self._finalizer()


def _check_seed(seed: Any, where: str) -> int:
    """``seed`` if it is one gymnasium takes and the segment holds (a non-negative int below
    2**256), else a :class:`SeedError` naming it; nothing has been written yet."""
    if not isinstance(seed, (int, np.integer)):
        raise SeedError(f"Seed must be a python integer (or None): reset got {where} = {seed!r:.40}")
    if not 0 <= seed < 1 << (SEED_WORDS * 64):
        raise SeedError(f"Seed must be between 0 and 2**{SEED_WORDS * 64} - 1: reset got {where} = {seed}")
    return int(seed)


#: Pools of this process, so that a forked child can disown them (see _after_fork_in_child).
_LIVE_POOLS: weakref.WeakSet[Pool] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Disowns the parent's pools in a forked child: its copies would otherwise drive the parent's
    workers (``step`` overwriting the parent's actions), and its exit would SIGTERM them. Every
    later use raises ``ForeignProcessError`` (see ``Pool._check_open``)."""
    for pool in list(_LIVE_POOLS):
        pool._usable = False
        pool._calls = threading.Lock()  # the fork copied it, maybe held by a parent's thread in a step
        pool._lifecycle.disown()


os.register_at_fork(after_in_child=_after_fork_in_child)
