"""The trainer's pool: a gymnasium ``VectorEnv`` whose envs run in worker processes. It builds its
rooms (``shmpool.pool``'s modules, handed the pool's ``Parts``), steps and closes; ``shmpool.view``
holds params, events, episodes and stats, the same view an attached handle has."""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_differing_spaces, batch_space

from ..calls import Request
from ..config import EnvSpec, PoolConfig
from ..errors import ForeignProcessError, PoolClosedError, ShmpoolError, StepSentInterrupt
from ..interfaces import EnvsRandomness, StepResult
from ..interrupts import CallLock, interrupts_deferred
from ..layout import CMD_RESET, CMD_STEP
from ..option_docs import with_options
from ..params import Param
from ..profiling import PhaseProfile
from ..protocol import check_memory_model
from ..registry import sweep_stale
from ..spaces import ActionChecker, leaves
from ..system import this_pid
from ..view import PoolView, SharedChannels
from .batches import Batches
from .commands import CallRouter, CommandChannel, PartialSteps, ResetEncoder
from .lifecycle import Lifecycle, Parts, plan_layout, probe_env, weak_checks
from .results import Results
from .waiting import Waiter

#: How long close() waits for a reset or step in flight in another thread to give up.
CLOSE_WAIT = 5.0


def launch(
    env: EnvSpec,
    num_envs: int | None = None,
    *,
    num_workers: int | None = None,
    seed: int | None = None,
    name: str | None = None,
    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
    start_method: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    copy: bool = True,
    timeout: float | None = 60.0,
    launch_timeout: float = 120.0,
    info_keys: int = 32,
    info_bytes: int = 64,
    params: Mapping[str, Param] | None = None,
    info_params: bool = False,
    hooks: Sequence[Any] = (),
    event_capacity: int = 1024,
    event_payload: int = 8,
    episode_metrics: Mapping[str, str] | None = None,
    episode_capacity: int = 4096,
    observation_mode: str | tuple[gymnasium.Space[Any], gymnasium.Space[Any]] = "same",
    batch_size: int | None = None,
    recv_order: str = "finished",
    trainer_slot: bool | None = None,
    episode_statistics: bool = True,
    profile: bool = False,
    worker_init: Callable[[], Any] | None = None,
    engine: str = "python",
) -> Pool:
    """Starts worker processes that together run ``num_envs`` copies of ``env``; returns the pool.
    The options are ``shmpool.config.PoolConfig``'s fields: its defaults, checks and docstrings.

    Examples:
        >>> import shmpool
        >>> with shmpool.launch("CartPole-v1", num_envs=4, num_workers=2, seed=0) as pool:
        ...     observations, infos = pool.reset()
        ...     observations, rewards, terminations, truncations, infos = pool.step([0, 1, 0, 1])
        >>> observations.shape
        (4, 4)
    """
    return Pool(PoolConfig(**locals()))  # every parameter is a PoolConfig field, and nothing else is local yet


launch.__doc__ = with_options(launch.__doc__ or "")


