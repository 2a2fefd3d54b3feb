"""A pool returns exactly what gymnasium's SyncVectorEnv returns for the same seeds and actions."""

from __future__ import annotations

import gymnasium as gym
import helpers
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import RecordEpisodeStatistics

import shmpool

# Shorter episodes than the registered ones, so a few hundred steps cross several of them; CartPole
# keeps its own limit (random actions end its episodes within ~30 steps).
ENVS = {
    "CartPole-v1": {},
    "Pendulum-v1": {"max_episode_steps": 40},
    "MountainCar-v0": {"max_episode_steps": 40},
    "Acrobot-v1": {"max_episode_steps": 40},
}
NUM_ENVS = 5


def assert_same(ours, theirs, where: str) -> None:
    if isinstance(theirs, dict):
        assert set(ours) >= set(theirs), f"{where}: keys {set(ours)} lack {set(theirs) - set(ours)}"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(theirs, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(theirs), where
        for index, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{where}[{index}]")
    elif isinstance(theirs, np.ndarray) and theirs.dtype == object:
        assert ours.dtype == object and ours.shape == theirs.shape, where
        for index, (a, b) in enumerate(zip(ours, theirs)):
            if b is None:
                assert a is None, f"{where}[{index}]"
            else:
                assert_same(a, b, f"{where}[{index}]")
    else:
        ours, theirs = np.asarray(ours), np.asarray(theirs)
        assert ours.dtype == theirs.dtype, f"{where}: dtype {ours.dtype} != {theirs.dtype}"
        np.testing.assert_array_equal(ours, theirs, err_msg=where)


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("env_id", list(ENVS))
def test_matches_sync_vector_env(env_id: str, mode: AutoresetMode, num_workers: int, pool_name: str) -> None:
    check_matches_sync_vector_env(env_id, ENVS[env_id], mode, num_workers, pool_name)


def check_matches_sync_vector_env(
    env_id: str, kwargs: dict, mode: AutoresetMode, num_workers: int, pool_name: str, **options: object
) -> None:
    """Steps a pool (launched with ``options``) and a SyncVectorEnv with the same seeds and actions,
    and checks that every result is the same."""
    steps = 150 if env_id == "CartPole-v1" else 100
    reference = RecordEpisodeStatistics(
        SyncVectorEnv([lambda: gym.make(env_id, **kwargs) for _ in range(NUM_ENVS)], autoreset_mode=mode)
    )
    with shmpool.launch(
        env_id, NUM_ENVS, num_workers=num_workers, autoreset_mode=mode, env_kwargs=kwargs, name=pool_name, **options
    ) as pool:
        assert pool.metadata["autoreset_mode"] == mode
        assert pool.observation_space == reference.observation_space
        assert pool.action_space == reference.action_space
        observations, infos = pool.reset(seed=123)
        expected_observations, expected_infos = reference.reset(seed=123)
        assert_same(observations, expected_observations, "reset observations")
        assert infos == expected_infos
        pool.action_space.seed(7)
        episodes_seen = 0
        for t in range(steps):
            actions = pool.action_space.sample()
            ours = pool.step(actions)
            theirs = reference.step(actions)
            for index, label in enumerate(["observations", "rewards", "terminations", "truncations"]):
                assert_same(ours[index], theirs[index], f"step {t} {label}")
            our_infos, their_infos = ours[4], theirs[4]
            if helpers.OLD_GYMNASIUM and mode == AutoresetMode.SAME_STEP:  # its statistics miss a step
                our_infos, their_infos = (
                    {k: v for k, v in infos.items() if k not in ("episode", "_episode")}
                    for infos in (our_infos, their_infos)
                )
            if "episode" in their_infos:
                episodes_seen += int(their_infos["_episode"].sum())
                np.testing.assert_array_equal(our_infos["_episode"], their_infos["_episode"])
                np.testing.assert_array_equal(our_infos["episode"]["l"], their_infos["episode"]["l"])
                np.testing.assert_allclose(our_infos["episode"]["r"], their_infos["episode"]["r"], rtol=1e-12)
                assert our_infos["episode"]["t"].dtype == np.float64
                their_infos = {k: v for k, v in their_infos.items() if k not in ("episode", "_episode")}
            else:
                assert "episode" not in our_infos
            assert_same(our_infos, their_infos, f"step {t} infos")
            assert set(our_infos) - {"episode", "_episode"} == set(their_infos), f"step {t} info keys"
        if not (helpers.OLD_GYMNASIUM and mode == AutoresetMode.SAME_STEP):
            assert episodes_seen >= NUM_ENVS, "the run should cross several episode ends"
    reference.close()


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_start_methods_and_closures(start_method: str, pool_name: str) -> None:
    length = 20  # captured by the closure below: spawn and forkserver must ship it by value

    def make() -> gym.Env:
        return gym.make("CartPole-v1", max_episode_steps=length)

    reference = SyncVectorEnv([make for _ in range(4)])
    with shmpool.launch(make, 4, num_workers=2, start_method=start_method, name=pool_name, seed=3) as pool:
        observations, _ = pool.reset()  # the launch seed applies to the first reset
        expected, _ = reference.reset(seed=3)
        np.testing.assert_array_equal(observations, expected)
        for _ in range(60):
            actions = np.array([0, 1, 1, 0])
            ours, theirs = pool.step(actions), reference.step(actions)
            for a, b in zip(ours[:4], theirs[:4]):
                np.testing.assert_array_equal(a, b)
    reference.close()


def test_reset_seeds_list_mask_and_options(pool_name: str) -> None:
    import helpers

    reference = SyncVectorEnv([lambda: helpers.CountingEnv() for _ in range(4)])
    with shmpool.launch(helpers.CountingEnv, 4, num_workers=2, name=pool_name) as pool:
        observations, _ = pool.reset(seed=[1, None, 3, 4], options={"offset": 2.5})
        expected, _ = reference.reset(seed=[1, None, 3, 4], options={"offset": 2.5})
        np.testing.assert_array_equal(observations, expected)
        for actions in ([1, 2, 0, 1], [2, 2, 2, 2]):
            np.testing.assert_array_equal(pool.step(actions)[0], reference.step(actions)[0])
        mask = np.array([False, True, True, False])
        observations, _ = pool.reset(options={"reset_mask": mask, "offset": 7})
        expected, _ = reference.reset(options={"reset_mask": mask, "offset": 7})
        np.testing.assert_array_equal(observations, expected)
        assert observations[1, 0] == 7 and observations[0, 0] == 2  # unmasked envs keep their state
        for actions in ([1, 1, 1, 1], [0, 2, 1, 0]):
            for a, b in zip(pool.step(actions)[:4], reference.step(actions)[:4]):
                np.testing.assert_array_equal(a, b)
        with pytest.raises(ValueError, match="reset_mask"):
            pool.reset(options={"reset_mask": np.zeros(4, dtype=bool)})
        with pytest.raises(TypeError, match="plain JSON"):
            pool.reset(options={"offset": object()})
        # JSON would hand the envs other data than given: a str key for 1, a list for the tuple.
        circular: dict = {}
        circular["offset"] = circular
        for options, said in [
            ({1: 7.0}, "the key 1, not a str"),
            ({"offset": (1, 2)}, r"\(1, 2\), a tuple"),
            (circular, "nested more than 64 deep"),
        ]:
            with pytest.raises(TypeError, match=f"plain JSON data .*{said}"):
                pool.reset(options=options)
        with pytest.raises(ValueError, match="3 seeds"):
            pool.reset(seed=[1, 2, 3])
    reference.close()


def test_default_workers_and_name() -> None:
    with shmpool.launch("CartPole-v1", 3) as pool:
        assert 1 <= pool.num_workers <= 3
        assert len(pool.worker_pids) == pool.num_workers - pool.config.trainer_slot
        assert pool.name and pool.name in repr(pool)
        pool.reset(seed=0)
        observations, rewards, terminations, truncations, infos = pool.step([0, 1, 0])
        assert observations.shape == (3, 4) and rewards.dtype == np.float64
        assert terminations.dtype == np.bool_ and truncations.dtype == np.bool_


def test_copy_false_returns_views_that_the_next_call_overwrites(pool_name: str) -> None:
    import helpers

    runs = {}
    for copy in (True, False):
        with shmpool.launch(
            lambda: helpers.CountingEnv(length=100), 2, num_workers=2, name=f"{pool_name}{copy}", copy=copy
        ) as pool:
            first, _ = pool.reset(seed=0)
            kept = first.copy()
            second = pool.step([1, 2])[0]
            assert second.tolist() == [[1.0, 1.0], [1.0, 2.0]]
            third = pool.step([2, 0])[0]
            runs[copy] = (first, second, third, kept)
    first, second, third, kept = runs[True]
    assert kept.tolist() == [[0.0, -1.0]] * 2
    assert first.tolist() == kept.tolist() and second.tolist() == [[1.0, 1.0], [1.0, 2.0]]  # copies keep
    assert not np.shares_memory(first, second) and not np.shares_memory(second, third)
    first, second, third, kept = runs[False]
    assert kept.tolist() == [[0.0, -1.0]] * 2
    # Views: every returned array now shows what the last call wrote.
    assert first.tolist() == second.tolist() == third.tolist() == [[2.0, 2.0], [2.0, 0.0]]


def test_reset_options_over_their_size_limit_are_refused_before_sending(pool_name: str) -> None:
    import json
    import re

    import helpers

    reference = SyncVectorEnv([lambda: helpers.CountingEnv(length=100) for _ in range(2)])
    with shmpool.launch(lambda: helpers.CountingEnv(length=100), 2, num_workers=2, name=pool_name) as pool:
        np.testing.assert_array_equal(
            pool.reset(seed=0, options={"offset": 1})[0], reference.reset(seed=0, options={"offset": 1})[0]
        )
        big = {"offset": 5, "pad": "x" * 10_000}
        with pytest.raises(ValueError, match=r"reset options .* at most \d+") as caught:
            pool.reset(options=big)
        assert str(len(json.dumps(big))) in str(caught.value)  # says how large they were
        limit = int(re.search(r"at most (\d+)", str(caught.value)).group(1))
        # Nothing reached the workers: their episodes go on.
        np.testing.assert_array_equal(pool.step([1, 2])[0], reference.step(np.array([1, 2]))[0])
        # Options of exactly the limit fit, and reach the envs intact.
        base = {"offset": 9, "pad": ""}
        fitting = {"offset": 9, "pad": "y" * (limit - len(json.dumps(base).encode()))}
        assert len(json.dumps(fitting).encode()) == limit
        observations = pool.reset(options=fitting)[0]
        np.testing.assert_array_equal(observations, reference.reset(options=fitting)[0])
        assert observations[:, 0].tolist() == [9.0, 9.0]
        with pytest.raises(ValueError, match=rf"at most {limit}"):
            pool.reset(options={**fitting, "pad": fitting["pad"] + "y"})  # one byte more
    reference.close()


def test_the_launch_seed_seeds_each_envs_first_reset_masked_or_not(pool_name: str) -> None:
    reference = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    expected, _ = reference.reset(seed=10)
    reference.close()
    with shmpool.launch("CartPole-v1", 4, num_workers=2, seed=10, name=pool_name) as pool:
        first, _ = pool.reset(options={"reset_mask": np.array([True, False, True, False])})
        second, _ = pool.reset(options={"reset_mask": np.array([False, True, False, True])})
        assert pool.np_random_seed == (10, 11, 12, 13)
        np.testing.assert_array_equal(np.where([[True], [False], [True], [False]], first, second), expected)


@pytest.mark.parametrize("trainer_slot", [False, True])
def test_gymnasiums_own_wrappers_keep_their_state_and_a_limit_changed_midway_holds(
    trainer_slot: bool, pool_name: str
) -> None:
    """Workers step an env under the wrappers gymnasium.make puts on it once its checker has
    checked: each TimeLimit's count must still be what stepping through it gives, and a limit
    changed midway (a curriculum of episode lengths) must hold from the next step, as in Sync."""
    kwargs = {"max_episode_steps": 40}
    reference = SyncVectorEnv([lambda: gym.make("Pendulum-v1", **kwargs) for _ in range(NUM_ENVS)])
    rng = np.random.default_rng(3)
    with shmpool.launch(
        "Pendulum-v1", NUM_ENVS, num_workers=2, env_kwargs=kwargs, name=pool_name, trainer_slot=trainer_slot
    ) as pool:
        assert_same(pool.reset(seed=11), reference.reset(seed=11), "reset")
        truncations_seen = 0
        for t in range(90):
            if t == 30:
                limits = [25, 60, 5, 40, 33]
                pool.set_attr("_max_episode_steps", limits)
                reference.set_attr("_max_episode_steps", limits)
            actions = rng.uniform(-2, 2, (NUM_ENVS, 1)).astype(np.float32)
            ours, theirs = pool.step(actions), reference.step(actions)
            assert_same(ours[:4], theirs[:4], f"step {t}")
            truncations_seen += int(theirs[3].sum())
            assert pool.get_attr("_elapsed_steps") == reference.get_attr("_elapsed_steps"), f"step {t}"
        assert truncations_seen >= 8  # the limits, old and new, were reached several times
        assert pool.get_attr("checked_step") == reference.get_attr("checked_step") == (True,) * NUM_ENVS
    reference.close()


def test_a_wrapper_subclass_is_stepped_not_passed_over(pool_name: str) -> None:
    """A subclass of gymnasium's TimeLimit with its own step (here: truncating at half its limit)
    is stepped as it is: only gymnasium's exact wrapper classes are passed over."""
    reference = SyncVectorEnv([helpers.pendulum_with_half_limit for _ in range(NUM_ENVS)])
    actions = np.zeros((NUM_ENVS, 1), dtype=np.float32)
    with shmpool.launch(helpers.pendulum_with_half_limit, NUM_ENVS, num_workers=2, name=pool_name) as pool:
        assert_same(pool.reset(seed=5), reference.reset(seed=5), "reset")
        for t in range(25):
            assert_same(pool.step(actions)[:4], reference.step(actions)[:4], f"step {t}")
            assert pool.get_attr("_elapsed_steps") == reference.get_attr("_elapsed_steps"), f"step {t}"
    reference.close()


@pytest.mark.parametrize("trainer_slot", [False, True])
def test_wrappers_and_steps_changed_by_a_control_call_are_stepped(trainer_slot: bool, pool_name: str) -> None:
    """A wrapper put under an env's TimeLimit, or a step patched on the env, by ``env_apply`` after
    the workers have started stepping under gymnasium's wrappers: the next step goes through it."""
    reference = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
    actions = np.zeros(2, dtype=np.int64)
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, trainer_slot=trainer_slot) as pool:
        assert_same(pool.reset(seed=0), reference.reset(seed=0), "reset")
        for change in (helpers.scale_reward_under_time_limit, helpers.double_reward_step):
            for _ in range(3):  # past the checker's two steps: the workers step under the wrappers
                assert_same(pool.step(actions)[:4], reference.step(actions)[:4], "step")
            pool.env_apply(change)
            for env in reference.envs:
                change(env)
            for t in range(3):
                assert_same(pool.step(actions)[:4], reference.step(actions)[:4], f"{change.__name__}, step {t}")
    reference.close()
