"""gymnasium's classic-control envs (:mod:`shmpool.classic_control`): every parameter of the documented table
changes the dynamics exactly as a hand edit does, and CartPole's derived values follow its parameters."""

from __future__ import annotations

import warnings

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


# What each env's own CartPole step computes with, changed midway on a pool's envs and on Sync's alike
# (step -> attribute -> one value per env): the slot steps its CartPoles together where every env's step
# is gymnasium's plain one, and each one by one where one is not: another integrator, an attribute that
# computes in more than float64 (a long double), values numpy warns of. Every change lasts until the next.
CARTPOLE_CHANGES: dict[int, dict[str, list[object]]] = {
    10: {"_sutton_barto_reward": [False, True, False, True, False, True]},
    20: {"force_mag": [10.0, np.float32(7.3), 12, np.float64(9.1), True, 10.0]},
    30: {"kinematics_integrator": ["euler", "semi-implicit euler", "euler", "euler", "euler", "euler"]},
    40: {"kinematics_integrator": ["euler"] * 6, "gravity": [9.8, np.longdouble(29) / 3, 9.8, 9.8, 9.8, 9.8]},
    50: {"gravity": [9.8, 12.5, 9.8, np.float32(8.1), 9.8, 9.8]},
    # no force: gymnasium negates an int 0 or False into a 0 without a sign (see the states at 58)
    56: {"force_mag": [10.0, 0, 10.0, False, 10.0, 10.0]},
    62: {"force_mag": [10.0] * 6},
    # numpy warns of an overflow on the way to a finite result (the pole's inertia), then of a division by zero
    80: {"length": [0.5, 0.5, 0.5, 1.5e308, 0.5, 0.5]},
    88: {"total_mass": [1.1, 1.1, 1.1, 1.1, 0.0, 1.1]},
    92: {"length": [0.5] * 6, "total_mass": [1.1] * 6},
}
# Env 1 fallen and stepped once since, set by a hook at this step: its next step warns and rewards 0.
FALLEN_AT = 97
# States a hook sets in the worker (no control call, so the slot has been stepping its envs together):
# signed zeros, a float32 state (gymnasium's step computes with it in float32), an angle that is not
# finite and a velocity beyond float32's range (numpy warns of both).
CARTPOLE_STATES: dict[int, list[np.ndarray]] = {
    58: [np.array([0.0, -0.0, -0.0, -0.0])] * 6,
    64: [np.array([0.01, 0.2, -0.03, 0.1], dtype=np.float32), *(np.array([0.0, 0.1, 0.02, -0.1]),) * 5],
    75: [np.array([0.0, 0.1, 0.02, -0.1]), np.array([0.0, 0.0, np.inf, 0.0]), *(np.zeros(4),) * 4],
    # finite, but beyond float32's range: numpy warns as it casts the observation
    94: [np.array([0.0, 1e39, 0.0, 0.0]), *(np.array([0.0, 0.1, 0.02, -0.1]),) * 5],
}


