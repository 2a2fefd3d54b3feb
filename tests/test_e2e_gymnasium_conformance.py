"""Conformance with gymnasium's vector API, checked the way gymnasium checks its own vector envs.

gymnasium's ``tests/vector`` and ``tests/wrappers/vector`` suites (1.x) are not shipped with the
package; these are shmpool's own tests of the same behaviours. Wherever a comparison is possible,
the same seeds and actions go through a pool and through ``gymnasium.vector.SyncVectorEnv``, and
what comes back is compared with gymnasium's own ``data_equivalence(..., exact=True)``: every space
with a fixed shape, the three autoreset modes, infos, seeding, ``call``/``get_attr``/``set_attr``,
``render``, envs given as a list of callables, errors, and the wrappers of
``gymnasium.wrappers.vector`` put on top of a pool.

What shmpool deliberately does not support or does differently, and why, is listed in
:data:`NOT_SUPPORTED` (each entry is pinned by a test below where it can be). Gaps found against
gymnasium that are not deliberate are tests marked ``xfail(strict=True)``.
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Callable
from contextlib import closing
from functools import partial
from typing import Any

import gymnasium as gym
import helpers
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_differing_spaces
from gymnasium.wrappers import vector as vector_wrappers

import shmpool

#: What shmpool deliberately does not support, or does differently from SyncVectorEnv and
#: AsyncVectorEnv, with the reason. Not listed here means: shmpool behaves as gymnasium does.
NOT_SUPPORTED: dict[str, str] = {
    "spaces without a fixed shape (Text, Sequence, Graph, OneOf, custom Space subclasses)": (
        "every field of the shared segment has a shape and dtype fixed at launch, and nothing in it is "
        "pickled; samples of these spaces vary in size or are arbitrary Python objects. launch raises "
        "TypeError naming the space (wrap the env, e.g. FlattenObservation, to give it a fixed shape)"
    ),
    "AsyncVectorEnv's transport options (shared_memory, context, daemon, worker, max_concurrency)": (
        "shmpool always moves data through one shared segment (no per-step pipes or pickles), picks the "
        "start method with start_method=, runs its own worker loop, and bounds concurrency by "
        "num_workers (each worker steps its slot of envs in turn)"
    ),
    "AsyncVectorEnv's split calls (step_async/step_wait, reset_async/reset_wait, call_async/call_wait)": (
        "AsyncVectorEnv-only API, not part of gymnasium.vector.VectorEnv, which is what the pool is and "
        "what every vector wrapper uses; the per-call timeout= of the *_wait methods is launch(timeout=), "
        "which raises PoolTimeoutError (a TimeoutError), tested in test_e2e_failures.py"
    ),
    "infos that are not numbers, bools or numeric arrays (strings, None, objects)": (
        "infos cross shared memory as fixed-size numeric fields and are never pickled; other values are "
        "left out with one RuntimeWarning per key, where SyncVectorEnv keeps them in object arrays"
    ),
    "more distinct info keys or larger info values than the segment has room for": (
        "each worker's info table has launch(info_keys=) keys (32 by default; the keys of final_info count "
        "too) and launch(info_bytes=) bytes per value (64); a key beyond them is left out with one "
        "RuntimeWarning. Raise the limits for envs with many or large infos (the info tests here use 32)"
    ),
    "final_obs entries as the very Python objects the env returned": (
        "in SAME_STEP mode a final observation crosses shared memory like any observation, so its leaves "
        "come back as a Python int for a Discrete leaf (as gymnasium's own envs return it, also where the "
        "env returned an np.int64) and as numpy values of the space's dtype for the others (a float32 array "
        "for a float32 Box, an array for MultiBinary), where SyncVectorEnv keeps what the env returned (an "
        "np.int64, a float64 array, a tuple); values are equal and always in the single observation space"
    ),
    "actions outside the action space": (
        "SyncVectorEnv passes any action to env.step (a Discrete action of 7, a float for a Discrete); "
        "shmpool writes actions into fields of the space's dtype, so it checks them first and raises "
        "ValueError naming the env and the value, before anything reaches a worker"
    ),
    "reset options that are not plain JSON data (apart from reset_mask)": (
        "options are written into the segment as JSON, never pickled; what JSON would not give back as it "
        "is (a tuple, a key that is not a str, numpy scalars and arrays) is refused with TypeError; the "
        "reset_mask option is taken out and checked as gymnasium checks it. Unlike SyncVectorEnv, the "
        "caller's options dict is not modified (Sync pops reset_mask from it)"
    ),
    "the env's own exception type when an env raises in step or reset": (
        "the pool raises WorkerError (a RuntimeError) naming worker, env and phase, with the env's "
        "traceback text as __cause__, and stays broken (PoolBrokenError) until close: the other envs of "
        "that worker's slot are in an unknown state. SyncVectorEnv re-raises the env's exception, "
        "AsyncVectorEnv its type and shuts that worker down. A step before an env's first reset is "
        "refused in the trainer with gymnasium's ResetNeeded, before anything is sent, and the pool goes "
        "on. call/get_attr/set_attr/render keep the env's exception type and leave the pool usable"
    ),
    "SyncVectorEnv's leniency after close": (
        "a closed pool raises gymnasium.error.ClosedEnvironmentError from every call, as AsyncVectorEnv "
        "does; SyncVectorEnv keeps answering reset, call and get_attr on its closed envs"
    ),
}

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]
ALL_MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


# -- tiny deterministic envs ---------------------------------------------------------------------


class EchoEnv(gym.Env):
    """Observation and action share ``space``; a step observes the action it got (so actions are
    checked to cross unchanged), a reset a sample drawn from the env's seed. Ends every ``length``
    steps; ``info["in_space"]`` says whether the action was in the action space."""

    def __init__(self, space: spaces.Space, length: int = 3) -> None:
        self.observation_space = copy.deepcopy(space)
        self.action_space = copy.deepcopy(space)
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.observation_space.seed(int(self.np_random.integers(1 << 31)))
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return action, 0.0, self.t >= self.length, False, {"in_space": action in self.action_space}


class CountEnv(gym.Env):
    """Observation = steps since reset; reward = the action; terminates at ``max_count`` steps.
    Reports no infos. ``scaled(factor, offset=0)`` is a method for ``call``."""

    def __init__(self) -> None:
        self.observation_space = spaces.Discrete(10)
        self.action_space = spaces.Discrete(5)
        self.max_count, self.count = 3, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = int(options.get("start", 0)) if options else 0
        return self.count, {}

    def step(self, action):
        self.count += 1
        return self.count, float(action), self.count == self.max_count, False, {}

    def scaled(self, factor: float, offset: float = 0.0) -> float:
        return self.count * factor + offset


class FinalInfoEnv(gym.Env):
    """Discrete observations; actions 3 and 4 terminate; infos at reset and at every step."""

    def __init__(self) -> None:
        self.observation_space = spaces.Discrete(4)
        self.action_space = spaces.Discrete(5)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {"reset": True}

    def step(self, action):
        return (int(action) if action < 3 else 0), 0.0, bool(action >= 3), False, {"action": int(action)}


class TypedInfoEnv(gym.Env):
    """Infos of every numeric type, nested, on some steps only; episodes of 3 or 4 steps."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-100.0, 100.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t, self.length = 0, 3

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length = 0, 3 + int(self.np_random.integers(2))
        offset = float(options.get("offset", 0.0)) if options else 0.0
        return np.array([offset, -1.0], np.float32), {
            "start": int(self.np_random.integers(100)),
            "seeded": seed is not None,
        }

    def step(self, action):
        self.t += 1
        info: dict[str, Any] = {"count": self.t}
        if (self.t + int(action)) % 2:
            info.update(
                ratio=self.t / 3,
                flag=True,
                f32=np.float32(self.t / 4),
                i16=np.int16(-self.t),
                u8=np.uint8(self.t),
                vec=np.arange(3, dtype=np.float32) * self.t,
                grid=np.full((2, 2), self.t, dtype=np.int64),
                nested={"depth": np.int32(self.t), "deeper": {"x": float(self.t)}},
            )
        observation = np.array([self.t, float(action)], np.float32)
        return observation, np.float32(0.5 * self.t), self.t >= self.length, False, info


