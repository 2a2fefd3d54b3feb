"""Checkpoints of a pool's shared state: ``state_dict()`` / ``load_state_dict()`` of a pool or handle.

Why and how: ``docs/internals.md``, "shmpool/checkpoints.py".
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Protocol, TypedDict

import numpy as np

from .param_block import ParamBlock
from .params import ParamSpec, bad_rows

#: Bumped when the state's shape changes; a state of another version is refused by name.
STATE_VERSION = 1

#: How many times ``state_dict`` reads the accepted values of refused rows, at most, for two equal reads in a row.
SETTLE_READS = 8

#: A loaded episode index must be below this: the workers' int64 counters then have 2**62 resets of
#: room before they could overflow (numpy would wrap them to -2**63, with a warning in the worker).
MAX_EPISODE_INDEX = 1 << 62


class PoolState(TypedDict):
    """What ``state_dict`` returns (see the module docstring)."""

    version: int
    schema: dict[str, Any]
    param_seed: int
    params: dict[str, Any]
    episode_index: np.ndarray


class Checkpointable(Protocol):
    """What a checkpoint reads and writes: one pool's channels, such as a ``shmpool.view.PoolView``.
    Described here rather than imported from ``shmpool.view``, which imports this module: the two
    would import each other."""

    name: str
    env_label: str
    param_seed: int
    episode_index: np.ndarray
    specs: list[ParamSpec]
    params: ParamBlock | None


def schema(view: Checkpointable) -> dict[str, Any]:
    """The fingerprint a state must share with a pool to load into it, as plain data."""
    params = []
    for spec in view.specs:
        description = spec.to_json()
        # Where a value goes is not part of the state's shape, and a binding object's text may hold
        # a memory address that differs between pools.
        description.pop("bind", None)
        params.append(description)
    return {"env": view.env_label, "num_envs": len(view.episode_index), "params": params}


def state_dict(view: Checkpointable) -> PoolState:
    """The pool's parameter block, episode indices, draw seed and schema (see the module docstring)."""
    params: dict[str, Any] = {}
    if view.params is not None:
        records = view.params.snapshot()
        for spec in view.specs:
            refused = np.flatnonzero(bad_rows(spec, records[spec.name]))
            if refused.size:
                kept = _settled_rows(view.params.accepted[spec.name], refused)
                _save_what_runs(spec, refused, records, kept)
            column = records[spec.name]
            if spec.dist:
                params[spec.name] = {argument: column[argument].copy() for argument in spec.arguments}
            else:
                params[spec.name] = column.copy()
    return {
        "version": STATE_VERSION,
        "schema": schema(view),
        "param_seed": view.param_seed,
        "params": params,
        "episode_index": view.episode_index.copy(),
    }


