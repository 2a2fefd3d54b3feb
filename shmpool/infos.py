"""Env ``info`` dicts through shared memory, without pickling.

Why and how: ``docs/internals.md``, "shmpool/infos.py".
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np

from .errors import LayoutMismatchError
from .layout import CTL_INFO_KEYS, CTL_INFO_OVERFLOW, decode_dtype

Path = tuple[Any, ...]
MAX_PATH_BYTES = 120
INFO_KEY_DTYPE = np.dtype(
    [("path", f"S{MAX_PATH_BYTES}"), ("dtype", "S8"), ("ndim", "<i8"), ("shape", "<i8", (4,)), ("batch", "<i8")]
)

#: How gymnasium's vector envs batch a key's values (a key record's ``batch``): into an array of their
#: dtype; into an object array (numpy scalars that are no ``np.number``: ``np.bool_``; instances of an
#: int or float subclass: an ``IntEnum`` member), the values traveling as their dtype; or, for an empty
#: nested dict, into a dict (nothing travels but the mask).
BATCH_TYPED, BATCH_OBJECTS, BATCH_DICT = 0, 1, 2


def info_format(value: Any, max_bytes: int) -> tuple[np.dtype[Any], tuple[int, ...], int] | None:
    """The dtype and shape a key's value is stored with, and how gymnasium would batch it; None if it
    cannot travel."""
    if isinstance(value, bool):
        return np.dtype(np.bool_), (), BATCH_TYPED
    if type(value) is int:
        return np.dtype(np.int64), (), BATCH_TYPED
    if type(value) is float:
        return np.dtype(np.float64), (), BATCH_TYPED
    if isinstance(value, np.number):  # as an array's: a complex or a wider one than info_bytes cannot travel
        fits = value.dtype.kind in "iuf" and value.dtype.itemsize <= max_bytes
        return (value.dtype, (), BATCH_TYPED) if fits else None
    if isinstance(value, np.bool_):
        return value.dtype, (), BATCH_OBJECTS
    if isinstance(value, (int, float)):  # a subclass: its number travels, not its class (InfoReader warns)
        return np.dtype(np.int64 if isinstance(value, int) else np.float64), (), BATCH_OBJECTS
    if (
        isinstance(value, np.ndarray)
        and value.dtype.kind in "biuf"
        and 0 < value.nbytes <= max_bytes
        and value.ndim <= 4
    ):
        return value.dtype, value.shape, BATCH_TYPED
    return None


def typed_view(values: np.ndarray, slot: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    """The values of key ``slot`` for every env of ``values``, as an array of ``(envs, *shape)``."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return values[:, slot, :nbytes].view(dtype).reshape(values.shape[0], *shape)