class DictObsEnv(EchoEnv):
    """A Dict observation drawn from the env's seed each step (reset as EchoEnv's); a Box action;
    episodes of 4 steps."""

    def __init__(self) -> None:
        super().__init__(spaces.Dict({"a": spaces.Box(0.0, 1.0, (2,)), "b": spaces.Discrete(5)}), length=4)
        self.action_space = spaces.Box(-1.0, 1.0, (1,))

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action[0]), self.t >= 4, False, {}


class BoundedEnv(gym.Env):
    """A Box observation whose upper bound differs between envs (``observation_mode="different"``)."""

    def __init__(self, high: float) -> None:
        self.observation_space = spaces.Box(0.0, high, (3,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(0, self.observation_space.high).astype(np.float32), {}

    def step(self, action):
        return self.np_random.uniform(0, self.observation_space.high).astype(np.float32), 0.0, False, False, {}


class RaisingEnv(gym.Env):
    """Raises in reset when seeded with 1."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed == 1:
            raise ValueError("Error in reset")
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}


def seeded_cartpole(seed: int, **kwargs: Any) -> Callable[[], gym.Env]:
    """A factory as gymnasium's tests write them: the env and its action space seeded when made."""

    def make() -> gym.Env:
        env = gym.make("CartPole-v1", disable_env_checker=True, **kwargs)
        env.action_space.seed(seed)
        env.reset(seed=seed)
        return env

    return make


# -- comparison ----------------------------------------------------------------------------------


def same(ours: Any, theirs: Any) -> bool:
    """gymnasium's own equivalence check, exact (shmpool must be bit-for-bit equal)."""
    return data_equivalence(ours, theirs, exact=True)


def same_values(ours: Any, theirs: Any) -> bool:
    """Equal structure and values; numeric leaves may differ in Python/numpy type (see NOT_SUPPORTED)."""
    if isinstance(theirs, dict):
        return (
            isinstance(ours, dict)
            and ours.keys() == theirs.keys()
            and all(same_values(ours[k], theirs[k]) for k in theirs)
        )
    if isinstance(theirs, tuple) and isinstance(ours, tuple):
        return len(ours) == len(theirs) and all(same_values(a, b) for a, b in zip(ours, theirs))
    return bool(np.array_equal(np.asarray(ours), np.asarray(theirs)))


def assert_same_infos(ours: dict[str, Any], theirs: dict[str, Any], space: spaces.Space, where: str) -> None:
    """Infos equal as data_equivalence sees them; ``final_obs`` entries equal in value and in ``space``."""
    ours, theirs = dict(ours), dict(theirs)
    our_final, their_final = ours.pop("final_obs", None), theirs.pop("final_obs", None)
    assert same(ours, theirs), f"{where}: infos differ\n ours:   {ours}\n theirs: {theirs}"
    if their_final is None:
        assert our_final is None, f"{where}: final_obs {our_final} where Sync has none"
        return
    if not (isinstance(their_final, np.ndarray) and their_final.dtype == object):  # one env's (DictInfoToList)
        assert our_final in space and same_values(our_final, their_final), f"{where}: final_obs {our_final!r}"
        return
    assert isinstance(our_final, np.ndarray) and our_final.dtype == object and our_final.shape == their_final.shape
    for env_id, (mine, expected) in enumerate(zip(our_final, their_final)):
        if expected is None:
            assert mine is None, f"{where}: final_obs[{env_id}] = {mine!r}, Sync has None"
        else:
            assert mine in space, f"{where}: final_obs[{env_id}] = {mine!r} is not in {space}"
            assert same_values(mine, expected), f"{where}: final_obs[{env_id}] {mine!r} != {expected!r}"


def assert_same_step(ours: tuple, theirs: tuple, space: spaces.Space, where: str) -> None:
    """One step's five results equal (infos as in :func:`assert_same_infos`)."""
    assert len(ours) == len(theirs) == 5
    for index, label in enumerate(("observations", "rewards", "terminations", "truncations")):
        assert same(ours[index], theirs[index]), (
            f"{where}: {label}\n ours:   {ours[index]!r}\n theirs: {theirs[index]!r}"
        )
    assert_same_infos(ours[4], theirs[4], space, where)


# -- spaces --------------------------------------------------------------------------------------


def space_id(space: spaces.Space) -> str:
    """A one-line test id naming the space and, for leaves, its dtype."""
    text = " ".join(str(space).split())
    return text if space.dtype is None or str(space.dtype) in text else f"{text} {space.dtype}"


FIXED_SHAPE_SPACES = [
    spaces.Discrete(3),
    spaces.Discrete(3, start=-1),
    spaces.Discrete(4, dtype=np.int32, start=1),
    spaces.Box(np.array(-1.0), np.array(1.0), dtype=np.float64),  # shape ()
    spaces.Box(0, 255, (), np.uint8),
    spaces.Box(0.0, 1.0),
    spaces.Box(0.0, np.inf, (2, 2)),
    spaces.Box(np.array([[-1.0, 0.0], [0.0, -1.0]]), np.ones((2, 2)), dtype=np.float64),
    spaces.Box(-1.0, 1.0, (3,), np.float16),
    spaces.Box(0, 255, (8, 8, 3), np.uint8),
    spaces.Box(np.array([0, 0, 1]), np.array([1, 0, 1]), dtype=np.bool_),  # type: ignore[arg-type]  # typed as float-only
    spaces.Box(np.array([-np.inf, -np.inf, 0, -10]), np.array([np.inf, 0, np.inf, 10]), dtype=np.int32),
    spaces.MultiDiscrete([2, 2]),
    spaces.MultiDiscrete(np.array([[2, 3], [3, 2]]), start=np.array([[10, 20], [30, 40]])),
    spaces.MultiDiscrete([2, 3], dtype=np.int8),
    spaces.MultiDiscrete([2, 3], dtype=np.uint16),
    spaces.MultiBinary(8),
    spaces.MultiBinary([2, 3]),
    spaces.Tuple((spaces.Discrete(3), spaces.Discrete(5))),
    spaces.Tuple((spaces.Discrete(5), spaces.Tuple((spaces.Box(0.0, 1.0, (3,)), spaces.Discrete(2))))),
    spaces.Tuple((spaces.Discrete(3), spaces.Dict(position=spaces.Box(0.0, 1.0), velocity=spaces.Discrete(2)))),
    spaces.Dict({"position": spaces.Discrete(23), "velocity": spaces.Box(0.0, 1.0, (1,), np.float64)}),
    spaces.Dict(
        {
            "a": spaces.Box(0, 1, (3, 3)),
            "b": spaces.Dict({"b_1": spaces.Box(-100, 100, (2,)), "b_2": spaces.Box(-1, 1, (2,))}),
            "c": spaces.Discrete(4),
        }
    ),
    spaces.Dict(
        {
            "position": spaces.Dict({"x": spaces.Discrete(29), "y": spaces.MultiBinary(2)}),
            "velocity": spaces.Tuple((spaces.MultiDiscrete([3, 7]), spaces.Box(0, 255, (), np.uint8))),
        }
    ),
]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
@pytest.mark.parametrize("space", FIXED_SHAPE_SPACES, ids=space_id)
def test_every_fixed_shape_space_matches_sync(space: spaces.Space, mode: AutoresetMode, pool_name: str) -> None:
    factory = partial(EchoEnv, space)
    with (
        closing(SyncVectorEnv([factory] * 3, autoreset_mode=mode)) as reference,
        shmpool.launch(
            factory, 3, num_workers=2, autoreset_mode=mode, episode_statistics=False, name=pool_name
        ) as pool,
    ):
        assert pool.single_observation_space == reference.single_observation_space == space
        assert pool.single_action_space == reference.single_action_space == space
        assert pool.observation_space == reference.observation_space
        assert pool.action_space == reference.action_space
        observations, infos = pool.reset(seed=11)
        expected = reference.reset(seed=11)
        assert same((observations, infos), expected)
        assert observations in pool.observation_space
        reference.action_space.seed(5)
        for t in range(7):
            actions = reference.action_space.sample()
            ours = pool.step(actions)
            assert_same_step(ours, reference.step(actions), space, f"step {t}")
            assert ours[0] in pool.observation_space
            if "in_space" in ours[4]:  # NEXT_STEP's autoreset steps report no info
                stepped = ours[4]["_in_space"]
                assert ours[4]["in_space"][stepped].all(), f"step {t}: an env got an action outside its space"


class CustomSpace(spaces.Space):
    """A space gymnasium can batch only as a Tuple of objects."""

    def sample(self, mask=None, probability=None):
        return int(self.np_random.integers(0, 10))

    def contains(self, x):
        return isinstance(x, int) and 0 <= x < 10

    def __eq__(self, other):
        return isinstance(other, CustomSpace)


@pytest.mark.parametrize(
    "space",
    [
        spaces.Text(6),
        spaces.Sequence(spaces.Discrete(4)),
        spaces.Graph(node_space=spaces.Box(-1, 1, shape=(2,)), edge_space=None),
        spaces.OneOf([spaces.Discrete(3), spaces.Box(0.0, 1.0)]),
        spaces.Dict({"fixed": spaces.Discrete(2), "text": spaces.Text(4)}),
        CustomSpace(),
    ],
    ids=lambda space: type(space).__name__,
)
def test_spaces_without_a_fixed_shape_are_refused_at_launch(space: spaces.Space, pool_name: str) -> None:
    """NOT_SUPPORTED: spaces without a fixed shape (AsyncVectorEnv(shared_memory=True) refuses them too)."""
    with pytest.raises(TypeError, match="cannot place"):
        shmpool.launch(partial(EchoEnv, space), 2, num_workers=1, name=pool_name)


# -- stepping, autoreset -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
def test_cartpole_matches_sync_step_for_step(mode: AutoresetMode, pool_name: str) -> None:
    """gymnasium's test_vector_env_equal and the Sync/Async step and reset type checks."""
    env_fns = [seeded_cartpole(i) for i in range(4)]
    with (
        closing(SyncVectorEnv(env_fns, autoreset_mode=mode)) as reference,
        shmpool.launch(env_fns, num_workers=2, autoreset_mode=mode, episode_statistics=False, name=pool_name) as pool,
    ):
        assert pool.num_envs == reference.num_envs == 4
        assert isinstance(pool.observation_space, spaces.Box) and isinstance(pool.action_space, spaces.MultiDiscrete)
        observations, infos = pool.reset(seed=0)
        assert same((observations, infos), reference.reset(seed=0))
        assert observations.dtype == pool.observation_space.dtype
        assert observations.shape == pool.observation_space.shape == (4, 4)
        ends = 0
        for t in range(100):
            actions: Any
            if t % 2:
                actions = pool.action_space.sample()
            else:  # a list of single-env actions works as well as a batched one
                actions = [pool.single_action_space.sample() for _ in range(4)]
            assert actions in reference.action_space
            ours = pool.step(actions)
            assert_same_step(ours, reference.step(actions), pool.single_observation_space, f"step {t}")
            _, rewards, terminations, truncations, _ = ours
            assert rewards.dtype == np.float64 and rewards.shape == (4,) and isinstance(rewards[0], np.floating)
            assert terminations.dtype == truncations.dtype == np.bool_
            assert terminations.shape == truncations.shape == (4,)
            ends += int((terminations | truncations).sum())
        assert ends >= 4, "the run should cross several episode ends"


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
def test_final_obs_and_final_info_of_a_single_env(mode: AutoresetMode, pool_name: str) -> None:
    """gymnasium's test_final_obs_info, with one env, and SAME_STEP's final_obs/final_info."""
    with (
        closing(SyncVectorEnv([FinalInfoEnv], autoreset_mode=mode)) as reference,
        shmpool.launch(
            FinalInfoEnv, 1, num_workers=1, autoreset_mode=mode, episode_statistics=False, name=pool_name
        ) as pool,
    ):
        observations, infos = pool.reset()
        assert same((observations, infos), reference.reset())
        assert same(infos, {"reset": np.array([True]), "_reset": np.array([True])})
        ended = False
        for action in (1, 2, 3, 4, 2, 3, 0):
            ours, theirs = pool.step([action]), reference.step([action])
            assert_same_step(ours, theirs, pool.single_observation_space, f"action {action}")
            if mode == AutoresetMode.NEXT_STEP and ended:  # this step was the autoreset
                assert same(ours[:4], (np.array([0]), np.array([0.0]), np.array([False]), np.array([False])))
                assert same(ours[4], {"reset": np.array([True]), "_reset": np.array([True])})
            elif action < 3:
                assert same(ours[4], {"action": np.array([action]), "_action": np.array([True])})
            elif mode == AutoresetMode.SAME_STEP:
                assert ours[0] == np.array([0]) and ours[2].all()
                assert ours[4]["final_obs"][0] == 0 and ours[4]["final_obs"][0] in pool.single_observation_space
                # A Discrete leaf's final observation is a Python int, as the env's (and Sync's)
                assert type(theirs[4]["final_obs"][0]) is int and type(ours[4]["final_obs"][0]) is int
                assert same(ours[4]["final_info"], {"action": np.array([action]), "_action": np.array([True])})
                assert same(ours[4]["reset"], np.array([True]))
            ended = bool(ours[2][0])
        observations, infos = pool.reset(options={"reset_mask": np.array([True])})
        assert same((observations, infos), reference.reset(options={"reset_mask": np.array([True])}))


def _autoreset_run(vector_env: Any) -> list[tuple]:
    """The scenario of gymnasium's autoreset tests: three envs ending after 2, 3 and 3 steps."""
    vector_env.set_attr("max_count", [2, 3, 3])
    results: list[tuple] = [vector_env.reset()]
    for _ in range(4):
        results.append(vector_env.step([1, 2, 3]))
        if vector_env.metadata["autoreset_mode"] == AutoresetMode.DISABLED:
            done = results[-1][2] | results[-1][3]
            if done.any():
                results.append(vector_env.reset(options={"reset_mask": done}))
    return results


AUTORESET_EXPECTED: dict[AutoresetMode, list[tuple]] = {
    # (observations, rewards, terminations, final_obs) per step; (observations,) per reset
    AutoresetMode.NEXT_STEP: [
        ([0, 0, 0],),
        ([1, 1, 1], [1, 2, 3], [0, 0, 0], None),
        ([2, 2, 2], [1, 2, 3], [1, 0, 0], None),
        ([0, 3, 3], [0, 2, 3], [0, 1, 1], None),
        ([1, 0, 0], [1, 0, 0], [0, 0, 0], None),
    ],
    AutoresetMode.SAME_STEP: [
        ([0, 0, 0],),
        ([1, 1, 1], [1, 2, 3], [0, 0, 0], None),
        ([0, 2, 2], [1, 2, 3], [1, 0, 0], [2, None, None]),
        ([1, 0, 0], [1, 2, 3], [0, 1, 1], [None, 3, 3]),
        ([0, 1, 1], [1, 2, 3], [1, 0, 0], [2, None, None]),
    ],
    AutoresetMode.DISABLED: [
        ([0, 0, 0],),
        ([1, 1, 1], [1, 2, 3], [0, 0, 0], None),
        ([2, 2, 2], [1, 2, 3], [1, 0, 0], None),
        ([0, 2, 2],),
        ([1, 3, 3], [1, 2, 3], [0, 1, 1], None),
        ([1, 0, 0],),
        ([2, 1, 1], [1, 2, 3], [1, 0, 0], None),
        ([0, 1, 1],),
    ],
}


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda mode: mode.value)
def test_autoreset_modes_step_by_step(mode: AutoresetMode, pool_name: str) -> None:
    """gymnasium's test_autoreset_next_step / _within_step / _disabled, written out, and equal to Sync."""
    with (
        closing(SyncVectorEnv([CountEnv] * 3, autoreset_mode=mode)) as reference,
        shmpool.launch(
            CountEnv, 3, num_workers=2, autoreset_mode=mode, episode_statistics=False, name=pool_name
        ) as pool,
    ):
        assert pool.metadata["autoreset_mode"] == mode
        ours, theirs = _autoreset_run(pool), _autoreset_run(reference)
        assert len(ours) == len(theirs) == len(AUTORESET_EXPECTED[mode])
        for index, (mine, sync, expected) in enumerate(zip(ours, theirs, AUTORESET_EXPECTED[mode])):
            where = f"result {index}"
            np.testing.assert_array_equal(mine[0], expected[0], err_msg=where)
            if len(mine) == 2:  # a reset
                assert len(expected) == 1 and same(mine, sync) and not mine[1], where
                continue
            assert_same_step(mine, sync, pool.single_observation_space, where)
            np.testing.assert_array_equal(mine[1], expected[1], err_msg=where)
            np.testing.assert_array_equal(mine[2], np.array(expected[2], bool), err_msg=where)
            final_obs = expected[3]
            if final_obs is None:
                assert not mine[4], where
            else:
                done = np.array([value is not None for value in final_obs])
                assert set(mine[4]) == {"final_obs", "_final_obs", "final_info", "_final_info"}, where
                assert list(mine[4]["final_obs"]) == final_obs, where
                np.testing.assert_array_equal(mine[4]["_final_obs"], done, err_msg=where)
                np.testing.assert_array_equal(mine[4]["_final_info"], done, err_msg=where)
                assert not mine[4]["final_info"], where


@pytest.mark.filterwarnings("error::RuntimeWarning")  # no info left out
@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda mode: mode.value)
def test_reset_mask_matches_sync(mode: AutoresetMode, pool_name: str) -> None:
    """Partial resets (seeds and options per masked env), including envs waiting for an autoreset."""
    rng = np.random.default_rng(3)
    with (
        closing(SyncVectorEnv([TypedInfoEnv] * 4, autoreset_mode=mode)) as reference,
        shmpool.launch(
            TypedInfoEnv, 4, num_workers=2, autoreset_mode=mode, episode_statistics=False, info_keys=32, name=pool_name
        ) as pool,
    ):
        assert same(pool.reset(seed=[0, 1, 2, 3]), reference.reset(seed=[0, 1, 2, 3]))
        pending = np.zeros(4, bool)
        for t in range(24):
            if t % 3 == 2 or (mode == AutoresetMode.DISABLED and pending.any()):
                mask = rng.random(4) < 0.5
                if mode == AutoresetMode.DISABLED:
                    mask |= pending
                mask[t % 4] = True
                seeds: list[int | None] | None = [int(seed) for seed in rng.integers(0, 1000, 4)] if t % 2 else None
                options = {"reset_mask": mask, "offset": float(t)}
                reset = pool.reset(seed=seeds, options=dict(options))
                assert same(reset, reference.reset(seed=seeds, options=dict(options))), f"masked reset {t}"
                assert set(np.flatnonzero(reset[1]["_start"])) == set(np.flatnonzero(mask)), "infos of reset envs only"
                assert pool.np_random_seed == reference.np_random_seed
                pending &= ~mask
            actions = rng.integers(0, 2, 4)
            ours = pool.step(actions)
            assert_same_step(ours, reference.step(actions), pool.single_observation_space, f"step {t}")
            pending = ours[2] | ours[3]


