"""Declared env parameters and the shared-memory block that holds them, one record per env.

Writers (the trainer, attached processes) write the ``params`` block; workers read it on every
step, validate what changed, and apply it to their envs per each parameter's ``when``; what each env
really uses is published in the ``applied`` block, which only workers write.

Atomic multi-field writes use a per-env sequence counter (a seqlock, in :mod:`shmpool.protocol`):
:meth:`ParamBlock.write` validates, makes the counters odd, writes the fields, makes them even, all
under the writers' lock (which excludes threads, processes and forked children); a worker copies the
records between two reads of the counters and keeps its last values for a row that is odd or moved.
A writer killed or interrupted mid-write leaves an undo journal that the next holder of the lock rolls
back, so its half write is never published. Plain numpy writes (``params["gravity"][:8] = 12.0``)
skip all of this: each element is one aligned store, but two fields written that way may be seen
half-done.

Random draws for ``dist`` parameters come from a counter-based hash of (pool seed, env id, episode
index, parameter, step, element): the same seed and writes give the same draws whatever the number
of workers or the order in which envs reset.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .errors import LayoutMismatchError
from .protocol import Seqlock, WriterLock

#: How long :meth:`ParamBlock.write` waits for another writer before raising ``WriterLockTimeout``.
WRITE_LOCK_TIMEOUT = 5.0

WHEN = ("step", "reset", "rebuild")
DISTRIBUTIONS: dict[str, tuple[str, str]] = {
    "uniform": ("low", "high"),
    "loguniform": ("low", "high"),
    "normal": ("mean", "std"),
}
Binder = Callable[[Any, Any], None]


class BindTarget(Protocol):
    """A binding object: resolves, once per env, to functions that read and write the value."""

    def resolve(self, env: Any, name: str) -> tuple[Callable[[], Any], Callable[[Any], None]]: ...  # pragma: no cover


#: One refusal message per worker and parameter, as plain bytes in the segment.
REFUSAL_TEXT_DTYPE = np.dtype("S240")


@dataclass(frozen=True)
class Param:
    """Declares one env parameter; pass a dict of them as ``launch(..., params=...)``.

    Args:
        default: the initial value for every env; None reads the nominal value from a fresh env.
            For a ``dist`` parameter, a dict of the distribution's arguments (by default
            ``low``/``high`` are the hard bounds, ``mean`` the nominal value and ``std`` 0).
        low, high: hard bounds; a value outside them, or not finite, is never applied.
        dtype, shape: of one env's value.
        when: ``"step"`` (from the env's next step), ``"reset"`` (from its next reset, autoresets
            included) or ``"rebuild"`` (a constructor keyword; the env is re-made at its next reset
            when the value changed).
        bind: where the value goes: a dotted path on ``env.unwrapped`` with optional indexing
            (``"gravity"``, ``"model.opt.gravity[2]"``), a callable ``bind(env, value)``, or a
            binding object with ``resolve(env, name) -> (read, write)`` such as
            ``shmpool.mujoco.body_mass("torso")``. Default: the parameter's name as an attribute of
            ``env.unwrapped``. False: nowhere on the env; hooks read it from ``ctx.applied`` (the
            built-in hooks declare theirs this way).
        dist: None, ``"uniform"``, ``"loguniform"`` or ``"normal"``: the block then holds the
            distribution's arguments per env and a value is drawn at each reset of the env (each
            step with ``when="step"``).

    Example:
        >>> import shmpool
        >>> spec = {"length": shmpool.Param(low=0.1, high=2.0), "gravity": shmpool.Param(9.8, when="reset")}
    """

    default: Any = None
    low: float | Sequence[float] | None = field(default=None, kw_only=True)
    high: float | Sequence[float] | None = field(default=None, kw_only=True)
    dtype: str = field(default="float64", kw_only=True)
    shape: tuple[int, ...] = field(default=(), kw_only=True)
    when: str = field(default="step", kw_only=True)
    bind: str | Binder | BindTarget | bool | None = field(default=None, kw_only=True)
    dist: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class ParamSpec:
    """A declared parameter after validation: plain data (but for a callable ``bind``)."""

    name: str
    index: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    low: np.ndarray
    high: np.ndarray
    when: str
    bind: str | Binder | BindTarget | bool | None
    dist: str | None

    @functools.cached_property
    def bounds(self) -> tuple[float, float]:
        """The loosest (low, high) over the parameter's elements, for a quick first check."""
        return float(self.low.min(initial=math.inf)), float(self.high.max(initial=-math.inf))

    @property
    def arguments(self) -> tuple[str, ...]:
        """The fields of this parameter's record in the block: its distribution's, or none."""
        return DISTRIBUTIONS[self.dist] if self.dist else ()

    def to_json(self) -> dict[str, Any]:
        """The description stored in the segment's table (``bind`` as text; infinities as null)."""
        return {
            "name": self.name,
            "dtype": self.dtype.str,
            "shape": list(self.shape),
            "low": [None if math.isinf(v) else v for v in self.low.ravel().tolist()],
            "high": [None if math.isinf(v) else v for v in self.high.ravel().tolist()],
            "when": self.when,
            "dist": self.dist,
            "bind": self.bind
            if isinstance(self.bind, (str, bool)) or self.bind is None
            else getattr(self.bind, "__qualname__", repr(self.bind)),
        }

    @classmethod
    def from_json(cls, index: int, data: Mapping[str, Any]) -> ParamSpec:
        """Rebuilds a spec from a segment's table, validating every field."""
        try:
            dtype = np.dtype(data["dtype"])
            shape = tuple(int(n) for n in data["shape"])
            if dtype.kind not in "biuf" or any(n < 1 for n in shape):
                raise ValueError(f"bad dtype or shape {dtype} {shape}")
            low = np.array([-math.inf if v is None else float(v) for v in data["low"]]).reshape(shape)
            high = np.array([math.inf if v is None else float(v) for v in data["high"]]).reshape(shape)
            when, dist = data["when"], data["dist"]
            if when not in WHEN or (dist is not None and dist not in DISTRIBUTIONS):
                raise ValueError(f"bad when/dist {when!r}/{dist!r}")
            return cls(str(data["name"]), index, dtype, shape, low, high, when, data.get("bind"), dist)
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutMismatchError(f"bad parameter description {data!r:.200}: {exc}") from exc


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def compile_specs(params: Mapping[str, Param]) -> list[ParamSpec]:
    """Validates declarations; raises ``ValueError``/``TypeError`` naming the parameter."""
    specs = []
    for index, (name, param) in enumerate(params.items()):
        if not isinstance(param, Param):
            raise TypeError(f"params[{name!r}] must be a shmpool.Param, got {type(param).__name__}")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"parameter name {name!r} must be a Python identifier")
        if param.when not in WHEN:
            raise ValueError(f"params[{name!r}]: when must be one of {WHEN}, got {param.when!r}")
        if param.dist is not None and param.dist not in DISTRIBUTIONS:
            raise ValueError(f"params[{name!r}]: dist must be None or one of {list(DISTRIBUTIONS)}, got {param.dist!r}")
        if param.dist is not None and param.when == "rebuild":
            raise ValueError(f"params[{name!r}]: a rebuild parameter cannot have a dist")
        try:
            dtype = np.dtype(param.dtype)
        except TypeError as exc:
            raise TypeError(f"params[{name!r}]: bad dtype {param.dtype!r}") from exc
        if dtype.kind not in "biuf":
            raise TypeError(f"params[{name!r}]: dtype must be a numeric numpy dtype, got {dtype}")
        if param.dist is not None and dtype.kind != "f":
            raise TypeError(f"params[{name!r}]: a dist parameter must have a float dtype, got {dtype}")
        shape = tuple(int(n) for n in param.shape)
        low = np.broadcast_to(np.asarray(-math.inf if param.low is None else param.low, dtype=np.float64), shape).copy()
        high = np.broadcast_to(
            np.asarray(math.inf if param.high is None else param.high, dtype=np.float64), shape
        ).copy()
        if np.any(low > high) or np.isnan(low).any() or np.isnan(high).any():
            raise ValueError(f"params[{name!r}]: low {param.low} must not exceed high {param.high}")
        if dtype.kind == "f" and dtype.itemsize < 8:
            # Values are checked as the block stores them, so the bounds are too: a float32 0.1 must
            # fit high=0.1.
            with np.errstate(over="ignore"):
                low, high = low.astype(dtype).astype(np.float64), high.astype(dtype).astype(np.float64)
        if param.dist == "loguniform" and np.any(low <= 0) and param.low is not None:
            raise ValueError(f"params[{name!r}]: a loguniform parameter needs low > 0, got {param.low}")
        bind = param.bind
        if not (bind is None or bind is False or isinstance(bind, str) or callable(bind) or hasattr(bind, "resolve")):
            raise TypeError(
                f"params[{name!r}]: bind must be a path string, a callable, a binding object or False, got {bind!r}"
            )
        specs.append(ParamSpec(name, index, dtype, shape, low, high, param.when, param.bind, param.dist))
    return specs


