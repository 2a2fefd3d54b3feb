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
        assert list(env.config) == list(reference.config)  # every key EnvPool code may read, in its order
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


@needs("mujoco")
def test_infos_carry_no_gymnasium_masks_where_every_env_has_the_key(pool_name: str) -> None:
    """EnvPool's infos have every key for every env: no ``_x_position`` beside ``x_position``."""
    with shm_envpool.make("HalfCheetah-v5", "gymnasium", num_envs=2, num_workers=1, name=pool_name) as env:
        env.reset()
        *_, info = env.step(np.zeros((2, 6)))
        assert "x_position" in info and not [key for key in info if key.startswith("_")], list(info)


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
        with pytest.raises(ValueError, match="env ids repeat"):
            env.step(np.zeros(2, dtype=np.int64), np.array([1, 1]))


def test_without_num_workers_the_batches_decide_the_workers() -> None:
    from shmpool.envpool import _workers_for_batches
    from shmpool.system import usable_cores

    cores = usable_cores()
    assert _workers_for_batches(16, None) == min(cores, 16)
    for num_envs, batch_size in [(16, 8), (12, 6), (8, 4), (6, 3)]:
        fits = [w for w in range(1, cores + 1) if num_envs % w == 0 and batch_size % (num_envs // w) == 0]
        assert fits  # two workers at least fit each
        assert _workers_for_batches(num_envs, batch_size) == max(fits)  # the most workers that fit


def test_a_batch_size_that_fits_no_worker_count_names_the_sizes_that_do() -> None:
    from shmpool.system import usable_cores

    with pytest.raises(ValueError, match=r"num_workers=\d+ \(the default: the usable cores\) .* batch sizes that fit"):
        shm_envpool.make("CartPole-v1", num_envs=10 * usable_cores(), batch_size=3)


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


@pytest.mark.parametrize("keyword", sorted(shm_envpool.REFUSED_OPTIONS))
def test_envpools_keywords_a_pool_does_not_take_are_refused_by_name(keyword: str) -> None:
    with pytest.raises(TypeError, match=f"EnvPool's {keyword}= is not taken here: "):
        shm_envpool.make_gym("CartPole-v1", num_envs=2, **{keyword: 1})


def test_an_async_pool_refuses_a_partial_reset_and_closes_cleanly(pool_name: str) -> None:
    env = shm_envpool.make("CartPole-v1", num_envs=4, batch_size=2, num_workers=2, name=pool_name)
    with env:
        observations, info = env.reset()
        assert observations.shape == (2, 4) and len(info["env_id"]) == 2
        with pytest.raises(ValueError, match="an async pool .* resets every env"):
            env.reset(np.array([0]))
    env.close()  # idempotent


@needs("envpool")
@pytest.mark.filterwarnings("ignore:.*precision lowered by casting")  # envpool's own spaces
@pytest.mark.parametrize("batch_size", [4, 2])
def test_a_step_before_any_reset_resets_the_envs_as_envpool_does(pool_name: str, batch_size: int) -> None:
    """EnvPool code steps a fresh pool: that step is the reset (gymnasium's reset observations,
    reward 0, no flags, elapsed_step 0), sync or async, and the next one a step."""
    import envpool

    kwargs = {"num_envs": 4, "batch_size": batch_size, "seed": 7}
    reference = envpool.make_gym("CartPole-v1", **kwargs)
    expected, _ = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync").reset(seed=7)
    with closing(reference), shm_envpool.make_gym("CartPole-v1", **kwargs, num_workers=2, name=pool_name) as env:
        first, reference_first = env.step(np.ones(batch_size, dtype=np.int64)), reference.step(np.ones(batch_size))
        assert shapes(first) == shapes(reference_first)
        for got in (first, reference_first):
            assert not got[1].any() and not got[2].any() and not got[3].any()
            assert not got[4]["elapsed_step"].any()
        np.testing.assert_array_equal(first[0], expected[first[4]["env_id"]])
        second = env.step(np.ones(batch_size, dtype=np.int64), first[4]["env_id"])
        reference_second = reference.step(np.ones(batch_size), reference_first[4]["env_id"])
        assert shapes(second) == shapes(reference_second)
        if batch_size == 4:  # the second step steps them
            for got in (second, reference_second):
                np.testing.assert_array_equal(got[1], np.ones(4))
                np.testing.assert_array_equal(got[4]["elapsed_step"], np.ones(4))


@needs("envpool")
@pytest.mark.filterwarnings("ignore:.*precision lowered by casting")  # envpool's own spaces
def test_a_partial_synchronous_step_steps_only_those_envs_as_envpool_does(pool_name: str) -> None:
    """``step(action, env_id)`` on a synchronous pool: the rows of those envs in that order, each
    env following its own gymnasium trajectory; the others do not move (Tianshou's collector)."""
    import envpool

    schedule = [[2, 0], [1], None, [3, 1, 0], [0], None, [2, 3]]
    reference = envpool.make_gym("CartPole-v1", num_envs=4, seed=0)
    singles = [gym.make("CartPole-v1") for _ in range(4)]
    with (
        closing(reference),
        shm_envpool.make_gym("CartPole-v1", num_envs=4, seed=3, num_workers=2, name=pool_name) as env,
    ):
        for pool in (env, reference):
            pool.reset()
        observations = [single.reset(seed=3 + i)[0] for i, single in enumerate(singles)]
        for ids in schedule:
            chosen = list(range(4)) if ids is None else ids
            actions = np.array([(step + i) % 2 for step, i in enumerate(chosen)])
            env_id = None if ids is None else np.array(ids)
            got, want = env.step(actions, env_id), reference.step(actions.astype(np.int32), env_id)
            assert shapes(got) == shapes(want)
            np.testing.assert_array_equal(got[4]["env_id"], want[4]["env_id"])
            np.testing.assert_array_equal(got[4]["elapsed_step"], want[4]["elapsed_step"])
            np.testing.assert_array_equal(got[1], want[1])  # no episode ends this early
            for row, (i, action) in enumerate(zip(chosen, actions)):
                observations[i] = singles[i].step(int(action))[0]
                np.testing.assert_array_equal(got[0][row], observations[i])
        with pytest.raises(ValueError, match="env ids repeat"):
            env.step(np.zeros(2, dtype=np.int64), np.array([1, 1]))


def test_infos_are_the_callers_to_write(pool_name: str) -> None:
    """Tianshou writes into ``info["env_id"]``; EnvPool's arrays are the caller's."""
    with shm_envpool.make_gym("CartPole-v1", num_envs=4, batch_size=2, num_workers=2, name=pool_name) as env:
        *_, info = env.reset()
        for _ in range(4):
            ids = info["env_id"].copy()
            for array in (info["env_id"], info["players"]["env_id"], info["elapsed_step"]):
                array[:] = 0  # would raise on a read-only array
            *_, info = env.step(np.zeros(2, dtype=np.int64), ids)
            assert sorted(info["env_id"].tolist()) in ([0, 1], [2, 3])


def test_gymnasiums_vector_wrappers_take_it(pool_name: str) -> None:
    with shm_envpool.make_gym("CartPole-v1", num_envs=4, num_workers=2, name=pool_name) as env:
        assert isinstance(env, gym.vector.VectorEnv) and isinstance(env, gym.Env) and env.is_vector_env
        assert env.single_observation_space is env.observation_space
        assert env.single_action_space is env.action_space
        assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
        wrapped = gym.wrappers.vector.NormalizeObservation(env)
        observations, _ = wrapped.reset(seed=0)
        assert observations.shape == (4, 4) and abs(observations.mean()) < 1.5
        observations, rewards, terminations, truncations, _ = wrapped.step(np.zeros(4, dtype=np.int64))
        assert observations.shape == (4, 4) and rewards.shape == terminations.shape == truncations.shape == (4,)
        wrapped.close()
        assert env.closed and env.pool.closed


@pytest.mark.parametrize(
    "task_id", ["CartPole-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Acrobot-v1"]
)
def test_seeds_decide_the_trajectories_within_the_observation_bounds(task_id: str) -> None:
    """EnvPool's own deterministic check: two pools with one seed agree at every step, a pool with
    another seed differs, and every observation lies within the space (episodes end and autoreset)."""
    pools = [shm_envpool.make_gym(task_id, num_envs=4, seed=seed, num_workers=2) for seed in (0, 0, 1)]
    space = pools[0].observation_space
    eps = np.finfo(np.float32).eps
    try:
        for _ in range(300):
            actions = np.array([space.sample() for space in [pools[0].action_space] * 4])
            first, again, other = (pool.step(actions)[0] for pool in pools)
            np.testing.assert_array_equal(first, again)
            assert not np.allclose(first, other)
            for observations in (first, other):
                assert np.all(space.low - eps <= observations) and np.all(observations <= space.high + eps)
    finally:
        for pool in pools:
            pool.close()


@pytest.mark.parametrize("task_id", ["MountainCar-v0", "MountainCarContinuous-v0"])
def test_one_env_steps_as_a_gymnasium_env_set_to_its_state(pool_name: str, task_id: str) -> None:
    """EnvPool's alignment check: a gymnasium env put in the state of the pool's first reset
    observation then steps as the pool's env does, episode by episode (step with env_id=[0])."""
    reference = gym.make(task_id)
    with closing(reference), shm_envpool.make_gym(task_id, name=pool_name) as env:
        for episode in range(3):
            reference.reset()
            reference.action_space.seed(episode)
            observations, _ = env.reset()
            reference.unwrapped.state = observations[0].astype(np.float64)
            done = False
            while not done:
                action = reference.action_space.sample()
                want = reference.step(action)
                got = env.step(np.array([action]), np.array([0]))
                np.testing.assert_allclose(got[0][0], want[0], atol=1e-4)
                np.testing.assert_allclose(got[1][0], want[1], rtol=1e-6)
                assert (got[2][0], got[3][0]) == (want[2], want[3])
                done = want[2] or want[3]


@needs("envpool")
@pytest.mark.filterwarnings("ignore:.*precision lowered by casting")  # envpool's own spaces
def test_spec_version_listing_and_render_as_envpool_has_them(pool_name: str) -> None:
    import envpool

    spec, reference_spec = (
        shm_envpool.make_spec("CartPole-v1", num_envs=3),
        envpool.make_spec("CartPole-v1", num_envs=3),
    )
    assert spec.config.num_envs == reference_spec.config.num_envs == 3
    assert spec.config.max_episode_steps == reference_spec.config.max_episode_steps
    assert spec.reward_threshold == reference_spec.reward_threshold
    assert (
        spec.observation_space == reference_spec.observation_space and spec.action_space == reference_spec.action_space
    )
    spec.id = "CartPole-v1"  # the SB3 example sets it
    assert tuple(int(part) for part in shm_envpool.__version__.split(".")[:2]) >= (1, 2)
    assert "CartPole-v1" in shm_envpool.list_all_envs() and "CartPole-v1" in envpool.list_all_envs()
    with pytest.raises(ValueError, match="env_type='dm' is not supported"):
        shm_envpool.make_dm("CartPole-v1")
    reference = envpool.make_gym("CartPole-v1", num_envs=2, render_mode="rgb_array")
    with (
        closing(reference),
        shm_envpool.make_gym("CartPole-v1", num_envs=2, render_mode="rgb_array", name=pool_name) as env,
    ):
        env.spec.id = "mine"
        assert env.render_mode == reference.render_mode == "rgb_array"
        env.reset()
        reference.reset()
        for env_ids in (None, np.array([0, 1])):
            frames, reference_frames = env.render(env_ids), reference.render(env_ids)
            assert frames.shape == reference_frames.shape and frames.dtype == reference_frames.dtype == np.uint8
    with shm_envpool.make_gym("CartPole-v1", num_envs=2, name=pool_name) as env:
        env.reset()
        with pytest.raises(RuntimeError, match="render\\(\\) needs render_mode='rgb_array' or 'human'"):
            env.render()


def test_make_spec_gives_the_config_make_gives(pool_name: str) -> None:
    for kwargs in ({"num_envs": 4}, {"num_envs": 4, "batch_size": 4}, {"num_envs": 4, "batch_size": 2}):
        spec = shm_envpool.make_spec("CartPole-v1", **kwargs)
        with shm_envpool.make_gym("CartPole-v1", **kwargs, name=pool_name) as env:
            assert spec.config == env.spec.config, kwargs
    with pytest.raises(TypeError, match="num_threads= is not taken here"):
        shm_envpool.make_spec("CartPole-v1", num_threads=2)
    # what make refuses, make_spec refuses too; of two refused keywords, always the first in sorted order
    for refused, error in (({"env_type": "dm"}, ValueError), ({"gym_reset_return_info": False}, ValueError)):
        with pytest.raises(error, match=next(iter(refused))):
            shm_envpool.make_spec("CartPole-v1", **refused)
    with pytest.raises(ValueError, match="render_mode='rgbarray'"):
        shm_envpool.make_spec("CartPole-v1", render_mode="rgbarray")
    with pytest.raises(TypeError, match="EnvPool's num_threads="):
        shm_envpool.make_spec("CartPole-v1", thread_affinity_offset=0, num_threads=2)


def test_a_first_step_whose_partial_step_is_refused_changes_nothing(pool_name: str) -> None:
    hooks = [shmpool.hooks.RewardScale(2.0)]  # a pool with hooks steps whole slots
    with shm_envpool.make_gym("CartPole-v1", num_envs=4, num_workers=2, hooks=hooks, name=pool_name) as env:
        env.reset(np.array([0, 1]))
        with pytest.raises(ValueError, match="a pool with hooks steps whole slots"):
            env.step(np.zeros(4, dtype=np.int64))  # envs 0 and 1 would step, 2 and 3 reset
        with pytest.raises(gym.error.ResetNeeded):
            env.pool.step(np.zeros(4, dtype=np.int64))  # 2 and 3 are still never reset
        env.reset()
        assert env.step(np.zeros(4, dtype=np.int64))[1].tolist() == [2.0] * 4