@pytest.mark.parametrize(
    ("mask", "error"),
    [
        ([True, False, True], TypeError),
        (np.array([True]), ValueError),
        (np.array([True, True, False, False]), ValueError),
        (np.array([[True, True, True]]), ValueError),
        (np.array([1, 1, 0]), TypeError),
        (np.array([1.0, 1.0, 0.0]), TypeError),
        (np.zeros(3, bool), ValueError),
    ],
    ids=["list", "short", "long", "2d", "int", "float", "all-false"],
)
def test_bad_reset_masks_raise_as_sync_does(mask: Any, error: type, pool_name: str) -> None:
    with (
        closing(SyncVectorEnv([CountEnv] * 3, autoreset_mode="Disabled")) as reference,
        shmpool.launch(CountEnv, 3, num_workers=2, autoreset_mode="Disabled", name=pool_name) as pool,
    ):
        for vector_env in (reference, pool):
            vector_env.reset(seed=0)
            vector_env.step([1, 1, 1])
            with pytest.raises(error if vector_env is pool else helpers.sync_error(error), match="reset_mask"):
                vector_env.reset(options={"reset_mask": mask})
        # a refused reset changes nothing
        assert_same_step(pool.step([2, 2, 2]), reference.step([2, 2, 2]), pool.single_observation_space, "after")


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda mode: mode.value)
@pytest.mark.parametrize("as_value", [False, True], ids=["enum", "value"])
def test_autoreset_mode_in_metadata(mode: AutoresetMode, as_value: bool, pool_name: str) -> None:
    """gymnasium's test_autoreset_metadata and test_metadata_async_vector_env: the vector env's
    metadata names its mode, and the env's (class-level) metadata is left alone."""
    with shmpool.launch(
        "CartPole-v1", 2, num_workers=1, autoreset_mode=mode.value if as_value else mode, name=pool_name
    ) as pool:
        assert pool.metadata["autoreset_mode"] is mode
        assert pool.autoreset_mode is mode
        env = gym.make("CartPole-v1")
        if not helpers.OLD_GYMNASIUM:  # whose SyncVectorEnv, run by other tests here, writes it there
            assert "autoreset_mode" not in env.metadata
        assert {k: v for k, v in pool.metadata.items() if k != "autoreset_mode"} == {
            k: v for k, v in env.metadata.items() if k != "autoreset_mode"
        }
        env.close()


