"""What step and reset return (:mod:`shmpool.pool.results`): the pool's ``episode`` info, or none with
``episode_statistics=False``, and an env's own ``info['episode']`` kept with one warning."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import helpers
import numpy as np
import pytest
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from helpers import CountingEnv, counting

import shmpool


def test_episode_statistics_false_composes_with_gymnasiums_wrapper(pool_name: str) -> None:
    with shmpool.launch(counting(3), 4, num_workers=2, episode_statistics=False, name=pool_name) as pool:
        wrapped = RecordEpisodeStatistics(pool)
        wrapped.reset(seed=0)
        for _ in range(3):
            *_, infos = wrapped.step(np.ones(4, dtype=np.int64))
        assert infos["episode"]["l"].tolist() == [3] * 4 and infos["episode"]["r"].tolist() == [3.0] * 4


def test_an_envs_own_episode_info_is_kept_with_a_warning(pool_name: str) -> None:
    def own() -> gym.Env:
        return gym.wrappers.RecordEpisodeStatistics(CountingEnv(length=2))

    with shmpool.launch(own, 2, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=0)
        pool.step(np.ones(2, dtype=np.int64))
        with pytest.warns(RuntimeWarning, match="reports its own info\\['episode'\\]"):
            *_, infos = pool.step(np.full(2, 2, dtype=np.int64))
        assert infos["episode"]["r"].tolist() == [3.0, 3.0]  # the env's, which counts the last action twice
        for _ in range(2):
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # once only
                pool.step(np.ones(2, dtype=np.int64))


@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.SAME_STEP, gym.vector.AutoresetMode.NEXT_STEP])
def test_episode_infos_match_gymnasiums_whether_few_or_many_envs_end_at_once(
    mode: gym.vector.AutoresetMode, pool_name: str
) -> None:
    """Envs of lengths 2 and 3 end together, 4 or 12 at a time of 16: both ways the pool builds the
    rows of ``infos["episode"]`` and ``final_obs`` give gymnasium's."""
    lengths = [2] * 4 + [3] * 12
    factories = [counting(length) for length in lengths]
    reference = RecordEpisodeStatistics(gym.vector.SyncVectorEnv(factories, autoreset_mode=mode))
    with shmpool.launch(factories, len(lengths), num_workers=2, autoreset_mode=mode, name=pool_name) as pool:
        pool.reset(seed=0)
        reference.reset(seed=0)
        rng = np.random.default_rng(0)
        ends = set()
        for t in range(12):
            actions = rng.integers(0, 3, len(lengths))
            *_, ours = pool.step(actions)
            *_, theirs = reference.step(actions)
            if helpers.OLD_GYMNASIUM and mode == gym.vector.AutoresetMode.SAME_STEP:
                theirs.pop("episode", None)  # its statistics miss a step there: the final observations still count
                ours.pop("episode", None)
            assert ("episode" in ours) == ("episode" in theirs), t
            if "episode" in theirs:
                ends.add(int(theirs["_episode"].sum()))
                np.testing.assert_array_equal(ours["_episode"], theirs["_episode"])
                for key in ("r", "l"):
                    np.testing.assert_array_equal(ours["episode"][key], theirs["episode"][key])
                    assert ours["episode"][key].dtype == theirs["episode"][key].dtype
                assert (ours["episode"]["t"][~ours["_episode"]] == 0).all()
            if "final_obs" in theirs:
                np.testing.assert_array_equal(ours["_final_obs"], theirs["_final_obs"])
                for got, want in zip(ours["final_obs"], theirs["final_obs"]):
                    assert (got is None and want is None) or np.array_equal(got, want)
        assert {4, 12} <= ends or (helpers.OLD_GYMNASIUM and mode == gym.vector.AutoresetMode.SAME_STEP), ends
    reference.close()


def _types(value: Any) -> Any:
    """The structure of ``value`` (its dicts and tuples) with each leaf replaced by its type."""
    if isinstance(value, dict):
        return {key: _types(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(_types(item) for item in value)
    return type(value)


@pytest.mark.filterwarnings("ignore:info key 'prob'")  # FrozenLake's is an int at reset, a float after
@pytest.mark.parametrize("env_id", ["FrozenLake-v1", "Blackjack-v1"])
def test_final_obs_of_discrete_leaves_are_the_python_ints_sync_gives(env_id: str, pool_name: str) -> None:
    """gymnasium's own envs observe a Discrete space (FrozenLake) or a Tuple of them (Blackjack) as
    Python ints, which SyncVectorEnv hands on in ``final_obs``: the pool gives the same values of
    the same types (it gave np.int64)."""
    mode = gym.vector.AutoresetMode.SAME_STEP
    reference = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * 4, autoreset_mode=mode)
    with shmpool.launch(env_id, 4, num_workers=2, autoreset_mode=mode, name=pool_name) as pool:
        pool.reset(seed=0)
        reference.reset(seed=0)
        rng = np.random.default_rng(0)
        ended = 0
        for t in range(40):
            actions = rng.integers(0, 2, 4)
            *_, ours = pool.step(actions)
            *_, theirs = reference.step(actions)
            assert ("final_obs" in ours) == ("final_obs" in theirs), t
            if "final_obs" in theirs:
                np.testing.assert_array_equal(ours["_final_obs"], theirs["_final_obs"])
                for got, want in zip(ours["final_obs"], theirs["final_obs"]):
                    assert got == want and _types(got) == _types(want), (t, got, want)
                    ended += want is not None
        assert ended >= 4
    reference.close()
