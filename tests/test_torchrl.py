"""shmpool.torchrl: TorchRL's checks pass, and rollouts equal TorchRL's own wrapper of gymnasium's
SyncVectorEnv (DISABLED autoreset) given the same seeds and actions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from helpers import needs

import shmpool

pytestmark = needs("torchrl")


def reference_env(num_envs: int):
    from torchrl.envs.libs.gym import GymWrapper

    vector = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1") for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.DISABLED
    )
    return GymWrapper(vector)


def test_check_env_specs_passes_and_the_pool_shows_through(pool_name: str) -> None:
    from torchrl.envs.utils import check_env_specs

    from shmpool.torchrl import ShmpoolEnv

    spec = {"length": shmpool.Param(0.5, low=0.1, high=2.0)}
    env = ShmpoolEnv("CartPole-v1", 4, num_workers=2, params=spec, hooks=[shmpool.hooks.Reset()], name=pool_name)
    try:
        assert tuple(env.batch_size) == (4,) and env.pool.num_workers == 2
        check_env_specs(env)
        assert isinstance(env.pool, shmpool.Pool) and env.pool.name == pool_name
        assert env.params is env.pool.params and env.episodes is env.pool.episodes
        assert env.events is env.pool.events
    finally:
        env.close()
    assert env.pool.closed


def test_a_300_step_rollout_equals_torchrls_wrapper_of_sync_vector_env(pool_name: str) -> None:
    import torch

    from shmpool.torchrl import ShmpoolEnv

    num_envs, steps = 4, 300
    reference = reference_env(num_envs)
    reference.set_seed(7)
    torch.manual_seed(0)
    expected = reference.rollout(steps, break_when_any_done=False)  # random actions
    actions = expected["action"]
    env = ShmpoolEnv("CartPole-v1", num_envs, num_workers=2, name=pool_name)
    try:
        env.set_seed(7)
        step = iter(range(steps))

        def replay(tensordict):
            return tensordict.set("action", actions[:, next(step)])

        got = env.rollout(steps, policy=replay, break_when_any_done=False)
    finally:
        env.close()
        reference.close()
    assert int(expected["next", "done"].sum()) > 20  # many episodes ended and were reset partway
    for key in ("observation", "done", "terminated", "truncated"):
        assert torch.equal(got[key], expected[key]), key
    for key in ("observation", "reward", "done", "terminated", "truncated"):
        assert torch.equal(got["next", key], expected["next", key]), key


def test_set_seed_seeds_env_i_with_seed_plus_i(pool_name: str) -> None:
    from shmpool.torchrl import ShmpoolEnv

    env = ShmpoolEnv("CartPole-v1", 3, num_workers=2, name=pool_name)
    try:
        env.set_seed(100)  # TorchRL seeds by a reset with the seed, then resets again unseeded
        observations = env.reset()["observation"].numpy()
    finally:
        env.close()
    for i in range(3):
        single = gym.make("CartPole-v1")
        single.reset(seed=100 + i)
        np.testing.assert_array_equal(observations[i], single.reset()[0])


def test_a_collector_runs_with_parameter_writes_between_batches(pool_name: str) -> None:
    import torchrl.collectors

    from shmpool.torchrl import ShmpoolEnv

    # TorchRL 0.14 renamed SyncDataCollector to Collector
    SyncDataCollector = getattr(torchrl.collectors, "SyncDataCollector", None) or torchrl.collectors.Collector

    spec = {"length": shmpool.Param(0.5, low=0.1, high=2.0)}
    env = ShmpoolEnv("CartPole-v1", 4, num_workers=2, params=spec, name=pool_name)
    # Endless (total_frames=-1): a collector closes its env as it yields its last batch.
    collector = SyncDataCollector(env, policy=None, frames_per_batch=64, total_frames=-1)
    lengths = []
    try:
        for batch, data in enumerate(collector):
            assert data.numel() == 64
            lengths.append(env.applied["length"].copy())
            if batch == 4:
                break
            env.params.write(None, length=0.5 + 0.1 * (batch + 1))  # a curriculum between batches
    finally:
        collector.shutdown()
        env.close()
    assert len(lengths) == 5
    for batch, applied in enumerate(lengths):
        np.testing.assert_allclose(applied, 0.5 + 0.1 * batch)  # each batch ran on the last write


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"autoreset_mode": "NextStep"}, "ShmpoolEnv needs autoreset_mode=<AutoresetMode.DISABLED"),
        ({"copy": False}, "ShmpoolEnv needs copy=True, got False"),
        ({"batch_size": 2}, "ShmpoolEnv: batch_size=2: the env's batch size is num_envs"),
    ],
)
def test_options_that_torchrl_cannot_use_are_refused(option: dict, message: str) -> None:
    from shmpool.torchrl import ShmpoolEnv

    with pytest.raises(ValueError, match=message):
        ShmpoolEnv("CartPole-v1", 2, **option)


def test_disabled_autoreset_may_be_spelt_as_launch_takes_it(pool_name: str) -> None:
    from shmpool.torchrl import ShmpoolEnv

    env = ShmpoolEnv(env="CartPole-v1", num_envs=2, autoreset_mode="disabled", num_workers=2, name=pool_name)
    assert env.pool.num_envs == 2 and env.pool.num_workers == 2  # by keyword too, nothing lost
    env.close()