def test_disabled_mode_refuses_to_step_an_env_whose_episode_ended(pool_name: str) -> None:
    with shmpool.launch(CountEnv, 2, num_workers=2, autoreset_mode="Disabled", name=pool_name) as pool:
        pool.set_attr("max_count", [1, 3])
        pool.reset(seed=0)
        assert pool.step([1, 1])[2].tolist() == [True, False]
        with pytest.raises((AssertionError, RuntimeError, ValueError)):
            pool.step([1, 1])  # env 0 ended and was not reset
        pool.reset(options={"reset_mask": np.array([True, False])})
        assert pool.step([1, 1])[0].tolist() == [1, 2]


@pytest.mark.parametrize("engine", helpers.ENGINES)
def test_a_step_before_every_env_was_reset_is_refused_and_the_pool_goes_on(engine: str, pool_name: str) -> None:
    """gymnasium's ``ResetNeeded``, raised in the trainer before anything is sent: a usage mistake,
    not an env failure, so the pool stays usable (an env raising it in a worker would break it)."""
    with shmpool.launch("CartPole-v1", 4, num_workers=2, engine=engine, name=pool_name) as pool:
        with pytest.raises(gym.error.ResetNeeded, match=r"step\(\): envs \[0, 1, 2, 3\] were never reset"):
            pool.step(np.zeros(4, dtype=np.int64))
        pool.reset(seed=0, options={"reset_mask": np.array([True, False, True, False])})
        with pytest.raises(gym.error.ResetNeeded, match=r"envs \[1, 3\] were never reset"):
            pool.step(np.zeros(4, dtype=np.int64))
        pool.reset(seed=0)
        with closing(SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)) as reference:
            reference.reset(seed=0)
            actions = np.ones(4, dtype=np.int64)
            for mine, theirs in zip(pool.step(actions)[:4], reference.step(actions)[:4]):
                np.testing.assert_array_equal(mine, theirs)


