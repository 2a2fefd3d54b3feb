"""Domain randomization on a MuJoCo robot: per-reset friction and mass, periodic pushes.

    python scripts/robot_dr.py                          # HalfCheetah-v5, 16 envs, 10 s
    python scripts/robot_dr.py --env Ant-v5 --body torso --seconds 5

Each episode draws the floor friction and the torso mass as scales of their nominal values
(``relative=True``: mass x U(0.8, 1.2), friction x U(0.5, 1.5)); every ``--push-every`` steps each
env's torso gets a force for one step. A random (or a simple sine) policy drives the robot. It prints
the ranges of the values applied and the throughput.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

import shmpool
from shmpool import hooks
from shmpool import mujoco as smj


@dataclass
class Settings:
    """What to run."""

    env: str = "HalfCheetah-v5"
    num_envs: int = 16
    num_workers: int = 2
    seconds: float = 10.0
    body: str = "torso"
    floor: str = "floor"
    push_every: int = 50
    push_force: float = 50.0
    policy: str = "random"
    seed: int = 0


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Reads Settings from the command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Settings()
    parser.add_argument("--env", default=defaults.env, help="a gymnasium MuJoCo env id")
    parser.add_argument("--num-envs", type=int, default=defaults.num_envs)
    parser.add_argument("--num-workers", type=int, default=defaults.num_workers)
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="how long to run")
    parser.add_argument("--body", default=defaults.body, help="the body whose mass is randomized and that is pushed")
    parser.add_argument("--floor", default=defaults.floor, help="the geom whose friction is randomized")
    parser.add_argument("--push-every", type=int, default=defaults.push_every, help="steps between pushes")
    parser.add_argument("--push-force", type=float, default=defaults.push_force, help="newtons per push axis")
    parser.add_argument("--policy", choices=["random", "sine"], default=defaults.policy)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    return Settings(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> None:
    """Runs the randomized pool and prints what was applied."""
    settings = parse_settings(argv)
    params = smj.scale_randomization(settings.body, settings.floor)
    push = hooks.Perturb(settings.push_force, every=settings.push_every, kick=smj.Push(settings.body), dims=3)
    with shmpool.launch(
        settings.env,
        settings.num_envs,
        num_workers=settings.num_workers,
        params=params,
        hooks=[push],
        seed=settings.seed,
        env_kwargs={"max_episode_steps": 200},
    ) as pool:
        print(pool)
        pool.reset()
        pool.action_space.seed(settings.seed)
        rng = np.random.default_rng(settings.seed)
        phases = rng.uniform(0, 2 * np.pi, (settings.num_envs, pool.single_action_space.shape[0]))
        seen = {name: [] for name in params}
        returns: list[float] = []
        start = time.perf_counter()
        steps = 0
        while time.perf_counter() - start < settings.seconds:
            if settings.policy == "random":
                actions = pool.action_space.sample()
            else:
                actions = np.sin(0.2 * steps + phases).astype(np.float32)
            _, _, _, _, infos = pool.step(actions)
            steps += 1
            if "episode" in infos:
                returns.extend(infos["episode"]["r"][infos["_episode"]].tolist())
            if steps % 20 == 0:
                for name in params:
                    seen[name].append(pool.applied[name].copy())
        elapsed = time.perf_counter() - start
        episodes = pool.episodes.read()
    print(f"\n{'parameter':<16} {'declared range':>16} {'applied min':>12} {'applied max':>12} {'distinct':>9}")
    for name, (low, high) in (("mass_scale", (0.8, 1.2)), ("friction_scale", (0.5, 1.5))):
        values = np.concatenate(seen[name]) if seen[name] else np.zeros(0)
        print(
            f"{name:<16} {f'[{low}, {high}]':>16} {values.min():>12.4f} {values.max():>12.4f} "
            f"{len(np.unique(values)):>9}"
        )
    mean_return = np.mean(returns) if returns else float("nan")
    print(
        f"\n{steps * settings.num_envs:,} env steps in {elapsed:.1f} s: "
        f"{steps * settings.num_envs / elapsed:,.0f} steps/s; "
        f"{len(episodes)} episodes, mean return {mean_return:.1f}; pushes every {settings.push_every} steps"
    )


if __name__ == "__main__":
    main()
