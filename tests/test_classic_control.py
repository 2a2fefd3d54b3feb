"""gymnasium's classic-control envs (:mod:`shmpool.classic_control`): every parameter of the documented table
changes the dynamics exactly as a hand edit does, and CartPole's derived values follow its parameters."""

from __future__ import annotations

import gymnasium as gym
import helpers
import numpy as np
import pytest
from helpers import RenamedCartPole

import shmpool
from shmpool import Param

# The documented table: every classic-control parameter shmpool is tested to bind correctly, with a
# value far enough from nominal to change the trajectory.
CLASSIC_PARAMS = [
    ("CartPole-v1", "gravity", 15.0),
    ("CartPole-v1", "masscart", 2.0),
    ("CartPole-v1", "masspole", 0.5),
    ("CartPole-v1", "length", 0.9),
    ("CartPole-v1", "force_mag", 5.0),
    ("CartPole-v1", "tau", 0.03),
    ("Pendulum-v1", "g", 4.0),
    ("Pendulum-v1", "m", 2.0),
    ("Pendulum-v1", "l", 0.5),
    ("Pendulum-v1", "max_speed", 2.0),
    ("Pendulum-v1", "max_torque", 0.5),
    ("Pendulum-v1", "dt", 0.1),
    ("MountainCar-v0", "force", 0.003),
    ("MountainCar-v0", "gravity", 0.004),
    ("MountainCarContinuous-v0", "power", 0.003),
    ("Acrobot-v1", "LINK_LENGTH_1", 1.5),
    ("Acrobot-v1", "LINK_MASS_1", 2.0),
    ("Acrobot-v1", "LINK_MASS_2", 0.5),
    ("Acrobot-v1", "LINK_COM_POS_1", 0.3),
    ("Acrobot-v1", "LINK_COM_POS_2", 0.7),
    ("Acrobot-v1", "LINK_MOI", 2.0),
]


def configured(env_id: str, name: str, value: float) -> gym.Env:
    """A plain gymnasium env with the parameter set by hand, derived quantities included."""
    env = gym.make(env_id)
    setattr(env.unwrapped, name, value)
    if env_id.startswith("CartPole"):
        env.unwrapped.total_mass = env.unwrapped.masspole + env.unwrapped.masscart
        env.unwrapped.polemass_length = env.unwrapped.masspole * env.unwrapped.length
    return env


@pytest.mark.parametrize("engine", helpers.ENGINES)
@pytest.mark.parametrize("env_id, name, value", CLASSIC_PARAMS)
def test_classic_control_parameter_changes_dynamics_exactly(
    env_id: str, name: str, value: float, engine: str, pool_name: str
) -> None:
    references = [gym.make(env_id), configured(env_id, name, value)]
    with shmpool.launch(
        env_id, 2, num_workers=2, name=pool_name, params={name: Param(low=0, high=100)}, engine=engine
    ) as pool:
        nominal = float(pool.params[name][0])
        assert nominal == getattr(references[0].unwrapped, name)
        pool.params[name][1] = value
        observations, _ = pool.reset(seed=10)
        expected = [ref.reset(seed=10 + i)[0] for i, ref in enumerate(references)]
        np.testing.assert_array_equal(observations, np.stack(expected))
        assert pool.applied[name].tolist() == [nominal, value]
        pool.action_space.seed(0)
        differs = False
        for t in range(40):
            actions = pool.action_space.sample()
            observations, rewards, terminations, truncations, _ = pool.step(actions)
            for i, ref in enumerate(references):
                expected_obs, expected_reward, terminated, truncated, _ = ref.step(actions[i])
                np.testing.assert_array_equal(observations[i], expected_obs, err_msg=f"step {t} env {i}")
                assert rewards[i] == expected_reward
            differs |= not np.array_equal(observations[0], observations[1])
            if terminations.any() or truncations.any():
                break
        assert differs, "the parameter should change the trajectory"


def test_cartpole_derived_values_follow_in_a_subclass_made_by_a_callable(pool_name: str) -> None:
    reference = RenamedCartPole()
    reference.masspole = 0.5
    reference.total_mass = reference.masspole + reference.masscart
    reference.polemass_length = reference.masspole * reference.length
    params = {"masspole": Param(low=0, high=10)}
    with shmpool.launch(RenamedCartPole, 1, num_workers=1, name=pool_name, params=params) as pool:
        pool.params["masspole"][0] = 0.5
        observation = pool.reset(seed=2)[0][0]
        np.testing.assert_array_equal(observation, reference.reset(seed=2)[0])
        for t in range(8):
            np.testing.assert_array_equal(pool.step([t % 2])[0][0], reference.step(t % 2)[0], err_msg=f"step {t}")


@pytest.mark.parametrize("engine", helpers.ENGINES)
@pytest.mark.parametrize(
    ("derived", "source"), [("total_mass", "masscart"), ("polemass_length", "length"), ("total_mass", "length")]
)
def test_a_derived_cartpole_value_declared_beside_what_it_is_derived_from_is_refused(
    derived: str, source: str, engine: str, pool_name: str
) -> None:
    """CartPole recomputes ``total_mass`` and ``polemass_length`` whenever ``masscart``, ``masspole``
    or ``length`` changes: declared beside one of them, a written ``total_mass`` was replaced by the
    env while ``pool.applied`` showed it. Declared alone, it is what the env uses."""
    params = {source: Param(low=0.01, high=10), derived: Param(low=0.01, high=20)}
    with pytest.raises(ValueError, match=rf"params\['{derived}'\].*params\['{source}'\]"):
        shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params, engine=engine)
    with shmpool.launch(
        "CartPole-v1", 2, num_workers=1, name=pool_name, params={derived: params[derived]}, engine=engine
    ) as pool:
        pool.params[derived][1] = 3.0
        pool.reset(seed=0)
        pool.step([0, 0])
        assert pool.applied[derived][1] == 3.0
        if engine == "python":
            assert pool.get_attr(derived)[1] == 3.0