def test_disabled_mode_sync_refuses_to_step_an_env_whose_episode_ended() -> None:
    """The reference behaviour for the xfail test above."""
    with closing(SyncVectorEnv([CountEnv] * 2, autoreset_mode="Disabled")) as reference:
        reference.set_attr("max_count", [1, 3])
        reference.reset(seed=0)
        reference.step([1, 1])
        with pytest.raises(AssertionError):
            reference.step([1, 1])


# -- infos ---------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("error::RuntimeWarning")  # no info left out
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
def test_infos_of_every_numeric_type_match_sync(mode: AutoresetMode, pool_name: str) -> None:
    """Infos as gymnasium batches them: an array per key (dtype of the value), a ``_key`` mask, nested
    dicts likewise; reset infos; SAME_STEP's final_info and the reset infos merged into the step's."""
    with (
        closing(SyncVectorEnv([TypedInfoEnv] * 3, autoreset_mode=mode)) as reference,
        shmpool.launch(
            TypedInfoEnv, 3, num_workers=2, autoreset_mode=mode, episode_statistics=False, info_keys=32, name=pool_name
        ) as pool,
    ):
        assert same(pool.reset(seed=[1, 2, 3]), reference.reset(seed=[1, 2, 3]))
        observations, infos = pool.reset(seed=[4, None, 6])  # env 1 goes on with its generator
        assert same((observations, infos), reference.reset(seed=[4, None, 6]))
        assert infos["seeded"].tolist() == [True, False, True] and infos["_seeded"].all()
        seen: set[str] = set()
        for t in range(14):
            actions = np.array([t % 2, 0, 1])
            ours = pool.step(actions)
            assert_same_step(ours, reference.step(actions), pool.single_observation_space, f"step {t}")
            seen |= set(ours[4])
        assert {"ratio", "f32", "i16", "u8", "vec", "grid", "nested", "_nested"} <= seen


def test_non_numeric_infos_are_left_out_with_a_warning(pool_name: str) -> None:
    """NOT_SUPPORTED: infos that are not numeric; SyncVectorEnv keeps them as object arrays."""
    with closing(SyncVectorEnv([lambda: helpers.InfoEnv(with_text=True)] * 2)) as reference:
        reference.reset(seed=0)
        assert reference.step([0, 1])[4]["label"].dtype == object
    with shmpool.launch(lambda: helpers.InfoEnv(with_text=True), 2, num_workers=1, name=pool_name) as pool:
        pool.reset(seed=0)
        with pytest.warns(RuntimeWarning, match="'label'"):
            infos = pool.step([0, 1])[4]
        assert "label" not in infos and "_label" not in infos and "count" in infos


# -- seeding -------------------------------------------------------------------------------------


def test_seeding_by_int_list_and_none_matches_sync(pool_name: str) -> None:
    """gymnasium's test_random_seeding_basics, lists of seeds with None, and the generators' states."""
    with (
        closing(SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3)) as reference,
        shmpool.launch("CartPole-v1", 3, num_workers=2, name=pool_name) as pool,
    ):
        assert same(pool.reset(seed=42)[0], reference.reset(seed=42)[0])
        assert pool.np_random_seed == reference.np_random_seed == (42, 43, 44)
        assert same(pool.reset(seed=None)[0], reference.reset(seed=None)[0])
        assert pool.np_random_seed == (42, 43, 44), "reset(seed=None) keeps the seeds"
        assert same(pool.reset(seed=[7, None, 9])[0], reference.reset(seed=[7, None, 9])[0])
        assert pool.np_random_seed == reference.np_random_seed == (7, 43, 9)
        ours, theirs = pool.np_random, reference.np_random
        assert len(ours) == 3 and all(isinstance(generator, np.random.Generator) for generator in ours)
        assert [g.bit_generator.state for g in ours] == [g.bit_generator.state for g in theirs]
        for vector_env in (pool, reference):
            with pytest.raises(
                ValueError if vector_env is pool else helpers.sync_error(ValueError), match="num_envs=3"
            ):
                vector_env.reset(seed=[1, 2])


@pytest.mark.parametrize("bad_seed", [-3, 2.7, "1"], ids=["negative", "float", "str"])
def test_seeds_gymnasium_refuses_are_refused_and_the_pool_stays_usable(bad_seed: Any, pool_name: str) -> None:
    with (
        closing(SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)) as reference,
        shmpool.launch("CartPole-v1", 2, num_workers=2, name=pool_name) as pool,
    ):
        for vector_env in (reference, pool):
            with pytest.raises(gym.error.Error, match="Seed must be"):
                vector_env.reset(seed=[1, bad_seed])
        assert same(pool.reset(seed=1), reference.reset(seed=1))


def test_seeds_of_any_size(pool_name: str) -> None:
    seed = 2**64 + 5
    with (
        closing(SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)) as reference,
        shmpool.launch("CartPole-v1", 2, num_workers=2, name=pool_name) as pool,
    ):
        assert same(pool.reset(seed=seed), reference.reset(seed=seed))
        assert pool.np_random_seed == reference.np_random_seed == (seed, seed + 1)


def test_seeds_set_by_the_factories_are_reported_before_any_reset(pool_name: str) -> None:
    """gymnasium's test_random_seeds_set_at_retrieval: factories that seed their env at creation."""
    env_fns = [seeded_cartpole(i) for i in range(3)]
    with closing(SyncVectorEnv(env_fns)) as reference, shmpool.launch(env_fns, num_workers=2, name=pool_name) as pool:
        assert pool.np_random_seed == reference.np_random_seed == (0, 1, 2)


def test_action_space_samples_match_sync(pool_name: str) -> None:
    """gymnasium's test_sync_vector_env_seed / _determinism: the batched action space carries the
    random state of the first env's seeded action space."""
    env_fns = [seeded_cartpole(123) for _ in range(3)]
    with closing(SyncVectorEnv(env_fns)) as reference, shmpool.launch(env_fns, num_workers=2, name=pool_name) as pool:
        assert pool.action_space.np_random.bit_generator.state == reference.action_space.np_random.bit_generator.state
        for _ in range(50):
            assert same(pool.action_space.sample(), reference.action_space.sample())


