"""Random draws for ``dist`` parameters, from a counter-based hash of (pool seed, env id, episode
index, parameter, step, element): the same seed and writes give the same draws whatever the number
of workers or the order in which envs reset."""

from __future__ import annotations

import numpy as np

from .params import ParamSpec

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