@pytest.mark.parametrize("trainer_slot", [False, True])
@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP])
def test_cartpoles_stepped_together_match_sync_as_what_each_steps_with_changes(
    mode: gym.vector.AutoresetMode, trainer_slot: bool, pool_name: str
) -> None:
    """Equal results and env state, step for step, while the slot steps its CartPoles together, one by
    one, or some reset while the others step (next-step autoreset); in the trainer's slot, numpy's
    warnings come from gymnasium's step, as in Sync."""
    limit = {"max_episode_steps": 12}  # truncations, beside the terminations
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", **limit) for _ in range(6)], autoreset_mode=mode)
    reference = gym.wrappers.vector.RecordEpisodeStatistics(sync)
    rng = np.random.default_rng(4)
    with shmpool.launch(
        "CartPole-v1",
        6,
        num_workers=1,
        trainer_slot=trainer_slot,
        autoreset_mode=mode,
        env_kwargs=limit,
        hooks=[
            helpers.SetsStates(CARTPOLE_STATES),
            helpers.ChangesEnv(FALLEN_AT, 1, helpers.make_fallen_and_stepped_again),
        ],
        name=pool_name,
    ) as pool:
        ours, theirs = pool.reset(seed=9), reference.reset(seed=9)
        np.testing.assert_array_equal(ours[0], theirs[0])
        ended = truncated = warned = 0
        for t in range(100):
            for name, values in CARTPOLE_CHANGES.get(t, {}).items():
                pool.set_attr(name, values)
                sync.set_attr(name, values)
            for env, state in zip(sync.envs, CARTPOLE_STATES.get(t, [])):
                env.unwrapped.state = state.copy()
            if t == FALLEN_AT:
                helpers.fallen_and_stepped_again(sync.envs[1])
            actions = rng.integers(0, 2, 6)
            with warnings.catch_warnings(record=True) as our_warnings:
                warnings.simplefilter("always")
                ours = pool.step(actions)
            with warnings.catch_warnings(record=True) as their_warnings:
                warnings.simplefilter("always")
                theirs = reference.step(actions)
            warned += len(their_warnings)
            if trainer_slot:
                assert [(w.message.args, w.filename) for w in our_warnings] == [
                    (w.message.args, w.filename) for w in their_warnings
                ], f"step {t}"
            for label, a, b in zip(("observations", "rewards", "terminations", "truncations"), ours, theirs):
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"step {t} {label}: {a} != {b}"  # -0.0 too
            # each env's episode statistics, counted as Sync's wrapper counts (gymnasium 1.2's misses a step
            # under same-step autoreset)
            if "episode" in theirs[4] and not (helpers.OLD_GYMNASIUM and mode == gym.vector.AutoresetMode.SAME_STEP):
                np.testing.assert_array_equal(ours[4]["_episode"], theirs[4]["_episode"], err_msg=f"step {t}")
                for key in ("r", "l"):
                    np.testing.assert_array_equal(
                        ours[4]["episode"][key], theirs[4]["episode"][key], err_msg=f"step {t}"
                    )
            ended += int(theirs[2].sum())
            truncated += int(theirs[3].sum())
            if t % 10 == 9:  # not every step: a control call makes the slot step each env by itself for a step
                for name in ("state", "steps_beyond_terminated"):
                    for a, b in zip(pool.get_attr(name), sync.get_attr(name)):
                        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), f"step {t} {name}: {a} != {b}"
        assert ended >= 5 and truncated >= 5, "episodes should end in every way the run sets up"
        assert warned, "numpy should have warned of the values the run sets up"
    reference.close()


@pytest.mark.parametrize("trainer_slot", [False, True])
def test_a_partial_step_of_cartpoles_steps_only_those_envs_as_their_own_steps(
    trainer_slot: bool, pool_name: str
) -> None:
    """``step(actions, env_ids)`` steps those envs together, in that order, and leaves the others."""
    envs = [gym.make("CartPole-v1") for _ in range(5)]
    with shmpool.launch("CartPole-v1", 5, num_workers=1, trainer_slot=trainer_slot, name=pool_name) as pool:
        observations, _ = pool.reset(seed=3)
        np.testing.assert_array_equal(observations, [env.reset(seed=3 + i)[0] for i, env in enumerate(envs)])
        # Two whole steps first: gymnasium's checker checks each env's first steps, which go through it.
        rounds = ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [4, 1, 2], [0, 3], [2, 4, 0, 1, 3], [3, 1], [1, 4, 2])
        for t, env_ids in enumerate(rounds):
            actions = np.array([(t + env_id) % 2 for env_id in env_ids])
            ours = pool.step(actions, env_ids=env_ids)
            theirs = [envs[env_id].step(action) for env_id, action in zip(env_ids, actions)]
            for index in range(4):
                np.testing.assert_array_equal(ours[index], [step[index] for step in theirs], err_msg=f"step {t}")
        np.testing.assert_array_equal(pool.get_attr("state"), [env.unwrapped.state for env in envs])


