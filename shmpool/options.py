"""Checks of option values, each raising an error that names the option and the value, and the
option sets that functions forwarding ``shmpool.launch``'s options take (typed, for static tools)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode

from .params import Param


def check_env_ids(env_ids: Any, num_envs: int, where: str, *, unique: bool) -> np.ndarray:
    """``env_ids`` as a 1-d int array, or an error naming ``where`` (the call) and the bad ids."""
    ids = np.asarray(env_ids)
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise TypeError(f"{where}: env ids must be a 1-d sequence of ints, got {env_ids!r:.80}")
    if ids.size and (ids.min() < 0 or ids.max() >= num_envs):
        raise IndexError(f"{where}: env ids {ids.tolist()!r:.80} are outside 0..{num_envs - 1}")
    if unique and len(np.unique(ids)) != len(ids):
        raise ValueError(f"{where}: env ids repeat: {ids.tolist()!r:.80}")
    return ids.astype(np.int64, copy=False)


def autoreset_mode(value: Any) -> AutoresetMode:
    """An ``AutoresetMode`` from itself, its value (``"SameStep"``) or its name in any case (``"same_step"``)."""
    if isinstance(value, str) and value not in {mode.value for mode in AutoresetMode}:
        return AutoresetMode[value.upper()]
    return AutoresetMode(value)


#: The largest count or size an option may ask for (ring lengths, info table sizes): far beyond any
#: real need, and small enough that a typo fails here rather than as a numpy or mmap error.
MAX_COUNT = 1 << 24


def mapping(option: str, value: Any) -> Mapping[Any, Any]:
    """``value`` (None: empty) as a mapping, or a ``TypeError`` naming the option."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{option} must be a dict, got {value!r:.80}")
    return value


def seconds(option: str, value: Any) -> float:
    """``value`` as a positive number of seconds, or an error naming the option."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{option} must be a number of seconds, got {value!r:.80}")
    if not value > 0:  # NaN fails too
        raise ValueError(f"{option} must be a positive number of seconds, got {value!r}")
    return float(value)


def deadline_after(wait: float | None, where: str) -> float | None:
    """When a wait of ``wait`` seconds from now ends, on ``time.monotonic``'s clock (None: no end).
    NaN, with which no deadline would ever pass, raises a ``ValueError`` naming ``where``."""
    if wait is None:
        return None
    if math.isnan(wait):
        raise ValueError(f"{where}: wait must be a number of seconds or None, got {wait}")
    return time.monotonic() + wait


def count(option: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int within [low, high], or a ``ValueError`` naming the option."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{option} must be an int, got {value!r}")
    number = int(value.__index__())
    if number < low or (high is not None and number > high):
        bounds = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ValueError(f"{option} must be {bounds}, got {number}")
    return number


def fixed_options(owner: str, options: Mapping[str, Any], **fixed: Any) -> dict[str, Any]:
    """``options`` with the ``fixed`` ones set, for an integration that needs those values; a
    ``ValueError`` naming ``owner``, the option and both values when ``options`` gives another."""
    for option, needed in fixed.items():
        if option not in options:
            continue
        given = options[option]
        if option == "autoreset_mode":
            with contextlib.suppress(KeyError, ValueError):
                given = autoreset_mode(given)  # any spelling PoolConfig takes
        if given is not needed and given != needed:
            raise ValueError(f"{owner} needs {option}={needed!r}, got {options[option]!r}")
    return {**options, **fixed}


class _Options(TypedDict, total=False):
    """The options of ``shmpool.launch`` that every function forwarding them takes through."""

    num_workers: int | None
    autoreset_mode: AutoresetMode | str
    env_kwargs: Mapping[str, Any] | None
    copy: bool
    timeout: float | None
    launch_timeout: float
    info_keys: int
    info_bytes: int
    params: Mapping[str, Param] | None
    info_params: bool
    hooks: Sequence[Any]
    event_capacity: int
    event_payload: int
    episode_metrics: Mapping[str, str] | None
    episode_capacity: int
    observation_mode: str | tuple[gymnasium.Space[Any], gymnasium.Space[Any]]
    recv_order: str
    trainer_slot: bool | None
    episode_statistics: bool
    profile: bool
    worker_init: Callable[[], Any] | None
    engine: str


# The options as the functions that forward them take them, written out for static tools (mypy,
# pyright, IDEs: a misspelt option is an error before anything runs): each leaves out those its
# function takes as its own parameters. tests/test_options.py checks them against PoolConfig.


class LaunchOptions(_Options, total=False):
    """Every option of ``shmpool.launch`` (``**options: Unpack[LaunchOptions]``)."""

    seed: int | None
    name: str | None
    start_method: str | None
    batch_size: int | None


class OptionsButName(_Options, total=False):
    """The options of ``shmpool.launch`` but ``name`` (the forwarder names the pool)."""

    seed: int | None
    start_method: str | None
    batch_size: int | None


class OptionsButStartMethod(_Options, total=False):
    """The options of ``shmpool.launch`` but ``start_method`` (the forwarder takes it itself)."""

    seed: int | None
    name: str | None
    batch_size: int | None


class OptionsButSeedAndBatch(_Options, total=False):
    """The options of ``shmpool.launch`` but ``seed`` and ``batch_size`` (the forwarder takes them)."""

    name: str | None
    start_method: str | None


class OptionsButBatchSize(_Options, total=False):
    """The options of ``shmpool.launch`` but ``batch_size`` (the forwarder steps every env at once)."""

    seed: int | None
    name: str | None
    start_method: str | None


def batch_size_problem(num_envs: int, workers: int, batch: int, workers_by_default: bool) -> str:
    """Why ``batch_size=batch`` does not fit ``num_envs`` envs over ``workers`` workers, and the values
    that would (a batch is whole, equal slots: a worker steps its whole slot at once)."""
    chosen = f"num_workers={workers}" + (" (the default: the usable cores)" if workers_by_default else "")
    if num_envs % workers:
        slots = f"{num_envs} envs make unequal slots over {chosen}"
        fitting_batches = ""
    else:
        size = num_envs // workers
        slots = f"{num_envs} envs over {chosen} make slots of {size}"
        fitting_batches = f"; batch sizes that fit: {list(range(size, num_envs + 1, size))}"
    fitting_workers = [w for w in range(1, num_envs + 1) if num_envs % w == 0 and batch % (num_envs // w) == 0]
    return (
        f"batch_size={batch} is not a whole number of slots: {slots}{fitting_batches}; "
        f"or set num_workers to one of {fitting_workers[:8]} for batches of {batch}"
    )
