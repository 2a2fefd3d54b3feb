"""Numeric env infos reach the trainer in gymnasium's vector convention; others are left out loudly."""

from __future__ import annotations

import enum
import functools
import warnings
from typing import Any

import gymnasium as gym
import helpers
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from test_e2e_equivalence import assert_same

import shmpool

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def without_episode(infos: dict) -> dict:
    return {key: value for key, value in infos.items() if key not in ("episode", "_episode")}


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_numeric_infos_match_sync(mode: AutoresetMode, pool_name: str) -> None:
    reference = SyncVectorEnv([helpers.InfoEnv for _ in range(5)], autoreset_mode=mode)
    with shmpool.launch(helpers.InfoEnv, 5, num_workers=2, autoreset_mode=mode, name=pool_name) as pool:
        ours, theirs = pool.reset(seed=9)[1], reference.reset(seed=9)[1]
        assert_same(ours, theirs, "reset infos")
        assert set(ours) == set(theirs) == {"start", "_start"}
        rng = np.random.default_rng(0)
        for t in range(12):
            actions = rng.integers(0, 2, 5)
            our_infos = pool.step(actions)[4]
            their_infos = reference.step(actions)[4]
            our_infos.pop("episode", None), our_infos.pop("_episode", None)
            assert set(our_infos) == set(their_infos), t
            assert_same(our_infos, their_infos, f"step {t}")


def test_non_numeric_info_is_left_out_with_one_warning(pool_name: str) -> None:
    with shmpool.launch(lambda: helpers.InfoEnv(with_text=True), 2, num_workers=1, name=pool_name) as pool:
        pool.reset(seed=0)
        with pytest.warns(RuntimeWarning, match="info key 'label' .* leaves it out"):
            infos = pool.step([0, 1])[4]
        assert "label" not in infos and "count" in infos
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pool.step([0, 1])  # warned once per key, not per step


def test_too_many_info_keys_warns(pool_name: str) -> None:
    with shmpool.launch(helpers.InfoEnv, 2, num_workers=1, name=pool_name, info_keys=2) as pool:
        pool.reset(seed=0)
        with pytest.warns(RuntimeWarning, match="beyond its table of 2 keys"):
            infos = pool.step([1, 0])[4]
        assert "count" in infos  # keys registered first still travel


