"""Random draws for ``dist`` parameters, from a counter-based hash of (pool seed, env id, episode
index, parameter, step, element): the same seed and writes give the same draws whatever the number
of workers or the order in which envs reset."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .params import ParamSpec

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31))
_FACTORS = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, in place: a bijective scramble of 64-bit words (wraps, never warns on
    arrays). In place, because on the few envs of a reset a numpy call costs more than its work."""
    x ^= x >> _SHIFTS[0]
    x *= _FACTORS[0]
    x ^= x >> _SHIFTS[1]
    x *= _FACTORS[1]
    x ^= x >> _SHIFTS[2]
    return x


def _words(part: Any) -> np.ndarray:
    return np.asarray(part).astype(np.int64).astype(np.uint64)


def uniform01_grid(
    seed: int,
    env_ids: np.ndarray,
    episodes: np.ndarray,
    params: list[int],
    step: int | np.ndarray,
    size: int,
    lanes: int,
) -> np.ndarray:
    """Uniform floats in [0, 1) of shape ``(len(env_ids), len(params), lanes, size)``: element
    ``[i, p, lane, k]`` is a pure function of (seed, env, episode, parameter, step, lane, k), the
    same whichever other parameters, lanes and sizes are drawn with it. One call draws every
    parameter of a reset, sharing the keys' first steps."""
    if len(env_ids) * (2 + len(params) * (2 + lanes * (1 + size))) <= FEW_MIXES:
        return _few_uniform01(seed, env_ids, episodes, params, step, (len(env_ids), len(params), lanes, size))
    key = np.full(len(env_ids), np.uint64(seed % (1 << 64)), dtype=np.uint64)
    for part in (env_ids, episodes):
        key += _GOLDEN
        key += _words(part)
        _mix(key)
    keys = key[:, None] + _GOLDEN + _words(params)[None, :]
    steps = _words(step)
    _mix(keys)
    keys += _GOLDEN
    keys += steps[:, None] if steps.ndim else steps
    _mix(keys)
    lane_keys = keys[:, :, None] + _GOLDEN + np.arange(lanes, dtype=np.uint64)
    _mix(lane_keys)
    words = lane_keys[..., None] + _GOLDEN * np.arange(1, size + 1, dtype=np.uint64)
    _mix(words)
    return (words >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


#: Up to how many scrambles (``_mix``) ``uniform01_grid`` computes with Python ints, about 0.7 us
#: each, rather than with its some 60 numpy calls, about 36 us whatever their size (this 2-core VM).
#: Resets and steps take their uniforms from ``AheadUniforms``, whose grids are larger; this serves
#: the draws of a few envs made outside them: a hook's ``resample``, a rebuilt env's seed.
FEW_MIXES = 40
_MASK = (1 << 64) - 1


def _mix_int(x: int) -> int:
    """``_mix`` of one word held in a Python int (the same bits: every product is taken mod 2**64)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _few_uniform01(
    seed: int, env_ids: np.ndarray, episodes: np.ndarray, params: list[int], step: Any, shape: tuple[int, ...]
) -> np.ndarray:
    """``uniform01_grid`` for a few draws, bit for bit, with Python ints: the same keys, mixed in the
    same order, and the same conversion to a float (53 bits, exact, times a power of two)."""
    golden, scale = int(_GOLDEN), 1.0 / (1 << 53)
    count, _, lanes, size = shape
    env_words, episode_words, step_words = (_int_words(part, count) for part in (env_ids, episodes, step))
    first, param_words, values = int(seed % (1 << 64)), _int_words(params, len(params)), []
    for env, episode, step_word in zip(env_words, episode_words, step_words):
        key = _mix_int((first + golden + env) & _MASK)
        key = _mix_int((key + golden + episode) & _MASK)
        for param in param_words:
            param_key = _mix_int((key + golden + param) & _MASK)
            param_key = _mix_int((param_key + golden + step_word) & _MASK)
            for lane in range(lanes):
                lane_key = _mix_int((param_key + golden + lane) & _MASK)
                values += [(_mix_int((lane_key + golden * k) & _MASK) >> 11) * scale for k in range(1, size + 1)]
    return np.array(values, dtype=np.float64).reshape(shape)


def _int_words(part: Any, count: int) -> list[int]:
    """``_words(part)`` as ``count`` Python ints (a scalar, or a single value, serves every one)."""
    words = np.asarray(part).astype(np.int64).tolist()
    words = words if isinstance(words, list) else [words]
    return [word & _MASK for word in (words * count if len(words) == 1 else words)]


def uniform01(
    seed: int, env_ids: np.ndarray, episodes: np.ndarray, param: int, step: int | np.ndarray, size: int, lane: int = 0
) -> np.ndarray:
    """Uniform floats in [0, 1) of shape ``(len(env_ids), size)``, a pure function of every key."""
    return uniform01_grid(seed, env_ids, episodes, [param], step, size, lane + 1)[:, 0, lane]


def derive_seed(seed: int, env_id: int, episode: int) -> int:
    """A reset seed for one env and episode, from the same keyed stream as the draws."""
    u = uniform01(seed, np.array([env_id]), np.array([episode]), -1, 0, 1)
    return int(u[0, 0] * (1 << 31))


def draws(
    specs: list[ParamSpec],
    arguments: list[np.ndarray],
    seed: int,
    env_ids: np.ndarray,
    episodes: np.ndarray,
    step: int | np.ndarray,
) -> list[np.ndarray]:
    """Draws one value per env from each of ``specs``' distributions, with per-env ``arguments``
    records (one array per spec), in one grid of uniforms."""
    size, lanes = _grid_shape(specs)
    grid = uniform01_grid(seed, env_ids, episodes, [spec.index for spec in specs], step, size, lanes)
    return values_from(specs, arguments, grid)


def _grid_shape(specs: list[ParamSpec]) -> tuple[int, int]:
    """The size and lanes of the grid of uniforms that ``specs`` draw from."""
    size = max(max(1, math.prod(spec.shape)) for spec in specs)
    return size, 2 if any(spec.dist == "normal" for spec in specs) else 1


def values_from(specs: list[ParamSpec], arguments: list[np.ndarray], grid: np.ndarray) -> list[np.ndarray]:
    """Each of ``specs``' values for the envs of ``grid`` (``uniform01_grid``'s, one column per spec),
    with their ``arguments`` records (one array per spec)."""
    results = []
    for column, (spec, records) in enumerate(zip(specs, arguments)):
        size = max(1, math.prod(spec.shape))
        shape = (len(grid), *spec.shape)
        u = grid[:, column, 0, :size].reshape(shape)
        if spec.dist == "uniform":
            low, high = records["low"].astype(np.float64), records["high"].astype(np.float64)
            values = low + u * (high - low)
        elif spec.dist == "loguniform":
            low, high = np.log(records["low"].astype(np.float64)), np.log(records["high"].astype(np.float64))
            values = np.exp(low + u * (high - low))
        else:
            v = grid[:, column, 1, :size].reshape(shape)
            normal = np.sqrt(-2.0 * np.log1p(-u)) * np.cos(2.0 * np.pi * v)
            values = records["mean"].astype(np.float64) + records["std"].astype(np.float64) * normal
        results.append(np.clip(values, spec.low, spec.high).astype(spec.dtype))
    return results


#: How many draws ahead ``AheadUniforms`` takes the uniforms of, per env, when they fit in
#: ``AHEAD_UNIFORMS`` per env (draws of large arrays take fewer; one: none held, each drawn alone).
AHEAD_DRAWS = 16
AHEAD_UNIFORMS = 512


class AheadUniforms:
    """The uniforms that a slot's envs draw ``specs``' values from (``uniform01_grid``'s), along
    episodes (a reset's draws, at step 0) or along the steps of each env's episode (``when="step"``
    draws), held for each env's next ``AHEAD_DRAWS`` draws: the same bits as a grid drawn for each
    draw alone, whatever episode or step an env moves to (a restored checkpoint's, say)."""

    # Why: a grid costs some 60 numpy calls (or a few dozen scrambles in Python) whatever its size,
    # so one grid per env every 16 draws replaces one per reset or step with a lookup. Each uniform
    # is a pure function of its keys, which is what makes the held ones exact.

    def __init__(self, seed: int, env_ids: np.ndarray, specs: list[ParamSpec], along_steps: bool) -> None:
        self._seed, self._env_ids, self._params = seed, env_ids, [spec.index for spec in specs]
        self._along_steps = along_steps
        self._size, self._lanes = _grid_shape(specs)
        self._ahead = max(1, min(AHEAD_DRAWS, AHEAD_UNIFORMS // (len(specs) * self._lanes * self._size)))
        held = len(env_ids) if self._ahead > 1 else 0
        self._grids = np.zeros((held, self._ahead, len(specs), self._lanes, self._size))
        #: Per env: the episode its grids are for, and the first step (or episode) they hold, far
        #: below any there is until a grid is drawn.
        self._episodes = np.zeros(held, dtype=np.int64)
        self._first = np.full(held, -(1 << 62), dtype=np.int64)

    def take(self, rows: np.ndarray, episodes: np.ndarray, steps: np.ndarray | int = 0) -> np.ndarray:
        """``uniform01_grid``'s ``(len(rows), params, lanes, size)`` for the envs at ``rows`` (distinct
        int indices) in their ``episodes``, at their ``steps`` (along steps) or at step 0."""
        if self._ahead == 1:  # a draw of large arrays: nothing held (it would only take memory)
            at = steps if self._along_steps else 0
            return uniform01_grid(self._seed, self._env_ids[rows], episodes, self._params, at, self._size, self._lanes)
        moving = steps if self._along_steps else episodes
        offsets = moving - self._first[rows]
        missing = (offsets < 0) | (offsets >= self._ahead)
        if self._along_steps:
            missing |= episodes != self._episodes[rows]
        if np.count_nonzero(missing):
            refilled, starts = rows[missing], np.broadcast_to(moving, missing.shape)[missing]
            keys = (starts[:, None] + np.arange(self._ahead)).ravel()
            held_episodes = np.repeat(episodes[missing], self._ahead)
            grid = uniform01_grid(
                self._seed,
                np.repeat(self._env_ids[refilled], self._ahead),
                held_episodes if self._along_steps else keys,
                self._params,
                keys if self._along_steps else 0,
                self._size,
                self._lanes,
            )
            self._grids[refilled] = grid.reshape(len(refilled), self._ahead, *grid.shape[1:])
            self._first[refilled], self._episodes[refilled] = starts, episodes[missing]
            offsets = moving - self._first[rows]
        return self._grids[rows, offsets]
