"""A first look at shmpool: run CartPole in worker processes and watch episodes finish.

    python scripts/demo.py                  # 64 CartPole envs on 2 workers for 3 seconds
    python scripts/demo.py --env Pendulum-v1 --num-envs 16 --seconds 5
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

import shmpool


@dataclass
class Settings:
    """What the demo runs."""

    env: str = "CartPole-v1"
    num_envs: int = 64
    num_workers: int = 2
    seconds: float = 3.0
    seed: int = 0


def parse_settings() -> Settings:
    """Reads Settings from the command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Settings()
    parser.add_argument("--env", default=defaults.env, help="a registered gymnasium env id")
    parser.add_argument("--num-envs", type=int, default=defaults.num_envs, help="envs in the pool")
    parser.add_argument("--num-workers", type=int, default=defaults.num_workers, help="worker processes")
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="how long to step")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the first reset and the policy")
    return Settings(**vars(parser.parse_args()))


def main() -> None:
    """Steps a pool with random actions and prints a line per second."""
    settings = parse_settings()
    with shmpool.launch(settings.env, settings.num_envs, num_workers=settings.num_workers, seed=settings.seed) as pool:
        print(pool)
        pool.reset()
        pool.action_space.seed(settings.seed)
        steps, returns, lengths = 0, [], []
        start = report = time.perf_counter()
        while (now := time.perf_counter()) - start < settings.seconds:
            _, _, _, _, infos = pool.step(pool.action_space.sample())
            steps += pool.num_envs
            if "episode" in infos:
                done = infos["_episode"]
                returns.extend(infos["episode"]["r"][done])
                lengths.extend(infos["episode"]["l"][done])
            if now - report >= 1.0:
                mean_return = np.mean(returns) if returns else float("nan")
                print(f"{now - start:5.1f} s  {steps / (now - start):>10,.0f} env steps/s  "
                      f"{len(returns):>6} episodes  mean return {mean_return:8.2f}")
                report = now
        print(f"done: {steps:,} env steps, {len(returns)} episodes, mean length {np.mean(lengths):.1f}")


if __name__ == "__main__":
    main()
