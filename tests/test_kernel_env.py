"""Attributes of the numba engine's envs through control calls: ``set_attr`` and
``get_attr`` do what they do on gymnasium's envs (``SyncVectorEnv``, ``engine="python"``) with the same
seeds and actions, or raise; a write is never silently ignored."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from gymnasium.vector.utils import batch_space

import shmpool
from shmpool import Param
from shmpool.errors import ShmpoolError

pytest.importorskip("numba", reason='needs numba: pip install ".[numba]"')

NUM_ENVS = 4
#: Per step ``t``: what to do with the vector env before its step (set_attr, params writes).
Script = Mapping[int, Callable[[Any], None]]


def run(
    env_id: str,
    engine: str,
    name: str,
    script: Script,
    steps: int,
    reads: tuple[str, ...] = (),
    **options: Any,
) -> list[Any]:
    """Every observation, reward, termination and truncation of ``steps`` steps of ``env_id`` on
    ``engine`` (``"sync"``: gymnasium's SyncVectorEnv), seeded the same way, with ``script`` run before
    the steps it names and the attributes ``reads`` read (get_attr) after each step."""
    space = batch_space(gym.make(env_id).action_space, NUM_ENVS)
    space.seed(5)
    actions = [space.sample() for _ in range(steps)]
    kwargs = options.pop("env_kwargs", {})
    if engine == "sync":
        envs: Any = SyncVectorEnv([lambda: gym.make(env_id, **kwargs) for _ in range(NUM_ENVS)])
    else:
        envs = shmpool.launch(env_id, NUM_ENVS, num_workers=2, engine=engine, name=name, env_kwargs=kwargs, **options)
    results: list[Any] = []
    try:
        results.append(envs.reset(seed=11)[0])
        for t, action in enumerate(actions):
            if t in script:
                script[t](envs)
            results += envs.step(action)[:4]
            results += [np.array(envs.get_attr(attribute)) for attribute in reads]
    finally:
        envs.close()
    return results


def assert_same_runs(ours: list[Any], theirs: list[Any]) -> None:
    assert len(ours) == len(theirs)
    for index, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"result {index}: {a!r} != {b!r}"
        assert a.tobytes() == b.tobytes(), f"result {index}: {a!r} != {b!r}"


def test_time_limit_attributes_follow_set_attr(pool_name: str) -> None:
    """A new ``_max_episode_steps`` truncates from the next step on and a new ``_elapsed_steps``
    counts on from its value, per env, as gymnasium's ``TimeLimit`` does; both read back as there."""

    def shorten(envs: Any) -> None:
        envs.set_attr("_max_episode_steps", [3, 5, 3, 8])

    def count_on(envs: Any) -> None:
        envs.set_attr("_elapsed_steps", [0, 4, 2, 7])

    script = {2: shorten, 40: count_on, 60: lambda envs: envs.set_attr("_max_episode_steps", 500)}
    reads = ("_elapsed_steps", "_max_episode_steps")
    numba = run("CartPole-v1", "numba", pool_name + "n", script, 80, reads)
    assert_same_runs(numba, run("CartPole-v1", "sync", "", script, 80, reads))
    assert_same_runs(numba, run("CartPole-v1", "python", pool_name + "p", script, 80, reads))
    truncations = np.array(numba[4::6][2:40])  # after the reset, 4 results and 2 reads per step
    assert truncations.any(axis=0).all(), "every env should have been truncated by its new limit"


def test_time_limit_attributes_take_ints_only(pool_name: str) -> None:
    with shmpool.launch("MountainCar-v0", 2, num_workers=1, engine="numba", name=pool_name) as pool:
        pool.reset(seed=0)
        pool.set_attr("_max_episode_steps", np.int64(2))
        assert [pool.step(np.ones(2, np.int64))[3].all() for _ in range(2)] == [False, True]
        with pytest.raises(TypeError, match=r"MountainCar-v0 .*_max_episode_steps = None refused: it must be an int"):
            pool.set_attr("_max_episode_steps", None)  # gymnasium's TimeLimit would fail at the next step
        assert pool.get_attr("_max_episode_steps") == (2, 2)


def test_cartpole_constants_follow_set_attr_as_gymnasiums_do(pool_name: str) -> None:
    """CartPoleEnv computes ``total_mass`` and ``polemass_length`` once, in ``__init__``: setting
    ``masspole`` or ``length`` later leaves them as they were, and setting them changes them."""

    def heavier_pole(envs: Any) -> None:
        envs.set_attr("masspole", 0.5)

    def longer_pole(envs: Any) -> None:
        envs.set_attr("length", [1.5, 0.5, 1.5, 0.25])

    def cached_values(envs: Any) -> None:
        envs.set_attr("total_mass", [2.0, 1.1, 1.6, 1.1])
        envs.set_attr("polemass_length", [0.75, 0.05, 0.9, 0.2])

    script = {0: heavier_pole, 10: longer_pole, 30: cached_values}
    reads = ("masspole", "length", "total_mass", "polemass_length")
    numba = run("CartPole-v1", "numba", pool_name, script, 80, reads)
    assert_same_runs(numba, run("CartPole-v1", "sync", "", script, 80, reads))


@pytest.mark.parametrize("when", ["step", "reset"])
def test_params_refresh_cartpoles_cached_constants_as_the_python_engine_does(when: str, pool_name: str) -> None:
    """A declared ``masspole`` recomputes ``total_mass`` and ``polemass_length`` where the Python
    engine's adapter does (a changed value, an episode's values), a set_attr in between does not."""
    params = {"masspole": Param(low=0.0, high=2.0, when=when), "gravity": Param(low=1.0, high=20.0)}

    def longer_pole(envs: Any) -> None:
        envs.set_attr("length", 1.5)  # stale polemass_length until something refreshes it

    def write(**values: Any) -> Callable[[Any], None]:
        return lambda envs: envs.params.write(None, **values)

    def rows(**values: Any) -> Callable[[Any], None]:
        return lambda envs: envs.params.write([0, 1], **values)

    script = {
        5: longer_pole,
        15: rows(masspole=0.3),
        25: write(gravity=12.0),
        35: lambda envs: envs.set_attr("masspole", 0.05),
        45: write(masspole=[0.2, 0.3, 0.4, 0.5]),
        55: longer_pole,
    }
    reads = ("masspole", "length", "total_mass", "polemass_length")
    numba = run("CartPole-v1", "numba", pool_name + "n", script, 80, reads, params=params)
    assert_same_runs(numba, run("CartPole-v1", "python", pool_name + "p", script, 80, reads, params=params))


#: A state of gymnasium's shape for each env, in dtypes gymnasium's env holds it in (or is given).
STATES = [
    ("CartPole-v1", np.array([0.05, -0.1, 0.02, 0.3])),
    ("CartPole-v1", [0, 0, 0, 1]),  # whole numbers: gymnasium steps them in float64
    ("Pendulum-v1", np.array([2.0, -1.0])),
    ("MountainCar-v0", np.array([-0.3, 0.01])),
    ("MountainCarContinuous-v0", np.array([-0.3, 0.01], dtype=np.float32)),  # as after a step: float32 math
    ("MountainCarContinuous-v0", np.array([-0.3, 0.01])),  # as after a reset
    ("Acrobot-v1", np.array([0.5, -0.5, 1.0, -1.0], dtype=np.float32)),  # as after a reset
]


@pytest.mark.parametrize("env_id, state", STATES)
def test_state_takes_gymnasiums_shape(env_id: str, state: Any, pool_name: str) -> None:
    def place(envs: Any) -> None:
        envs.set_attr("state", [np.asarray(state) * (1 + k) for k in range(NUM_ENVS)])

    script = {3: place, 20: place}
    kwargs = {"env_kwargs": {"max_episode_steps": 40}}
    numba = run(env_id, "numba", pool_name, script, 30, ("state",), **kwargs)
    theirs = run(env_id, "sync", "", script, 30, ("state",), **kwargs)
    for index, (a, b) in enumerate(zip(numba, theirs)):  # the states read: float64 views of gymnasium's
        np.testing.assert_array_equal(a, b.astype(a.dtype) if a.ndim == 2 else b, err_msg=f"result {index}")
        assert a.shape == b.shape, f"result {index}"


def test_a_state_gymnasium_would_step_in_float32_is_refused(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 2, num_workers=1, engine="numba", name=pool_name) as pool:
        pool.reset(seed=0)
        with pytest.raises(
            ValueError, match=r"CartPole-v1 .*float32 arithmetic.*np.asarray\(state, dtype=np.float64\)"
        ):
            pool.set_attr("state", np.zeros(4, np.float32))
        with pytest.raises(ValueError, match=r"state of this env is 4 real numbers, got shape \(5,\)"):
            pool.set_attr("state", np.zeros(5))


@pytest.mark.parametrize(
    "env_id, attribute, value",
    [
        ("CartPole-v1", "kinematics_integrator", "semi-implicit euler"),
        ("CartPole-v1", "steps_beyond_terminated", 0),
        ("Pendulum-v1", "screen_dim", 300),
        ("MountainCar-v0", "low", np.array([-1.0, -0.1])),
        ("MountainCarContinuous-v0", "high_state", np.array([0.5, 0.1])),
        ("Acrobot-v1", "torque_noise_max", 0.1),
        ("Acrobot-v1", "book_or_nips", "nips"),
    ],
)
def test_attributes_the_kernel_does_not_model_are_refused(
    env_id: str, attribute: str, value: Any, pool_name: str
) -> None:
    """Gymnasium's env would act on these; the kernel cannot, so setting one raises, naming the
    attribute, the env and what to do instead, and the pool stays usable."""
    with shmpool.launch(env_id, 2, num_workers=1, engine="numba", name=pool_name) as pool:
        pool.reset(seed=0)
        with pytest.raises(AttributeError) as raised:
            pool.set_attr(attribute, value)
        assert isinstance(raised.value, ShmpoolError)
        message = str(raised.value)
        assert f"{env_id} (engine='numba')" in message and repr(attribute) in message
        assert "shmpool.Param in launch(params=...)" in message and "engine='python'" in message
        with pytest.raises(AttributeError, match=repr(attribute)):
            pool.get_attr(attribute)
        pool.set_attr("note", ["a", "b"])  # a name gymnasium's env does not have: kept, as there
        assert pool.get_attr("note") == ("a", "b")
        pool.step(batch_space(pool.single_action_space, 2).sample())
