"""Gymnasium spaces as fixed-size shared-memory fields.

A space is split into *leaves* (Box, Discrete, MultiDiscrete, MultiBinary), each stored as one field
of shape ``(num_envs, *leaf shape)``; Dict and Tuple spaces are rebuilt from their leaves in the
space's own order, so a batch has exactly the structure gymnasium's vector envs return.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces

Path = tuple[Any, ...]


@dataclass(frozen=True)
class Leaf:
    """One array-valued part of a space: where it sits in the structure and how it is stored."""

    path: Path
    space: spaces.Space[Any]
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    def field_name(self, prefix: str) -> str:
        """The segment field that holds this leaf for every env, e.g. ``observations/image``."""
        return "/".join([prefix, *map(str, self.path)])


@singledispatch
def leaves(space: spaces.Space[Any], path: Path = ()) -> list[Leaf]:
    """The leaves of ``space`` in order; raises ``TypeError`` for a space shmpool cannot store."""
    raise TypeError(
        f"shmpool cannot place a {type(space).__name__} space in shared memory ({space}); supported are "
        f"Box, Discrete, MultiDiscrete, MultiBinary and Dict/Tuple nestings of them. Wrap the env so that "
        f"it uses one of those (for example gymnasium.wrappers.FlattenObservation)."
    )


@leaves.register(spaces.Box)
@leaves.register(spaces.Discrete)  # shape ()
@leaves.register(spaces.MultiDiscrete)  # shape nvec.shape
@leaves.register(spaces.MultiBinary)
def _(space: spaces.Space[Any], path: Path = ()) -> list[Leaf]:
    return [Leaf(path, space, np.dtype(space.dtype), tuple(space.shape))]  # type: ignore[arg-type]


@leaves.register
def _(space: spaces.Dict, path: Path = ()) -> list[Leaf]:
    return [leaf for key, sub in space.spaces.items() for leaf in leaves(sub, (*path, key))]


@leaves.register
def _(space: spaces.Tuple, path: Path = ()) -> list[Leaf]:
    return [leaf for index, sub in enumerate(space.spaces) for leaf in leaves(sub, (*path, index))]


def is_leaf(space: spaces.Space[Any]) -> bool:
    """Whether ``space`` is a leaf itself, not a Dict or Tuple (even one holding a single leaf)."""
    return not isinstance(space, (spaces.Dict, spaces.Tuple))


@singledispatch
def flatten(space: spaces.Space[Any], value: Any) -> list[Any]:
    """The leaf values of ``value`` (one env's, or a batch's) in the order of ``leaves``."""
    return [value]


@flatten.register
def _(space: spaces.Dict, value: Any) -> list[Any]:
    try:
        return [part for key, sub in space.spaces.items() for part in flatten(sub, value[key])]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"expected a dict with keys {list(space.spaces)}, got {value!r:.200}") from exc


@flatten.register
def _(space: spaces.Tuple, value: Any) -> list[Any]:
    if not isinstance(value, (tuple, list)) or len(value) != len(space.spaces):
        raise ValueError(f"expected a tuple of {len(space.spaces)} items, got {value!r:.200}")
    return [part for sub, item in zip(space.spaces, value) for part in flatten(sub, item)]


@singledispatch
def assemble(space: spaces.Space[Any], parts: Iterator[Any]) -> Any:
    """Rebuilds the structure of ``space`` from leaf values taken in order from ``parts``."""
    return next(parts)


@assemble.register
def _(space: spaces.Dict, parts: Iterator[Any]) -> Any:
    return {key: assemble(sub, parts) for key, sub in space.spaces.items()}


@assemble.register
def _(space: spaces.Tuple, parts: Iterator[Any]) -> Any:
    return tuple(assemble(sub, parts) for sub in space.spaces)


def _first_bad_env(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[0])


@singledispatch
def _range_check(space: spaces.Space[Any]) -> Callable[[np.ndarray], np.ndarray | None] | None:
    """A function returning the mask of out-of-range entries (None when all are fine), or None
    when every value of the dtype is allowed."""
    return None


#: Up to this many discrete actions are checked by Python's ``min`` and ``max``: in a training loop the
#: step follows the policy's forward, which leaves numpy's reduction code out of the caches, and there
#: a reduction costs several times a small list's (docs/benchmarks.md, the PPO loop).
_FEW_ACTIONS = 64


@_range_check.register
def _(space: spaces.Discrete) -> Callable[[np.ndarray], np.ndarray | None]:
    low, high = int(space.start), int(space.start) + int(space.n)

    def check(array: np.ndarray) -> np.ndarray | None:
        dtype = array.dtype
        if array.size <= _FEW_ACTIONS:
            values = array.ravel().tolist()
            if not values or (min(values) >= low and max(values) < high):
                return None
        elif low == 0 and dtype.kind in "iub" and dtype.isnative and high <= 1 << (8 * dtype.itemsize - 1):
            # One max instead of a min and a max (a step's actions are checked on every step): seen as
            # unsigned, a negative value is at least 2 ** (bits - 1), so larger than any action.
            if array.view(f"u{dtype.itemsize}").max() < high:
                return None
        elif array.min() >= low and array.max() < high:
            return None
        return (array < low) | (array >= high)

    return check


@_range_check.register
def _(space: spaces.MultiDiscrete) -> Callable[[np.ndarray], np.ndarray | None]:
    low, high = space.start, space.start + space.nvec

    def check(array: np.ndarray) -> np.ndarray | None:
        bad = (array < low) | (array >= high)
        return bad if bad.any() else None

    return check


@_range_check.register
def _(space: spaces.MultiBinary) -> Callable[[np.ndarray], np.ndarray | None]:
    def check(array: np.ndarray) -> np.ndarray | None:
        bad = (array != 0) & (array != 1)
        return bad if bad.any() else None

    return check


def _narrowing_bounds(source: np.dtype[Any], target: np.dtype[Any]) -> tuple[float, float] | None:
    """The smallest and the largest value of ``target``, where casting ``source`` to it could wrap (an
    integer) or overflow to infinity (a float: there the cast itself says so); None where it cannot."""
    if target.kind not in "iuf" or np.can_cast(source, target):
        return None
    limits = np.finfo(target) if target.kind == "f" else np.iinfo(target)
    return limits.min, limits.max


class ActionChecker:
    """Validates batches of actions for one action space and pool size; built once per pool.

    Calling it returns one array per leaf. It raises ``TypeError`` for a scalar where a batch belongs
    (as gymnasium does), and ``ValueError`` naming the env and the value for a wrong shape, a dtype
    that cannot be cast to the space's, numpy bools for a Discrete space (which gymnasium's does not
    contain), a discrete value out of range, or a number that the space's dtype cannot hold (an
    integer the cast would wrap, a finite float it would make infinite). Box bounds are not checked:
    gymnasium envs clip; infinities and NaNs pass, as gymnasium passes them.
    """

    def __init__(self, space: spaces.Space[Any], num_envs: int, env_label: str) -> None:
        self._space = space
        self._leaves = leaves(space)
        self._is_leaf = is_leaf(space)
        self._label = env_label
        self._checks = [
            (
                leaf,
                (num_envs, *leaf.shape),
                _range_check(leaf.space),
                "actions" + "".join(f"[{p!r}]" for p in leaf.path),
                isinstance(leaf.space, spaces.Discrete),
            )
            for leaf in self._leaves
        ]
        #: Per leaf, the dtypes of actions that a cast to the leaf's would wrap or overflow, with the range
        #: the leaf's dtype holds (a bounded space's range check covers the others); cached, as the same
        #: dtype comes on every step.
        self._narrowing: list[dict[np.dtype[Any], tuple[float, float] | None]] = [{} for _ in self._leaves]

    def __call__(self, actions: Any, env_ids: np.ndarray | None = None) -> list[np.ndarray]:
        """The checked arrays; ``env_ids`` names the env of each row in messages (default: the row)."""
        parts = [actions] if self._is_leaf else flatten(self._space, actions)
        checked = []
        for (leaf, expected, range_check, where, discrete), part, narrowing in zip(
            self._checks, parts, self._narrowing
        ):
            array = np.asarray(part)
            if array.ndim == 0 and expected:  # gymnasium raises TypeError: a scalar cannot be iterated
                raise TypeError(
                    f"{self._label}: {where} must be a batch of {expected[0]} actions (shape {expected}), "
                    f"got the scalar {part!r:.40}"
                )
            if array.shape != expected:
                raise ValueError(
                    f"{self._label}: {where} has shape {array.shape}, expected {expected} "
                    f"({expected[0]} envs of {leaf.space})"
                )
            if array.dtype != leaf.dtype and not np.can_cast(array.dtype, leaf.dtype, casting="same_kind"):
                raise ValueError(
                    f"{self._label}: {where} has dtype {array.dtype}, which cannot be cast to {leaf.dtype} "
                    f"for {leaf.space}"
                )
            # A bool array, or a list or tuple whose numpy bools numpy may have made ints ([np.True_, 1]).
            row = (
                _first_numpy_bool(part, array) if discrete and (part is not array or array.dtype.kind == "b") else None
            )
            bad, outside = range_check(array) if range_check is not None else None, "is outside"
            # Sync fails at the first env whose action it refuses: an earlier one out of range is named below.
            if row is not None and (bad is None or _first_bad_env(bad) >= row):
                env_id = row if env_ids is None else int(env_ids[row])
                given = part[row] if isinstance(part, (list, tuple)) else array[row].tolist()
                raise ValueError(
                    f"{self._label} env {env_id}: action {given!r} in {where} is a numpy bool, which "
                    f"{leaf.space} does not contain, as in gymnasium; give integers (np.asarray(actions, np.int64))"
                )
            if range_check is None and array.dtype != leaf.dtype:
                if array.dtype not in narrowing:
                    narrowing[array.dtype] = _narrowing_bounds(array.dtype, leaf.dtype)
                bounds = narrowing[array.dtype]
                if bounds is not None and array.size:
                    if leaf.dtype.kind == "f":  # a cast that overflows says so: cheaper than a min and a max
                        try:
                            with np.errstate(over="raise"):
                                array = array.astype(leaf.dtype)
                        except FloatingPointError:  # finite, and infinite once cast (inf and nan pass)
                            with np.errstate(over="ignore"):
                                bad = np.isfinite(array) & ~np.isfinite(array.astype(leaf.dtype))
                    elif not bounds[0] <= array.min() <= array.max() <= bounds[1]:
                        bad = (array < bounds[0]) | (array > bounds[1])
                    if bad is not None:
                        outside = f"does not fit {leaf.dtype}, the dtype of"
            if bad is not None:
                row = _first_bad_env(bad)
                env_id = row if env_ids is None else int(env_ids[row])
                raise ValueError(
                    f"{self._label} env {env_id}: action {array[row].tolist()!r} in {where} {outside} {leaf.space}"
                )
            checked.append(array)
        return checked


def _first_numpy_bool(part: Any, array: np.ndarray) -> int | None:
    """The first row of Discrete actions ``part`` (``array`` as numpy read it) that is a numpy bool,
    a scalar or a 0-d array, which gymnasium's Discrete refuses where it takes a Python bool (a bool
    is an int); None if none is."""
    if not isinstance(part, (list, tuple)):
        return 0 if array.dtype.kind == "b" else None
    if not {np.bool_, np.ndarray} & set(map(type, part)):  # the common list: no scan in Python
        return None
    return next(
        (
            row
            for row, value in enumerate(part)
            if isinstance(value, (np.bool_, np.ndarray)) and value.dtype.kind == "b"
        ),
        None,
    )


class ActionCheckers:
    """The ``ActionChecker`` of each batch size that comes (async sends and partial steps step some
    envs), for one action space."""

    def __init__(self, space: spaces.Space[Any], env_label: str) -> None:
        self._space, self._label = space, env_label
        self._by_size: dict[int, ActionChecker] = {}

    def check(self, actions: Any, env_ids: np.ndarray) -> list[np.ndarray]:
        """The checked arrays of ``actions``, a row per env of ``env_ids`` (named in messages)."""
        checker = self._by_size.get(len(env_ids))
        if checker is None:
            checker = self._by_size[len(env_ids)] = ActionChecker(self._space, len(env_ids), self._label)
        return checker(actions, env_ids)


class _LeafSlot:
    """One leaf's rows of a field, and what a value must look like to be written there."""

    __slots__ = ("view", "leaf", "shape", "dtype", "where", "dtypes", "scalar_types")

    def __init__(self, view: np.ndarray, leaf: Leaf) -> None:
        self.view, self.leaf, self.shape, self.dtype = view, leaf, leaf.shape, leaf.dtype
        self.where = "observation" + "".join(f"[{p!r}]" for p in leaf.path)
        self.dtypes: dict[np.dtype[Any], bool] = {leaf.dtype: True}  # which array dtypes cast 'same_kind'
        self.scalar_types: set[type] = set()  # non-array types seen to fit a leaf of shape ()

    def write(self, row: int, value: Any) -> None:
        """Writes ``value`` to ``row``; raises ``ValueError`` if its shape is not the leaf's or its dtype
        does not cast 'same_kind' to the leaf's (gymnasium's vector envs raise there too)."""
        kind = type(value)
        if kind is np.ndarray:
            if value.shape == self.shape:
                fits = self.dtypes.get(value.dtype)
                if fits is None:
                    fits = self.dtypes[value.dtype] = bool(np.can_cast(value.dtype, self.dtype, "same_kind"))
                if fits:
                    self.view[row] = value
                    return
        elif kind in self.scalar_types:
            self.view[row] = value
            return
        self._write_checked(row, value)

    def _write_checked(self, row: int, value: Any) -> None:
        array = np.asarray(value)
        if array.shape != self.shape or not np.can_cast(array.dtype, self.dtype, "same_kind"):
            raise ValueError(
                f"{self.where} is {type(value).__name__} of shape {array.shape} and dtype {array.dtype}, but "
                f"{self.leaf.space} needs shape {self.shape} and dtype {self.dtype} (or one that casts to it "
                f"'same_kind')"
            )
        if type(value) is not np.ndarray and not self.shape:
            self.scalar_types.add(type(value))  # a Python or numpy scalar: its type fixes its dtype
        self.view[row] = array


