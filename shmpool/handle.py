"""Attaching to a running pool by name from any process of the same user."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .errors import (
    LayoutMismatchError,
    PoolClosedError,
    PoolNotFoundError,
    SegmentNotReadyError,
)
from .layout import CONTROL_WORDS, H_GLOBAL_STEP, H_STATE, STATE_CLOSING, Layout, header_words
from .options import deadline_after
from .protocol import check_memory_model
from .registry import list_pools
from .system import ProcessWatch, Segment, is_pool_name, pid_namespace, process_alive
from .view import PoolStats, PoolView, SharedChannels

__all__ = ["PoolHandle", "PoolStats", "attach"]


class PoolHandle(SharedChannels):
    """A view of a running pool from another process: ``params`` (writable, ``write()`` included),
    ``applied`` (read-only), ``episodes`` (finished-episode records), ``events`` (when the pool has
    hooks), ``param_specs``, ``stats`` and ``alive``. Closing the handle never affects the pool.

    Made by ``attach``; use it as a context manager or call ``close``.
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
        views = layout.views(segment.buffer)
        try:
            if "writers" not in views:
                raise LayoutMismatchError(f"pool {name!r} has no 'writers' field")
            self._channels = PoolView(name, views, self._header, meta, self._check_open)
        except BaseException:
            self._owner.close()  # attach raises: nothing else will release the pidfd
            raise

    @property
    def alive(self) -> bool:
        """Whether the pool's owner still runs and has not begun closing the pool."""
        if self._closed:
            return False
        return self._header[H_STATE] != STATE_CLOSING and self._owner.alive()

    @property
    def global_step(self) -> int:
        """How many steps the pool's trainer has issued."""
        self._check_open()
        return int(self._header[H_GLOBAL_STEP])

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError(f"this handle on pool {self.name!r} is closed")
        if not self.alive:
            raise PoolClosedError(f"pool {self.name!r} has closed (or its owner died)")

    def close(self) -> None:
        """Lets go of the segment (it is unmapped once no numpy view of it is alive); the pool goes on."""
        if self._closed:
            return
        self._closed = True
        self._channels.close()
        self._owner.close()
        self._segment.close()

    def __enter__(self) -> PoolHandle:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PoolHandle({self.name!r}, env={self.env!r}, num_envs={self.num_envs}, alive={self.alive})"


def attach(name: str, *, wait: float | None = None) -> PoolHandle:
    """Finds the running pool called ``name`` and maps it, after validating its segment.

    Waits up to ``wait`` seconds for the pool to appear, and for a pool being launched to finish its header (None: do
    not wait). Raises ``PoolNotFoundError`` (listing the pools that exist, or saying the owner is dead or in another pid
    namespace), ``LayoutMismatchError`` for a segment that is not a shmpool one of this layout version or is damaged in
    any way, and ``PermissionError`` for another user's pool. Nothing in the segment is unpickled.

    Examples:
        >>> import shmpool
        >>> with shmpool.launch("CartPole-v1", 4, params={"length": shmpool.Param()}) as pool:
        ...     with shmpool.attach(pool.name) as handle:
        ...         handle.params.write([0, 1], length=0.8)  # the write's version
        1
    """
    check_memory_model()
    deadline = deadline_after(wait, f"attach({name!r})")
    while True:  # until the segment exists and has its header (a pool being launched gets both soon)
        segment, closing = None, False
        try:
            segment = Segment.open(name)
            layout, header = Layout.read(segment.buffer)
            closing = header_words(segment.buffer)[H_STATE] == STATE_CLOSING  # by its owner: a dead one's is stale
            closing = closing and process_alive(header.owner_pid, header.owner_start_ticks)
            if not closing:
                break
            segment.close()  # a pool on its way out is as good as gone (a restarted one may come)
        except PoolNotFoundError:
            if not is_pool_name(name):  # Segment.open's word: no pool can have that name
                raise
            if deadline is None or time.monotonic() > deadline:
                others = [record.name for record in list_pools() if record.alive]
                raise PoolNotFoundError(f"no pool named {name!r}; running pools: {others or 'none'}") from None
        except SegmentNotReadyError:
            if segment is not None:
                segment.close()
            if deadline is None or time.monotonic() > deadline:
                raise
        except BaseException:
            if segment is not None:
                segment.close()
            raise
        if closing and (deadline is None or time.monotonic() > deadline):
            raise PoolNotFoundError(f"pool {name!r} is closing")
        time.sleep(0.05)
    try:
        _check_pool_meta(name, layout)
        if header.owner_pid_namespace != pid_namespace():
            raise PoolNotFoundError(
                f"pool {name!r} belongs to a process in another pid namespace (another container sharing "
                f"/dev/shm), whose pid means nothing here; attach from a process in the owner's namespace"
            )
        if not process_alive(header.owner_pid, header.owner_start_ticks):
            raise PoolNotFoundError(
                f"pool {name!r} is stale: its owner (pid {header.owner_pid}) is dead; `shmpool gc` removes it"
            )
        try:
            return PoolHandle(name, segment, layout, header.owner_pid, header.owner_start_ticks)
        except LayoutMismatchError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, OverflowError) as exc:
            # Whatever the checks above missed: the fields do not hold what the table promises.
            raise LayoutMismatchError(
                f"segment {name!r} is damaged: its fields do not match its table ({type(exc).__name__}: {exc!s:.200})"
            ) from exc
    except BaseException:
        segment.close()
        raise