def block_dtype(specs: Sequence[ParamSpec]) -> np.dtype[Any]:
    """The record of the ``params`` block: a value, or a distribution's arguments, per parameter."""
    fields: list[Any] = []
    for spec in specs:
        if spec.dist:
            fields.append((spec.name, [(argument, spec.dtype, spec.shape) for argument in spec.arguments]))
        else:
            fields.append((spec.name, spec.dtype, spec.shape))
    return np.dtype(fields)


def applied_dtype(specs: Sequence[ParamSpec]) -> np.dtype[Any]:
    """The record of the ``applied`` block: the value each env uses, per parameter."""
    return np.dtype([(spec.name, spec.dtype, spec.shape) for spec in specs])


# -- validation -----------------------------------------------------------------------------------


Check = Callable[[dict[str, np.ndarray]], Any]  # -> a bool mask of the rows that fail


def _rules(spec: ParamSpec) -> list[tuple[str, Check]]:
    """What a value must satisfy to be applied: (reason, rows -> mask of the rows that fail), in the
    order messages name them. Rows are ``{"value": ...}``, or one entry per distribution argument."""
    bounds = f"outside [{_bound(spec.low)}, {_bound(spec.high)}]"
    if not spec.dist:
        return [
            ("not finite", functools.partial(_not_finite, "value")),
            (bounds, lambda rows: _outside_rows(spec, rows["value"])),
        ]
    rules: list[tuple[str, Check]] = [
        (f"{argument} is not finite", functools.partial(_not_finite, argument)) for argument in spec.arguments
    ]
    if spec.dist == "normal":
        return rules + [
            ("std is negative", lambda rows: (rows["std"] < 0).any(axis=1)),
            (f"mean {bounds}", lambda rows: _outside_rows(spec, rows["mean"])),
        ]
    rules.append(("low exceeds high", lambda rows: (rows["low"] > rows["high"]).any(axis=1)))
    if spec.dist == "loguniform":
        rules.append(("loguniform needs low > 0", lambda rows: (rows["low"] <= 0).any(axis=1)))
    return rules + [
        (f"low {bounds}", lambda rows: _outside_rows(spec, rows["low"])),
        (f"high {bounds}", lambda rows: _outside_rows(spec, rows["high"])),
    ]


