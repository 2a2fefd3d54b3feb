"""What a worker is told at launch (shipped once with ``multiprocess``), and how an env is made."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium

from .params import ParamSpec

EnvFactory = str | Callable[..., gymnasium.Env]

#: The dotted name of the function every worker process runs; shmpool never imports it itself.
WORKER_ENTRY_POINT = "shmpool.workers.main:run"


def make_env(factory: EnvFactory, env_kwargs: dict[str, Any]) -> gymnasium.Env:
    """Builds one env from a registered id (``gymnasium.make``) or a callable."""
    env = gymnasium.make(factory, **env_kwargs) if isinstance(factory, str) else factory(**env_kwargs)
    if not isinstance(env, gymnasium.Env):
        raise TypeError(f"the env factory returned {type(env).__name__}, not a gymnasium.Env")
    return env


def describe_factory(factory: EnvFactory) -> str:
    """A short human name for an env factory, used in messages."""
    if isinstance(factory, str):
        return factory
    return getattr(factory, "__qualname__", None) or type(factory).__name__


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to join its pool; pickled once at launch, never per step."""

    pool_name: str
    worker_id: int
    env_ids: tuple[int, int]  # the slot: env ids start (inclusive) to stop (exclusive)
    env_factory: EnvFactory
    env_kwargs: dict[str, Any]
    env_label: str
    same_step_autoreset: bool
    owner_pid: int
    owner_start_ticks: int
    observation_space: gymnasium.Space[Any]
    action_space: gymnasium.Space[Any]
    doorbell: str  # this worker's
    trainer_doorbell: str
    all_doorbells: tuple[str, ...] = field(default=())  # removed by a worker that outlives the owner
    params: tuple[ParamSpec, ...] = ()
    param_seed: int = 0
    hooks: tuple[Any, ...] = ()
    episode_metrics: dict[str, str] = field(default_factory=dict)
    spin: int = 200
    poll_interval: float = 0.2
