"""Every supported space, nested in Dict and Tuple, crosses shared memory unchanged."""

from __future__ import annotations

import re
import warnings

import gymnasium as gym
import helpers
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from test_e2e_equivalence import assert_same

import shmpool


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_structured_spaces_match_sync(mode: AutoresetMode, pool_name: str) -> None:
    reference = SyncVectorEnv([helpers.StructuredEnv for _ in range(3)], autoreset_mode=mode)
    with shmpool.launch(helpers.StructuredEnv, 3, num_workers=2, autoreset_mode=mode.value, name=pool_name) as pool:
        assert pool.single_observation_space == reference.single_observation_space
        assert pool.observation_space == reference.observation_space
        assert pool.action_space == reference.action_space
        observations, _ = pool.reset(seed=5)
        expected, _ = reference.reset(seed=5)
        assert_same(observations, expected, "reset")
        pool.action_space.seed(1)
        for t in range(8):
            actions = pool.action_space.sample()
            ours, theirs = pool.step(actions), reference.step(actions)
            for index in range(4):
                assert_same(ours[index], theirs[index], f"step {t} item {index}")
            their_infos = dict(theirs[4])
            if mode == AutoresetMode.SAME_STEP and "final_obs" in their_infos:
                assert_same(ours[4]["final_obs"], their_infos["final_obs"], f"step {t} final_obs")
                assert isinstance(ours[4]["final_obs"][0], dict)
    reference.close()


def test_structured_actions_are_validated(pool_name: str) -> None:
    with shmpool.launch(helpers.StructuredEnv, 2, num_workers=1, name=pool_name) as pool:
        pool.reset(seed=0)
        actions = pool.action_space.sample()
        actions["b"]["m"][1] = [0, 4]  # nvec is [3, 4]: 4 is out of range
        with pytest.raises(
            ValueError, match=r"env 1: action \[0, 4\] in actions\['b'\]\['m'\] is outside MultiDiscrete"
        ):
            pool.step(actions)
        actions = pool.action_space.sample()
        actions["b"]["bin"][0, 2] = 2
        with pytest.raises(ValueError, match=r"env 0: .* outside MultiBinary"):
            pool.step(actions)
        actions = pool.action_space.sample()
        actions["a"] = (actions["a"][0], np.array([-3, 0]))  # Discrete(5, start=-2) allows -2..2
        with pytest.raises(ValueError, match=r"env 0: action -3 in actions\['a'\]\[1\]"):
            pool.step(actions)
        with pytest.raises(ValueError, match="expected a dict with keys"):
            pool.step({"a": actions["a"]})
        pool.step(pool.action_space.sample())  # still usable


@pytest.mark.parametrize("num_envs", [3, 67])  # up to 64 checked by Python's min and max, more by numpy
def test_discrete_actions_out_of_range_are_refused_whatever_their_integer_type(num_envs: int, pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", num_envs, num_workers=1, name=pool_name) as pool:
        pool.reset(seed=0)
        lead = num_envs - 3  # envs whose action is 0: the last three get the values below
        for values, dtype, shown in [
            ([0, -1, 1], np.int64, "-1"),
            ([0, 1, 2], np.uint8, "2"),
            ([0, 1, -(2**63)], np.int64, str(-(2**63))),
            ([1, 0, 7], ">i8", "7"),  # big-endian: not read as an unsigned native view
            ([1, 0, -1], ">i2", "-1"),
        ]:
            bad = np.array([0] * lead + values, dtype=dtype)
            env = lead + next(row for row, value in enumerate(values) if value not in (0, 1))
            with pytest.raises(ValueError, match=rf"env {env}: action {shown} in actions is outside Discrete\(2\)"):
                pool.step(bad)
        for values, dtype in [([1, 0, 1], ">i8"), ([0, 1, 1], np.uint64)]:
            pool.step(np.array([0] * lead + values, dtype=dtype))
    with shmpool.launch(_Bytes, 2, num_workers=1, name=pool_name + "b") as pool:  # -1 as uint8 is 255
        pool.reset(seed=0)
        for dtype in (np.int8, np.int16, np.int64):
            with pytest.raises(ValueError, match=r"env 1: action -1 in actions is outside Discrete\(256\)"):
                pool.step(np.array([3, -1], dtype))
        assert pool.step(np.array([3, 255], np.uint8))[0].tolist() == [[3.0], [255.0]]


def test_numpy_bool_actions_for_a_discrete_space_are_refused_as_sync_refuses_them(pool_name: str) -> None:
    """Discrete(2) holds no numpy bool, so CartPole under SyncVectorEnv fails its action assert for a
    bool array or a list of np.bool_, and takes a list of Python bools (a bool is an int). The pool
    took all three, as 0 and 1."""
    reference = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3)
    with shmpool.launch("CartPole-v1", 3, num_workers=1, name=pool_name) as pool:
        pool.reset(seed=0)
        reference.reset(seed=0)
        for actions in (np.array([False, True, True]), [np.False_, np.True_, np.True_], [np.array(False)] * 3):
            with pytest.raises(AssertionError):
                reference.step(actions)
            with pytest.raises(ValueError, match=r"CartPole-v1 env 0: action \S*False\S* in actions is a numpy bool"):
                pool.step(actions)
        with pytest.raises(ValueError, match=r"CartPole-v1 env 2: action True in actions is a numpy bool"):
            pool.step(np.array([True, False]), env_ids=[2, 1])  # rows named by their env
        with pytest.raises(ValueError, match=r"CartPole-v1 env 1: action np.True_ in actions is a numpy bool"):
            pool.step([False, np.True_, True])  # the first row that is not a Python bool
        for t, actions in enumerate(([False, True, True], (True, False, True), [1, True, np.int64(0)])):
            ours, theirs = pool.step(actions), reference.step(actions)
            for index in range(4):
                assert_same(ours[index], theirs[index], f"step {t} item {index}")
        for actions in ([1, np.True_, 0], (1, np.array(True), 0)):  # numpy makes them ints: found in the list
            with pytest.raises(ValueError, match=r"CartPole-v1 env 1: action \S*True\S* in actions is a numpy bool"):
                pool.step(actions)
        # An action out of range before the numpy bool: named first, where Sync fails first
        with pytest.raises(ValueError, match=r"CartPole-v1 env 0: action 5 in actions is outside Discrete\(2\)"):
            pool.step([5, np.True_, 0])
        with pytest.raises(ValueError, match=r"CartPole-v1 env 0: action \S*True\S* in actions is a numpy bool"):
            pool.step([np.True_, 5, 0])
        with pytest.raises(AssertionError):  # last: Sync has stepped env 0 when env 1 refuses
            reference.step([1, np.True_, 0])
    reference.close()