class Pool(SharedChannels, EnvsRandomness, VectorEnv):  # type: ignore[misc]  # np_random: each env's
    """A gymnasium ``VectorEnv`` whose envs run in worker processes over one shared-memory segment.

    Made by ``launch``; use it as a context manager or call ``close``. ``params``,
    ``applied``, ``events``, ``episodes`` and ``stats`` are the same as on an attached handle.
    """

    def __init__(self, config: PoolConfig) -> None:
        self._owner_pid = os.getpid()
        #: Held by every call: close() from another thread waits for the call in flight, which stops
        #: waiting (PoolClosedError) once it sees ``_closing``, before anything is released.
        self._calls = CallLock(f"pool {config.name!r}")
        self._closing = False
        check_memory_model()
        self.config = config
        self.num_envs = config.num_envs
        self.num_workers: int = config.num_workers  # type: ignore[assignment]
        self.autoreset_mode: AutoresetMode = config.autoreset_mode  # type: ignore[assignment]
        self._name: str = config.name  # type: ignore[assignment]
        self._profile: PhaseProfile | None = None

        probe = probe_env(config)
        self.metadata = {**probe.metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = probe.render_mode
        self.single_observation_space, self.single_action_space = probe.observation_space, probe.action_space
        if isinstance(config.observation_mode, tuple):
            self.observation_space, self.single_observation_space = config.observation_mode
        else:
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        observation_leaves, action_leaves = leaves(self.single_observation_space), leaves(self.single_action_space)
        self._check_actions = ActionChecker(self.single_action_space, self.num_envs, config.env_label)
        sweep_stale()
        layout = plan_layout(config, observation_leaves, action_leaves)
        lifecycle = self._lifecycle = Lifecycle(config, self._calls)
        self._finalizer = weakref.finalize(self, lifecycle.close)
        try:
            fields = self._fields = lifecycle.create(layout, probe.initial_params)
            assert lifecycle.segment is not None
            check_open, closing = weak_checks(self)
            self._channels = PoolView(self._name, fields, lifecycle.header, layout.meta, check_open)
            actions = self._action_fields = [fields[leaf.field_name("actions")] for leaf in action_leaves]
            parts = Parts(config, lifecycle, check_open, closing, self._channels.recover_writers)
            waiter = self._waiter = parts.waiter = Waiter(parts)
            self._results = parts.results = Results(parts, self.single_observation_space, observation_leaves)
            self._batches = parts.batches = Batches(parts, actions, self.single_action_space)
            commands = self._commands = CommandChannel(parts)
            self._resets = ResetEncoder(parts, commands.ended)
            self._call_router = CallRouter(parts, commands)
            self._partial_steps = PartialSteps(parts, commands, self._resets, actions, self.single_action_space)
            _LIVE_POOLS.add(self)
            lifecycle.start_workers(self.single_observation_space, self.single_action_space)
            if config.profile:  # the trainer's side of a step, each call as (owner, method name, phase); recv's too
                self._profile = PhaseProfile(fields["profile"], [
                    (self, "_check_actions", "action check"), (self._batches.checkers, "check", "action check"),
                    (self._partial_steps.checkers, "check", "action check"), (lifecycle, "send", "command"),
                    (lifecycle.local, "run", "own slot"), (waiter, "wait_done", "wait"), (waiter, "wait_some", "wait"),
                    (self._results, "step", "results"), (self._results, "batch", "results"),
                    (self._results, "_read_infos", "infos"), (self._results._infos, "read_into", "infos"),
                    (self._results, "_add_episode_infos", "episode stats"),
                ])  # fmt: skip
            waiter.wait_ready()
        except BaseException:
            with interrupts_deferred():  # a second Ctrl-C must not cut the cleanup short (as close())
                self._finalizer()
            raise
        lifecycle.mark_running()
        commands.usable = True
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
        return self._commands.global_step

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the workers (empty once closed)."""
        return [process.pid for process in self._lifecycle.processes]

    @property
    def alive(self) -> bool:
        """Whether the pool still runs: not closed or closing, and not broken by a failure."""
        return not (self.closed or self._closing) and self._commands.broken is None

    def __repr__(self) -> str:
        commands = getattr(self, "_commands", None)  # a pool whose launch failed has none
        state = "closed" if self.closed else ("broken" if commands is not None and commands.broken else "running")
        return f"Pool({self.config!r}, {state})"

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed or self._closing:
            raise PoolClosedError(f"pool {self._name!r} is closed")
        if this_pid() != self._owner_pid:  # every write asks: no system call
            raise ForeignProcessError(
                f"pool {self._name!r} belongs to process {self._owner_pid}, which created it; this process "
                f"({os.getpid()}) was forked from it and must not drive its workers: call "
                f"shmpool.attach({self._name!r}) here to write params, send events or read episodes"
            )

    def phase_profile(self) -> dict[str, dict[str, float]]:
        """Microseconds per step of each phase, ``{"trainer": {...}, "workers": {...}}``, since the
        last reset (``launch(profile=True)``); see ``shmpool.profiling`` for what each phase covers."""
        self._check_open()
        if self._profile is None:
            raise ValueError(f"pool {self._name!r} was launched without profile=True")
        return self._profile.read(self._commands.global_step)

    # -- the trainer's calls ---------------------------------------------------------------------

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every env (or those in ``options["reset_mask"]``); returns observations and infos.
        ``seed``: an int (env ``i`` gets ``seed + i``), one seed (or None) per env, or None (the launch
        seed on the first reset, unseeded after). ``options``: plain JSON data, and ``reset_mask``."""
        with self._calls.checked():
            return self._reset(seed, options)

    def _reset(
        self, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None
    ) -> tuple[Any, dict[str, Any]]:
        self._commands.enter()
        reset = self._resets.encode(seed, options)  # refused arguments change nothing, async batches included
        if self._batches.in_flight and not reset.mask.all():
            # Step results not yet returned would be dropped for the envs it does not reset, and an
            # episode end among them never seen (next-step autoreset would then reset them).
            dropped = self._batches.unreturned(np.flatnonzero(~reset.mask))
            if dropped:
                raise RuntimeError(
                    f"pool {self._name!r}: this reset_mask leaves out envs {dropped}, whose async results no "
                    f"recv() returned yet: they would be dropped; recv() them first, or reset them too"
                )
        self._commands.settle_batches(discard=True)
        with interrupts_deferred():  # written and pending together: a reset written is one sent later
            self._resets.write(reset, self._commands.global_step)
            self._commands.prepare(CMD_RESET)
        self._commands.finish("reset")
        observations, infos = self._results.reset()
        if self._profile is not None:  # the profile covers steps since the last reset, not the reset itself
            self._profile.restart(self._commands.global_step)
        return observations, infos

    def step(self, actions: Any, *, env_ids: Any = None) -> StepResult:
        """Steps every env with its action; returns observations, rewards, terminations, truncations, infos.
        ``env_ids``: only those envs step, a row each, and come back in that order (see PartialSteps)."""
        with self._calls.checked():
            commands = self._commands
            if not commands.usable or self._batches.in_flight:
                commands.enter()
                if self._batches.in_flight:
                    raise RuntimeError(
                        f"pool {self._name!r} has async batches in flight (async_reset/send/recv): keep using "
                        f"send() and recv(), or call reset() to go back to step()"
                    )
            if env_ids is not None:
                return self._partial_steps.step(actions, env_ids)
            if not self._resets.all_reset:  # one attribute per step: the message only when refused
                self._resets.refuse_step(f"pool {self._name!r}: step()")
            parts = self._check_actions(actions)
            ended = commands.ended
            if ended is not None and ended.any():
                commands.refuse_ended(ended)
            for field, part in zip(self._action_fields, parts):
                field[...] = part
            commands.run(CMD_STEP, "step", env_steps=self.num_envs)
            return self._results.step()

    # -- async batches (EnvPool's API; see shmpool.pool.batches) ----------------------------------------

    @property
    def batch_size(self) -> int:
        """Envs per ``recv()``: ``launch(batch_size=...)``, or ``num_envs``."""
        return self._batches.batch_size

    def async_reset(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Starts resetting every env (as ``reset``, without waiting); each ``recv()`` then returns
        ``batch_size`` of their first observations.

        Examples:
            >>> import shmpool
            >>> with shmpool.launch("CartPole-v1", 4, num_workers=2, batch_size=2) as pool:
            ...     pool.async_reset(seed=0)
            ...     for _ in range(10):
            ...         observations, rewards, terminations, truncations, infos = pool.recv()
            ...         pool.send(observations[:, 2] > 0, infos["env_id"])  # push toward the pole's lean
        """
        with self._calls.checked():
            self._commands.enter()
            if options is not None and "reset_mask" in options:
                raise ValueError("async_reset resets every env: reset_mask belongs to reset()")
            if self._commands.ended is not None:
                raise ValueError("async batches autoreset their envs: launch with NEXT_STEP or SAME_STEP, not DISABLED")
            reset = self._resets.encode(seed, options)  # before the batches in flight go
            self._commands.settle_batches(discard=True)
            with interrupts_deferred():  # a reset written is a reset sent (see _reset)
                self._resets.write(reset, self._commands.global_step)
                self._batches.start_reset(self._lifecycle.next_seq())

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Starts stepping the envs ``env_ids`` (default: those the last ``recv()`` returned) with
        ``actions``, one row per env id in that order; returns at once.

        A Ctrl-C is never ambiguous: a plain ``KeyboardInterrupt`` means that nothing was sent, and
        ``shmpool.errors.StepSentInterrupt`` (a ``KeyboardInterrupt``) that the step went out."""
        held = interrupts_deferred()
        went_out = False
        try:
            with self._calls.checked():
                self._commands.enter()
                held.hold()  # a send that went out is counted, whenever Ctrl-C comes
                try:
                    sent = self._batches.send(actions, env_ids, self._lifecycle.next_seq)
                    went_out = True
                    self._commands.count_send(sent)
                except BaseException as error:
                    if isinstance(error, ShmpoolError):
                        self._commands.broken = error
                    held.release()
                    raise
            # Past the lock's release: a Ctrl-C there would hide that the step went out. Nothing
            # after it may call anything (a call is where Python raises a pending Ctrl-C).
            held.release()
        except KeyboardInterrupt:
            if went_out:
                raise StepSentInterrupt from None  # the class: making an instance would be a call
            raise

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Waits for the first ``batch_size`` envs to finish their step or reset (with
        ``recv_order="sent"``: those sent first) and returns their
        observations, rewards, terminations, truncations and infos, with ``infos["env_id"]`` (int32)
        saying which env each row is. One that raises ``KeyboardInterrupt`` has handed nothing out:
        the next ``recv()`` returns the batch."""
        with self._calls.checked():
            self._commands.enter()
            # Before the batch is handed out, not after: a Ctrl-C (or a warning made an error) in
            # between would lose it. A refusal in this batch's step is then warned at the next recv.
            if self.config.param_specs:
                self._results.warn_refusals()
            held = interrupts_deferred()
            try:
                handout = self._batches.recv(held)
            except ShmpoolError as error:
                self._commands.broken = error
                raise
        # A Ctrl-C held back since the hand-out queues the batch again, then is raised (a handler that
        # raises nothing: recv starts over, the batch first in line). One during the release itself is
        # caught below; no bytecode after it checks for signals before the caller stores the batch.
        if held.pending:
            with self._calls.checked():
                self._batches.take_back(handout)
            held.release()
            return self.recv()
        try:
            held.release()
        except BaseException:  # KeyboardInterrupt, or whatever a handler of the user's raises
            taken_back = False  # inline, not a method: a call's entry is where another Ctrl-C lands
            while not taken_back:
                try:
                    with interrupts_deferred(), self._calls.checked():
                        self._batches.take_back(handout)  # idempotent
                        taken_back = True
                except KeyboardInterrupt:
                    pass
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
        return self._apply(self._call_router.apply_requests(function, env_ids, args, kwargs), repr(function))

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
        self._apply(self._call_router.set_attr_requests(name, values), f"set_attr({name!r})")

    def render(self) -> tuple[Any, ...] | None:  # type: ignore[override]
        """Every env's ``render()`` (launch with ``env_kwargs={"render_mode": "rgb_array"}`` for frames)."""
        return self.call("render")

    def _apply(self, requests: list[Request], what: str) -> list[Any]:
        """Runs a control call's requests in the workers and returns the results in request order."""
        with self._calls.checked():
            self._commands.enter(settle=True)  # a worker mid-step would take the call for its next command
            answers = self._call_router.run(requests, what)
        return self._call_router.results(answers, what)

    def state_dict(self) -> Any:
        """As on an attached handle (``SharedChannels.state_dict``), once no env is stepping."""
        with self._calls.checked():
            self._commands.enter(settle=True)
            return super().state_dict()

    def load_state_dict(self, state: Any, *, same_draws: bool = True) -> None:
        """As on an attached handle (``SharedChannels.load_state_dict``), once no env is stepping (an
        interrupted step finished, async batches waited for): none resets while the episode indices land."""
        with self._calls.checked():
            self._commands.enter(settle=True)
            super().load_state_dict(state, same_draws=same_draws)

    def close_extras(self, **kwargs: Any) -> None:
        """Stops the workers and unlinks the segment and doorbells; safe to call more than once."""
        commands = getattr(self, "_commands", None)  # a pool whose launch failed has none
        if commands is not None:
            commands.usable = False
        self._closing = True
        calls = getattr(self, "_calls", None)
        if calls is not None and calls.held_here():  # a signal handler's, inside this thread's call, which
            self._deferred_release = calls.once_free(self._release)  # uses the segment until it returns
            return
        self._release_after_calls()

    def close(self, **kwargs: Any) -> None:
        """Stops the workers and frees the pool's shared memory; returns once they are. A signal handler's close
        inside a call of the pool returns at once (the release follows that call); a call still running after
        ``CLOSE_WAIT`` keeps this process's handles of the pool until it ends, its workers and names going then."""
        super().close(**kwargs)
        released = getattr(self, "_deferred_release", None)  # by a handler's close, once its call let go
        if released is not None and not self._calls.held_here() and not released.wait(CLOSE_WAIT):
            self._lifecycle.close()  # that call still runs and keeps its handles: see _release_after_calls

    def _release_after_calls(self) -> None:
        calls = getattr(self, "_calls", None)
        waited = calls is not None and calls.acquire(timeout=CLOSE_WAIT)  # another thread's call leaves soon
        if calls is not None and not waited:
            # That call still runs (a long env step in the trainer's slot): the workers and names go now,
            # what it uses (the slot's envs, the doorbells' semaphores) once it lets go, by a daemon thread
            # (a call that never returns must not keep the process from exiting).
            try:
                self._lifecycle.close()  # what the call holding the lock uses stays
            finally:  # after a Ctrl-C too; an exit soon after gives the envs time to close
                with contextlib.suppress(RuntimeError):  # an atexit close: Python 3.12 starts no thread
                    atexit.register(calls.once_free(self._release, daemon=True).wait, CLOSE_WAIT)
            return
        try:
            with interrupts_deferred():  # a release cut short by Ctrl-C could not be run again
                self._release()
        finally:
            if waited:
                calls.release()  # type: ignore[union-attr]

    def _release(self) -> None:
        if getattr(self, "_channels", None) is not None:
            self._channels.close()
        if getattr(self, "_lifecycle", None) is not None:  # not the one-shot finalizer: ends a close cut short
            self._lifecycle.close()


#: Pools of this process, so that a forked child can disown them (see _after_fork_in_child).
_LIVE_POOLS: weakref.WeakSet[Pool] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Disowns the parent's pools in a forked child: its copies would otherwise drive the parent's
    workers (``step`` overwriting the parent's actions), and its exit would SIGTERM them. Every
    later use raises ``ForeignProcessError`` (see ``Pool._check_open``)."""
    for pool in list(_LIVE_POOLS):
        pool._commands.usable = False
        pool._calls = CallLock(f"pool {pool._name!r}")  # the fork copied it, maybe held by a parent's thread
        pool._lifecycle.disown()


os.register_at_fork(after_in_child=_after_fork_in_child)