_EPISODE_FIELDS = {"env_id", "episode", "step", "return", "length"}


def _check_pool_meta(name: str, layout: Layout) -> None:
    """Checks the metadata and fields a handle relies on, so that a damaged or crafted segment is a
    ``LayoutMismatchError`` here, never a ``TypeError`` or ``IndexError`` from deep inside later."""
    meta, fields = layout.meta, layout.fields

    def refuse(what: str) -> LayoutMismatchError:
        return LayoutMismatchError(
            f"segment {name!r} is not a valid shmpool pool ({what}): it was damaged, or written by something else"
        )

    def count(value: Any, low: int, high: int) -> bool:
        return type(value) is int and low <= value <= high  # type(): a JSON true is not a count

    num_envs, num_workers = meta.get("num_envs"), meta.get("num_workers")
    if not count(num_envs, 1, 1 << 31):
        raise refuse(f"num_envs is {num_envs!r:.40}")
    assert isinstance(num_envs, int)
    if not count(num_workers, 1, num_envs):
        raise refuse(f"num_workers is {num_workers!r:.40}")
    slots = meta.get("slots")
    if (
        not isinstance(slots, list)
        or len(slots) != num_workers
        or not all(isinstance(s, list) and len(s) == 2 and all(count(n, 0, num_envs) for n in s) for s in slots)
        or [s[0] for s in slots] != [0] + [s[1] for s in slots[:-1]]
        or slots[-1][1] != num_envs
        or any(start >= stop for start, stop in slots)
    ):
        raise refuse(f"slots are {slots!r:.80}")
    for key, kind in (("env", str), ("hooks", list), ("params", list)):
        if meta.get(key) is not None and not isinstance(meta[key], kind):
            raise refuse(f"{key} is a {type(meta[key]).__name__}")
    if not all(isinstance(hook, str) for hook in meta.get("hooks") or []):
        raise refuse("a hook name is not a string")
    if not all(isinstance(param, dict) for param in meta.get("params") or []):
        raise refuse("a parameter description is not an object")
    created = meta.get("created", 0.0)
    if not isinstance(created, (int, float)) or isinstance(created, bool) or not -1e18 < created < 1e18:
        raise refuse(f"created is {created!r:.40}")
    control = fields.get("control")
    if control is None or control.dtype != np.dtype(np.int64) or control.shape != (num_workers, CONTROL_WORDS):
        raise refuse("its control field does not match its worker count")
    records, heads = fields.get("episode_records"), fields.get("episode_heads")
    reserved = fields.get("episode_reserved")
    if (
        records is None
        or heads is None
        or reserved is None
        or len(records.shape) != 2
        or records.shape[0] != num_workers
        or not _EPISODE_FIELDS <= set(records.dtype.names or ())
        or any(words.dtype != np.dtype(np.int64) or words.shape != (num_workers,) for words in (heads, reserved))
    ):
        raise refuse("its episode ring does not match its worker count")
    refusals = fields.get("param_refusals")
    params = meta.get("params") or []
    if params and (
        refusals is None or refusals.dtype != np.dtype(np.int64) or refusals.shape != (num_workers, len(params))
    ):
        raise refuse("its refusal counters do not match its parameters")
