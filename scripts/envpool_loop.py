"""EnvPool code on shmpool: an async loop written for EnvPool's API (as cleanba's is), with one import
changed, plus what EnvPool cannot do: a curriculum that lengthens the pole while the loop runs.

    python scripts/envpool_loop.py                    # CartPole-v1, 16 envs, batches of 8
    python scripts/envpool_loop.py --quick

The policy pushes toward the pole's lean. Every ``--curriculum-every`` recvs every env's pole grows
by ``--length-step``, written into the pool's shared parameter block while batches are in flight;
the table shows each env's pole length and episode count at the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import _settings
import numpy as np

import shmpool
import shmpool.envpool as envpool  # was: import envpool


@dataclass
class Settings:
    """What the loop runs."""

    task: str = "CartPole-v1"
    """the gymnasium id (EnvPool's task_id)."""
    num_envs: int = 16
    """envs in the pool."""
    batch_size: int = 8
    """envs per recv(): fewer than num_envs makes the loop asynchronous."""
    num_workers: int = 2
    """worker processes."""
    recvs: int = 3000
    """how many batches the loop receives."""
    curriculum_every: int = 200
    """recvs between two curriculum steps."""
    length_step: float = 0.05
    """how much each curriculum step lengthens the poles."""
    seed: int = 0
    """env i is seeded with seed + i."""
    quick: bool = False
    """300 recvs and a curriculum step every 45, for a smoke test."""


def main() -> None:
    settings = _settings.parse(Settings, description=__doc__)
    recvs = 300 if settings.quick else settings.recvs
    every = 45 if settings.quick else settings.curriculum_every
    env = envpool.make(
        settings.task,
        env_type="gymnasium",
        num_envs=settings.num_envs,
        batch_size=settings.batch_size,
        seed=settings.seed,
        # the one thing EnvPool has no equivalent of: parameters any process can change while it runs
        num_workers=settings.num_workers,
        params={"length": shmpool.Param(0.5, low=0.1, high=2.0)},
    )
    with env:
        start = time.perf_counter()
        env.async_reset()
        episodes = np.zeros(settings.num_envs, dtype=np.int64)
        for recv in range(1, recvs + 1):
            observations, rewards, terminations, truncations, info = env.recv()
            env_id = info["env_id"]
            episodes[env_id] += terminations | truncations
            if recv % every == 0:
                longer = np.minimum(env.params["length"] + settings.length_step, 2.0)
                env.params.write(None, length=longer)  # every env, from its next step
            actions = (observations[:, 2] > 0).astype(np.int64)  # push toward the pole's lean
            env.send(actions, env_id)
        elapsed = time.perf_counter() - start
        print(f"{'env':>4} {'pole length':>12} {'episodes':>9}")
        for env_id in range(settings.num_envs):
            print(f"{env_id:>4} {env.applied['length'][env_id]:>12.2f} {episodes[env_id]:>9}")
        steps = recvs * settings.batch_size
        print(f"\n{steps:,} env steps in {elapsed:.2f} s: {steps / elapsed:,.0f} steps/s, {env!r}")


if __name__ == "__main__":
    main()
