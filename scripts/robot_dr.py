"""Domain randomization on a MuJoCo robot: per-reset friction and mass, periodic pushes.

    python scripts/robot_dr.py                          # HalfCheetah-v5, 16 envs, 10 s
    python scripts/robot_dr.py --env Ant-v5 --body torso --seconds 5
    python scripts/robot_dr.py --engine python           # gymnasium's envs stepped one by one

Each episode draws the floor friction and the torso mass as scales of their nominal values
(``relative=True``: mass x U(0.8, 1.2), friction x U(0.5, 1.5)); every ``--push-every`` steps each
env's torso gets a force for one step. A random (or a simple sine) policy drives the robot. It prints
the ranges of the values applied and the throughput.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Literal

import _settings
import numpy as np

import shmpool
from shmpool import hooks
from shmpool import mujoco as smj


@dataclass
class Settings:
    """What to run."""

    env: str = "HalfCheetah-v5"
    """a gymnasium MuJoCo env id."""
    num_envs: int = 16
    """envs in the pool."""
    num_workers: int | None = None
    """worker processes (default: the engine's fastest placement for this machine)."""
    engine: str = "mujoco"
    """how the envs step: mujoco (MuJoCo's batch stepper, C threads) or python (gymnasium's env by env)."""
    seconds: float = 10.0
    """how long to run."""
    body: str = "torso"
    """the body whose mass is randomized and that is pushed."""
    floor: str = "floor"
    """the geom whose friction is randomized."""
    push_every: int = 50
    """steps between pushes."""
    push_force: float = 50.0
    """newtons per push axis."""
    policy: Literal["random", "sine"] = "random"
    """random actions, or a sine wave per env and joint."""
    seed: int = 0
    """seed of the pool, the actions and the sine phases."""
    quick: bool = False
    """a short run: 1.5 s with 4 envs, a push every 5 steps."""


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Reads Settings from the command line."""
    return _settings.parse(Settings, argv, description=__doc__)


def main(argv: list[str] | None = None) -> None:
    """Runs the randomized pool and prints what was applied."""
    settings = parse_settings(argv)
    if settings.quick:
        settings = dataclasses.replace(settings, seconds=1.5, num_envs=4, push_every=5)
    smj.log_to_python()  # MuJoCo's warnings to logging, not to MUJOCO_LOG.TXT (workers: worker_init below)
    params = smj.scale_randomization(settings.body, settings.floor)
    push = hooks.Perturb(settings.push_force, every=settings.push_every, kick=smj.Push(settings.body), dims=3)
    with shmpool.launch(
        settings.env,
        settings.num_envs,
        num_workers=settings.num_workers,
        engine=settings.engine,
        params=params,
        hooks=[push],
        seed=settings.seed,
        env_kwargs={"max_episode_steps": 200},
        worker_init=smj.log_to_python,
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
