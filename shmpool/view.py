"""One view of a running pool's shared channels, used by the pool itself and by attached handles.

A ``PoolView`` turns a mapped segment's field views and metadata into the objects users touch:
the parameter block and its ``applied`` values, the event sender, the episode reader and the stats.
``SharedChannels`` gives ``Pool`` and ``PoolHandle`` the same properties over it, each checking that
its owner is still usable first. A new channel is added here, once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import checkpoints
from .episodes import EpisodeReader
from .errors import LayoutMismatchError, WriterLockTimeoutError
from .events import EventSender
from .layout import (
    CTL_PID,
    CTL_START_TICKS,
    CTL_STATUS,
    H_GLOBAL_STEP,
    H_OWNER_PID,
    H_STEPS_PER_SECOND,
    WORKER_CLOSED,
    WORKER_FAILED,
    WORKER_READY,
    WORKER_STARTING,
    current_rate,
)
from .param_block import ParamBlock
from .params import ParamSpec
from .protocol import W_EVENTS_JOURNAL, W_PARAMS_JOURNAL, event_rings, params_seqlock, writer_lock
from .system import process_alive, segment_file

_WORKER_STATES = {WORKER_STARTING: "starting", WORKER_READY: "ready", WORKER_FAILED: "failed", WORKER_CLOSED: "closed"}


def _worker_state(control: np.ndarray) -> str:
    """A worker's state from its control words: ``dead`` where a starting or ready worker's process is
    gone (the trainer finds out at its next wait; attached monitors see it now)."""
    state = _WORKER_STATES.get(int(control[CTL_STATUS]), "?")
    pid, ticks = int(control[CTL_PID]), int(control[CTL_START_TICKS])
    if state in ("starting", "ready") and pid and ticks and not process_alive(pid, ticks):
        return "dead"
    return state


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of how a pool is doing, read from its segment."""

    global_step: int  # steps the trainer has issued
    steps_per_second: int  # env steps per second over the last second or so
    workers: list[str]  # each worker's state: starting, ready, failed, closed, or dead (its process gone)
    refusals: dict[str, int]  # raw parameter writes the workers refused, per parameter
    episodes: int  # episodes finished so far
    owner_pid: int
    age: float  # seconds since the pool was launched


class PoolView:
    """The channels of one mapped segment: ``params``, ``events``, ``episodes`` and ``stats()``."""

    def __init__(
        self,
        name: str,
        views: dict[str, np.ndarray],
        header: Any,
        meta: Mapping[str, Any],
        check_open: Callable[[], None],
    ) -> None:
        self.name = name
        self.env_label = str(meta.get("env", "?"))
        #: The seed of the ``dist`` draws (``launch(seed=)``, or the random one drawn for seed=None).
        self.param_seed = int(meta.get("param_seed", 0))
        #: Each env's episode index, which workers advance at each reset: with the seed, it keys the draws.
        self.episode_index = views["episode_index"]
        self._views = views
        self._header = header
        self._check_open = check_open
        self._created = float(meta.get("created", time.time()))
        self._owner_pid = int(header[H_OWNER_PID])
        self.specs = [ParamSpec.from_json(index, data) for index, data in enumerate(meta.get("params") or [])]
        self.lock = writer_lock(views, segment_file(name))
        self.episodes = EpisodeReader(views, check_open)
        self.events: EventSender | None = None
        hook_names = [str(h) for h in meta.get("hooks") or []]
        rings = event_rings(views)
        if hook_names:
            if rings is None or "event_undo_heads" not in views:
                raise LayoutMismatchError(f"pool {name!r} has hooks but no event rings")
            slots = [(int(start), int(stop)) for start, stop in meta["slots"]]
            self.events = EventSender(hook_names, rings, slots, self.lock, self.env_label, check_open)
        self.params: ParamBlock | None = None
        if self.specs:
            fields = {"params", "params_seq", "params_undo", "applied", "params_accepted", "param_refusals"}
            missing = fields - set(views)
            seqlock = params_seqlock(views)
            if missing or seqlock is None:
                raise LayoutMismatchError(f"pool {name!r} declares parameters but has no {sorted(missing)} fields")
            self.params = ParamBlock(self.specs, views, seqlock, self.lock, self.env_label, check_open)

    def stats(self) -> PoolStats:
        """Global step, steps/s, worker states, refusal counts, finished episodes."""
        header, views = self._header, self._views
        refusals = views["param_refusals"].sum(axis=0) if "param_refusals" in views else []
        control = views["control"]
        return PoolStats(
            global_step=int(header[H_GLOBAL_STEP]),
            steps_per_second=current_rate(int(header[H_STEPS_PER_SECOND]), control),
            workers=[_worker_state(row) for row in control],
            refusals={spec.name: int(refusals[spec.index]) for spec in self.specs},
            episodes=self.episodes.total,
            owner_pid=self._owner_pid,
            age=time.time() - self._created,
        )

    def recover_writers(self) -> None:
        """Rolls back what a writer that died mid-write left (its rows stay unread until then), unless
        the next writer does it first; a writer still at work keeps the lock, and is left alone. The
        pool's owner calls it every 64 steps."""
        writers = self._views["writers"]
        if writers[W_PARAMS_JOURNAL] or writers[W_EVENTS_JOURNAL]:
            try:
                self.lock.run(0.0, self._check_open, _nothing)  # taking the lock runs the recovery
            except WriterLockTimeoutError:
                pass

    def close(self) -> None:
        """Refuses further writes through this view's lock."""
        self.lock.close()


