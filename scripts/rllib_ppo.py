"""RLlib's PPO on a pool, with a curriculum and per-episode randomization that rebuild nothing.

    pip install -e ".[rllib]"            # ray[rllib] pins its own gymnasium: use a venv of its own
    python scripts/rllib_ppo.py          # CartPole-v1, 8 envs on the local env runner
    python scripts/rllib_ppo.py --quick

Two RLlib callbacks steer the envs through the pool's shared parameter block:
- ``on_train_result`` lengthens every env's pole by ``--length-step`` whenever the mean return
  reaches ``--target``, on every env runner (``shmpool.rllib.write_params``, which goes through
  ``foreach_env_runner``);
- ``on_episode_end`` draws a new pole mass for the env whose episode ended, used from its reset.

RLlib's own curriculum example edits ``env_config`` and rebuilds every env instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import _settings
import numpy as np

import shmpool
from shmpool.rllib import pool_of, vector_env_creator, write_params


@dataclass
class Settings:
    """What PPO trains on, and the curriculum."""

    iterations: int = 25
    """PPO training iterations."""
    num_envs: int = 8
    """envs per env runner (num_envs_per_env_runner)."""
    num_workers: int = 2
    """worker processes of each env runner's pool."""
    target: float = 150.0
    """the mean return at which the poles grow."""
    length_step: float = 0.1
    """how much the poles grow each time."""
    max_length: float = 1.5
    """the longest pole."""
    mass_range: tuple[float, float] = (0.05, 0.2)
    """pole masses drawn per episode."""
    seed: int = 0
    """RLlib's seed (env i of the runner gets seed + i)."""
    quick: bool = False
    """two iterations and a low target, for a smoke test."""


def main() -> None:
    settings = _settings.parse(Settings, description=__doc__)
    from ray.rllib.algorithms.ppo import PPOConfig  # after --help, which needs no RLlib
    from ray.tune.registry import register_env

    iterations, target = (2, 10.0) if settings.quick else (settings.iterations, settings.target)
    spec = {
        "length": shmpool.Param(0.5, low=0.1, high=settings.max_length),
        "masspole": shmpool.Param(0.1, low=0.01, high=1.0, when="reset"),
    }
    register_env("cartpole-pool", vector_env_creator("CartPole-v1", num_workers=settings.num_workers, params=spec))
    rng = np.random.default_rng(settings.seed)

    def lengthen_poles(algorithm: Any, result: dict[str, Any], **_: Any) -> None:
        mean_return = result["env_runners"].get("episode_return_mean", float("nan"))
        length = float(pool_of(algorithm.env_runner).params["length"].max())
        if mean_return >= target and length < settings.max_length:
            write_params(algorithm, None, length=min(length + settings.length_step, settings.max_length))

    def draw_mass(env_runner: Any, env_index: int, **_: Any) -> None:
        pool_of(env_runner).params.write([env_index], masspole=rng.uniform(*settings.mass_range))

    config = (
        PPOConfig()
        .environment("cartpole-pool")
        .env_runners(
            num_env_runners=0, num_envs_per_env_runner=settings.num_envs, gym_env_vectorize_mode="vector_entry_point"
        )
        .training(train_batch_size_per_learner=1000, minibatch_size=250, num_epochs=4, lr=3e-4)
        .callbacks(on_train_result=lengthen_poles, on_episode_end=draw_mass)
        .debugging(seed=settings.seed)
    )
    algorithm = config.build_algo()
    try:
        pool = pool_of(algorithm.env_runner)
        print(f"{'iteration':>9} {'mean return':>12} {'pole length':>12} {'pole masses':>14} {'seconds':>8}")
        start = time.perf_counter()
        for iteration in range(1, iterations + 1):
            result = algorithm.train()
            mean_return = result["env_runners"].get("episode_return_mean", float("nan"))
            masses = pool.applied["masspole"]
            print(
                f"{iteration:>9} {mean_return:>12.1f} {pool.applied['length'].max():>12.2f} "
                f"{f'{masses.min():.3f}-{masses.max():.3f}':>14} {time.perf_counter() - start:>8.1f}"
            )
    finally:
        algorithm.stop()


if __name__ == "__main__":
    main()