def _not_finite(name: str, rows: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(~np.isfinite(rows[name]).all(axis=1))


def _as_rows(spec: ParamSpec, values: Any) -> dict[str, np.ndarray]:
    if spec.dist:
        return {argument: _rows(values[argument]) for argument in spec.arguments}
    return {"value": _rows(values)}


def problem(spec: ParamSpec, value: Any) -> str | None:
    """Why one env's ``value`` (or record of distribution arguments) may not be applied, or None."""
    if spec.dist:
        batch: Any = {argument: np.asarray(value[argument], dtype=np.float64)[None] for argument in spec.arguments}
    else:
        batch = np.asarray(value, dtype=np.float64)[None]
    rows = _as_rows(spec, batch)
    return next((reason for reason, fails in _rules(spec) if fails(rows)[0]), None)


def show(value: Any) -> str:
    """A short text for a value or a record of distribution arguments, for messages."""
    if isinstance(value, np.void) and value.dtype.names:
        return "{" + ", ".join(f"{name}: {show(value[name])}" for name in value.dtype.names) + "}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{name}: {show(item)}" for name, item in value.items()) + "}"
    array = np.asarray(value)
    return repr(array.item()) if array.ndim == 0 else str(array.tolist())


def bad_rows(spec: ParamSpec, values: Any) -> np.ndarray:
    """A mask of the rows of ``values`` (one per env) that :func:`problem` would refuse, vectorized.

    ``values`` is an array of ``(rows, *shape)`` values, or for a distribution a mapping (or
    structured array) of such arrays per argument.
    """
    if not spec.dist:
        array: np.ndarray = np.asarray(values, dtype=np.float64)
        if array.size:
            # Fast path: NaN propagates through min/max and fails every comparison.
            smallest, largest = float(array.min()), float(array.max())
            if (
                math.isfinite(smallest)
                and math.isfinite(largest)
                and smallest >= spec.bounds[0]
                and largest <= spec.bounds[1]
                and (spec.low.size <= 1 or not _outside_rows(spec, _rows(array)).any())
            ):
                return np.zeros(len(array), dtype=np.bool_)
        values = array
    rows = _as_rows(spec, values)
    bad = np.zeros(len(next(iter(rows.values()))), dtype=np.bool_)
    for _, fails in _rules(spec):
        bad |= fails(rows)
    return bad