# -- call, get_attr, set_attr, render ------------------------------------------------------------


def test_call_get_attr_and_set_attr_match_sync(pool_name: str) -> None:
    """gymnasium's test_call_*/test_set_attr_* plus set_attr's single-value forms and wrapper attributes."""
    env_fns = [seeded_cartpole(i) for i in range(4)]
    with (
        closing(SyncVectorEnv(env_fns)) as reference,
        shmpool.launch(env_fns, num_workers=2, episode_statistics=False, name=pool_name) as pool,
    ):
        gravity = pool.call("gravity")
        assert isinstance(gravity, tuple) and gravity == reference.call("gravity") == (9.8,) * 4
        assert all(isinstance(value, float) for value in gravity)
        for vector_env in (pool, reference):
            vector_env.set_attr("gravity", [9.81, 3.72, 8.87, 1.62])
        assert pool.get_attr("gravity") == reference.get_attr("gravity") == (9.81, 3.72, 8.87, 1.62)
        for vector_env in (pool, reference):
            vector_env.set_attr("gravity", (1.0, 2.0, 3.0, 4.0))
        assert pool.get_attr("gravity") == (1.0, 2.0, 3.0, 4.0)
        for vector_env in (pool, reference):
            vector_env.set_attr("gravity", 5.0)  # one value, for every env
        assert pool.get_attr("gravity") == (5.0,) * 4
        for vector_env in (pool, reference):
            vector_env.set_attr("force_mag", np.array([1.0, 2.0]))  # an array is one value, not one per env
        assert same(pool.get_attr("force_mag"), reference.get_attr("force_mag"))
        for vector_env in (pool, reference):
            vector_env.set_attr("force_mag", 10.0)
        # attributes found on wrappers, as get_wrapper_attr / set_wrapper_attr find them
        assert pool.get_attr("_max_episode_steps") == reference.get_attr("_max_episode_steps") == (500,) * 4
        for vector_env in (pool, reference):
            vector_env.set_attr("_max_episode_steps", [3, 4, 5, 6])
        # a method with arguments; a missing attribute raises AttributeError and the pool stays usable
        assert same(pool.call("get_wrapper_attr", "gravity"), reference.call("get_wrapper_attr", "gravity"))
        for vector_env in (pool, reference):
            with pytest.raises(AttributeError, match="no_such_attribute"):
                vector_env.get_attr("no_such_attribute")
        assert same(pool.reset(seed=1), reference.reset(seed=1))
        for t in range(7):
            actions = np.array([0, 1, 0, 1])
            ours = pool.step(actions)
            assert_same_step(ours, reference.step(actions), pool.single_observation_space, f"step {t}")
            if t in (2, 3, 4, 5):
                assert ours[3][t - 2], "set_attr('_max_episode_steps') truncates env t - 2 after t + 1 steps"


def test_call_passes_arguments_and_keywords(pool_name: str) -> None:
    with (
        closing(SyncVectorEnv([CountEnv] * 3)) as reference,
        shmpool.launch(CountEnv, 3, num_workers=2, name=pool_name) as pool,
    ):
        for vector_env in (pool, reference):
            vector_env.reset(options={"start": 2})
            vector_env.step([0, 0, 0])
        assert pool.call("scaled", 2.0, offset=0.5) == reference.call("scaled", 2.0, offset=0.5) == (6.5,) * 3
        assert pool.call("max_count") == (3, 3, 3), "call of an attribute that is not callable returns it"


@pytest.mark.parametrize("values", [[1, 2], (1, 2, 3, 4), []], ids=["short-list", "long-tuple", "empty"])
def test_set_attr_with_the_wrong_number_of_values_raises_value_error(values: Any, pool_name: str) -> None:
    with (
        closing(SyncVectorEnv([CountEnv] * 3)) as reference,
        shmpool.launch(CountEnv, 3, num_workers=2, name=pool_name) as pool,
    ):
        for vector_env in (pool, reference):
            with pytest.raises(ValueError, match="Values must be a list or tuple with length equal to the number"):
                vector_env.set_attr("max_count", values)
        assert pool.get_attr("max_count") == (3, 3, 3)


def test_render_rgb_array_frames_equal_sync(pool_name: str) -> None:
    """gymnasium's test_render_sync_vector / _async_vector, frames compared pixel for pixel."""
    env_fns = [seeded_cartpole(i, render_mode="rgb_array") for i in range(3)]
    with (
        closing(SyncVectorEnv(env_fns)) as reference,
        shmpool.launch(
            "CartPole-v1", 3, num_workers=2, env_kwargs={"render_mode": "rgb_array"}, name=pool_name
        ) as pool,
    ):
        assert pool.render_mode == reference.render_mode == "rgb_array"
        pool.reset(seed=0)
        reference.reset(seed=0)
        for t in range(3):
            frames = pool.render()
            assert isinstance(frames, tuple) and len(frames) == 3
            assert all(isinstance(frame, np.ndarray) and frame.dtype == np.uint8 for frame in frames)
            assert same(frames, reference.render()), f"frames after {t} steps"
            assert same(pool.call("render"), reference.call("render"))
            pool.step([0, 1, 1])
            reference.step([0, 1, 1])


def test_render_rgb_array_list_and_no_render_mode(pool_name: str) -> None:
    """gymnasium's test_call_sync_vector_env (call('render') with rgb_array_list); render_mode None."""
    env_fns = [seeded_cartpole(i, render_mode="rgb_array_list") for i in range(2)]
    with closing(SyncVectorEnv(env_fns)) as reference, shmpool.launch(env_fns, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=0)
        reference.reset(seed=0)
        images = pool.call("render")
        assert isinstance(images, tuple) and len(images) == 2
        assert all(len(image) == 1 and isinstance(image[0], np.ndarray) for image in images)
        assert same(images, reference.call("render"))
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name + "-b") as pool:
        assert pool.render_mode is None


# -- env given as a list of callables --------------------------------------------------------------


def test_env_fns_as_a_list_without_num_envs(pool_name: str) -> None:
    """SyncVectorEnv(env_fns): each env is made by its own callable, in order."""
    env_fns = [partial(gym.make, "Pendulum-v1", g=g, max_episode_steps=15) for g in (9.81, 1.62, 3.72)]
    with closing(SyncVectorEnv(env_fns)) as reference, shmpool.launch(env_fns, num_workers=2, name=pool_name) as pool:
        assert pool.num_envs == 3
        assert pool.get_attr("g") == reference.get_attr("g") == (9.81, 1.62, 3.72)
        assert same(pool.reset(seed=8), reference.reset(seed=8))
        reference.action_space.seed(0)
        for t in range(20):
            actions = reference.action_space.sample()
            ours = pool.step(actions)
            theirs = reference.step(actions)
            for our_key in ("episode", "_episode"):  # the pool's own episode statistics (default on)
                ours[4].pop(our_key, None)
            assert_same_step(ours, theirs, pool.single_observation_space, f"step {t}")


def test_env_fns_with_different_spaces_raise_runtime_error(pool_name: str) -> None:
    """gymnasium's test_check_spaces_*: envs whose spaces differ are refused with a RuntimeError."""
    env_fns = [seeded_cartpole(i) for i in range(4)]
    env_fns[1] = lambda: gym.make("FrozenLake-v1")
    with pytest.raises(helpers.sync_error(RuntimeError), match="observation spaces are not equivalent"):
        SyncVectorEnv(env_fns)
    with pytest.raises(RuntimeError, match="same spaces"):
        shmpool.launch(env_fns, num_workers=2, name=pool_name)


