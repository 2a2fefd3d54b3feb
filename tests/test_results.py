"""What step and reset return (:mod:`shmpool.pool.results`): the pool's ``episode`` info, or none with
``episode_statistics=False``, and an env's own ``info['episode']`` kept with one warning."""

from __future__ import annotations

import warnings

import gymnasium as gym
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