class InfoWriter:
    """Worker side: writes the infos of one slot's envs."""

    def __init__(self, key_table: np.ndarray, values: np.ndarray, mask: np.ndarray, control: np.ndarray) -> None:
        self._table = key_table  # (info_keys,) records of this worker
        self._values = values  # (slot envs, info_keys, info_bytes)
        self._mask = mask  # (slot envs, info_keys)
        self._control = control  # this worker's control row
        # (path, type) of a scalar or (path, dtype, shape) of an array -> its record (-1: none left)
        self._slots: dict[tuple[Any, ...], int] = {}
        #: (path, dtype, shape, batch) -> record
        self._records: dict[tuple[Path, str, tuple[int, ...], int], int] = {}
        self._views: list[np.ndarray | None] = []  # None: a value left out, or an empty dict
        self.dirty = False  # whether any env of the slot reported info since begin()

    def begin(self) -> None:
        """Forgets the previous step's infos."""
        if self.dirty:
            self._mask[:] = False
            self.dirty = False

    def add(self, local_index: int, info: dict[str, Any], prefix: Path = ()) -> None:
        """Stores the info of the env at ``local_index`` of the slot (nested dicts under ``prefix``)."""
        self.dirty = True
        for key, value in info.items():
            path = (*prefix, key)
            if isinstance(value, dict) and value:
                self.add(local_index, value, path)
                continue
            # A scalar's type fixes its dtype; an array's dtype and shape are checked on every value,
            # so a value that changes either goes to a record of its own instead of being cast.
            kind = (path, value.dtype, value.shape) if isinstance(value, np.ndarray) else (path, type(value))
            slot = self._slots.get(kind)
            if slot is None:
                slot = self._register(kind, path, value)
            if slot < 0:
                continue
            view = self._views[slot]
            if view is not None:
                try:
                    view[local_index] = value
                except (OverflowError, TypeError, ValueError):
                    # An int beyond int64: reported like any value that cannot travel, not dropped quietly.
                    self._register((path, None), path, None)
                    continue
            elif not isinstance(value, dict):  # left out (an empty dict travels as its mask alone)
                continue
            self._mask[local_index, slot] = True

    def add_column(self, path: Path, values: np.ndarray, rows: np.ndarray | slice, like: Any) -> None:
        """Stores info key ``path`` for the envs where ``rows`` (a bool mask over the slot, or a slice) is set:
        ``values[i]`` for env ``i``, every value of the type of ``like``, which fixes the key's record
        as ``add`` would for ``like`` (a slot's infos computed as arrays, not dicts)."""
        self.dirty = True
        kind = (path, like.dtype, like.shape) if isinstance(like, np.ndarray) else (path, type(like))
        slot = self._slots.get(kind)
        if slot is None:
            slot = self._register(kind, path, like)
        if slot < 0 or self._views[slot] is None:
            return
        self._views[slot][rows] = values[rows]  # type: ignore[index]
        self._mask[rows, slot] = True

    def _register(self, kind: tuple[Any, ...], path: Path, value: Any) -> int:
        fmt = info_format(value, self._values.shape[2])
        if fmt is not None:
            same = self._records.get((path, fmt[0].str, *fmt[1:]))
            if same is not None:  # another type stored alike (float and np.float64): one record for both
                self._slots[kind] = same
                return same
        if kind in self._slots:
            return self._slots[kind]
        encoded = json.dumps(list(path), default=str).encode()
        slot = len(self._views)
        if slot >= len(self._table) or len(encoded) > MAX_PATH_BYTES:
            self._slots[kind] = -1
            self._control[CTL_INFO_OVERFLOW] += 1
            return -1
        record = self._table[slot]
        record["path"] = encoded
        if fmt is None:
            record["dtype"] = b""
            record["batch"] = BATCH_DICT if isinstance(value, dict) else BATCH_TYPED
            self._views.append(None)
        else:
            dtype, shape, batch = fmt
            record["dtype"] = dtype.str.encode()
            record["ndim"] = len(shape)
            record["shape"][: len(shape)] = shape
            record["batch"] = batch
            self._views.append(typed_view(self._values, slot, dtype, shape))
            self._records[(path, dtype.str, shape, batch)] = slot
        self._slots[kind] = slot
        self._control[CTL_INFO_KEYS] = slot + 1  # publish after the record is complete
        return slot


def _as_key(part: Any) -> Any:
    """A path part read back from JSON as the dict key it was: JSON gives a tuple back as a list."""
    return tuple(_as_key(item) for item in part) if isinstance(part, list) else part


def _same_kind(one: _Key, other: _Key) -> bool:
    return (one.path, one.dtype, one.shape, one.batch) == (other.path, other.dtype, other.shape, other.batch)


def _indices(rows: Any) -> np.ndarray:
    """A slice of rows (with a stop) as the array of its indices; an index array as itself."""
    return np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows


class _Key:
    __slots__ = ("path", "view", "dtype", "shape", "batch")

    def __init__(
        self,
        path: Path,
        view: np.ndarray | None,
        dtype: np.dtype[Any] | None,
        shape: tuple[int, ...],
        batch: int = BATCH_TYPED,
    ):
        self.path, self.view, self.dtype, self.shape, self.batch = path, view, dtype, shape, batch