@pytest.mark.parametrize("trainer_slot", [False, True])
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (helpers.write_action_five, r"AssertionError: np\.int64\(5\)"),
        (helpers.shrink_action_space, r"AssertionError: np\.int64\(1\)"),
        (helpers.shrink_action_space_in_place, r"AssertionError: np\.int64\(1\)"),
        (helpers.narrow_action_space_in_place, r"AssertionError: np\.int64\(1\)"),
        (helpers.remove_time_limit_count, "TypeError"),
        (helpers.delete_tau, "AttributeError.*tau"),
        (helpers.OnEnvs(helpers.put_a_non_env), "AttributeError.*step"),
    ],
)
def test_a_cartpole_step_that_fails_names_the_env_as_its_own_step_would(
    change: object, message: str, trainer_slot: bool, pool_name: str
) -> None:
    """A hook's action outside the action space, an action space that no longer holds the action (another
    one, or the same one changed), an attribute the step needs gone, a time limit that cannot count:
    gymnasium's own step raises for that env, and so does the pool, naming it, where the slot was
    stepping its envs together. So does something put in the env's place that has no ``step``."""
    hook = helpers.ChangesEnv(5, 2, change)
    with shmpool.launch(
        "CartPole-v1", 4, num_workers=1, trainer_slot=trainer_slot, hooks=[hook], name=pool_name
    ) as pool:
        pool.reset(seed=0)
        for _ in range(5):
            pool.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(shmpool.WorkerError, match=rf"(?s)env 2 \(CartPole-v1\).*{message}"):
            pool.step(np.ones(4, dtype=np.int64))


def test_a_cartpole_step_patched_on_the_class_or_rendering_is_what_steps(monkeypatch, pool_name: str) -> None:
    """``CartPoleEnv.step`` replaced on the class runs for every env, as does ``render`` in human mode."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    calls = {"step": 0, "render": 0}
    original = CartPoleEnv.step

    def counted_step(self, action):
        calls["step"] += 1
        return original(self, action)

    def counted_render(self):
        calls["render"] += 1

    with shmpool.launch("CartPole-v1", 4, num_workers=1, trainer_slot=True, name=pool_name) as pool:
        pool.reset(seed=0)
        for _ in range(4):
            pool.step(np.zeros(4, dtype=np.int64))
        monkeypatch.setattr(CartPoleEnv, "step", counted_step)
        pool.env_apply(lambda env: None)  # a control call: the slot looks at its steppers again
        for _ in range(4):
            pool.step(np.array([0, 1, 0, 1]))
        assert calls["step"] == 16
        monkeypatch.setattr(CartPoleEnv, "step", original)
        monkeypatch.setattr(CartPoleEnv, "render", counted_render)
        pool.env_apply(lambda env: setattr(env.unwrapped, "render_mode", "human"))
        for _ in range(4):
            pool.step(np.array([0, 1, 0, 1]))
        assert calls["render"] == 16


def test_cartpoles_with_float64_observations_match_sync(pool_name: str) -> None:
    """gymnasium's float32 observation, cast into a float64 observation space, as Sync does."""
    reference = gym.vector.SyncVectorEnv([helpers.cartpole_with_float64_observations] * 4)
    with shmpool.launch(
        helpers.cartpole_with_float64_observations, 4, num_workers=1, trainer_slot=True, name=pool_name
    ) as pool:
        assert pool.single_observation_space.dtype == np.float64
        np.testing.assert_array_equal(pool.reset(seed=1)[0], reference.reset(seed=1)[0])
        for t in range(20):
            actions = np.array([t % 2, 1, 0, (t // 2) % 2])
            ours, theirs = pool.step(actions), reference.step(actions)
            for a, b in zip(ours[:4], theirs[:4]):
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b, err_msg=f"step {t}")
    reference.close()