class SharedChannels:
    """The properties ``Pool`` and ``PoolHandle`` share: each checks that its owner is usable, then
    hands out the channel from its ``PoolView``, which subclasses set as ``_channels``; they
    define ``_check_open``."""

    _channels: PoolView
    name: str

    def _check_open(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    @property
    def params(self) -> ParamBlock:
        """The parameter block: writable numpy views per parameter, and ``write()`` (see ParamBlock)."""
        self._check_open()
        if self._channels.params is None:
            raise AttributeError(f"pool {self.name!r} was launched without params")
        return self._channels.params

    @property
    def applied(self) -> np.ndarray:
        """What each env uses now, one read-only record per env (a drawn value for a ``dist`` one)."""
        return self.params.applied

    @property
    def param_specs(self) -> dict[str, ParamSpec]:
        """The declared parameters by name, as plain data."""
        return {spec.name: spec for spec in self._channels.specs}

    @property
    def events(self) -> EventSender:
        """Sends one-shot events to the pool's hooks (see EventSender.send)."""
        self._check_open()
        if self._channels.events is None:
            raise AttributeError(f"pool {self.name!r} was launched without hooks, so it takes no events")
        return self._channels.events

    @property
    def episodes(self) -> EpisodeReader:
        """Finished-episode records since this reader's last ``read()``."""
        self._check_open()
        return self._channels.episodes

    @property
    def stats(self) -> PoolStats:
        """Global step, steps/s, worker states, refusal counts, finished episodes."""
        self._check_open()
        return self._channels.stats()

    def state_dict(self) -> checkpoints.PoolState:
        """A checkpoint of the pool's shared state, as plain data that ``pickle`` and ``torch.save`` store:
        the parameter block (distribution arguments included), each env's episode index, the draw seed
        and a schema (see ``shmpool.checkpoints``). Env internals and hook streams are not in it.

        Examples:
            >>> import pickle, shmpool
            >>> spec = {"length": shmpool.Param(dist="uniform", low=0.1, high=2.0, when="reset")}
            >>> with shmpool.launch("CartPole-v1", 4, params=spec, seed=0) as pool:
            ...     _ = pool.reset()
            ...     state = pickle.loads(pickle.dumps(pool.state_dict()))
            >>> with shmpool.launch("CartPole-v1", 4, params=spec, seed=0) as fresh:
            ...     fresh.load_state_dict(state)  # its next reset draws what the first pool's would
        """
        self._check_open()
        return checkpoints.state_dict(self._channels)

    def load_state_dict(self, state: Mapping[str, Any], *, same_draws: bool = True) -> None:
        """Loads a ``state_dict`` of a pool launched with the same env, ``num_envs`` and params.

        Parameters are written through ``params.write()`` (validated, atomic per env; workers apply them
        at their next step or reset), then the episode indices: after it, each env's next reset draws
        what the saved pool would have drawn at its next one. Call it between steps (or before the first
        reset): an env resetting while the indices land may keep its own.

        Args:
            state: what ``state_dict()`` returned, here or in another process (after ``pickle``).
            same_draws: refuse a state from a pool with another draw seed (whose draws could not
                continue here); False loads the values and indices anyway.

        Raises:
            ValueError: naming each differing schema field (or the seed), or a value the pool's bounds
                refuse; nothing is written then.
        """
        self._check_open()
        checkpoints.load_state_dict(self._channels, state, same_draws=same_draws)


class WrappedPoolChannels:
    """``params``, ``applied``, ``events`` and ``episodes`` of ``self.pool``, for the wrappers that put
    another library's API around a pool (:mod:`shmpool.envpool`, :mod:`shmpool.torchrl`)."""

    pool: Any

    @property
    def params(self) -> ParamBlock:
        """The pool's parameter block (``Pool.params``)."""
        return self.pool.params

    @property
    def applied(self) -> np.ndarray:
        """The parameter values each env uses now (``Pool.applied``)."""
        return self.pool.applied

    @property
    def events(self) -> EventSender:
        """The pool's per-step event queues (``Pool.events``)."""
        return self.pool.events

    @property
    def episodes(self) -> EpisodeReader:
        """The pool's finished-episode records (``Pool.episodes``)."""
        return self.pool.episodes


def _nothing() -> None:
    """A critical section that does nothing: taking the lock is the work."""
