"""Does domain randomization help? PPO trained twice on a MuJoCo robot with the same budget and seed,
on nominal physics and with the torso mass and floor friction drawn per episode, then both policies
evaluated on one grid of mass x friction (``shmpool.evaluate``), as two heatmaps on one colour scale.

    pip install -e ".[examples,mujoco,plot]"
    python scripts/dr_study.py                    # HalfCheetah-v5, 2 x 300,000 env steps: ~5 min on 2 cores
    python scripts/dr_study.py --quick            # seconds, for the tests
    python scripts/dr_study.py --mass-range 0.5 2.0 --friction-range 0.2 2.0   # a wider training range

Training uses ``scripts/ppo.py``'s CleanRL PPO with a Gaussian policy on ``engine="mujoco"``; the
randomized run draws mass x U(--mass-range) and friction x U(--friction-range) at each reset. The
evaluation acts with the policy's mean action, so each episode is reproducible from its seed. It
prints both tables and the mean return over the grid, and saves the picture to ``--plot``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import _settings
import gymnasium
import numpy as np
import ppo
import torch

import shmpool
from shmpool import mujoco as smj


@dataclass
class Settings:
    """What the study runs."""

    env: str = "HalfCheetah-v5"
    """a gymnasium MuJoCo robot with a 'torso' body and a 'floor' geom."""
    num_envs: int = 16
    """envs of each training pool."""
    total_timesteps: int = 300_000
    """env steps of each training run (the same budget for both)."""
    mass_range: list[float] = field(default_factory=lambda: [0.8, 1.2])
    """the torso mass scale's range in the randomized training."""
    friction_range: list[float] = field(default_factory=lambda: [0.5, 1.5])
    """the floor friction scale's range in the randomized training."""
    mass_grid: list[float] = field(default_factory=lambda: [0.5, 0.75, 1.0, 1.25, 1.5])
    """torso mass scales of the evaluation grid."""
    friction_grid: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 1.5, 2.0])
    """floor friction scales of the evaluation grid."""
    episodes: int = 3
    """evaluation episodes per cell."""
    episode_steps: int = 1000
    """time limit of an evaluation episode."""
    seed: int = 1
    """seed of both trainings (torch and the pools) and of the evaluation."""
    plot: str = "dr_study.png"
    """where to save the two heatmaps ('' for none)."""
    quick: bool = False
    """2 x 4,096 steps, a 2 x 2 grid of one 50-step episode, for the tests."""


def grid_params() -> dict[str, shmpool.Param]:
    """The evaluation's parameters: the torso mass and floor friction as scales of their nominal values."""
    return {
        "mass": shmpool.Param(1.0, low=0.01, high=100.0, bind=smj.body_mass("torso", relative=True)),
        "friction": shmpool.Param(1.0, low=0.01, high=100.0, bind=smj.geom_friction("floor", relative=True)),
    }