class InfoReader:
    """Trainer side: rebuilds the vector info dict from the slots of the workers that reported.

    Workers are read in the order of their slots (lowest env ids first), so that a key's array takes
    the dtype and shape of the lowest env's value, as in gymnasium.
    """

    def __init__(
        self,
        key_tables: np.ndarray,
        values: np.ndarray,
        mask: np.ndarray,
        control: np.ndarray,
        slots: list[tuple[int, int]],
    ) -> None:
        self._tables = key_tables
        self._values = values
        self._mask = mask
        self._control = control
        self._slots = slots
        self._num_envs = values.shape[0]
        self._keys: list[list[_Key]] = [[] for _ in slots]
        self._paths: list[set[Path]] = [set() for _ in slots]
        self._several = [False] * len(slots)  # whether a worker has a key with records of two kinds
        self._overflow_warned = [0] * len(slots)
        self._warned: set[tuple[str, Path]] = set()
        self._columns_counts: tuple[int, ...] = ()
        self._columns: list[tuple[str, str, np.ndarray, tuple[int, ...]]] | None = None
        #: Every env reported it: the mask each key of a step like that gets a copy of (a copy costs a
        #: ninth of ``np.ones``, which the trainer would pay for every key of every step).
        self._reported_by_all = np.ones(self._num_envs, dtype=np.bool_)

    def read_all(self, infos: dict[str, Any], workers: list[int]) -> None:
        """``read_into`` for each of ``workers`` (those that reported infos this step), into an empty
        ``infos``. When every worker has the same flat keys, recorded alike, and all reported this
        step, each key is one copy of its column over the pool instead of a copy per worker: the same
        arrays, the keys in the order of their records."""
        columns = self._same_columns() if len(workers) == len(self._slots) else None
        if columns is None:
            for worker_id in workers:
                self.read_into(infos, worker_id)
            return
        mask = self._mask[:, : len(columns)]
        # Every env reported every key (the common case): no zeros, no index arrays. Counted, at a
        # third of ``mask.all()``'s cost.
        if np.count_nonzero(mask) == mask.size:
            every = self._reported_by_all
            for name, mask_name, view, _ in columns:
                infos[name], infos[mask_name] = view.copy(), every.copy()
            return
        reported_by_some = np.asarray(mask.any(axis=0))
        for slot, (name, mask_name, view, rows_shape) in enumerate(columns):
            if reported_by_some[slot]:  # zeros where an env did not report it, as gymnasium leaves them
                reported = mask[:, slot]
                infos[name] = np.where(reported.reshape(rows_shape), view, np.zeros((), view.dtype))
                infos[mask_name] = reported.copy()

    def _same_columns(self) -> list[tuple[str, str, np.ndarray, tuple[int, ...]]] | None:
        """When every worker's keys are the same top-level keys of numbers, each recorded alike at
        the same record: per record, the key, its mask's key, its values over the pool and the shape
        that spreads a mask of envs over them; None otherwise."""
        keys = [self._refresh(worker_id) for worker_id in range(len(self._slots))]
        counts = tuple(len(each) for each in keys)
        if counts != self._columns_counts:  # keys only grow: the answer changes when they do
            self._columns_counts = counts
            first = keys[0]
            same = (
                not any(self._several)
                and len(set(counts)) == 1
                and all(
                    key.view is not None
                    and key.batch == BATCH_TYPED
                    and len(key.path) == 1
                    and isinstance(key.path[0], str)
                    for key in first
                )
                and all(_same_kind(key, other[slot]) for other in keys[1:] for slot, key in enumerate(first))
                # A key named as another's mask ("x" and "_x") shares its array in gymnasium's way.
                and not {f"_{key.path[0]}" for key in first} & {key.path[0] for key in first}
            )
            self._columns = (
                [(key.path[0], f"_{key.path[0]}", key.view, (-1, *(1,) * len(key.shape))) for key in first]  # type: ignore[misc]
                if same and first
                else None
            )
        return self._columns

    def read_into(self, infos: dict[str, Any], worker_id: int, at: int | None = None, size: int | None = None) -> None:
        """Adds the infos that ``worker_id`` reported this step to ``infos``: in arrays of one row per
        env, or, with ``at``, in arrays of ``size`` rows where the slot's rows start at row ``at``
        (an async batch of a few slots)."""
        keys = self._refresh(worker_id)
        start, stop = self._slots[worker_id]
        first = start if at is None else at
        rows = self._num_envs if size is None else size
        mask = self._mask[start:stop, : len(keys)]
        reported = mask.sum(axis=0)
        present = np.flatnonzero(reported)
        if self._several[worker_id] and len(present) > 1:
            # Records in the order of the first env reporting them: that env's value sizes the array.
            present = present[np.argsort(mask[:, present].argmax(axis=0), kind="stable")]
        count = stop - start
        for slot in present.tolist():
            key = keys[slot]
            if key.view is None and key.batch != BATCH_DICT:
                continue
            if reported[slot] == count:  # every env of the slot: slices, no index arrays
                self._put(infos, key, slice(start, stop), slice(first, first + count), rows)
            else:
                local = np.flatnonzero(mask[:, slot])
                self._put(infos, key, local + start, local + first, rows)

    def _put(self, infos: dict[str, Any], key: _Key, source: Any, target: Any, rows: int) -> None:
        """Copies ``key``'s values of the envs ``source`` (env ids) to rows ``target`` of its array."""
        container = infos
        for part in key.path[:-1]:
            inner = container.get(part)
            if inner is None:
                inner = container[part] = {}
            container = inner
            if not isinstance(container, dict):
                self._warn_once("nesting", key.path, "is a dict in some envs' infos and a value in others'")
                return
        name = key.path[-1]
        array = container.get(name)
        if key.batch == BATCH_DICT:  # an empty nested info: a dict, as gymnasium's recursion leaves it
            if array is None:
                container[name] = {}
            elif not isinstance(array, dict):
                self._warn_once("nesting", key.path, "is a dict in some envs' infos and a value in others'")
                return
        elif array is None and key.batch == BATCH_OBJECTS:
            array = container[name] = np.full(rows, None, dtype=object)
            values = key.view[source]  # type: ignore[index]
            # numpy bools stay numpy bools; a subclass's numbers become the Python int or float they are
            array[target] = list(values) if values.dtype.kind == "b" else values.tolist()
        elif array is None:
            array = container[name] = np.zeros((rows, *key.shape), key.dtype)
            array[target] = key.view[source]  # type: ignore[index]
        elif type(array) is np.ndarray and array.dtype == key.dtype and array.shape[1:] == key.shape:
            array[target] = key.view[source]  # type: ignore[index]
        else:
            target = self._put_other_kind(array, key, _indices(source), _indices(target))
            if not target.size:
                return
        self._mark(infos, key.path, target, rows)

    def _put_other_kind(self, array: Any, key: _Key, source: np.ndarray, target: np.ndarray) -> np.ndarray:
        """Assigns, one env at a time as gymnasium does, values whose dtype or shape differ from those
        of the key's array this step (made for a lower env's value); returns the rows whose values fit."""
        if not isinstance(array, np.ndarray):
            self._warn_once("nesting", key.path, "is a dict in some envs' infos and a value in others'")
            return target[:0]
        view = key.view
        assert view is not None and key.dtype is not None
        kept, objects = [], array.dtype == object
        # A subclass's number (an IntEnum member's) as the Python int or float it is, as _put gives it
        numbers = objects and key.batch == BATCH_OBJECTS and key.dtype.kind != "b"
        for env_id, row in zip(source.tolist(), target.tolist()):
            value = view[env_id]
            if objects and type(value) is np.ndarray:  # held as an object: a copy, not a view of the segment
                value = value.copy()
            elif numbers:
                value = value.item()
            try:
                array[row] = value
            except (OverflowError, TypeError, ValueError):
                self._warn_once(
                    "fit",
                    key.path,
                    f"of env {env_id} (shape {key.shape}, {key.dtype}) does not fit this step's array of the key "
                    f"(shape {array.shape[1:]}, {array.dtype}), made for a lower env's value; gymnasium's vector "
                    f"envs raise here, shmpool leaves it out of info",
                )
                continue
            kept.append((env_id, row))
        if kept and not np.can_cast(key.dtype, array.dtype, casting="same_kind"):
            self._warn_once(
                "cast",
                key.path,
                f"of env {kept[0][0]} is {key.dtype}, but this step's array of the key is {array.dtype} (the type of "
                f"a lower env's value): the value is truncated into it, as gymnasium's vector envs do. "
                f"Report one type per key (e.g. always a float) to keep such values whole",
            )
        return np.array([row for _, row in kept], dtype=np.int64)

    def _mark(self, infos: dict[str, Any], path: Path, target: Any, rows: int) -> None:
        """Sets the ``_key`` masks along ``path`` for rows ``target`` (of ``rows``)."""
        container = infos
        for part in path:
            present = container.get(f"_{part}")
            if present is None:
                present = container[f"_{part}"] = np.zeros(rows, dtype=np.bool_)
            present[target] = True
            container = container[part]

    def _warn_once(self, what: str, path: Path, text: str) -> None:
        if (what, path) in self._warned:
            return
        self._warned.add((what, path))
        warnings.warn(
            f"info key {'/'.join(map(str, path))!r}: the value {text} (warned once per key)",
            RuntimeWarning,
            stacklevel=7,
        )

    def _refresh(self, worker_id: int) -> list[_Key]:
        keys = self._keys[worker_id]
        published = min(int(self._control[worker_id, CTL_INFO_KEYS]), self._tables.shape[1])
        for slot in range(len(keys), published):
            key = self._decode(worker_id, slot)
            if key.path in self._paths[worker_id]:
                self._several[worker_id] = True
            self._paths[worker_id].add(key.path)
            keys.append(key)
        overflow = int(self._control[worker_id, CTL_INFO_OVERFLOW])
        if overflow > self._overflow_warned[worker_id]:
            self._overflow_warned[worker_id] = overflow
            warnings.warn(
                f"worker {worker_id} saw {overflow} info key(s) beyond its table of {self._tables.shape[1]} keys "
                f"(each dtype and shape that a key's values take counts as one), or with a path over "
                f"{MAX_PATH_BYTES} bytes as JSON; they are left out of info. Raise launch(info_keys=...) for "
                f"the first; shorten the key for the second.",
                RuntimeWarning,
                stacklevel=4,
            )
        return keys

    def _decode(self, worker_id: int, slot: int) -> _Key:
        record = self._tables[worker_id, slot]
        try:
            path = tuple(_as_key(part) for part in json.loads(bytes(record["path"]).decode()))
            if not path:
                raise ValueError("empty path")
            hash(path)  # a JSON object (no key a worker writes) would be no dict key
        except (ValueError, TypeError):
            return _Key(("?",), None, None, ())
        batch = int(record["batch"])
        if batch == BATCH_DICT:
            return _Key(path, None, None, (), BATCH_DICT)
        dtype_text = bytes(record["dtype"]).decode(errors="replace")
        if dtype_text and batch in (BATCH_TYPED, BATCH_OBJECTS):
            try:
                dtype = decode_dtype(dtype_text)
                ndim = int(record["ndim"])
                shape = tuple(int(n) for n in record["shape"][:ndim])
                if not 0 <= ndim <= 4 or min(shape, default=1) < 1:
                    raise ValueError(f"bad shape {shape}")
                if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize <= self._values.shape[2]:
                    view = typed_view(self._values, slot, dtype, shape)
                    if batch == BATCH_OBJECTS and dtype.kind != "b" and ("subclass", path) not in self._warned:
                        self._warned.add(("subclass", path))  # once per key, whichever workers report it
                        warnings.warn(
                            f"info key {'/'.join(map(str, path))!r} holds instances of an int or float subclass "
                            f"(enum.IntEnum members, say): gymnasium's vector envs batch those objects into an "
                            f"object array, shmpool into an object array of the plain numbers they equal, as their "
                            f"class does not travel (nothing in shared memory is unpickled); report plain numbers "
                            f"to silence this",
                            RuntimeWarning,
                            stacklevel=5,
                        )
                    return _Key(path, view, dtype, shape, batch)
            except (LayoutMismatchError, ValueError, TypeError):
                pass
        if ("left out", path) not in self._warned:  # once per key, whichever workers report it
            self._warned.add(("left out", path))
            warnings.warn(
                f"info key {'/'.join(map(str, path))!r} is not a number, bool or numeric array of at most "
                f"{self._values.shape[2]} bytes; shmpool leaves it out of info (nothing is pickled per step; "
                f"launch(info_bytes=...) makes room for larger arrays)",
                RuntimeWarning,
                stacklevel=5,
            )
        return _Key(path, None, None, ())