def test_observation_mode_different(pool_name: str) -> None:
    env_fns = [partial(BoundedEnv, high) for high in (1.0, 2.0, 3.0)]
    with (
        closing(SyncVectorEnv(env_fns, observation_mode="different")) as reference,
        shmpool.launch(env_fns, num_workers=2, observation_mode="different", name=pool_name) as pool,
    ):
        expected_space = batch_differing_spaces([spaces.Box(0.0, high, (3,), np.float32) for high in (1.0, 2.0, 3.0)])
        assert pool.observation_space == reference.observation_space == expected_space
        assert pool.single_observation_space == reference.single_observation_space
        assert same(pool.reset(seed=0), reference.reset(seed=0))
        assert_same_step(pool.step([0, 1, 0]), reference.step([0, 1, 0]), pool.single_observation_space, "step")


# -- errors ----------------------------------------------------------------------------------------


def test_use_after_close_raises_closed_environment_error(pool_name: str) -> None:
    """gymnasium's test_already_closed_async_vector_env, for every call; close is idempotent."""
    pool = shmpool.launch(CountEnv, 2, num_workers=2, name=pool_name)
    pool.reset(seed=0)
    assert not pool.closed
    pool.close()
    assert pool.closed
    calls: dict[str, Callable[[], Any]] = {
        "reset": pool.reset,
        "step": lambda: pool.step([0, 0]),
        "call": lambda: pool.call("max_count"),
        "get_attr": lambda: pool.get_attr("max_count"),
        "set_attr": lambda: pool.set_attr("max_count", 4),
        "render": pool.render,
        "np_random_seed": lambda: pool.np_random_seed,
        "np_random": lambda: pool.np_random,
    }
    for name, call in calls.items():
        try:
            call()
        except gym.error.ClosedEnvironmentError:
            continue
        pytest.fail(f"{name} after close did not raise ClosedEnvironmentError")
    pool.close()
    assert pool.closed


def test_wrong_actions_raise_as_sync_does(pool_name: str) -> None:
    """step(0) is a TypeError (not a batch), a batch of the wrong size a ValueError, in both. (Sync
    finds a wrong size only once it has stepped the envs it had actions for; the pool refuses first.)"""
    with (
        closing(SyncVectorEnv([CountEnv] * 3)) as reference,
        shmpool.launch(CountEnv, 3, num_workers=2, name=pool_name) as pool,
    ):
        for vector_env in (pool, reference):
            vector_env.reset(seed=0)
            with pytest.raises(TypeError):
                vector_env.step(0)
            with pytest.raises(ValueError):
                vector_env.step([0, 1])
            with pytest.raises(ValueError):
                vector_env.step([0, 1, 1, 1])
        assert pool.step([1, 2, 3])[0].tolist() == [1, 1, 1], "the refused steps stepped nothing"


def test_actions_outside_the_space_are_refused(pool_name: str) -> None:
    """NOT_SUPPORTED: actions outside the action space (Sync passes them to the env)."""
    with (
        closing(SyncVectorEnv([CountEnv] * 2)) as reference,
        shmpool.launch(CountEnv, 2, num_workers=2, name=pool_name) as pool,
    ):
        reference.reset(seed=0)
        reference.step([7, 1])  # Discrete(5): Sync does not look
        pool.reset(seed=0)
        with pytest.raises(ValueError, match=r"env 0: action 7 .*outside Discrete\(5\)"):
            pool.step([7, 1])
        with pytest.raises(ValueError, match="cannot be cast"):
            pool.step(np.array([0.5, 1.0]))
        assert pool.step([1, 1])[0].tolist() == [1, 1], "nothing was sent: the pool goes on"


def test_an_env_raising_in_reset_reaches_the_caller(pool_name: str) -> None:
    """gymnasium's test_async_vector_subenv_error. NOT_SUPPORTED: the env's own exception type (the
    pool raises WorkerError, a RuntimeError, with the env's traceback as its cause)."""
    with closing(SyncVectorEnv([RaisingEnv] * 2)) as reference:
        reference.reset(seed=[0, 0])
        with pytest.raises(ValueError, match="Error in reset"):
            reference.reset(seed=[1, 0])
    with shmpool.launch(RaisingEnv, 2, num_workers=2, name=pool_name) as pool:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a healthy reset warns nothing (Async warns nothing either)
            pool.reset(seed=[0, 0])
        with pytest.raises(RuntimeError, match="env 0 .*during reset: ValueError: Error in reset") as caught:
            pool.reset(seed=[1, 0])
        assert isinstance(caught.value, shmpool.WorkerError)
        assert 'raise ValueError("Error in reset")' in str(caught.value.__cause__)
        with pytest.raises(shmpool.PoolBrokenError):
            pool.reset(seed=[0, 0])


# -- wrappers from gymnasium.wrappers.vector on top of the pool ---------------------------------------


def _wrapper_state(wrapper: Any) -> dict[str, Any]:
    """The statistics a stateful vector wrapper accumulates, to compare once the run is over."""
    while wrapper is not None and not isinstance(wrapper, shmpool.Pool | SyncVectorEnv):
        if isinstance(wrapper, vector_wrappers.NormalizeObservation):
            return {"mean": wrapper.obs_rms.mean, "var": wrapper.obs_rms.var, "count": wrapper.obs_rms.count}
        if isinstance(wrapper, vector_wrappers.NormalizeReward):
            rms = wrapper.return_rms
            return {"mean": rms.mean, "var": rms.var, "count": rms.count, "accumulated": wrapper.accumulated_reward}
        if isinstance(wrapper, vector_wrappers.RecordEpisodeStatistics):
            return {
                "episodes": wrapper.episode_count,
                "returns": list(wrapper.return_queue),
                "lengths": list(wrapper.length_queue),
            }
        wrapper = getattr(wrapper, "env", None)
    return {}


def _without_episode_times(infos: Any) -> tuple[Any, list[np.ndarray]]:
    """Infos with the wall-clock ``t`` of RecordEpisodeStatistics taken out (it differs between runs)."""
    if isinstance(infos, list):  # DictInfoToList
        parts = [_without_episode_times(info) for info in infos]
        return [part[0] for part in parts], [time for part in parts for time in part[1]]
    if "episode" not in infos:
        return infos, []
    episode = dict(infos["episode"])
    return {**infos, "episode": {k: v for k, v in episode.items() if k != "t"}}, [episode["t"]]