def train(settings: Settings, randomized: bool) -> ppo.Agent:
    """PPO on ``settings.env`` for ``total_timesteps`` env steps; returns the trained agent."""
    params = None
    if randomized:  # drawn at each reset
        params = smj.scale_randomization(mass=tuple(settings.mass_range), friction=tuple(settings.friction_range))
    torch.manual_seed(settings.seed)
    training = ppo.Settings(
        env=settings.env,
        num_envs=settings.num_envs,
        num_steps=64 if settings.quick else 256,
        learning_rate=3e-4,
        ent_coef=0.0,
        num_minibatches=8,
        update_epochs=10,
        seed=settings.seed,
    )
    started = time.perf_counter()
    with shmpool.launch(
        settings.env,
        settings.num_envs,
        engine="mujoco",
        params=params,
        seed=settings.seed,
        autoreset_mode="SameStep",
        worker_init=smj.log_to_python,
    ) as pool:
        iteration = ppo.PpoIteration(pool, training)
        iterations = max(1, settings.total_timesteps // (training.num_steps * settings.num_envs))
        for done in range(iterations):
            iteration.optimizer.param_groups[0]["lr"] = training.learning_rate * (1.0 - done / iterations)
            iteration()
        returns = pool.episodes.read()["return"][-50:]
    label = "randomized" if randomized else "nominal"
    print(
        f"trained {label:<10} {iterations * training.num_steps * settings.num_envs:>9,} env steps in "
        f"{time.perf_counter() - started:5.1f} s; mean training return of its last {len(returns)} episodes: "
        f"{returns.mean() if len(returns) else float('nan'):.0f}",
        flush=True,
    )
    return iteration.agent


def mean_action(agent: ppo.Agent, low: np.ndarray, high: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The agent's deterministic policy: its mean action, clipped to the bounds."""

    def policy(observations: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            mean = agent.actor(torch.as_tensor(observations, dtype=torch.float32)).numpy()
        return np.clip(mean, low, high).astype(np.float32)

    return policy


def main() -> None:
    settings = _settings.parse(Settings, description=__doc__)
    if settings.quick:
        settings.total_timesteps, settings.episodes, settings.episode_steps = 4096, 1, 50
        settings.mass_grid, settings.friction_grid = [0.5, 1.5], [0.25, 2.0]
    torch.set_num_threads(1)  # the pools' workers need the other core
    smj.log_to_python()
    agents = {label: train(settings, randomized) for label, randomized in (("nominal", False), ("randomized", True))}
    grid = {"mass": settings.mass_grid, "friction": settings.friction_grid}
    robot = gymnasium.make(settings.env)
    bounds = robot.action_space.low, robot.action_space.high
    robot.close()
    evaluations = {}
    for label, agent in agents.items():
        evaluations[label] = shmpool.evaluate(
            settings.env,
            mean_action(agent, *bounds),
            grid=grid,
            episodes=settings.episodes,
            seed=settings.seed,
            params=grid_params(),
            engine="mujoco",
            env_kwargs={"max_episode_steps": settings.episode_steps},
            worker_init=smj.log_to_python,
        )
    for label, evaluation in evaluations.items():
        print(f"\n{label}: mean return per cell (rows: torso mass scale, columns: floor friction scale)")
        means = evaluation.returns.mean(axis=1).reshape(len(settings.mass_grid), len(settings.friction_grid))
        print(f"{'mass':>6} " + " ".join(f"{f'x{friction:g}':>8}" for friction in settings.friction_grid))
        for mass, row in zip(settings.mass_grid, means):
            print(f"{f'x{mass:g}':>6} " + " ".join(f"{value:8.0f}" for value in row))
        nominal = _nominal(means, settings)
        print(f"  over the grid: mean {means.mean():.0f}, worst cell {means.min():.0f}, nominal cell {nominal:.0f}")
    if settings.plot:
        save_plot(settings.plot, evaluations, settings)
        print(f"\nplot saved to {settings.plot}")


def _nominal(means: np.ndarray, settings: Settings) -> float:
    """The mean return of the grid's cell nearest to nominal physics (both scales 1)."""
    row = int(np.argmin(np.abs(np.array(settings.mass_grid) - 1.0)))
    column = int(np.argmin(np.abs(np.array(settings.friction_grid) - 1.0)))
    return float(means[row, column])


def save_plot(path: str, evaluations: dict[str, shmpool.Evaluation], settings: Settings) -> None:
    """The two heatmaps side by side, on one colour scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    means = [evaluation.returns.mean(axis=1) for evaluation in evaluations.values()]
    low, high = min(m.min() for m in means), max(m.max() for m in means)
    figure, axes = plt.subplots(1, len(evaluations), figsize=(6 * len(evaluations), 4.5))
    for ax, (label, evaluation) in zip(axes, evaluations.items()):
        evaluation.plot(ax=ax, vmin=low, vmax=high)
        ax.set_title(f"trained on {label} physics")
        ax.set_xlabel("floor friction scale")
        ax.set_ylabel("torso mass scale")
    figure.suptitle(
        f"PPO on {settings.env}, {settings.total_timesteps:,} steps each: mean return over "
        f"{settings.episodes} episodes per cell"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
