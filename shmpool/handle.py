"""Attaching to a running pool by name from any process of the same user."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .episodes import EpisodeReader
from .errors import LayoutMismatchError, PoolClosedError, PoolNotFoundError
from .events import EventSender
from .layout import (
    CONTROL_WORDS,
    CTL_STATUS,
    H_GLOBAL_STEP,
    H_STATE,
    H_STEPS_PER_SECOND,
    STATE_CLOSING,
    WORKER_CLOSED,
    WORKER_FAILED,
    WORKER_READY,
    WORKER_STARTING,
    Layout,
    header_words,
)
from .params import ParamBlock, ParamSpec
from .registry import list_pools
from .system import ProcessWatch, Segment, WriterLock, process_alive

_WORKER_STATES = {WORKER_STARTING: "starting", WORKER_READY: "ready", WORKER_FAILED: "failed", WORKER_CLOSED: "closed"}


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of how a pool is doing, read from its segment."""

    global_step: int  # steps the trainer has issued
    steps_per_second: int  # env steps per second over the last second or so
    workers: list[str]  # each worker's state: starting, ready, failed or closed
    refusals: dict[str, int]  # raw parameter writes the workers refused, per parameter
    episodes: int  # episodes finished so far
    owner_pid: int
    age: float  # seconds since the pool was launched


class PoolHandle:
    """A view of a running pool from another process: ``params`` (writable, ``write()`` included),
    ``applied`` (read-only), ``episodes`` (finished-episode records), ``events`` (when the pool has
    hooks), ``param_specs``, ``stats`` and ``alive``. Closing the handle never affects the pool.

    Made by :func:`attach`; use it as a context manager or call :meth:`close`.
    """

    def __init__(self, name: str, segment: Segment, layout: Layout, owner_pid: int, owner_start_ticks: int) -> None:
        self.name = name
        self._segment = segment
        self._owner = ProcessWatch(owner_pid, owner_start_ticks)  # a pidfd: cheap to ask on every write
        self._header = header_words(segment.buffer)
        self._closed = False
        meta = layout.meta
        self.num_envs = int(meta["num_envs"])
        self.num_workers = int(meta["num_workers"])
        self.env = str(meta.get("env", "?"))
        specs = [ParamSpec.from_json(index, data) for index, data in enumerate(meta.get("params") or [])]
        self.param_specs: dict[str, ParamSpec] = {spec.name: spec for spec in specs}
        views = layout.views(segment.buffer)
        self._views = views
        self._control = views["control"]
        self._lock = WriterLock(name)
        self._created = float(meta.get("created", time.time()))
        self.episodes = EpisodeReader(views, self._check_open)
        hook_names = [str(h) for h in meta.get("hooks") or []]
        if hook_names:
            for field in ("events", "event_heads", "event_tails"):
                if field not in views:
                    raise LayoutMismatchError(f"pool {name!r} has hooks but no {field!r} field")
            slots = [(int(start), int(stop)) for start, stop in meta["slots"]]
            self.events = EventSender(hook_names, views, slots, self._lock, self.env, self._check_open)
        if specs:
            missing = {"params", "params_seq", "applied", "param_refusals"} - set(views)
            if missing:
                raise LayoutMismatchError(f"pool {name!r} declares parameters but has no {sorted(missing)} fields")
            self.params = ParamBlock(specs, views, self._lock, self.env, self._check_open)

    @property
    def alive(self) -> bool:
        """Whether the pool's owner still runs and has not begun closing the pool."""
        if self._closed:
            return False
        return self._header[H_STATE] != STATE_CLOSING and self._owner.alive()

    @property
    def stats(self) -> PoolStats:
        """Global step, steps/s, worker states, refusal counts, finished episodes."""
        self._check_open()
        header = self._header
        refusals = self._views["param_refusals"].sum(axis=0) if "param_refusals" in self._views else []
        return PoolStats(
            global_step=int(header[H_GLOBAL_STEP]),
            steps_per_second=int(header[H_STEPS_PER_SECOND]),
            workers=[_WORKER_STATES.get(int(self._control[k, CTL_STATUS]), "?") for k in range(self.num_workers)],
            refusals={name: int(refusals[spec.index]) for name, spec in self.param_specs.items()},
            episodes=self.episodes.total,
            owner_pid=self._owner.pid,
            age=time.time() - self._created,
        )

    @property
    def global_step(self) -> int:
        """How many steps the pool's trainer has issued."""
        self._check_open()
        return int(self._header[H_GLOBAL_STEP])

    @property
    def applied(self) -> np.ndarray:
        """What each env uses now: one read-only record per env."""
        self._check_open()
        return self.params.applied

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError(f"this handle on pool {self.name!r} is closed")
        if not self.alive:
            raise PoolClosedError(f"pool {self.name!r} has closed (or its owner died)")

    def close(self) -> None:
        """Unmaps the segment (once no numpy view of it is alive); the pool goes on."""
        if self._closed:
            return
        self._closed = True
        self._lock.close()
        self._owner.close()
        self._header.release()
        self._views = {}
        self.__dict__.pop("events", None)
        self.__dict__.pop("episodes", None)
        self.__dict__.pop("params", None)
        self._segment.close()

    def __enter__(self) -> PoolHandle:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PoolHandle({self.name!r}, env={self.env!r}, num_envs={self.num_envs}, alive={self.alive})"


def attach(name: str, *, timeout: float | None = None) -> PoolHandle:
    """Finds the running pool called ``name`` and maps it, after validating its segment.

    Waits up to ``timeout`` seconds for the pool to appear (None: do not wait). Raises
    ``PoolNotFoundError`` (listing the pools that exist, or saying the owner is dead),
    ``LayoutMismatchError`` for a segment that is not a shmpool one of this layout version, and
    ``PermissionError`` for another user's pool. Nothing in the segment is unpickled.

    Example:
        >>> import shmpool
        >>> with shmpool.launch("CartPole-v1", 4, params={"length": shmpool.Param()}) as pool:
        ...     with shmpool.attach(pool.name) as handle:
        ...         handle.params.write([0, 1], length=0.8)
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            segment = Segment.open(name)
            break
        except PoolNotFoundError:
            if deadline is None or time.monotonic() > deadline:
                others = [record.name for record in list_pools() if record.alive]
                raise PoolNotFoundError(f"no pool named {name!r}; running pools: {others or 'none'}") from None
            time.sleep(0.05)
    try:
        layout, header = Layout.read(segment.buffer)
        if "num_envs" not in layout.meta or "control" not in layout.fields:
            raise LayoutMismatchError(f"segment {name!r} is not a shmpool pool")
        if not process_alive(header.owner_pid, header.owner_start_ticks):
            raise PoolNotFoundError(
                f"pool {name!r} is stale: its owner (pid {header.owner_pid}) is dead; `shmpool gc` removes it"
            )
        if layout.fields["control"].shape != (int(layout.meta["num_workers"]), CONTROL_WORDS):
            raise LayoutMismatchError(f"pool {name!r}: control field does not match its worker count")
        return PoolHandle(name, segment, layout, header.owner_pid, header.owner_start_ticks)
    except BaseException:
        segment.close()
        raise
