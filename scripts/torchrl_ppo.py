"""TorchRL's PPO on a pool (``shmpool.torchrl.ShmpoolEnv``), with a curriculum written between batches.

    pip install -e ".[torchrl]"
    python scripts/torchrl_ppo.py          # CartPole-v1, 16 envs
    python scripts/torchrl_ppo.py --quick

TorchRL's collector steps the pool (DISABLED autoreset, TorchRL's preferred mode); after each batch,
when the mean return of the episodes it finished reaches ``--target``, every env's pole grows by
``--length-step``, written into the pool's shared parameter block: the next batch runs on it. With
TorchRL's EnvPool wrapper the envs are frozen once built.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import _settings

import shmpool


@dataclass
class Settings:
    """What PPO trains on, and the curriculum."""

    batches: int = 40
    """collector batches (one PPO update each)."""
    num_envs: int = 16
    """envs in the pool."""
    num_workers: int = 2
    """worker processes."""
    frames_per_batch: int = 2048
    """env steps per batch."""
    target: float = 150.0
    """the mean return at which the poles grow."""
    length_step: float = 0.1
    """how much the poles grow each time."""
    max_length: float = 1.5
    """the longest pole."""
    seed: int = 0
    """env i is seeded with seed + i; torch's seed too."""
    quick: bool = False
    """three small batches and a low target, for a smoke test."""


def main() -> None:
    settings = _settings.parse(Settings, description=__doc__)
    import torch  # after --help, which needs no torch
    import torchrl.collectors
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.envs import RewardSum, TransformedEnv
    from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    from shmpool.torchrl import ShmpoolEnv

    batches, frames, target = (
        (3, 256, 10.0) if settings.quick else (settings.batches, settings.frames_per_batch, settings.target)
    )
    torch.manual_seed(settings.seed)
    spec = {"length": shmpool.Param(0.5, low=0.1, high=settings.max_length)}
    base = ShmpoolEnv("CartPole-v1", settings.num_envs, num_workers=settings.num_workers, params=spec)
    collector = None
    try:
        env = TransformedEnv(base, RewardSum())
        env.set_seed(settings.seed)
        logits = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
        actor = ProbabilisticActor(
            TensorDictModule(logits, in_keys=["observation"], out_keys=["logits"]),
            in_keys=["logits"],
            distribution_class=OneHotCategorical,
            spec=env.action_spec,
            return_log_prob=True,
        )
        critic = ValueOperator(nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1)), in_keys=["observation"])
        advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
        loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.01)
        optimizer = torch.optim.Adam(loss.parameters(), lr=3e-4)
        # TorchRL 0.14 renamed SyncDataCollector to Collector
        collector_class = getattr(torchrl.collectors, "SyncDataCollector", None) or torchrl.collectors.Collector
        collector = collector_class(env, actor, frames_per_batch=frames, total_frames=-1)
        print(f"{'batch':>5} {'episodes':>9} {'mean return':>12} {'pole length':>12} {'seconds':>8}")
        start = time.perf_counter()
        for batch, data in enumerate(collector, start=1):
            finished = data["next", "done"].squeeze(-1)
            returns = data["next", "episode_reward"].squeeze(-1)[finished]
            mean_return = float(returns.mean()) if len(returns) else float("nan")
            with torch.no_grad():
                advantage(data)
            flat = data.reshape(-1)
            for _ in range(4):
                for rows in torch.randperm(len(flat)).split(256):
                    losses = loss(flat[rows])
                    total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                    optimizer.zero_grad()
                    total.backward()
                    optimizer.step()
            collector.update_policy_weights_()
            length = float(base.params["length"].max())
            seconds = time.perf_counter() - start
            print(f"{batch:>5} {len(returns):>9} {mean_return:>12.1f} {length:>12.2f} {seconds:>8.1f}")
            if mean_return >= target and length < settings.max_length:
                base.params.write(None, length=min(length + settings.length_step, settings.max_length))
            if batch == batches:
                break
    finally:
        if collector is not None:
            collector.shutdown()
        base.close()


if __name__ == "__main__":
    main()
