"""Regressions: what envs report (infos, observations) and what hooks see reaches the trainer as
gymnasium's SyncVectorEnv would give it, or fails loudly."""

from __future__ import annotations

import os
import signal
import time
import warnings

import gymnasium as gym
import helpers
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from test_equivalence import assert_same

import shmpool
from shmpool import hooks

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def without_episode(infos: dict) -> dict:
    return {key: value for key, value in infos.items() if key not in ("episode", "_episode")}


# -- infos whose dtype or shape changes ------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_frozenlake_prob_info_matches_sync(mode: AutoresetMode, pool_name: str) -> None:
    # FrozenLake reports prob as the int 1 at reset and as a float on every step.
    kwargs = {"is_slippery": True}
    reference = SyncVectorEnv([lambda: gym.make("FrozenLake-v1", **kwargs) for _ in range(4)], autoreset_mode=mode)
    with shmpool.launch(
        "FrozenLake-v1", 4, num_workers=2, autoreset_mode=mode, env_kwargs=kwargs, name=pool_name
    ) as pool:
        assert_same(pool.reset(seed=2)[1], reference.reset(seed=2)[1], "reset infos")
        rng = np.random.default_rng(0)
        fractions = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a mixed step truncates, as gymnasium does
            for t in range(60):
                actions = rng.integers(0, 4, 4)
                ours, theirs = pool.step(actions), reference.step(actions)
                for index in range(4):
                    assert_same(ours[index], theirs[index], f"step {t} item {index}")
                our_infos, their_infos = without_episode(ours[4]), dict(theirs[4])
                their_infos.pop("final_obs", None), our_infos.pop("final_obs", None)
                assert_same(our_infos, their_infos, f"step {t} infos")
                assert set(our_infos) == set(their_infos), t
                fractions += int(np.any((our_infos["prob"] > 0) & (our_infos["prob"] < 1)))
        assert fractions > 10, "slippery steps report a probability of 1/3"
    reference.close()


@pytest.mark.parametrize("mode", MODES)
def test_info_dtype_and_shape_changes_match_sync(mode: AutoresetMode, pool_name: str) -> None:
    reference = SyncVectorEnv([helpers.ShiftingInfoEnv for _ in range(4)], autoreset_mode=mode)
    with shmpool.launch(helpers.ShiftingInfoEnv, 4, num_workers=2, autoreset_mode=mode, name=pool_name) as pool:

        def run(seed: int, steps: int) -> None:
            assert_same(pool.reset(seed=seed)[1], reference.reset(seed=seed)[1], f"reset {seed}")
            for t in range(steps):
                actions = np.zeros(4, int)
                our_infos, their_infos = without_episode(pool.step(actions)[4]), dict(reference.step(actions)[4])
                their_infos.pop("final_obs", None), our_infos.pop("final_obs", None)
                assert_same(our_infos, their_infos, f"seed {seed} step {t} infos")
                assert set(our_infos) == set(their_infos), t

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # int into float, new shapes in new steps: nothing to warn about
            run(3, 11)  # env 0 reports odd_dist as a float: the others' ints become floats
        with pytest.warns(RuntimeWarning, match=r"info key '(final_info/)?odd_dist'.*int64.*truncat"):
            run(4, 11)  # env 0 reports it as an int: gymnasium truncates the others' floats, we warn
    reference.close()


def test_info_values_that_do_not_fit_one_step_warn_once_per_key(pool_name: str) -> None:
    # SyncVectorEnv raises here (a 3-vector does not fit a row of 2); shmpool leaves it out, loudly.
    with shmpool.launch(lambda: helpers.ShiftingInfoEnv(with_vec_mix=True), 2, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=0)  # env 0 even: 2 entries and ints; env 1 odd: 3 entries and floats
        with pytest.warns(RuntimeWarning) as caught:
            infos = pool.step([0, 0])[4]
        text = " ".join(str(w.message) for w in caught)
        assert "'mixed_vec'" in text and "'odd_dist'" in text
        assert infos["_mixed_vec"].tolist() == [True, False]
        np.testing.assert_array_equal(infos["mixed_vec"], [[1.0, 1.0], [0.0, 0.0]])
        assert infos["odd_dist"].tolist() == [1, 0] and infos["odd_dist"].dtype == np.int64
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            infos = pool.step([0, 0])[4]  # warned once per key, not per step
        assert infos["mixed_vec"].tolist() == [[2.0, 2.0], [0.0, 0.0]]


# -- observations that do not fit the space ----------------------------------------------------------


BAD_OBSERVATIONS = [
    ("shape1", "reset", False, r"shape \(1,\)"),
    ("scalar", "step", False, r"shape \(\)"),
    ("none", "step", False, r"NoneType"),
    ("complex", "reset", False, r"complex128"),
    ("shape1", "step", True, r"observation\['pos'\].*shape \(1,\)"),
    ("complex", "step", True, r"observation\['pos'\].*complex128"),
    ("none", "reset", True, r"observation\['pos'\].*NoneType"),
]