def _rows(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    return array.reshape(len(array), -1)


def _outside_rows(spec: ParamSpec, rows: np.ndarray) -> np.ndarray:
    return np.asarray((rows < spec.low.ravel()).any(axis=1) | (rows > spec.high.ravel()).any(axis=1))


def _bound(array: np.ndarray) -> Any:
    return array.item() if array.ndim == 0 else array.tolist()


# -- the writer's view ----------------------------------------------------------------------------


class ParamBlock:
    """The ``params`` block of a pool: ``block["gravity"]`` is a writable numpy view of every env's
    value (``block["length"]["low"]`` for a distribution's argument); :meth:`write` validates and
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
        for name, expected in (("params", block_dtype(specs)), ("applied", applied_dtype(specs))):
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

    @property
    def applied(self) -> np.ndarray:
        """What each env uses now (a drawn value for a ``dist`` parameter): read-only, workers write it."""
        self._check_open()
        return self._applied

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

    def __len__(self) -> int:
        return len(self._block)

    def __getitem__(self, name: str) -> np.ndarray:
        self._check_open()
        try:
            return self._block[name]
        except (KeyError, ValueError):
            raise KeyError(f"no parameter {name!r}; the pool has {self.names}") from None

    def __setitem__(self, name: str, value: Any) -> None:
        self[name][...] = value

    def __repr__(self) -> str:
        return f"ParamBlock({self.names}, num_envs={len(self)})"

    def write(self, env_ids: int | Sequence[int] | slice | np.ndarray | None, **values: Any) -> None:
        """Validates ``values`` (bounds, shape, finite) and writes them for ``env_ids``, atomically per env.

        ``env_ids``: an env id, a sequence or array of them, a slice, or None for every env. A
        distribution's arguments are given as a dict, e.g. ``length={"low": 0.4, "high": 0.6}``.
        Raises ``ValueError`` naming the parameter, the env and the value; nothing is written then.
        """
        self._check_open()
        ids = self._env_ids(env_ids)
        specs = []
        for name in values:
            spec = self.specs.get(name)
            if spec is None:
                raise KeyError(f"no parameter {name!r}; the pool has {self.names}")
            specs.append(spec)
        rows = slice(None) if env_ids is None else ids  # every env: plain views are cheaper than indexing
        # Validated under the lock: a distribution's arguments are merged with what the block holds,
        # which another writer could change between a check outside the lock and the write.
        with self._lock.hold(WRITE_LOCK_TIMEOUT, self._check_open):
            staged: list[tuple[np.ndarray, np.ndarray]] = []
            for spec in specs:
                staged.extend(self._stage(spec, ids, values[spec.name]))
            self._seqlock.write(rows, staged)

    def _env_ids(self, env_ids: Any) -> np.ndarray:
        n = len(self._block)
        if env_ids is None:
            return self._all
        if isinstance(env_ids, slice):
            return np.arange(n)[env_ids]
        ids = np.atleast_1d(np.asarray(env_ids))
        if ids.dtype.kind not in "iu" or ids.ndim != 1:
            raise ValueError(f"env_ids must be ints, a slice or None, got {env_ids!r:.100}")
        if ids.size and (ids.min() < -n or ids.max() >= n):
            raise ValueError(f"env_ids {ids.tolist()} out of range for num_envs={n}")
        return np.unique(ids % n)

    def _stage(self, spec: ParamSpec, ids: np.ndarray, value: Any) -> list[tuple[np.ndarray, np.ndarray]]:
        """The validated ``(column view, values)`` pairs of one parameter; raises naming the bad value."""
        if spec.dist:
            if not isinstance(value, Mapping) or set(value) - set(spec.arguments):
                raise ValueError(
                    f"params[{spec.name!r}] is a {spec.dist} parameter: write a dict with keys {list(spec.arguments)}"
                )
            merged = {arg: value.get(arg, self._block[spec.name][arg][ids]) for arg in spec.arguments}
            arrays = {arg: self._broadcast(spec, ids, merged[arg], f"[{arg!r}]") for arg in spec.arguments}
            bad = bad_rows(spec, arrays)
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                record = {arg: arrays[arg][row] for arg in spec.arguments}
                raise ValueError(
                    f"{self._label}: params[{spec.name!r}][{ids[row]}] = {show(record)} "
                    f"rejected: {problem(spec, record)}"
                )
            return [(self._block[spec.name][arg], arrays[arg]) for arg in spec.arguments if arg in value]
        array = self._broadcast(spec, ids, value, "")
        bad = bad_rows(spec, array)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{self._label}: params[{spec.name!r}][{ids[row]}] = {show(array[row])} "
                f"rejected: {problem(spec, array[row])}"
            )
        return [(self._block[spec.name], array)]

    def _broadcast(self, spec: ParamSpec, ids: np.ndarray, value: Any, where: str) -> np.ndarray:
        """``value`` as rows of one env each, in the parameter's dtype; raises unless every number is
        stored exactly as given (integers in range and whole, bools 0 or 1, floats that do not
        overflow), so that what is validated is what the workers will read."""
        try:
            array = np.asarray(value)
            if array.dtype.kind not in "biuf":
                raise TypeError(f"dtype {array.dtype}")
            shape = (len(ids), *spec.shape)
            if array.shape != shape:
                array = np.broadcast_to(array, shape)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{self._label}: params[{spec.name!r}]{where} = {value!r:.100} does not fit "
                f"{len(ids)} env(s) of shape {spec.shape}: {exc}"
            ) from exc
        if spec.dtype.kind == "f":
            if array.dtype == spec.dtype:  # the common case: float64 values for a float64 parameter
                return array
            with np.errstate(over="ignore"):  # an overflow becomes inf, refused as not finite
                return array.astype(spec.dtype, copy=False)
        low, high = (0, 1) if spec.dtype.kind == "b" else (np.iinfo(spec.dtype).min, np.iinfo(spec.dtype).max)
        with np.errstate(invalid="ignore"):
            if array.dtype.kind == "f":
                unfit = ~np.isfinite(array) | (array != np.round(array)) | (array < low) | (array > high)
            else:
                unfit = (array < low) | (array > high)
        if unfit.any():
            row = int(np.flatnonzero(unfit.reshape(len(ids), -1).any(axis=1))[0])
            kind = "0 or 1" if spec.dtype.kind == "b" else f"a whole number in [{low}, {high}]"
            raise ValueError(
                f"{self._label}: params[{spec.name!r}][{ids[row]}]{where} = {show(array[row])} rejected: "
                f"{spec.name!r} has dtype {spec.dtype}, which holds {kind}"
            )
        return array.astype(spec.dtype, copy=False)


# -- random draws ---------------------------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijective scramble of 64-bit words (wraps, never warns on arrays)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniform01(
    seed: int, env_ids: np.ndarray, episodes: np.ndarray, param: int, step: int | np.ndarray, size: int, lane: int = 0
) -> np.ndarray:
    """Uniform floats in [0, 1) of shape ``(len(env_ids), size)``, a pure function of every key."""
    key = np.full(len(env_ids), np.uint64(seed % (1 << 64)), dtype=np.uint64)
    for part in (env_ids, episodes, param, step, lane):
        key = _mix(key + _GOLDEN + np.asarray(part).astype(np.int64).astype(np.uint64))
    elements = np.arange(size, dtype=np.uint64)
    words = _mix(key[:, None] + _GOLDEN * (elements[None, :] + np.uint64(1)))
    return (words >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def derive_seed(seed: int, env_id: int, episode: int) -> int:
    """A reset seed for one env and episode, from the same keyed stream as the draws."""
    u = uniform01(seed, np.array([env_id]), np.array([episode]), -1, 0, 1)
    return int(u[0, 0] * (1 << 31))


def draw(
    spec: ParamSpec, arguments: np.ndarray, seed: int, env_ids: np.ndarray, episodes: np.ndarray, step: int | np.ndarray
) -> np.ndarray:
    """Draws one value per env from ``spec``'s distribution with per-env ``arguments`` records."""
    size = max(1, int(np.prod(spec.shape, dtype=np.int64)))
    shape = (len(env_ids), *spec.shape)
    u = uniform01(seed, env_ids, episodes, spec.index, step, size).reshape(shape)
    if spec.dist == "uniform":
        low, high = arguments["low"].astype(np.float64), arguments["high"].astype(np.float64)
        values = low + u * (high - low)
    elif spec.dist == "loguniform":
        low, high = np.log(arguments["low"].astype(np.float64)), np.log(arguments["high"].astype(np.float64))
        values = np.exp(low + u * (high - low))
    else:
        v = uniform01(seed, env_ids, episodes, spec.index, step, size, lane=1).reshape(shape)
        normal = np.sqrt(-2.0 * np.log1p(-u)) * np.cos(2.0 * np.pi * v)
        values = arguments["mean"].astype(np.float64) + arguments["std"].astype(np.float64) * normal
    return np.clip(values, spec.low, spec.high).astype(spec.dtype)


# -- bindings -------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[(-?\d+)\]")


def parse_path(path: str) -> list[str | int]:
    """Splits ``"model.opt.gravity[2]"`` into ``["model", "opt", "gravity", 2]``."""
    tokens: list[str | int] = []
    position = 0
    while position < len(path):
        match = _TOKEN.match(path, position)
        if match is None or (position == 0 and path.startswith(".")):
            raise ValueError(f"bad bind path {path!r} at {path[position:]!r}")
        tokens.append(match.group(1) if match.group(1) is not None else int(match.group(2)))
        position = match.end()
    if not tokens or not isinstance(tokens[0], str):
        raise ValueError(f"bad bind path {path!r}")
    return tokens


def _unbound(env: Any, value: Any) -> None:
    """The setter of a parameter that only hooks read."""


class Binding:
    """Reads and writes one parameter on one env, along a path resolved once."""

    def __init__(self, env: Any, spec: ParamSpec, env_label: str) -> None:
        self._spec = spec
        self._root = env.unwrapped
        self._setter: Binder | None = None
        self._tokens: list[str | int] = []
        self._simple: str | None = None  # a plain attribute of a scalar parameter: set directly
        self._getter: Callable[[], Any] | None = None
        if spec.bind is False:
            self._setter = _unbound
            return
        if hasattr(spec.bind, "resolve"):  # a binding object, e.g. shmpool.mujoco.body_mass("torso")
            self._getter, write = spec.bind.resolve(env, spec.name)  # type: ignore[union-attr]
            self._setter = lambda _env, value: write(value)
            return
        if callable(spec.bind):
            self._setter = spec.bind
            return
        path = spec.bind if isinstance(spec.bind, str) else spec.name
        self._tokens = parse_path(path)
        target = self._root
        for depth, token in enumerate(self._tokens):
            try:
                target = target[token] if isinstance(token, int) else getattr(target, token)
            except (AttributeError, IndexError, KeyError, TypeError) as exc:
                where = "".join(f"[{t}]" if isinstance(t, int) else f".{t}" for t in self._tokens[: depth + 1])
                raise AttributeError(
                    f"params[{spec.name!r}]: {env_label} ({type(self._root).__name__}) has no {where.lstrip('.')!r} "
                    f"(bind path {path!r}); shmpool never creates attributes"
                ) from exc
        if len(self._tokens) == 1 and not spec.shape:
            self._simple = str(self._tokens[0])

    def get(self) -> Any:
        """The current value on the env (None for a callable binding, which cannot be read)."""
        if self._getter is not None:
            return self._getter()
        if self._setter is not None:
            return None
        target = self._root
        for token in self._tokens:
            target = target[token] if isinstance(token, int) else getattr(target, token)
        return target

    @property
    def attribute(self) -> tuple[Any, str] | None:
        """(object, attribute name) when the value is a plain attribute set as is, else None: lets
        a caller that sets many envs skip the general path."""
        return (self._root, self._simple) if self._simple is not None else None

    def set(self, value: Any) -> None:
        """Applies one env's value: a Python scalar for shape (), an array assigned in place where the
        env holds a matching array."""
        if self._setter is not None:
            self._setter(self._root, value)
            return
        if self._simple is not None:
            setattr(self._root, self._simple, value)
            return
        parent = self._root
        for token in self._tokens[:-1]:
            parent = parent[token] if isinstance(token, int) else getattr(parent, token)
        last = self._tokens[-1]
        current = parent[last] if isinstance(last, int) else getattr(parent, last)
        if isinstance(current, np.ndarray) and current.ndim and current.shape == np.shape(value):
            current[...] = value
        elif isinstance(last, int):
            parent[last] = value
        else:
            setattr(parent, last, value)


def plain_values(values: np.ndarray) -> list[Any]:
    """Per-env values as :meth:`Binding.set` takes them: Python scalars, or arrays for shaped ones."""
    return values.tolist() if values.ndim == 1 else list(values)


def constructor_defaults(specs: Sequence[ParamSpec], declared: Mapping[str, Param]) -> dict[str, Any]:
    """The ``rebuild`` parameters that have an explicit default, as constructor keywords."""
    return {
        s.name: declared[s.name].default for s in specs if s.when == "rebuild" and declared[s.name].default is not None
    }


def _nominal(spec: ParamSpec, binding: Binding | None, env_label: str) -> np.ndarray:
    """The value a freshly made env has for ``spec``, read through its binding."""
    if binding is None or (callable(spec.bind) and not hasattr(spec.bind, "resolve")) or spec.bind is False:
        raise ValueError(
            f"params[{spec.name!r}]: bind={spec.bind!r} cannot be read for a nominal value; give a default"
        )
    value = np.asarray(binding.get())
    if value.shape != spec.shape:
        raise ValueError(
            f"params[{spec.name!r}]: {env_label}'s nominal value {show(value)} has shape {value.shape}, "
            f"the parameter is declared with shape {spec.shape}"
        )
    return value.astype(spec.dtype)


def initial_records(
    specs: Sequence[ParamSpec], declared: Mapping[str, Param], probe: Any, env_label: str, num_envs: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``params`` and ``applied`` records of every env, from the defaults or, where the
    default is None, from a freshly made env. Checks every bind path against that env."""
    block = np.zeros(num_envs, dtype=block_dtype(specs))
    applied = np.zeros(num_envs, dtype=applied_dtype(specs))
    for spec in specs:
        param = declared[spec.name]
        # Resolving the binding fails here, at launch, for a bad path or name.
        binding = Binding(probe, spec, env_label) if spec.when != "rebuild" or param.default is None else None
        nominal = functools.partial(_nominal, spec, binding, env_label)
        if spec.dist:
            given = param.default if param.default is not None else {}
            if not isinstance(given, Mapping) or set(given) - set(spec.arguments):
                raise ValueError(
                    f"params[{spec.name!r}]: the default of a {spec.dist} parameter is a dict with keys "
                    f"{list(spec.arguments)}, got {param.default!r}"
                )
            fallback = {"low": spec.low, "high": spec.high, "std": np.zeros(spec.shape)}
            record = {}
            for argument in spec.arguments:
                value = given.get(argument)
                if value is None:
                    value = nominal() if argument == "mean" else fallback[argument]
                record[argument] = np.broadcast_to(np.asarray(value, dtype=spec.dtype), spec.shape)
                block[spec.name][argument] = record[argument]
            applied[spec.name] = np.nan  # nothing drawn before the env's first reset
            reason = problem(spec, record)
        else:
            value = (
                nominal()
                if param.default is None
                else np.broadcast_to(np.asarray(param.default, dtype=spec.dtype), spec.shape)
            )
            block[spec.name] = value
            applied[spec.name] = value
            reason = problem(spec, value)
        if reason:
            raise ValueError(
                f"params[{spec.name!r}]: the initial value {show(block[spec.name][0])} is rejected: {reason}"
            )
    return block, applied