class _Int16Box(gym.Env):
    """Observes its last action, an int16 Box clipped to its bounds as envs do."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (1,), np.float64)
    action_space = gym.spaces.Box(-100, 100, (1,), np.int16)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.clip(action, -100, 100).astype(np.float64), 0.0, False, False, {}


def test_integer_actions_that_the_spaces_dtype_cannot_hold_are_refused_not_wrapped(pool_name: str) -> None:
    """int64 actions for an int16 Box: 65541 would be cast to 5, another env's action; within int16 the
    env clips them, as under gymnasium's vector envs."""
    with shmpool.launch(_Int16Box, 4, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=0)
        for bad, env, shown in [([[5], [65541], [0], [1]], 1, "65541"), ([[5], [0], [0], [-32769]], 3, "-32769")]:
            with pytest.raises(ValueError, match=rf"env {env}: action \[{shown}\] in actions does not fit int16"):
                pool.step(np.array(bad, dtype=np.int64))
        observations, *_ = pool.step(np.array([[32767], [-32768], [7], [-7]], dtype=np.int64))
        assert observations.ravel().tolist() == [100.0, -100.0, 7.0, -7.0]


def test_finite_float_actions_that_the_spaces_dtype_cannot_hold_are_refused_not_made_infinite(
    pool_name: str,
) -> None:
    """float64 actions for a float32 Box: 1e40 would reach the env as inf (with only numpy's overflow
    warning), where gymnasium's vector envs pass 1e40 on; inf and NaN themselves pass as they do there."""
    with shmpool.launch("Pendulum-v1", 3, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=0)
        for bad, env, shown in [([[0.5], [1e40], [0.0]], 1, "1e+40"), ([[0.5], [0.0], [-1e39]], 2, "-1e+39")]:
            with pytest.raises(
                ValueError, match=rf"env {env}: action \[{re.escape(shown)}\] in actions does not fit float32"
            ):
                pool.step(np.array(bad, dtype=np.float64))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no overflow on the way either
            _, rewards, *_ = pool.step(np.array([[np.inf], [np.nan], [1.5]], dtype=np.float64))
        assert np.isnan(rewards[1]) and np.isfinite(rewards[2])


class _Bytes(gym.Env):
    """Observes its last action, one of 256."""

    observation_space = gym.spaces.Box(0.0, 255.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(256)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.array([action], np.float32), 0.0, False, False, {}


def test_unsupported_space_fails_at_launch(pool_name: str) -> None:
    with pytest.raises(TypeError, match="cannot place a Text space in shared memory.*FlattenObservation"):
        shmpool.launch(helpers.TextSpaceEnv, 2, name=pool_name)


def test_mismatched_worker_spaces_fail_at_launch(pool_name: str) -> None:
    import os

    trainer = os.getpid()

    def factory() -> gym.Env:
        size = 4 if os.getpid() == trainer else 5  # workers build a different space than the probe
        env = helpers.CountingEnv()
        env.observation_space = gym.spaces.Box(-1, 1, (size,))
        return env

    with pytest.raises(shmpool.WorkerError, match="every env of a pool must have the same spaces"):
        shmpool.launch(factory, 2, num_workers=1, name=pool_name)


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


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
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