def test_info_arrays_larger_than_info_bytes_are_left_out_with_one_warning(pool_name: str) -> None:
    import warnings

    with shmpool.launch(helpers.BigInfoEnv, 2, num_workers=1, name=pool_name, info_bytes=64) as pool:
        pool.reset(seed=0)
        with pytest.warns(RuntimeWarning) as caught:
            infos = pool.step([0, 1])[4]
        about = [str(w.message) for w in caught if "'big'" in str(w.message)]
        assert len(about) == 1 and "at most 64 bytes" in about[0], about
        assert not [str(w.message) for w in caught if "'fits'" in str(w.message) or "'count'" in str(w.message)]
        assert "big" not in infos and "_big" not in infos
        np.testing.assert_array_equal(infos["fits"], np.ones((2, 8)))  # 64 bytes: exactly room enough
        assert infos["count"].tolist() == [1, 1]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            infos = pool.step([0, 1])[4]  # warned once per key, not per step
        assert "big" not in infos and infos["count"].tolist() == [2, 2]
    with shmpool.launch(helpers.BigInfoEnv, 2, num_workers=1, name=pool_name + "w", info_bytes=72) as pool:
        pool.reset(seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # with room for it, the same value travels
            infos = pool.step([0, 1])[4]
        np.testing.assert_array_equal(infos["big"], np.ones((2, 9)))
        assert infos["_big"].tolist() == [True, True]


@pytest.mark.parametrize("value", [np.complex128(1 + 2j), np.longdouble(1.5)], ids=["complex", "longdouble"])
def test_a_numpy_scalar_that_cannot_travel_is_left_out_as_an_array_would_be(value: Any, pool_name: str) -> None:
    """A complex scalar, or one wider than ``info_bytes``, broke the worker (and lost the step's other
    keys); it is left out with the warning an array gets."""
    factory = functools.partial(helpers.OneInfoEnv, value)
    with shmpool.launch(factory, 2, num_workers=1, name=pool_name, info_bytes=8) as pool:
        pool.reset(seed=0)
        with pytest.warns(RuntimeWarning, match="info key 'v' .* leaves it out"):
            infos = pool.step([0, 1])[4]
        assert "v" not in infos and infos["count"].tolist() == [1, 1]


class Phase(enum.IntEnum):
    """An ``IntEnum`` an env reports in its info."""

    RUN = 2


class Meters(float):
    """A float subclass an env reports in its info."""


@pytest.mark.parametrize("value", [Phase.RUN, Meters(1.5)], ids=["int_enum", "float_subclass"])
def test_an_int_or_float_subclass_arrives_as_gymnasiums_object_array_of_its_number(value: Any, pool_name: str) -> None:
    """SyncVectorEnv batches an ``IntEnum`` member (any int or float subclass) into an object array of
    the objects; nothing in shared memory is unpickled, so the pool gives an object array of the
    numbers they are (equal to them), with one warning per key, where it gave a plain int64 array."""
    factory = functools.partial(helpers.OneInfoEnv, value)
    reference = SyncVectorEnv([factory] * 4)
    reference.reset(seed=0)
    with shmpool.launch(factory, 4, num_workers=2, name=pool_name) as pool:  # rows from either worker alike
        pool.reset(seed=0)
        with pytest.warns(RuntimeWarning, match="info key 'v' holds instances of an int or float subclass"):
            ours = pool.step([0, 1, 0, 1])[4]
        theirs = reference.step(np.array([0, 1, 0, 1]))[4]
        assert ours["v"].dtype == theirs["v"].dtype == object
        assert ours["v"].tolist() == theirs["v"].tolist() == [value] * 4
        assert [type(one) for one in ours["v"]] == [int if isinstance(value, int) else float] * 4
        assert ours["_v"].tolist() == [True] * 4 and ours["count"].tolist() == [1] * 4
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert pool.step([0, 1, 0, 1])[4]["v"].tolist() == [value] * 4  # warned once per key
    reference.close()


def test_a_left_out_info_key_warns_once_whatever_the_number_of_workers(pool_name: str) -> None:
    with shmpool.launch(helpers.BigInfoEnv, 4, num_workers=2, name=pool_name, info_bytes=64) as pool:
        pool.reset(seed=0)
        with pytest.warns(RuntimeWarning) as caught:
            pool.step([0, 1, 0, 1])
    assert len([w for w in caught if "'big'" in str(w.message)]) == 1


@pytest.mark.parametrize("scenario", ["bool_then_array", "empty_ordered_dict"])
def test_infos_of_kinds_that_differ_between_envs_match_sync_and_stay_put(scenario: str, pool_name: str) -> None:
    """A numpy bool in env 0 and an array in env 1 under one key make an object array (its array held
    as a copy, which later steps leave alone); an empty dict of any dict type stays an empty dict."""
    fns = [functools.partial(helpers.MixedInfoEnv, scenario, index) for index in range(2)]
    reference = SyncVectorEnv(fns)
    with shmpool.launch(fns, 2, num_workers=1, name=pool_name) as pool, warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left out
        assert_same(pool.reset(seed=0)[1], reference.reset(seed=0)[1], "reset")
        kept = []
        for t in range(3):
            actions = np.zeros(2, np.int64)
            ours, theirs = pool.step(actions)[4], reference.step(actions)[4]
            assert_same(ours, theirs, f"step {t}")
            kept.append((ours, theirs))
        for t, (ours, theirs) in enumerate(kept):
            assert_same(ours, theirs, f"step {t}, read after the last step")
    reference.close()


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


class FlatInfoEnv(gym.Env):
    """Flat numeric infos on some steps only, every worker registering them in the same order (the
    trainer's one-copy-per-key path), with a key named as another's mask if asked."""

    def __init__(self, index: int, with_mask_name: bool) -> None:
        self.observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.index, self.with_mask_name, self.t = index, with_mask_name, 0

    def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {"x": 0.5, "_x": 2.0} if self.with_mask_name else {"x": 0.5}

    def step(self, action):  # type: ignore[no-untyped-def]
        self.t += 1
        info = {"x": self.t * 1.5, "n": np.int32(self.index)} if (self.t + self.index + int(action)) % 2 else {}
        if self.with_mask_name and info:
            info["_x"] = 3.0
        return np.zeros(1, np.float32), 1.0, self.t >= 5, False, info


@pytest.mark.filterwarnings("ignore:info key '_x'")  # a float into the mask's bool array, as gymnasium does
@pytest.mark.parametrize("with_mask_name", [False, True])
def test_flat_infos_read_for_the_whole_pool_match_sync(with_mask_name: bool, pool_name: str) -> None:
    fns = [functools.partial(FlatInfoEnv, index, with_mask_name) for index in range(4)]
    reference = SyncVectorEnv(fns)
    with shmpool.launch(fns, 4, num_workers=2, name=pool_name, episode_statistics=False) as pool:
        assert_same(pool.reset(seed=0)[1], reference.reset(seed=0)[1], "reset")
        rng = np.random.default_rng(0)
        for t in range(12):
            actions = rng.integers(0, 2, 4)
            ours, theirs = pool.step(actions)[4], reference.step(actions)[4]
            assert set(ours) == set(theirs), t
            assert_same(ours, theirs, f"step {t}")
    reference.close()
