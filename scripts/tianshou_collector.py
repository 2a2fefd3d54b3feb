"""Tianshou's collector over EnvPool and over ``shmpool.envpool``: env steps per second of the same
collection, the two taking turns. Tianshou 0.5.1 is old and pins its own packages, so run it in a
virtual environment of its own:

    python3 -m venv /tmp/ts && /tmp/ts/bin/pip install "tianshou==0.5.1" envpool -e .
    /tmp/ts/bin/python scripts/tianshou_collector.py             # CartPole-v1, 20 envs
    /tmp/ts/bin/python scripts/tianshou_collector.py --quick

The policy is the PPO actor of Tianshou's ``cartpole_ppo.py`` example (untrained, sampling its
actions). Each round collects ``--steps`` steps, where every env steps every time, then
``--episodes`` episodes, where an env whose episode ended waits for the others, so that the
collector steps a subset of the envs (a partial synchronous step). The table shows the worst round.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Any

import _settings


@dataclass
class Settings:
    """What the collector runs."""

    task: str = "CartPole-v1"
    """a gymnasium id with a discrete action space (and an EnvPool task of that name)."""
    num_envs: int = 20
    """envs in each pool (the example's --training-num)."""
    steps: int = 20000
    """env steps of each n_step collection."""
    episodes: int = 100
    """episodes of each n_episode collection."""
    rounds: int = 3
    """rounds of both backends, taken in turns."""
    seed: int = 0
    """the pools' seed and torch's."""
    quick: bool = False
    """one round of 2000 steps and 20 episodes, for a smoke test."""


def make_policy(env: Any) -> Any:
    """The example's PPO policy for ``env``'s spaces, in evaluation mode but sampling its actions."""
    import torch
    from tianshou.policy import PPOPolicy
    from tianshou.utils.net.common import ActorCritic, Net
    from tianshou.utils.net.discrete import Actor, Critic

    net = Net(env.observation_space.shape, hidden_sizes=[64, 64])
    actor, critic = Actor(net, env.action_space.n), Critic(net)
    optim = torch.optim.Adam(ActorCritic(actor, critic).parameters(), lr=1e-3)
    policy = PPOPolicy(actor, critic, optim, torch.distributions.Categorical, action_space=env.action_space)
    policy.eval()
    return policy


def collect_rates(module_name: str, settings: Settings, steps: int, episodes: int) -> tuple[float, float]:
    """Env steps per second of an n_step and an n_episode collection on ``module_name``'s pool."""
    import torch
    from tianshou.data import Collector

    module = importlib.import_module(module_name)
    torch.manual_seed(settings.seed)
    env = module.make_gym(settings.task, num_envs=settings.num_envs, seed=settings.seed)
    try:
        collector = Collector(make_policy(env), env)
        collector.reset()
        rates = []
        for kind, amount in (("n_step", steps), ("n_episode", episodes)):
            start = time.perf_counter()
            result = collector.collect(**{kind: amount})
            rates.append(result["n/st"] / (time.perf_counter() - start))
        return rates[0], rates[1]
    finally:
        env.close()


def main() -> None:
    settings = _settings.parse(Settings, description=__doc__)
    rounds = 1 if settings.quick else settings.rounds
    steps, episodes = (2000, 20) if settings.quick else (settings.steps, settings.episodes)
    backends = {"EnvPool": "envpool", "shmpool.envpool": "shmpool.envpool"}
    worst = {name: [float("inf"), float("inf")] for name in backends}
    for _ in range(rounds):
        for name, module_name in backends.items():
            rates = collect_rates(module_name, settings, steps, episodes)
            worst[name] = [min(old, new) for old, new in zip(worst[name], rates)]
    print(f"{settings.task} x{settings.num_envs}, Tianshou's Collector, worst of {rounds} round(s), env steps/s")
    print(f"{'backend':<18}{'n_step':>12}{'n_episode':>12}{'n_step / EnvPool':>19}{'n_episode / EnvPool':>21}")
    for name, (by_step, by_episode) in worst.items():
        step_ratio, episode_ratio = by_step / worst["EnvPool"][0], by_episode / worst["EnvPool"][1]
        print(f"{name:<18}{by_step:>12,.0f}{by_episode:>12,.0f}{step_ratio:>19.2f}{episode_ratio:>21.2f}")


if __name__ == "__main__":
    main()
