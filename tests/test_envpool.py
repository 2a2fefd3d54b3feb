"""shmpool.envpool: EnvPool's Python API over a pool, checked against the installed envpool (the API)
and gymnasium's SyncVectorEnv (the trajectories: shmpool runs gymnasium's envs, not EnvPool's)."""

from __future__ import annotations

from contextlib import closing
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from helpers import needs

import shmpool
import shmpool.envpool as shm_envpool

#: EnvPool's calls and attributes that code written for it uses (the issue's list).
API = [
    "reset",
    "step",
    "async_reset",
    "send",
    "recv",
    "spec",
    "config",
    "all_env_ids",
    "is_async",
    "observation_space",
    "action_space",
    "num_envs",
    "close",
]


def shapes(value: Any) -> Any:
    """The dtype and shape of every array in ``value`` (nested dicts and tuples kept)."""
    if isinstance(value, dict):
        return {key: shapes(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(shapes(item) for item in value)
    array = np.asarray(value)
    return (array.dtype, array.shape)


@needs("envpool")
@pytest.mark.filterwarnings("ignore:.*precision lowered by casting")  # envpool's own spaces
def test_the_api_matches_envpools_methods_arity_dtypes_and_info_keys(pool_name: str) -> None:
    import envpool

    kwargs = {"env_type": "gymnasium", "num_envs": 4, "batch_size": 2, "seed": 3}
    reference = envpool.make("CartPole-v1", **kwargs)
    with closing(reference), shm_envpool.make("CartPole-v1", **kwargs, num_workers=2, name=pool_name) as env:
        for name in API:
            assert hasattr(reference, name) and hasattr(env, name), name
        assert env.single_observation_space == reference.single_observation_space
        assert env.single_action_space == reference.single_action_space
        assert env.is_async == reference.is_async is True
        assert env.spec.config.num_envs == reference.spec.config.num_envs == 4
        assert env.spec.config.batch_size == reference.spec.config.batch_size == 2
        assert env.spec.config.max_episode_steps == reference.spec.config.max_episode_steps == 500
        assert env.config["max_episode_steps"] == reference.config["max_episode_steps"]
        assert env.all_env_ids.dtype == reference.all_env_ids.dtype
        np.testing.assert_array_equal(env.all_env_ids, reference.all_env_ids)
        assert env.observation_space == reference.observation_space
        assert env.action_space == reference.action_space
        for pool in (reference, env):
            pool.async_reset()
        for cycle in range(6):
            seen: list[int] = []
            for _ in range(2):  # two recvs of 2 are one cycle over the 4 envs
                got = env.recv()
                expected = reference.recv()
                assert len(got) == len(expected) == 5
                assert shapes(got[:4]) == shapes(expected[:4])
                assert shapes(got[4]) == shapes(expected[4]), cycle
                seen.extend(got[4]["env_id"].tolist())
                actions = np.ones(2, dtype=np.int64)
                env.send(actions, got[4]["env_id"])
                reference.send(actions, expected[4]["env_id"])
            assert sorted(seen) == [0, 1, 2, 3]


@pytest.mark.parametrize("env_type", ["gymnasium", "gym"])
def test_sync_trajectories_equal_gymnasiums_with_elapsed_steps_and_partial_resets(
    pool_name: str, env_type: str
) -> None:
    num_envs, seed = 4, 11
    reference = gym.make_vec("CartPole-v1", num_envs, vectorization_mode="sync")
    rng = np.random.default_rng(0)
    with shm_envpool.make("CartPole-v1", env_type, num_envs=num_envs, seed=seed, num_workers=2, name=pool_name) as env:
        observations, info = env.reset()
        expected, _ = reference.reset(seed=seed)
        np.testing.assert_array_equal(observations, expected)
        assert info["elapsed_step"].dtype == np.int32 and not info["elapsed_step"].any()
        elapsed = np.zeros(num_envs, dtype=np.int64)
        ended = np.zeros(num_envs, dtype=bool)
        episodes = 0
        for _ in range(300):
            actions = rng.integers(0, 2, num_envs)
            got = env.step(actions)
            want = reference.step(actions)
            for got_part, want_part in zip(got[:4], want[:4]):
                np.testing.assert_array_equal(got_part, want_part)
            assert got[1].dtype == np.float32  # EnvPool's dtype
            elapsed = np.where(ended, 0, elapsed + 1)  # the step after an end is the autoreset
            ended = want[2] | want[3]
            episodes += int(ended.sum())
            np.testing.assert_array_equal(got[4]["elapsed_step"], elapsed)
            np.testing.assert_array_equal(got[4]["env_id"], np.arange(num_envs))
        assert episodes > 10  # random actions end CartPole's episodes in tens of steps
        # A partial reset: EnvPool's reset(env_id) returns the rows of those envs only.
        observations, info = env.reset(np.array([1, 3]))
        mask = np.array([False, True, False, True])
        expected, _ = reference.reset(options={"reset_mask": mask})
        np.testing.assert_array_equal(observations, expected[mask])
        np.testing.assert_array_equal(info["env_id"], [1, 3])
        np.testing.assert_array_equal(info["elapsed_step"], [0, 0])
        actions = np.zeros(num_envs, dtype=np.int64)
        np.testing.assert_array_equal(env.step(actions)[0], reference.step(actions)[0])
    reference.close()


def test_async_batches_follow_each_envs_gymnasium_trajectory(pool_name: str) -> None:
    num_envs, seed = 4, 5
    rng = np.random.default_rng(1)
    received: dict[int, list[tuple[Any, ...]]] = {i: [] for i in range(num_envs)}
    sent: dict[int, list[int]] = {i: [] for i in range(num_envs)}
    with shm_envpool.make(
        "CartPole-v1", num_envs=num_envs, batch_size=2, seed=seed, num_workers=2, name=pool_name
    ) as env:
        env.async_reset()
        for _ in range(200):
            observations, rewards, terminations, truncations, info = env.recv()
            for row, env_id in enumerate(info["env_id"].tolist()):
                received[env_id].append(
                    (observations[row], rewards[row], terminations[row], truncations[row], info["elapsed_step"][row])
                )
            actions = rng.integers(0, 2, len(info["env_id"]))
            for env_id, action in zip(info["env_id"].tolist(), actions.tolist()):
                sent[env_id].append(action)
            env.send(actions, info["env_id"])
    for env_id in range(num_envs):
        reference = gym.make_vec("CartPole-v1", 1, vectorization_mode="sync")
        observation, _ = reference.reset(seed=seed + env_id)
        steps = received[env_id]
        assert len(steps) > 50
        np.testing.assert_array_equal(steps[0][0], observation[0])
        elapsed, ended = 0, False
        for action, step in zip(sent[env_id], steps[1:]):
            observation, reward, terminated, truncated, _ = reference.step(np.array([action]))
            elapsed = 0 if ended else elapsed + 1
            ended = bool(terminated[0] or truncated[0])
            np.testing.assert_array_equal(step[0], observation[0])
            assert (step[1], step[2], step[3], step[4]) == (reward[0], terminated[0], truncated[0], elapsed)
        reference.close()


@pytest.mark.parametrize("recv_order", ["sent", "finished"])
def test_async_batches_carry_their_own_rows_of_infos(pool_name: str, recv_order: str) -> None:
    """Infos of every kind (the applied params, episode statistics) are the batch's own rows, for
    each batch whatever its envs."""
    spec = {"length": shmpool.Param(0.5, low=0.1, high=2.0)}
    with shm_envpool.make(
        "CartPole-v1",
        num_envs=4,
        batch_size=2,
        num_workers=2,
        params=spec,
        info_params=True,
        episode_statistics=True,
        recv_order=recv_order,
        name=pool_name,
    ) as env:
        lengths = np.array([0.4, 0.5, 0.6, 0.7])
        env.params.write(None, length=lengths)
        env.async_reset()
        batches, episodes = set(), 0
        for _ in range(120):
            observations, rewards, terminations, truncations, info = env.recv()
            ids = info["env_id"]
            batches.add(tuple(ids.tolist()))
            np.testing.assert_array_equal(info["params"]["length"], lengths[ids])
            if "episode" in info:
                ended = terminations | truncations
                np.testing.assert_array_equal(info["_episode"], ended)
                episodes += int(ended.sum())
            env.send(np.ones(2, dtype=np.int64), ids)  # always right: episodes end in about ten steps
        assert batches == {(0, 1), (2, 3)} and episodes > 10


def test_partial_resets_and_steps_are_checked_as_envpool_checks_them(pool_name: str) -> None:
    with shm_envpool.make("CartPole-v1", num_envs=4, num_workers=2, seed=1, name=pool_name) as env:
        env.reset()
        for _ in range(3):
            env.step(np.zeros(4, dtype=np.int64))
        mask = np.array([True, False, False, False])
        observations, info = env.reset(options={"reset_mask": mask})
        assert observations.shape == (1, 4)
        np.testing.assert_array_equal(info["env_id"], [0])
        *_, info = env.step(np.zeros(4, dtype=np.int64))
        np.testing.assert_array_equal(info["elapsed_step"], [1, 4, 4, 4])  # only env 0 was reset
        with pytest.raises(ValueError, match="either env_id or options\\['reset_mask'\\], not both"):
            env.reset(np.array([1]), options={"reset_mask": mask})
        with pytest.raises(ValueError, match="env ids repeat"):
            env.reset(np.array([2, 2]))
        with pytest.raises(ValueError, match="env_id=\\[1, 2\\]: a synchronous pool .* steps every env at once"):
            env.step(np.zeros(2, dtype=np.int64), np.array([1, 2]))


def test_without_num_workers_the_batches_decide_the_workers() -> None:
    from shmpool.envpool import _workers_for_batches
    from shmpool.system import usable_cores

    cores = usable_cores()
    assert _workers_for_batches(16, None) == min(cores, 16)
    for num_envs, batch_size in [(16, 8), (12, 6), (8, 4), (6, 3)]:
        fits = [w for w in range(1, cores + 1) if num_envs % w == 0 and batch_size % (num_envs // w) == 0]
        assert fits  # two workers at least fit each
        assert _workers_for_batches(num_envs, batch_size) == max(fits)  # the most workers that fit


def test_params_are_the_pools_and_a_write_reaches_the_envs(pool_name: str) -> None:
    spec = {"length": shmpool.Param(low=0.1, high=2.0)}
    with shm_envpool.make_gymnasium("CartPole-v1", num_envs=4, params=spec, num_workers=2, name=pool_name) as env:
        assert env.pool.params is env.params and env.pool.episodes is env.episodes
        env.reset()
        env.params.write([0, 2], length=1.5)
        env.step(np.zeros(4, dtype=np.int64))
        np.testing.assert_array_equal(env.applied["length"], [1.5, 0.5, 1.5, 0.5])
        assert env.pool.call("length") == (1.5, 0.5, 1.5, 0.5)


def test_max_episode_steps_truncates_and_shows_in_the_config(pool_name: str) -> None:
    with shm_envpool.make("Pendulum-v1", num_envs=2, max_episode_steps=7, num_workers=2, name=pool_name) as env:
        assert env.spec.config.max_episode_steps == 7
        env.reset()
        for step in range(1, 8):
            *_, truncations, info = env.step(np.zeros((2, 1), dtype=np.float32))
            assert truncations.all() == (step == 7)
        assert info["elapsed_step"].tolist() == [7, 7]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"env_type": "dm"}, "env_type='dm' is not supported; shmpool.envpool takes \\['gymnasium', 'gym'\\]"),
        ({"autoreset_mode": "SameStep"}, "needs autoreset_mode=<AutoresetMode.NEXT_STEP"),
    ],
)
def test_what_the_api_cannot_offer_is_refused_naming_it(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shm_envpool.make("CartPole-v1", num_envs=2, **options)


def test_an_async_pool_refuses_a_partial_reset_and_closes_cleanly(pool_name: str) -> None:
    env = shm_envpool.make("CartPole-v1", num_envs=4, batch_size=2, num_workers=2, name=pool_name)
    with env:
        observations, info = env.reset()
        assert observations.shape == (2, 4) and len(info["env_id"]) == 2
        with pytest.raises(ValueError, match="an async pool .* resets every env"):
            env.reset(np.array([0]))
    env.close()  # idempotent


@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_step_before_reset_is_refused_and_the_pool_stays_usable(batch_size: int | None) -> None:
    """A usage mistake is refused in the trainer; it never breaks the pool as an env failure would."""
    options = {} if batch_size is None else {"batch_size": batch_size}
    with closing(shm_envpool.make("CartPole-v1", env_type="gymnasium", num_envs=4, seed=0, **options)) as env:
        if batch_size is None:
            with pytest.raises(gym.error.ResetNeeded, match="never reset"):
                env.step(np.zeros(4, dtype=np.int64))
            observations, _ = env.reset()
            assert observations.shape == (4, 4)
            assert env.step(np.zeros(4, dtype=np.int64))[0].shape == (4, 4)
        else:
            with pytest.raises(RuntimeError, match=r"send: envs 0..1 \(worker 0\) have no results"):
                env.send(np.zeros(2, dtype=np.int64), np.array([0, 1]))
            env.async_reset()
            *_, infos = env.recv()
            env.send(np.zeros(2, dtype=np.int64), infos["env_id"])
            assert env.recv()[0].shape == (2, 4)