@pytest.mark.parametrize(("bad", "when", "nested", "expected"), BAD_OBSERVATIONS)
def test_observation_that_does_not_fit_the_space_raises(
    bad: str, when: str, nested: bool, expected: str, pool_name: str
) -> None:
    def make() -> gym.Env:
        return helpers.BadObservationEnv(bad, when, nested, bad_seed=2)

    reference = SyncVectorEnv([make for _ in range(3)])
    with pytest.raises((ValueError, TypeError)):  # gymnasium refuses it too
        reference.reset(seed=0)
        for _ in range(3):
            reference.step(np.zeros(3, int))
    with shmpool.launch(make, 3, num_workers=2, name=pool_name) as pool:
        phase = "reset" if when == "reset" else "step"
        with pytest.raises(shmpool.WorkerError, match=rf"failed in env 2 .*during {phase}: .*{expected}") as caught:
            pool.reset(seed=0)
            for _ in range(3):
                pool.step(np.zeros(3, int))
        assert caught.value.env_id == 2
        assert "needs shape (4,) and dtype float32" in str(caught.value)


# -- Dict and Tuple spaces of a single leaf ----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["dict", "tuple"])
def test_single_leaf_dict_and_tuple_spaces_match_sync(kind: str, mode: AutoresetMode, pool_name: str) -> None:
    def make() -> gym.Env:
        return helpers.SingleLeafEnv(kind)

    reference = SyncVectorEnv([make for _ in range(3)], autoreset_mode=mode)
    with shmpool.launch(make, 3, num_workers=2, autoreset_mode=mode, name=pool_name) as pool:
        assert pool.observation_space == reference.observation_space
        assert pool.action_space == reference.action_space
        assert_same(pool.reset(seed=1)[0], reference.reset(seed=1)[0], "reset")
        pool.action_space.seed(3)
        for t in range(7):
            actions = pool.action_space.sample()
            ours, theirs = pool.step(actions), reference.step(actions)
            for index in range(4):
                assert_same(ours[index], theirs[index], f"step {t} item {index}")
            if "final_obs" in theirs[4]:
                assert_same(ours[4]["final_obs"], theirs[4]["final_obs"], f"step {t} final_obs")
        with pytest.raises(ValueError, match=r"actions\['a'\] has shape \(3, 2\)"):
            pool.step({"a": np.zeros((3, 2), np.float32)})
    reference.close()


# -- hooks ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["reset_hook_first", "delay_first"])
def test_action_delay_never_delivers_the_previous_episodes_actions(order: str, pool_name: str) -> None:
    delay = hooks.ActionDelay(2)
    chain = [helpers.ResetWhereNotResetting(1, at=6), delay] if order == "reset_hook_first" else [delay, hooks.Reset()]
    with shmpool.launch(helpers.EchoActionEnv, 2, num_workers=2, name=pool_name, hooks=chain) as pool:
        pool.reset(seed=0)
        received = []
        for step in range(11):
            if step == 6 and order == "delay_first":
                pool.events.send("Reset", [1])
            received.append(pool.step(np.full((2, 1), float(step)))[0][:, 1].tolist())
    received = np.array(received)
    # Env 0 never resets: a0, a0, a0, a1, a2, ...
    assert received[:, 0].tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    # Env 1 resets in place of step 6; its new episode's first action is a7: a7, a7, a7, a8.
    assert received[6, 1] == -1.0
    assert received[7:, 1].tolist() == [7, 7, 7, 8]


def test_hooks_later_in_the_chain_see_resets_that_earlier_hooks_asked_for(pool_name: str) -> None:
    chain = [helpers.ResetWhereNotResetting(1, at=3), helpers.SeesResetting()]
    with shmpool.launch(helpers.EchoActionEnv, 3, num_workers=1, name=pool_name, hooks=chain) as pool:
        pool.reset(seed=0)
        seen = [pool.step(np.zeros((3, 1)))[1].tolist() for _ in range(5)]
    assert seen == [[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0]]


def test_noise_streams_of_names_sharing_8_characters_differ(pool_name: str) -> None:
    observations = []
    for suffix in ("Left", "Right"):
        noise = hooks.ObservationNoise(1.0, name=f"ObsNoise{suffix}")
        with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name + suffix, hooks=[noise], seed=0) as pool:
            observations.append(pool.reset()[0])
    plain = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)]).reset(seed=0)[0]
    assert not np.array_equal(observations[0], plain)
    assert not np.allclose(observations[0], observations[1])


def _restores_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_worker_init_that_restores_ctrl_c_does_not_let_it_kill_the_workers(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 2, num_workers=2, name=pool_name, worker_init=_restores_ctrl_c) as pool:
        pool.reset(seed=0)
        os.kill(pool.worker_pids[0], signal.SIGINT)  # as a terminal's Ctrl-C reaches the whole group
        time.sleep(0.3)
        pool.step(np.zeros(2, dtype=np.int64))