WRAPPERS: list[tuple[str, Any, dict[str, Any], Callable[[VectorEnv], VectorEnv]]] = [
    ("RecordEpisodeStatistics", "CartPole-v1", {}, vector_wrappers.RecordEpisodeStatistics),
    ("NormalizeObservation", "CartPole-v1", {}, vector_wrappers.NormalizeObservation),
    ("NormalizeReward", "CartPole-v1", {}, vector_wrappers.NormalizeReward),
    ("ClipReward", "CartPole-v1", {}, partial(vector_wrappers.ClipReward, min_reward=-0.25, max_reward=0.75)),
    ("TransformReward", "CartPole-v1", {}, partial(vector_wrappers.TransformReward, func=lambda r: 2 * r - 1)),
    ("FlattenObservation", "CartPole-v1", {}, vector_wrappers.FlattenObservation),
    ("DtypeObservation", "CartPole-v1", {}, partial(vector_wrappers.DtypeObservation, dtype=np.float64)),
    (
        "RescaleObservation",
        "CartPole-v1",
        {},
        partial(
            vector_wrappers.RescaleObservation,
            min_obs=np.array([0, -np.inf, 0, -np.inf]),
            max_obs=np.array([1, np.inf, 1, np.inf]),
        ),
    ),
    ("ReshapeObservation", "CartPole-v1", {}, partial(vector_wrappers.ReshapeObservation, shape=(2, 2))),
    (
        "TransformObservation",
        "CartPole-v1",
        {},
        partial(vector_wrappers.TransformObservation, func=lambda obs: obs + 100),
    ),
    (
        "DictInfoToList",
        "CartPole-v1",
        {},
        lambda env: vector_wrappers.DictInfoToList(vector_wrappers.RecordEpisodeStatistics(env)),
    ),
    ("FilterObservation", DictObsEnv, {}, partial(vector_wrappers.FilterObservation, filter_keys=["a"])),
    ("FlattenObservation-Dict", DictObsEnv, {}, vector_wrappers.FlattenObservation),
    ("ClipAction", "MountainCarContinuous-v0", {"max_episode_steps": 20}, vector_wrappers.ClipAction),
    (
        "RescaleAction",
        "MountainCarContinuous-v0",
        {"max_episode_steps": 20},
        partial(vector_wrappers.RescaleAction, min_action=1, max_action=2),
    ),
    (
        "TransformAction",
        "MountainCarContinuous-v0",
        {"max_episode_steps": 20},
        partial(vector_wrappers.TransformAction, func=lambda action: 0.5 * action),
    ),
    (
        "VectorizeTransformAction",
        "MountainCarContinuous-v0",
        {"max_episode_steps": 20},
        partial(
            vector_wrappers.VectorizeTransformAction,
            wrapper=gym.wrappers.TransformAction,
            func=lambda action: action["key"],
            action_space=spaces.Dict({"key": spaces.Box(-1.0, 1.0, (1,), np.float32)}),
        ),
    ),
    (
        "VectorizeTransformObservation",
        "CartPole-v1",
        {},
        partial(
            vector_wrappers.VectorizeTransformObservation,
            wrapper=gym.wrappers.TransformObservation,
            func=lambda obs: {"x": obs[:1], "rest": obs[1:]},
            observation_space=spaces.Dict(
                {
                    "x": spaces.Box(-np.inf, np.inf, (1,), np.float32),
                    "rest": spaces.Box(-np.inf, np.inf, (3,), np.float32),
                }
            ),
        ),
    ),
]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
@pytest.mark.parametrize(("name", "env", "env_kwargs", "wrap"), WRAPPERS, ids=[case[0] for case in WRAPPERS])
def test_vector_wrappers_on_the_pool_match_sync(
    name: str, env: Any, env_kwargs: dict[str, Any], wrap: Callable, mode: AutoresetMode, pool_name: str
) -> None:
    """gymnasium's tests/wrappers/vector: each vector wrapper over the pool (launched with
    episode_statistics=False, so RecordEpisodeStatistics owns infos["episode"]) gives what it gives
    over SyncVectorEnv, its accumulated statistics included. A wrapper that refuses an autoreset mode
    (gymnasium 1.4's observation wrappers refuse SAME_STEP) refuses it on the pool with the same error."""
    factory = partial(gym.make, env, **env_kwargs) if isinstance(env, str) else env
    with (
        closing(SyncVectorEnv([factory] * 3, autoreset_mode=mode)) as reference_env,
        shmpool.launch(
            env, 3, num_workers=2, autoreset_mode=mode, env_kwargs=env_kwargs, episode_statistics=False, name=pool_name
        ) as pool,
    ):
        try:
            reference = wrap(reference_env)
        except helpers.sync_error(ValueError) as refused:
            if helpers.OLD_GYMNASIUM:  # its wrappers refused SAME_STEP with a bare assert: no text to match
                with pytest.raises(AssertionError):
                    wrap(pool)
                return
            with pytest.raises(ValueError, match=re.escape(str(refused))):
                wrap(pool)
            return
        wrapped = wrap(pool)
        assert wrapped.observation_space == reference.observation_space
        assert wrapped.single_observation_space == reference.single_observation_space
        assert wrapped.action_space == reference.action_space
        assert wrapped.single_action_space == reference.single_action_space
        assert same(wrapped.reset(seed=123), reference.reset(seed=123))
        reference.action_space.seed(4)
        episodes = 0
        for t in range(60):
            actions = reference.action_space.sample()
            ours, theirs = wrapped.step(actions), reference.step(actions)
            our_infos, our_times = _without_episode_times(ours[4])
            their_infos, their_times = _without_episode_times(theirs[4])
            for our_time, their_time in zip(our_times, their_times, strict=True):
                assert our_time.shape == their_time.shape and our_time.dtype == their_time.dtype
            if isinstance(our_infos, list):
                assert same(ours[:4], theirs[:4]) and len(our_infos) == len(their_infos) == 3
                for env_id, (mine, expected) in enumerate(zip(our_infos, their_infos)):
                    assert_same_infos(mine, expected, wrapped.single_observation_space, f"step {t} env {env_id}")
            else:
                assert_same_step(
                    (*ours[:4], our_infos), (*theirs[:4], their_infos), wrapped.single_observation_space, f"step {t}"
                )
            episodes += int((ours[2] | ours[3]).sum())
        assert episodes >= 3, "the run should cross episode ends"
        assert same(_wrapper_state(wrapped), _wrapper_state(reference))


def test_record_episode_statistics_needs_episode_statistics_false(pool_name: str) -> None:
    """The pool reports infos["episode"] itself by default, so gymnasium's RecordEpisodeStatistics
    refuses to overwrite it (ValueError at the first episode end): launch with episode_statistics=False."""
    with closing(
        vector_wrappers.RecordEpisodeStatistics(shmpool.launch(CountEnv, 2, num_workers=2, name=pool_name))
    ) as wrapped:
        wrapped.reset(seed=0)
        wrapped.step([0, 0])
        wrapped.step([0, 0])
        with pytest.raises(ValueError, match="key 'episode' .*already exists"):
            wrapped.step([0, 0])


class CountingResets(VectorWrapper):
    """gymnasium's DummyVectorWrapper: counts the resets that pass through it."""

    def __init__(self, env: VectorEnv) -> None:
        super().__init__(env)
        self.counter = 0

    def reset(self, *, seed=None, options=None):
        self.counter += 1
        return super().reset(seed=seed, options=options)


def test_vector_wrapper_forwards_to_the_pool(pool_name: str) -> None:
    """gymnasium's tests/vector/test_vector_wrapper.py on the pool."""
    pool = shmpool.launch("CartPole-v1", 3, num_workers=2, name=pool_name)
    with closing(CountingResets(pool)) as wrapped:
        wrapped.reset(seed=1)
        assert wrapped.counter == 1
        assert wrapped.unwrapped is pool and wrapped.num_envs == 3
        assert wrapped.metadata == pool.metadata and wrapped.render_mode is None
        assert wrapped.np_random_seed == pool.np_random_seed == (1, 2, 3)
        inner: Any = wrapped.env
        assert np.allclose(inner.call("gravity"), (9.8,) * 3)
        inner.set_attr("gravity", [20.0, 20.0, 20.0])
        assert pool.get_attr("gravity") == (20.0, 20.0, 20.0)
        wrapped.step(wrapped.action_space.sample())
    assert pool.closed, "closing the wrapper closes the pool"
