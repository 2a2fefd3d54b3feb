"""Stable-Baselines3 PPO on CartPole-v1 in a shmpool pool (``shmpool.sb3.ShmpoolVecEnv``), evaluated
along the way by an ``EvalCallback`` on a second, smaller pool.

    pip install -e ".[sb3]"
    python scripts/sb3_ppo.py                    # 50k steps, about 20 s on 2 cores (return 500 from ~25k)
    python scripts/sb3_ppo.py --quick            # a few seconds, for CI
    python scripts/sb3_ppo.py --num-envs 16 --total-timesteps 100000

The hyperparameters are RL Zoo's for CartPole-v1 (8 envs, 32 steps per rollout, 20 epochs). It prints
one line per evaluation while it trains, then a table of the evaluations and the throughput.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass

import _settings
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env

from shmpool.sb3 import ShmpoolVecEnv


@dataclass
class Settings:
    """What to train."""

    env: str = "CartPole-v1"
    """a gymnasium env id with a discrete or box action space."""
    num_envs: int = 8
    """training envs in the pool."""
    num_workers: int = 2
    """worker processes of the training pool."""
    total_timesteps: int = 50_000
    """env steps to train for."""
    n_steps: int = 32
    """steps per env per rollout."""
    batch_size: int = 256
    """minibatch size of the PPO update."""
    n_epochs: int = 20
    """passes over each rollout."""
    learning_rate: float = 1e-3
    """Adam's learning rate, decayed linearly to 0."""
    eval_every: int = 5_000
    """env steps (all envs together) between evaluations."""
    eval_episodes: int = 10
    """episodes per evaluation."""
    eval_envs: int = 2
    """envs of the evaluation pool (one worker)."""
    seed: int = 0
    """seed of the pools and of PPO."""
    torch_threads: int = 1
    """torch threads: the workers use the other cores."""
    log_dir: str | None = None
    """folder for EvalCallback's evaluations.npz (and best_model.zip); none: a temporary one."""
    quick: bool = False
    """a short run for CI: 2048 steps, an evaluation every 1024 of 2 episodes."""


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Builds Settings from the command line; each field is an option, documented by --help."""
    given = _settings.parse_given(Settings, argv, description=__doc__)
    if given["quick"]:
        for name, value in {"total_timesteps": 2048, "eval_every": 1024, "eval_episodes": 2, "n_epochs": 2}.items():
            given.setdefault(name, value)
    return Settings(**given)


def main(argv: list[str] | None = None) -> None:
    """Trains PPO with periodic evaluations and prints their table."""
    settings = parse_settings(argv)
    torch.set_num_threads(settings.torch_threads)
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory())
        train_env = make_vec_env(
            settings.env,
            n_envs=settings.num_envs,
            seed=settings.seed,
            vec_env_cls=ShmpoolVecEnv,  # type: ignore[arg-type]  # SB3 types it as its two classes
            vec_env_kwargs={"num_workers": settings.num_workers},
        )
        stack.callback(train_env.close)
        # make_vec_env wraps every env in a Monitor, which EvalCallback needs for true episode returns.
        eval_env = make_vec_env(
            settings.env,
            n_envs=settings.eval_envs,
            seed=settings.seed + 10_000,
            vec_env_cls=ShmpoolVecEnv,  # type: ignore[arg-type]  # SB3 types it as its two classes
            vec_env_kwargs={"num_workers": 1},
        )
        stack.callback(eval_env.close)
        callback = EvalCallback(
            eval_env,
            # EvalCallback counts calls, one per vector step: convert from env steps.
            eval_freq=max(settings.eval_every // settings.num_envs, 1),
            n_eval_episodes=settings.eval_episodes,
            deterministic=True,
            # Only with a log path does EvalCallback keep each evaluation's returns for the table.
            log_path=settings.log_dir or scratch,
            best_model_save_path=settings.log_dir,
            callback_after_eval=PrintEvaluation(),
            verbose=0,
        )
        model = PPO(
            "MlpPolicy",
            train_env,
            n_steps=settings.n_steps,
            batch_size=settings.batch_size,
            n_epochs=settings.n_epochs,
            gamma=0.98,
            gae_lambda=0.8,
            ent_coef=0.0,
            learning_rate=lambda remaining: settings.learning_rate * remaining,
            clip_range=lambda remaining: 0.2 * remaining,
            seed=settings.seed,
            device="cpu",
        )
        start = time.perf_counter()
        model.learn(total_timesteps=settings.total_timesteps, callback=callback)
        seconds = time.perf_counter() - start
    _print_table(callback, model.num_timesteps, seconds, settings)


class PrintEvaluation(BaseCallback):
    """Prints each evaluation's mean return to stderr as it comes (``EvalCallback``'s after-eval hook)."""

    def _on_step(self) -> bool:
        assert isinstance(self.parent, EvalCallback)  # set by EvalCallback(callback_after_eval=...)
        print(
            f"{self.num_timesteps:>10,} env steps: mean return {self.parent.last_mean_reward:.1f}",
            file=sys.stderr,
            flush=True,
        )
        return True


def _print_table(callback: EvalCallback, timesteps: int, seconds: float, settings: Settings) -> None:
    """The evaluations as a table, then the throughput."""
    steps = list(callback.evaluations_timesteps)
    results = [np.asarray(episode_returns) for episode_returns in callback.evaluations_results]
    header = f"{'env steps':>10}  {'mean return':>11}  {'std':>7}  {'min':>7}  {'max':>7}"
    print(f"PPO on {settings.env}: {settings.num_envs} envs in {settings.num_workers} shmpool workers")
    print(header)
    print("-" * len(header))
    for step, returns in zip(steps, results):
        print(
            f"{step:>10,}  {returns.mean():>11.1f}  {returns.std():>7.1f}  {returns.min():>7.1f}  {returns.max():>7.1f}"
        )
    print(f"{timesteps:,} env steps in {seconds:.1f} s ({timesteps / seconds:,.0f} steps/s, PPO updates included)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
