"""The ``params`` block as writers see it: numpy views per parameter, and validated atomic writes.

Why and how: ``docs/internals.md``, "shmpool/param_block.py".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .compiled_writes import COMPILED_AFTER, CompiledWrites
from .errors import LayoutMismatchError
from .params import (
    ParamSpec,
    applied_dtype,
    as_stored,
    bad_rows,
    block_dtype,
    did_you_mean,
    problem,
    show,
    unknown_parameter,
)
from .protocol import Seqlock, WriterLock

#: How long ``ParamBlock.write`` waits for another writer before raising ``WriterLockTimeoutError``.
WRITE_LOCK_TIMEOUT = 5.0
_FLOAT64 = np.dtype(np.float64)
_INT64_MIN, _UINT64_MAX = -(1 << 63), (1 << 64) - 1


class ParamBlock:
    """The ``params`` block of a pool: ``block["gravity"]`` is a writable numpy view of every env's
    value (``block["length"]["low"]`` for a distribution's argument); ``write`` validates and
    lands atomically per env.

    Workers pick up plain numpy writes on their next step too; they refuse values that break a
    bound or are not finite (the env keeps its last good value; see ``refusals``).
    """

    def __init__(
        self,
        specs: Sequence[ParamSpec],
        views: Mapping[str, np.ndarray],
        seqlock: Seqlock,
        lock: WriterLock,
        env_label: str,
        check_open: Callable[[], None],
    ) -> None:
        num_envs = len(views["params"])
        fields = (
            ("params", block_dtype(specs)),
            ("applied", applied_dtype(specs)),
            ("params_accepted", block_dtype(specs)),
        )
        for name, expected in fields:
            if views[name].dtype != expected or views[name].shape != (num_envs,):
                raise LayoutMismatchError(f"field {name!r} does not match the parameter table")
        self.specs = {spec.name: spec for spec in specs}
        self._block = views["params"]
        self._all = np.arange(num_envs)
        self._seqlock = seqlock
        self._refusal_table = views["param_refusals"]
        self._lock = lock
        self._label = env_label
        self._check_open = check_open
        self._applied = views["applied"].view()
        self._applied.flags.writeable = False
        self._accepted = views["params_accepted"].view()
        self._accepted.flags.writeable = False
        self._compiled: CompiledWrites | None = None
        self._until_compiled = COMPILED_AFTER if CompiledWrites.possible(specs, self._block) else 0

    @property
    def applied(self) -> np.ndarray:
        """What each env uses now (a drawn value for a ``dist`` parameter): read-only, workers write it."""
        self._check_open()
        return self._applied

    @property
    def accepted(self) -> np.ndarray:
        """Each env's record as its worker last accepted it, in the block's dtype: what the env runs
        with, draws from, or takes at its next reset, where the block holds a value the workers
        refused. Read-only, workers write it."""
        self._check_open()
        return self._accepted

    @property
    def dtype(self) -> np.dtype[Any]:
        """The record type: one field per parameter (a sub-record for a distribution)."""
        return self._block.dtype

    @property
    def names(self) -> list[str]:
        """The declared parameters, in declaration order."""
        return list(self.specs)

    @property
    def refusals(self) -> dict[str, int]:
        """How many raw writes each parameter's workers refused so far."""
        counts = self._refusal_table.sum(axis=0)
        return {name: int(counts[spec.index]) for name, spec in self.specs.items()}

    def snapshot(self) -> np.ndarray:
        """A copy of every env's record, taken under the writers' lock so that no ``write()`` is
        half in it (raw numpy writes are single stores per element and need no lock)."""
        self._check_open()
        return self._lock.run(WRITE_LOCK_TIMEOUT, self._check_open, self._block.copy)

    def __len__(self) -> int:
        return len(self._block)

    def __getitem__(self, name: str) -> np.ndarray:
        self._check_open()
        try:
            return self._block[name]
        except (KeyError, ValueError):
            raise unknown_parameter(name, self.names) from None

    def __setitem__(self, name: str, value: Any) -> None:
        self[name][...] = value

    def __setattr__(self, name: str, value: Any) -> None:
        set_own_attribute(self, name, value, "params[{name!r}][env_ids] = value")

    def __getattr__(self, name: str) -> Any:  # only for names that are not attributes
        if isinstance(getattr(type(self), name, None), property):  # a property that raised: its own error
            return getattr(type(self), name).fget(self)
        if name.startswith("_") or name == "specs":
            raise AttributeError(name)
        where = f"; read params[{name!r}]" if name in self.specs else did_you_mean(name, self.names)
        raise AttributeError(f"ParamBlock has no attribute {name!r}{where}")

    def __repr__(self) -> str:
        return f"ParamBlock({self.names}, num_envs={len(self)})"

    def write(self, env_ids: int | Sequence[int] | slice | np.ndarray | None, **values: Any) -> int:
        """Validates ``values`` (bounds, shape, finite) and writes them for ``env_ids``, atomically per env; returns
        the write's version.

        ``env_ids``: an env id, a sequence or array of them (row ``k`` of a value goes to env ``env_ids[k]``; an env
        given twice takes its last row), a slice, or None for every env. A distribution's arguments are given as a
        dict, e.g. ``length={"low": 0.4, "high": 0.6}``. Raises ``ValueError`` naming the parameter, the env and the
        value; nothing is written then.

        The version is the block's write count once this write is published: unique and one more than the write
        before, across every writer of the pool (a write that a killed writer left half done uses up a number when
        it is rolled back). A write of no env writes nothing and returns the current version.

        Examples:
            >>> import shmpool
            >>> with shmpool.launch("CartPole-v1", 4, params={"length": shmpool.Param()}) as pool:
            ...     first = pool.params.write([0, 1], length=0.8)
            ...     pool.params.write(None, length=0.6) == first + 1
            True
        """
        self._check_open()
        compiled = self._compiled
        if compiled is not None:
            version = compiled.write(env_ids, values)
            if version >= 0:
                return version
        elif self._until_compiled and (env_ids is None or type(env_ids) is int):  # the writes it would take
            self._until_compiled -= 1
            if not self._until_compiled:
                self._until_compiled = 1  # a load that a signal handler's exception cut short is retried
                self._compiled = CompiledWrites.load(self.specs, self._seqlock, self._lock)
                self._until_compiled = 0
        ids = self._env_ids(env_ids)
        specs = named_specs(self.specs, values)
        if not len(ids):  # no env (an empty list or slice): nothing to check or write
            return self._seqlock.version
        rows = slice(None) if env_ids is None else ids  # every env: plain views are cheaper than indexing
        plain = self._plain_values(specs, values, len(ids))
        return self._lock.run(
            WRITE_LOCK_TIMEOUT, self._check_open, self._write_locked, env_ids, ids, rows, specs, values, plain
        )

    def _write_locked(
        self,
        env_ids: Any,
        ids: np.ndarray,
        rows: slice | np.ndarray,
        specs: list[ParamSpec],
        values: dict[str, Any],
        plain: list[float | np.ndarray] | None,
    ) -> int:
        """``write``'s part under the writers' lock."""
        if plain is not None:
            staged = [(self._block[spec.name], array) for spec, array in zip(specs, plain)]
        else:
            # Validated under the lock: a distribution's arguments are merged with what the block
            # holds, which another writer could change between a check outside the lock and the write.
            staged = []
            for spec in specs:
                staged.extend(self._stage(spec, ids, values[spec.name]))
        last = None if env_ids is None else last_rows(ids)
        if last is not None:  # an env given twice: its last row, each env's counter bumped once
            rows = ids[last]
            staged = [(column, array if isinstance(array, float) else array[last]) for column, array in staged]
        return self._seqlock.write(rows, staged)

    def _plain_values(
        self, specs: list[ParamSpec], values: dict[str, Any], count: int
    ) -> list[float | np.ndarray] | None:
        """The values as they are when each is, for a scalar float64 parameter, a float (or an int
        or numpy float: one value for every env) or a float64 array of one value per env, and all
        are within bounds: the common writes, checked in Python for a number, and with one min and
        one max over all the arrays. None sends the write through ``_stage``, which names a bad
        value."""
        plain: list[float | np.ndarray] = []
        arrays, array_specs = [], []
        for spec in specs:
            value = values[spec.name]
            if spec.dist or spec.shape or spec.dtype != _FLOAT64:
                return None
            kind = type(value)
            if kind is float or kind is np.float64 or (kind is int and _INT64_MIN <= value <= _UINT64_MAX):
                # Beyond 64 bits an int is no number to numpy: the slow path refuses it, naming it.
                number = float(value)  # a float64 stores an int as this rounds it
                if not (spec.bounds[0] <= number <= spec.bounds[1] and math.isfinite(number)):
                    return None
                plain.append(number)
            elif kind is np.ndarray and value.dtype == _FLOAT64 and value.shape == (count,):
                arrays.append(value)
                array_specs.append(spec)
                plain.append(value)
            else:
                return None
        if arrays:
            stacked = np.array(arrays)  # one min and one max over all of them: numpy calls dominate here
            smallest, largest = stacked.min(axis=1).tolist(), stacked.max(axis=1).tolist()
            for spec, low, high in zip(array_specs, smallest, largest):
                # NaN fails every comparison; infinities fail isfinite.
                within = spec.bounds[0] <= low and high <= spec.bounds[1]
                if not (within and math.isfinite(low) and math.isfinite(high)):
                    return None
        return plain

    def _env_ids(self, env_ids: Any) -> np.ndarray:
        return self._all if env_ids is None else env_rows(env_ids, len(self._block))

    def _stage(self, spec: ParamSpec, ids: np.ndarray, value: Any) -> list[tuple[np.ndarray, np.ndarray]]:
        """The validated ``(column view, values)`` pairs of one parameter; raises naming the bad value."""
        column = self._block[spec.name]
        checked = validate(spec, ids, value, lambda arg: column[arg][ids], self._label)
        if isinstance(checked, dict):
            return [(column[arg], array) for arg, array in checked.items()]
        return [(column, checked)]


def named_specs(specs: Mapping[str, ParamSpec], names: Iterable[str]) -> list[ParamSpec]:
    """The specs of the parameters ``names``, or a ``KeyError`` naming the unknown one and the known."""
    found = []
    for name in names:
        spec = specs.get(name)
        if spec is None:
            raise unknown_parameter(name, list(specs))
        found.append(spec)
    return found


def set_own_attribute(params: Any, name: str, value: Any, per_env: str) -> None:
    """``params.NAME = value`` on a block of parameters (``ParamBlock``, ``shmpool.ray``'s
    ``ClusterParams``): sets the block's own state (``_`` names and ``specs``, set by ``__init__``)
    and its methods (which test doubles replace); anything else writes no parameter and raises,
    saying how to write instead: ``per_env`` (formatted with ``name``) for some envs' values."""
    if name.startswith("_") or name == "specs" or callable(getattr(type(params), name, None)):
        object.__setattr__(params, name, value)
        return
    hint = "" if name in params.specs else did_you_mean(name, params.names)
    raise AttributeError(
        f"params.{name} = ... writes no parameter: say {per_env.format(name=name)}, or "
        f"params.write(None, {name}=value) for every env{hint}"
    )


def env_rows(env_ids: Any, num_envs: int) -> np.ndarray:
    """The env ids that ``write`` takes ``env_ids`` (an id, ids, a slice; negative ids count from the
    end) to mean, in the order given: row ``k`` of a value goes to env ``env_ids[k]``, as with numpy's
    ``array[env_ids] = values`` (an id given more than once takes its last row: see ``last_rows``)."""
    if isinstance(env_ids, slice):
        return np.arange(num_envs)[env_ids]
    ids = np.atleast_1d(np.asarray(env_ids))
    if ids.ndim != 1 or (ids.dtype.kind not in "iu" and ids.size):
        raise ValueError(f"env_ids must be ints, a slice or None, got {env_ids!r:.100}")
    # Checked in the ids' own dtype, before the cast: a uint64 id past 2**63 would wrap onto an env.
    if ids.size and (ids.max() >= num_envs or (ids.dtype.kind == "i" and ids.min() < -num_envs)):
        raise ValueError(f"env_ids {ids.tolist()} out of range for num_envs={num_envs}")
    return ids.astype(np.int64, copy=False) % num_envs


def last_rows(ids: np.ndarray) -> np.ndarray | None:
    """For ids that repeat, the row of each id's last occurrence (ascending by id); None when every id
    is given once. numpy leaves the winner of a repeated index unspecified: a write names it."""
    if len(ids) < 2:  # one env (a curriculum's per-episode write): nothing can repeat
        return None
    unique, first_of_reversed = np.unique(ids[::-1], return_index=True)
    if len(unique) == len(ids):
        return None
    return len(ids) - 1 - first_of_reversed


def validate(
    spec: ParamSpec, ids: np.ndarray, value: Any, current: Callable[[str], np.ndarray], label: str
) -> np.ndarray | dict[str, np.ndarray]:
    """``value`` for the envs ``ids`` (one row each) as the block stores it, or a ``ValueError``
    naming the parameter, the env and the value: the rule of ``ParamBlock.write``, also used by
    writers that check before sending (``shmpool.ray``). A distribution's value is a dict of some
    of its arguments; ``current(arg)`` gives the others' values for ``ids``, since a record is
    valid only as a whole. Returns the array, or the given arguments' arrays."""
    if spec.dist:
        if not isinstance(value, Mapping) or set(value) - set(spec.arguments):
            raise ValueError(
                f"params[{spec.name!r}] is a {spec.dist} parameter: write a dict with keys {list(spec.arguments)}"
            )
        merged = {arg: value[arg] if arg in value else current(arg) for arg in spec.arguments}
        arrays = {arg: as_stored(spec, ids, merged[arg], f"[{arg!r}]", label) for arg in spec.arguments}
        bad = bad_rows(spec, arrays)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            record = {arg: arrays[arg][row] for arg in spec.arguments}
            raise ValueError(
                f"{label}: params[{spec.name!r}][{ids[row]}] = {show(record)} rejected: {problem(spec, record)}"
            )
        return {arg: arrays[arg] for arg in spec.arguments if arg in value}
    if isinstance(value, Mapping):
        raise ValueError(
            f"{label}: params[{spec.name!r}] is not a distribution, so it takes a value, not the arguments "
            f"{dict(value)!r:.80}; declare it with Param(dist=...) to write those"
        )
    array = as_stored(spec, ids, value, "", label)
    bad = bad_rows(spec, array)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{label}: params[{spec.name!r}][{ids[row]}] = {show(array[row])} rejected: {problem(spec, array[row])}"
        )
    return array