class ObservationWriter:
    """Writes one env's observation into its rows of the leaf fields, checking every leaf's shape and
    dtype: a value that does not fit raises ``ValueError`` naming the leaf, the value's shape and dtype
    and the space's, where casting would broadcast it, fill it or drop its imaginary part."""

    def __init__(self, space: spaces.Space[Any], views: list[np.ndarray]) -> None:
        self._space = space
        self._slots = [_LeafSlot(view, leaf) for view, leaf in zip(views, leaves(space))]
        #: ``write(row, observation)`` writes one env's observation (structured like the space) to
        #: ``row`` of every leaf's view; a plain leaf goes straight to its slot (one call per step).
        self.write: Callable[[int, Any], None] = self._slots[0].write if is_leaf(space) else self._write_parts
        #: For a plain leaf: (view, shape, dtype) of the value that may be stored without a call, the
        #: common case a caller checks inline (an ndarray of exactly that shape and dtype); else None.
        self.exact: tuple[np.ndarray, tuple[int, ...], np.dtype[Any]] | None = (
            (views[0], self._slots[0].shape, self._slots[0].dtype) if is_leaf(space) else None
        )

    def _write_parts(self, row: int, observation: Any) -> None:
        for slot, part in zip(self._slots, flatten(self._space, observation)):
            slot.write(row, part)
