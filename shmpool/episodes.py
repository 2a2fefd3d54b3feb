"""Finished-episode records: one ring per worker in the segment, read by any number of readers.

Workers never wait for readers; a reader that falls more than a ring behind counts what it lost and never returns a
record that was overwritten while it copied. Why and how: ``docs/internals.md``, "shmpool/episodes.py".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


def episode_dtype(applied: np.dtype[Any] | None, metrics: Sequence[str]) -> np.dtype[Any]:
    """The record of one finished episode."""
    fields: list[Any] = [
        ("env_id", "<i8"),
        ("episode", "<i8"),
        ("step", "<i8"),  # the pool's global step at which it ended
        ("return", "<f8"),
        ("length", "<i8"),
        ("terminated", "?"),
        ("truncated", "?"),
    ]
    if applied is not None:
        fields.append(("params", applied))
    if metrics:
        fields.append(("metrics", [(name, "<f8") for name in metrics]))
    return np.dtype(fields)


def metric_value(info: Mapping[str, Any], key: str) -> float:
    """The number at ``key`` of an env's final info (``a/b`` for nested dicts), NaN if absent."""
    value: Any = info
    for part in key.split("/"):
        if not isinstance(value, Mapping) or part not in value:
            return math.nan
        value = value[part]
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


class EpisodeWriter:
    """Worker side: appends records to this worker's ring."""

    def __init__(self, views: dict[str, np.ndarray], worker_id: int, metrics: Mapping[str, str]) -> None:
        self._records = views["episode_records"][worker_id]
        self._heads = views["episode_heads"]
        self._reserved = views["episode_reserved"]
        self._worker_id = worker_id
        self._capacity = len(self._records)
        self._applied = views.get("applied")
        fields = self._records.dtype.fields
        # The info keys of the declared metrics, in the order of the record's fields.
        self._metric_names = list(fields["metrics"][0].names) if "metrics" in fields else []
        self._metric_keys = [metrics[name] for name in self._metric_names]

    @property
    def plain_ring(self) -> np.ndarray | None:
        """This worker's ring, for a writer that fills records itself (the numba engine's compiled
        episode ends) when they hold no parameters or metrics; else None."""
        return None if self._applied is not None or self._metric_keys else self._records

    def reserve(self, count: int) -> int:
        """Announces ``count`` records about to be written into ``plain_ring``; returns where
        the first goes (modulo the capacity). ``publish`` them once written."""
        head = int(self._heads[self._worker_id])
        self._reserved[self._worker_id] = head + count
        return head

    def publish(self, count: int) -> None:
        """Publishes the ``count`` records written since ``reserve``."""
        self._heads[self._worker_id] += count

    def append(
        self,
        env_id: int,
        episode: int,
        step: int,
        total: float,
        length: int,
        terminated: bool,
        truncated: bool,
        info: Mapping[str, Any] | None,
    ) -> None:
        """Writes one record, then publishes it by advancing the head."""
        head = int(self._heads[self._worker_id])
        values: list[Any] = [env_id, episode, step, total, length, terminated, truncated]
        if self._applied is not None:
            values.append(self._applied[env_id])
        if self._metric_keys:
            values.append(tuple(metric_value(info or {}, key) for key in self._metric_keys))
        self._reserved[self._worker_id] = head + 1
        self._records[head % self._capacity] = tuple(values)  # one store: an eighth of field by field
        self._heads[self._worker_id] = head + 1

    def append_many(
        self,
        env_ids: np.ndarray,
        episodes: np.ndarray,
        step: int,
        totals: np.ndarray,
        lengths: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        infos: Mapping[str, np.ndarray] | None,
    ) -> None:
        """``append`` for several finished episodes at once (one entry each), published together;
        ``infos``: the final info values of those episodes by key, as ``append``'s info holds them
        (flat: an ``a/b`` metric is NaN, as in a flat info dict)."""
        count = len(env_ids)
        records = np.zeros(count, dtype=self._records.dtype)
        for name, values in (
            ("env_id", env_ids),
            ("episode", episodes),
            ("step", step),
            ("return", totals),
            ("length", lengths),
            ("terminated", terminated),
            ("truncated", truncated),
        ):
            records[name] = values
        if self._applied is not None:
            records["params"] = self._applied[env_ids]
        for name, key in zip(self._metric_names, self._metric_keys):
            records["metrics"][name] = _metric_column((infos or {}).get(key), count)
        head = self.reserve(count)
        # More records than the ring holds: the newest stay, as one append at a time would leave them.
        skip = max(0, count - self._capacity)
        self._records[(head + np.arange(skip, count)) % self._capacity] = records[skip:]
        self.publish(count)


def _metric_column(values: np.ndarray | None, count: int) -> np.ndarray:
    """A metric's values for ``count`` episodes from an info column: NaN where ``metric_value``
    gives NaN (no such key, or a value that is not one number)."""
    if values is None or values.dtype.kind not in "biuf" or values.shape != (count,):
        return np.full(count, math.nan)
    return values.reshape(count).astype(np.float64)


class EpisodeReader:
    """Reads the records finished since this reader's last ``read`` (its own cursor per ring)."""

    def __init__(self, views: dict[str, np.ndarray], check_open: Callable[[], None]) -> None:
        self._records = views["episode_records"]
        self._heads = views["episode_heads"]
        self._reserved = views["episode_reserved"]
        self._check_open = check_open
        self._cursors = self._heads.copy()
        self.capacity = self._records.shape[1]
        self.lost = 0  # records this reader never saw because it fell more than a ring behind

    @property
    def dtype(self) -> np.dtype[Any]:
        """The record type."""
        return self._records.dtype

    def read(self) -> np.ndarray:
        """The new records, ordered by the step they ended at, then env id."""
        self._check_open()
        chunks = []
        for worker_id in range(len(self._heads)):
            start, chunk = self._copy(worker_id, int(self._cursors[worker_id]))
            self._cursors[worker_id] = start + len(chunk)
            chunks.append(chunk)
        records = np.concatenate(chunks) if chunks else np.zeros(0, self.dtype)
        return records[np.lexsort((records["env_id"], records["step"]))]

    def recent(self, count: int) -> np.ndarray:
        """Up to the last ``count`` records of each ring, without moving the cursor."""
        self._check_open()
        chunks = []
        for worker_id in range(len(self._heads)):
            head = int(self._heads[worker_id])
            chunks.append(self._copy(worker_id, max(0, head - count), count_lost=False)[1])
        records = np.concatenate(chunks) if chunks else np.zeros(0, self.dtype)
        return records[np.lexsort((records["env_id"], records["step"]))]

    def _copy(self, worker_id: int, start: int, count_lost: bool = True) -> tuple[int, np.ndarray]:
        head = int(self._heads[worker_id])
        if head - start > self.capacity:
            if count_lost:
                self.lost += head - self.capacity - start
            start = head - self.capacity
        chunk = self._records[worker_id][np.arange(start, head) % self.capacity]  # a copy
        overwritten = int(self._reserved[worker_id]) - self.capacity - start  # while copying, or being
        if overwritten > 0:
            if count_lost:
                self.lost += overwritten
            chunk, start = chunk[overwritten:], start + overwritten
        return start, chunk

    @property
    def total(self) -> int:
        """Episodes finished in the pool so far."""
        return int(self._heads.sum())