def _settled_rows(column: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``column[rows]``, read again until two reads in a row are equal (at most ``SETTLE_READS``
    reads): a worker writes its rows of ``params_accepted`` with no lock a reader could take, and a
    read while it does may hold half of a row (one argument of a distribution but not the other)."""
    last = column[rows]
    for _ in range(SETTLE_READS - 1):
        again = column[rows]
        if again.tobytes() == last.tobytes():
            break
        last = again
    return last


def _save_what_runs(spec: ParamSpec, rows: np.ndarray, records: np.ndarray, kept: np.ndarray) -> None:
    """Replaces in ``records`` the ``rows`` of ``spec`` that the workers refused by ``kept``, the values
    those workers accepted last (what the envs run with, draw from or take at their next reset), and
    says so."""
    first = int(rows[0])

    def shown(value: Any) -> Any:
        return {argument: value[argument].tolist() for argument in spec.arguments} if spec.dist else value.tolist()

    held = shown(records[spec.name][first])
    records[spec.name][rows] = kept
    warnings.warn(
        f"state_dict: params[{spec.name!r}] of env(s) {rows.tolist()[:10]} hold(s) {held}, which the "
        f"workers refused; the state saves what those envs run with instead ({shown(kept[0])} for env {first})",
        RuntimeWarning,
        stacklevel=3,
    )


def load_state_dict(view: Checkpointable, state: Mapping[str, Any], *, same_draws: bool = True) -> None:
    """Writes ``state`` into the pool: parameters through the validated, atomic ``write()`` (workers pick them up at
    their next step or reset), then episode indices.

    Every field is checked before anything is written, so a state loads whole or not at all. Raises ``ValueError``
    naming the field and its value: what differs from the pool (schema fields, the draw seed unless ``same_draws`` is
    False), a malformed field (a seed that is not an integer, a ``dist`` parameter lacking an argument, an episode
    index outside ``[-1, MAX_EPISODE_INDEX)``), or a value the pool's bounds refuse (as ``ParamBlock.write`` does).
    """
    version = state.get("version") if isinstance(state, Mapping) else type(state).__name__
    if not isinstance(state, Mapping) or isinstance(version, bool) or not _same(version, STATE_VERSION):
        raise ValueError(f"not a shmpool pool state of version {STATE_VERSION} (got version {version!r:.60})")
    missing = [key for key in PoolState.__annotations__ if key not in state]
    if missing:
        raise ValueError(f"the pool state lacks {missing}")
    differences = _differences(state["schema"], schema(view))
    if differences:
        raise ValueError(
            f"cannot load this state into pool {view.name!r}: it was saved from a pool that differs in "
            f"{'; '.join(differences)}. Launch the pool with the same env, num_envs and params"
        )
    seed = _param_seed(state["param_seed"])
    has_draws = any(spec.dist for spec in view.specs)
    if same_draws and has_draws and seed != view.param_seed:
        raise ValueError(
            f"cannot load this state into pool {view.name!r}: param_seed differs (state {seed}, "
            f"pool {view.param_seed}), so its draws would not continue; launch with seed={seed}, "
            f"or pass same_draws=False to load the values alone"
        )
    indices = _episode_indices(state["episode_index"], len(view.episode_index))
    arrays = _param_arrays(view, state["params"])
    if view.params is not None:
        # One write: validated as a whole before anything lands, then atomic per env. Every dist
        # parameter holds all its arguments (checked above), so nothing is merged with the pool's own.
        view.params.write(None, **arrays)
    # A single aligned store per env. Workers only advance these during a command, so between the
    # trainer's calls (or before its first reset) the next reset of each env continues from here.
    view.episode_index[:] = indices


def _same(a: Any, b: Any) -> bool:
    """``a == b`` for values of a state, which may be of any type: one whose ``==`` is not a plain
    truth (a numpy array) or raises counts as different, where a bare ``!=`` would raise."""
    try:
        return bool(a == b)
    except Exception:  # any type's __eq__ or __bool__ can raise; each means "not the same"
        return False


def _param_seed(value: Any) -> int:
    """The state's ``param_seed`` as an int, or a ``ValueError`` naming it: the pool's seeds are int64s."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"the state's param_seed must be an integer, got {value!r:.60} ({type(value).__name__})")
    seed = int(value)
    if not -(1 << 63) <= seed < 1 << 63:
        raise ValueError(f"the state's param_seed = {seed} is outside the int64 seeds a pool draws with")
    return seed


def _episode_indices(value: Any, num_envs: int) -> np.ndarray:
    """The state's ``episode_index`` as int64s, each in ``[-1, MAX_EPISODE_INDEX)``, or a ``ValueError``
    naming the first bad env and its value (checked by value, whatever the dtype: a uint64 of 2**64-1
    must not load as -1)."""
    bound = f"2**{MAX_EPISODE_INDEX.bit_length() - 1}"
    wanted = f"the state's episode_index must be {num_envs} integers in [-1, {bound})"
    try:
        indices = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{wanted}, got {value!r:.80}: {exc}") from None
    if indices.shape != (num_envs,) or indices.dtype.kind not in "iu":
        raise ValueError(f"{wanted}, got {indices.dtype} of shape {indices.shape}")
    # Python ints compare exactly across signed and unsigned dtypes, where numpy may go through float64.
    for env_id, index in enumerate(indices.tolist()):
        if not -1 <= index < MAX_EPISODE_INDEX:
            raise ValueError(f"{wanted}, got episode_index[{env_id}] = {index}")
    return indices.astype(np.int64)


def _param_arrays(view: Checkpointable, values: Any) -> dict[str, Any]:
    """The state's ``params`` as arrays (a dict of them for a ``dist`` parameter, with every argument),
    or a ``ValueError`` naming the parameter, the argument and the value."""
    names = [spec.name for spec in view.specs]
    if not isinstance(values, Mapping) or set(values) != set(names):
        # Sorted by repr: the keys of a hand-made state may be of types that do not compare.
        shown = (
            f"[{', '.join(sorted(map(repr, values)))}]" if isinstance(values, Mapping) else f"a {type(values).__name__}"
        )
        raise ValueError(f"the state's params must hold exactly {names}, got {shown}")
    arrays: dict[str, Any] = {}
    for spec in view.specs:
        value = values[spec.name]
        if not spec.dist:
            if isinstance(value, Mapping):
                raise ValueError(f"the state's params[{spec.name!r}] must be an array (not a dict): it has no dist")
            arrays[spec.name] = _numbers(value, f"params[{spec.name!r}]")
            continue
        if not isinstance(value, Mapping):
            raise ValueError(
                f"the state's params[{spec.name!r}] must be a dict of the {spec.dist} arguments "
                f"{list(spec.arguments)}, got {value!r:.60}"
            )
        lacking = [argument for argument in spec.arguments if argument not in value]
        extra = [argument for argument in value if argument not in spec.arguments]
        if lacking or extra:
            # write() would merge a lacking argument with the pool's own value: a partial load.
            wrong = ([f"lacks {lacking}"] if lacking else []) + ([f"has unknown {extra!r:.60}"] if extra else [])
            raise ValueError(
                f"the state's params[{spec.name!r}] is a {spec.dist} parameter, which needs the arguments "
                f"{list(spec.arguments)}: it {' and '.join(wrong)}"
            )
        arrays[spec.name] = {
            argument: _numbers(value[argument], f"params[{spec.name!r}][{argument!r}]") for argument in spec.arguments
        }
    return arrays


def _numbers(value: Any, where: str) -> np.ndarray:
    """``value`` as a numeric array, or a ``ValueError`` naming ``where``; bounds and shape are ``write()``'s."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"the state's {where} = {value!r:.60} is not an array of numbers: {exc}") from None
    if array.dtype.kind not in "biuf":
        raise ValueError(f"the state's {where} = {value!r:.60} is not an array of numbers (dtype {array.dtype})")
    return array


def _differences(saved: Any, current: dict[str, Any]) -> list[str]:
    """The schema fields that differ, each as ``field (state X, pool Y)``; a ``ValueError`` for a saved
    param name that is not a str (nothing could be matched by it)."""
    if not isinstance(saved, Mapping):
        return [f"schema (state {saved!r:.60}, pool {current!r:.60})"]
    found = [
        f"{key} (state {saved.get(key)!r}, pool {current[key]!r})"
        for key in ("env", "num_envs")
        if not _same(saved.get(key), current[key])
    ]
    saved_params = saved.get("params")
    if not isinstance(saved_params, list) or not all(isinstance(p, Mapping) for p in saved_params):
        return [*found, "params (the state's are not a list of descriptions)"]
    saved_names = [p.get("name") for p in saved_params]
    for index, name in enumerate(saved_names):
        if not isinstance(name, str):
            raise ValueError(
                f"the state's schema['params'][{index}]['name'] must be a str, got {name!r:.60} ({type(name).__name__})"
            )
    names = [p["name"] for p in current["params"]]
    if saved_names != names:
        if set(saved_names) == set(names):
            found.append(f"the order of params (state {saved_names}, pool {names}), which keys the draws")
        else:
            extra = [n for n in saved_names if n not in names]
            lacking = [n for n in names if n not in saved_names]
            found.append(f"params (only the state has {extra}, only the pool has {lacking})")
    by_name = {p.get("name"): p for p in saved_params}
    for description in current["params"]:
        old = by_name.get(description["name"])
        if old is None:
            continue
        found += [
            f"params[{description['name']!r}].{key} (state {old.get(key)!r}, pool {value!r})"
            for key, value in description.items()
            if key != "name" and not _same(old.get(key), value)
        ]
    return found
