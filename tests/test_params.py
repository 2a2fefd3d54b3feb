"""Parameters written in the shared block reach the envs when their ``when`` says, exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import helpers
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

import shmpool
from shmpool import Param, classic_control, env_families, param_block

ROOT = Path(__file__).resolve().parents[1]

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


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_step_and_reset_params_take_effect_when_declared(num_workers: int, pool_name: str) -> None:
    params = {"a": Param(0.0, low=-10, high=10), "b": Param(0.0, low=-10, high=10, when="reset")}
    with shmpool.launch(helpers.PairEnv, 5, num_workers=num_workers, name=pool_name, params=params) as pool:
        pool.reset(seed=0)
        pool.params["a"][:] = np.arange(5)
        pool.params["b"][:] = -np.arange(5)
        observations = pool.step(np.zeros(5, int))[0]
        assert observations[:, 0].tolist() == list(range(5))  # step params: this very step
        assert observations[:, 1].tolist() == [0] * 5  # reset params: not before a reset
        assert pool.applied["b"].tolist() == [0] * 5
        mask = np.array([False, True, False, True, False])
        observations, _ = pool.reset(options={"reset_mask": mask})
        assert observations[:, 1].tolist() == [0, -1, 0, -3, 0]
        assert pool.applied["b"].tolist() == [0, -1, 0, -3, 0]


@pytest.mark.parametrize("engine", helpers.ENGINES)
def test_reset_params_apply_at_autoreset(engine: str, pool_name: str) -> None:
    params = {"length": Param(low=0.1, high=2.0, when="reset")}
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name, params=params, engine=engine) as pool:
        pool.reset(seed=0)
        pool.params["length"][:] = 1.5
        done_once = np.zeros(4, bool)
        for _ in range(200):
            _, _, terminations, truncations, _ = pool.step(np.ones(4, int))  # always push right: short episodes
            applied = pool.applied["length"]
            # NEXT_STEP: the step after a done is the reset, which applies the new length.
            assert np.all(applied[~done_once] == 0.5)
            done_once |= terminations | truncations
            if done_once.all():
                break
        pool.step(np.ones(4, int))
        assert pool.applied["length"].tolist() == [1.5] * 4


DIST_PARAMS = {
    "masscart": Param(dist="uniform", low=0.5, high=2.0, when="reset"),
    "length": Param(dist="normal", default={"std": 0.1}, low=0.2, high=1.0, when="reset"),
    "force_mag": Param(dist="loguniform", default={"low": 5.0, "high": 20.0}, low=1.0, high=50.0),
    "gravity": Param(9.8, low=5, high=15),
}


def run_schedule(
    num_workers: int, name: str, seed: int = 42, engine: str = "python"
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    trajectory, applied = [], []
    with shmpool.launch(
        "CartPole-v1", 6, num_workers=num_workers, seed=seed, name=name, params=DIST_PARAMS, engine=engine
    ) as pool:
        observations, _ = pool.reset()
        trajectory.append(observations)
        rng = np.random.default_rng(0)
        for t in range(120):
            if t % 10 == 0:
                pool.params.write(
                    rng.integers(0, 6, 2), gravity=rng.uniform(5, 15), masscart={"high": rng.uniform(1, 2)}
                )
            if t == 50:
                pool.params["length"]["mean"][:3] = 0.8
            trajectory.append(pool.step(rng.integers(0, 2, 6))[0])
            applied.append(pool.applied.copy())
    return trajectory, applied


def test_same_seed_and_writes_give_the_same_run_for_any_worker_count(pool_name: str) -> None:
    runs = [run_schedule(w, f"{pool_name}{w}") for w in (1, 2, 3)]
    for trajectory, applied in runs[1:]:
        for a, b in zip(runs[0][0], trajectory):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(runs[0][1], applied):
            assert a.tobytes() == b.tobytes()
    masses = np.concatenate([a["masscart"] for a in runs[0][1]])
    assert len(np.unique(masses)) > 6, "per-env, per-episode draws should differ"
    assert masses.min() >= 0.5 and masses.max() <= 2.0
    lengths = np.concatenate([a["length"] for a in runs[0][1]])
    assert lengths.min() >= 0.2 and lengths.max() <= 1.0
    other_seed = run_schedule(2, pool_name + "x", seed=43)[1]
    assert other_seed[-1]["masscart"].tobytes() != runs[0][1][-1]["masscart"].tobytes()


@pytest.mark.parametrize("engine", helpers.ENGINES)
def test_every_value_rewritten_every_step_matches_gymnasium(engine: str, pool_name: str) -> None:
    """A curriculum's write of every parameter of every env before every step (the workers' whole-slot
    path) steps exactly like gymnasium envs configured by hand, derived values included; a change of
    ``force_mag`` alone, which CartPole derives nothing from, is applied too; a raw write that breaks a
    bound in every env is refused as a whole and the envs keep their values."""
    params = {
        "length": Param(low=0.1, high=2.0),
        "masspole": Param(low=0.01, high=1.0),
        "force_mag": Param(low=1.0, high=30.0),
        "masscart": Param(low=0.5, high=2.0, when="reset"),  # a scalar column that is not applied at steps
    }
    num_envs, rng = 4, np.random.default_rng(1)
    references = [gym.make("CartPole-v1") for _ in range(num_envs)]
    with shmpool.launch("CartPole-v1", num_envs, num_workers=2, name=pool_name, params=params, engine=engine) as pool:
        observations, _ = pool.reset(seed=3)
        for i, reference in enumerate(references):
            np.testing.assert_array_equal(observations[i], reference.reset(seed=3 + i)[0])
        pool.action_space.seed(0)
        for t in range(60):
            values = {
                "length": rng.uniform(0.3, 1.5, num_envs),
                "masspole": rng.uniform(0.05, 0.5, num_envs),
                "force_mag": rng.uniform(5.0, 20.0, num_envs),
                "masscart": rng.uniform(0.5, 2.0, num_envs),
            }
            if t % 3 == 2:  # force_mag alone
                values = {"force_mag": values["force_mag"]}
            if t % 2:
                pool.params.write(None, **values)
            else:  # raw numpy writes, field by field
                for name, column in values.items():
                    pool.params[name][:] = column
            for i, reference in enumerate(references):
                env = reference.unwrapped
                for name in ("length", "masspole", "force_mag"):
                    if name in values:
                        setattr(env, name, float(values[name][i]))
                env.total_mass = env.masspole + env.masscart
                env.polemass_length = env.masspole * env.length
            actions = pool.action_space.sample()
            observations, rewards, terminations, truncations, _ = pool.step(actions)
            for i, reference in enumerate(references):
                expected, reward, terminated, truncated, _ = reference.step(actions[i])
                np.testing.assert_array_equal(observations[i], expected, err_msg=f"step {t} env {i}")
                assert rewards[i] == reward and terminations[i] == terminated
            for name in ("length", "masspole", "force_mag"):
                if name in values:
                    assert pool.applied[name].tobytes() == values[name].tobytes(), f"step {t} {name}"
            if terminations.any() or truncations.any():
                break  # compared up to the first episode's end
        assert t > 5
        if engine == "python":
            lengths = pool.get_attr("length")
            assert all(type(length) is float for length in lengths), "envs get Python floats, as from gymnasium"
        before = pool.applied.copy()
        pool.params["length"][:] = 5.0  # above the bound in every env
        with pytest.warns(RuntimeWarning, match=r"params\['length'\].*rejected: outside"):
            pool.step(np.zeros(num_envs, int))
        assert pool.applied["length"].tobytes() == before["length"].tobytes()
        assert pool.params.refusals["length"] == num_envs


@pytest.mark.parametrize("engine", helpers.ENGINES)
def test_refused_raw_writes_keep_the_last_good_value(engine: str, pool_name: str) -> None:
    params = {"length": Param(low=0.1, high=2.0), "gravity": Param(low=0.0, high=50.0)}
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name, params=params, engine=engine) as pool:
        pool.reset(seed=0)
        pool.params["length"][1] = 0.8
        pool.step(np.zeros(4, int))
        pool.params["length"][1] = np.nan
        pool.params["length"][2] = np.inf
        pool.params["gravity"][3] = 99.0
        with pytest.warns(RuntimeWarning) as caught:
            pool.step(np.zeros(4, int))
        messages = [str(w.message) for w in caught]
        assert len(messages) == 2  # one per parameter
        assert any("params['length']" in m and "rejected: not finite" in m for m in messages)
        assert any("params['gravity'][3] = 99.0 rejected: outside [0.0, 50.0]; env 3 keeps 9.8" in m for m in messages)
        assert pool.applied["length"].tolist() == [0.5, 0.8, 0.5, 0.5]
        assert pool.applied["gravity"][3] == 9.8
        assert pool.params.refusals == {"length": 2, "gravity": 1}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pool.step(np.zeros(4, int))  # no new write: nothing refused again
        pool.params["length"][1] = 1.2  # a good write after a bad one is applied
        pool.step(np.zeros(4, int))
        assert pool.applied["length"][1] == 1.2
        for bad in (np.nan, np.inf, 2.5, -1.0):
            with pytest.raises(ValueError, match=r"params\['length'\]\[0\] = .* rejected"):
                pool.params.write(0, length=bad)
            # One float64 value per env: the checks of the common write, which cover all its arrays at once.
            values = np.full(4, 1.0)
            values[2] = bad
            before = pool.params.snapshot()
            with pytest.raises(ValueError, match=r"params\['length'\]\[2\] = .* rejected"):
                pool.params.write(None, gravity=np.full(4, 1.5), length=values)
            assert pool.params.snapshot().tobytes() == before.tobytes()  # nothing written
        with pytest.raises(ValueError, match="does not fit"):
            pool.params.write([0, 1], length=[0.5, 0.6, 0.7])
        with pytest.raises(KeyError, match="the pool has"):
            pool.params.write(0, mass=1.0)


def test_write_gives_each_env_its_own_row_in_the_order_the_ids_are_given(pool_name: str) -> None:
    """Row k of a value goes to env env_ids[k], as numpy's ``array[env_ids] = values`` does, whatever
    the order of the ids (negative ones count from the end); an env given twice takes its last row."""
    params = {
        "gravity": Param(9.8, low=1.0, high=20.0),
        "length": Param(dist="uniform", default={"low": 0.5, "high": 0.5}, low=0.1, high=2.0),
    }
    with shmpool.launch("CartPole-v1", 5, num_workers=2, name=pool_name, params=params, seed=0) as pool:
        pool.reset(seed=0)
        pool.params.write([3, 1], gravity=np.array([13.0, 11.0]))
        pool.params.write([-1, 0], gravity=[14.0, 10.0])
        pool.params.write(slice(None, None, -2), length={"low": [0.4, 0.3, 0.2], "high": [1.4, 1.3, 1.2]})
        expected = np.array([10.0, 11.0, 9.8, 13.0, 14.0])
        np.testing.assert_array_equal(pool.params["gravity"], expected)
        np.testing.assert_array_equal(pool.params["length"]["low"], [0.2, 0.5, 0.3, 0.5, 0.4])
        np.testing.assert_array_equal(pool.params["length"]["high"], [1.2, 0.5, 1.3, 0.5, 1.4])
        pool.step(np.zeros(5, dtype=np.int64))
        np.testing.assert_array_equal(pool.get_attr("gravity"), expected)  # what the envs use
        pool.params.write([1, 2, -4, 2], gravity=[10.0, 15.0, 12.0, 16.0])  # env 1 twice, env 2 twice: the last rows
        expected[1:3] = 12.0, 16.0
        np.testing.assert_array_equal(pool.params["gravity"], expected)
        with pytest.raises(ValueError, match=r"params\['gravity'\]\[4\] = 30.0 rejected"):
            pool.params.write([0, 4], gravity=[10.0, 30.0])  # the bad value is named by its own env
        np.testing.assert_array_equal(pool.params["gravity"], expected)  # nothing written
        pool.params.write([], gravity=np.array([]))  # no env: nothing to do
        pool.params.write(slice(0, 0), gravity=12.0)
        np.testing.assert_array_equal(pool.params["gravity"], expected)


def test_write_returns_the_blocks_write_count_whoever_writes(pool_name: str) -> None:
    """``params.write`` returns its version: the block's write count once the write is published, one
    more than the write before it whoever made that (the pool, an attached handle, another thread);
    a write of no env, or one refused, writes nothing and takes no number."""
    params = {
        "gravity": Param(9.8, low=1.0, high=20.0),
        "length": Param(dist="uniform", default={"low": 0.5, "high": 0.5}, low=0.1, high=2.0),
    }
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name, params=params) as pool:
        with shmpool.attach(pool.name) as handle:
            assert pool.params.write(None, gravity=10.0) == 1  # the first write (launch writes no version)
            assert handle.params.write([1, 3], length={"low": 0.4}) == 2
            assert pool.params.write(2, gravity=11.0) == 3
            assert handle.params.write([], gravity=np.array([])) == 3  # no env: nothing written
            assert pool.params.write(slice(0, 0), gravity=12.0) == 3
            with pytest.raises(ValueError, match="rejected"):
                handle.params.write(0, gravity=30.0)
            assert handle.params.write(0, gravity=12.0) == 4
            assert pool.params.write(None, gravity=np.full(4, 13.0)) == 5  # the one-check path of float arrays
            versions: list[int] = []

            def write(block: shmpool.ParamBlock, value: float) -> None:
                for _ in range(200):
                    versions.append(block.write([0, 2], gravity=value))

            writers = [threading.Thread(target=write, args=(block, 14.0)) for block in (pool.params, handle.params)]
            for thread in writers:
                thread.start()
            for thread in writers:
                thread.join()
            assert sorted(versions) == list(range(6, 406))  # each once: numbered under the writers' lock
            assert pool.params.write([], gravity=np.array([])) == 405  # the current version
            assert handle.params.write(None, gravity=15.0) == 406


def test_bad_declarations_fail_at_launch(pool_name: str) -> None:
    with pytest.raises(AttributeError, match=r"has no 'not_there'.*never creates attributes"):
        shmpool.launch("CartPole-v1", 2, name=pool_name, params={"not_there": Param(1.0)})
    with pytest.raises(AttributeError, match=r"has no 'state\[9\]'"):
        shmpool.launch("CartPole-v1", 2, name=pool_name, params={"x": Param(1.0, bind="state[9]")})
    with pytest.raises(ValueError, match="initial value 9.8 is rejected: outside"):
        shmpool.launch("CartPole-v1", 2, name=pool_name, params={"gravity": Param(low=0, high=5)})
    with pytest.raises(ValueError, match="when must be one of"):
        shmpool.launch("CartPole-v1", 2, name=pool_name, params={"gravity": Param(when="sometimes")})


@pytest.mark.parametrize(
    ("declared", "error", "message"),
    [
        ({"shape": (-1,)}, ValueError, r"params\['x'\]: shape must be a tuple of positive ints, got \(-1,\)"),
        ({"shape": (0,)}, ValueError, r"params\['x'\]: shape must be a tuple of positive ints, got \(0,\)"),
        ({"shape": 3}, TypeError, r"params\['x'\]: shape must be a tuple of ints, got 3"),
        ({"low": float("nan")}, ValueError, r"params\['x'\]: low must be a number \(or None for no bound\), got nan"),
        ({"high": float("nan")}, ValueError, r"params\['x'\]: high must be a number"),
        ({"low": [1, 2], "shape": (3,)}, ValueError, r"params\['x'\]: low must be a number or one per element"),
        ({"low": 2, "high": 1}, ValueError, r"params\['x'\]: low 2 must not exceed high 1"),
        ({"high": 10**400}, ValueError, r"params\['x'\]: high must be a number or one per element"),
    ],
)
def test_bad_shapes_and_bounds_are_refused_naming_the_parameter_and_value(
    declared: dict[str, Any], error: type, message: str, pool_name: str
) -> None:
    """Refused before anything is made (no numpy broadcast error, no segment error type)."""
    with pytest.raises(error, match=message):
        shmpool.launch("CartPole-v1", 2, name=pool_name, params={"x": Param(1.0, bind=False, **declared)})


def test_bind_paths_and_callables(pool_name: str) -> None:
    seen = []

    def set_length(env, value) -> None:
        env.length = value
        seen.append(value)

    params = {
        "second": Param(bind="x_threshold", low=0, high=10),
        "pole": Param(0.5, bind=set_length, low=0.1, high=2.0),
    }
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        assert pool.params["second"].tolist() == [2.4, 2.4]
        pool.params.write(1, second=3.0, pole=0.7)
        pool.reset(seed=0)
        assert pool.applied["pole"].tolist() == [0.5, 0.7] and pool.applied["second"].tolist() == [2.4, 3.0]


@pytest.mark.parametrize("engine", helpers.ENGINES)
def test_rebuild_params_remake_the_env(engine: str, pool_name: str) -> None:
    params = {"g": Param(10.0, when="rebuild", low=0, high=20)}
    with shmpool.launch(
        "Pendulum-v1", 2, num_workers=2, name=pool_name, params=params, info_params=True, engine=engine
    ) as pool:
        pool.params["g"][1] = 3.0
        observations, infos = pool.reset(seed=5)
        assert infos["params"]["g"].tolist() == [10.0, 3.0]
        references = [gym.make("Pendulum-v1", g=10.0), gym.make("Pendulum-v1", g=3.0)]
        np.testing.assert_array_equal(
            observations, np.stack([r.reset(seed=5 + i)[0] for i, r in enumerate(references)])
        )
        for _ in range(10):
            actions = np.full((2, 1), 1.5, np.float32)
            observations = pool.step(actions)[0]
            np.testing.assert_array_equal(
                observations, np.stack([r.step(actions[i])[0] for i, r in enumerate(references)])
            )
        assert pool.applied["g"].tolist() == [10.0, 3.0]


WRITER = """
import sys, numpy as np, shmpool
name, count = sys.argv[1], int(sys.argv[2])
with shmpool.attach(name, wait=10) as handle:
    rng = np.random.default_rng(1)
    print("attached", flush=True)
    for i in range(count):
        x = rng.uniform(-5, 5, handle.num_envs)
        handle.params.write(None, a=x, b=-x)
    print("wrote", count, flush=True)
"""


def test_writes_from_an_attached_process_are_atomic_per_env(pool_name: str) -> None:
    params = {"a": Param(0.0, low=-10, high=10), "b": Param(0.0, low=-10, high=10)}
    with shmpool.launch(helpers.PairEnv, 8, num_workers=2, name=pool_name, params=params) as pool:
        pool.reset(seed=0)
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, pool.name, "20000"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert writer.stdout.readline().strip() == "attached"
        steps, distinct = 0, set()
        while writer.poll() is None or steps < 100:
            observations = pool.step(np.zeros(8, int))[0]
            np.testing.assert_array_equal(observations[:, 0] + observations[:, 1], 0.0)
            applied = pool.applied.copy()
            np.testing.assert_array_equal(applied["a"] + applied["b"], 0.0)
            distinct.add(float(observations[0, 0]))
            steps += 1
        assert writer.wait(30) == 0 and "wrote 20000" in writer.stdout.read()
        assert len(distinct) > 10, "the writer's values should reach the envs"


@pytest.mark.parametrize("engine", helpers.ENGINES)
def test_attach_sees_params_and_applied(engine: str, pool_name: str) -> None:
    with shmpool.launch(
        "CartPole-v1", 4, num_workers=2, name=pool_name, params={"length": Param(low=0.1, high=2)}, engine=engine
    ) as pool:
        pool.reset(seed=0)
        with shmpool.attach(pool.name) as handle:
            assert handle.num_envs == 4 and handle.alive
            assert handle.params.dtype == pool.params.dtype
            assert handle.param_specs["length"].high == 2
            handle.params["length"][2] = 1.1
            handle.params.write(3, length=0.3)
            with pytest.raises(ValueError, match="rejected"):
                handle.params.write(3, length=3.0)
            pool.step(np.zeros(4, int))
            assert handle.applied["length"].tolist() == [0.5, 0.5, 1.1, 0.3]
            with pytest.raises(ValueError, match="read-only"):
                handle.applied["length"][0] = 1.0
    with pytest.raises(shmpool.PoolNotFoundError, match="no pool named"):
        shmpool.attach(pool_name)


class RenamedCartPole(CartPoleEnv):
    """CartPole under another class name: its adapter is found through its class hierarchy."""


def impostor() -> gym.Env:
    """An env of an unrelated class that is only named CartPoleEnv."""
    return type("CartPoleEnv", (gym.Env,), {})()


def test_adapters_are_found_by_the_unwrapped_class_not_the_name() -> None:
    cartpole = env_families.adapter_for(gym.make("CartPole-v1"))  # wrapped: looked up on env.unwrapped
    assert isinstance(cartpole, classic_control.CartPole)
    assert env_families.adapter_for(RenamedCartPole()) is cartpole
    assert env_families.adapter_for(impostor()) is env_families.GENERIC
    assert env_families.GENERIC.refresher(impostor()) is None and env_families.GENERIC.kicker(impostor()) is None
    pendulum = env_families.adapter_for(gym.make("Pendulum-v1"))
    assert isinstance(pendulum, classic_control.ClassicControl) and pendulum.refresher(gym.make("Pendulum-v1")) is None
    env = RenamedCartPole()
    env.masspole, env.length = 0.3, 0.9
    cartpole.refresher(env)()
    assert (env.total_mass, env.polemass_length) == (0.3 + env.masscart, 0.3 * 0.9)


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


class MirrorAdapter(env_families.EnvAdapter):
    """A family of one's own: PairEnv derives ``b`` from ``a``."""

    name = "mirror"
    classes = (env_families.class_key(helpers.PairEnv),)

    def refresher(self, env):
        unwrapped = env.unwrapped

        def refresh() -> None:
            unwrapped.b = -unwrapped.a

        return refresh


def test_a_registered_adapter_is_used_by_the_workers(pool_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env_families, "_registered", {})  # undone after the test: the registry is per process
    monkeypatch.setattr(env_families, "_table", None)
    monkeypatch.setattr(env_families, "_by_type", {})
    assert env_families.adapter_for(helpers.PairEnv()) is env_families.GENERIC
    mirror = env_families.register(MirrorAdapter())
    assert env_families.adapter_for(helpers.PairEnv()) is mirror
    with pytest.raises(ValueError, match="module:QualName"):
        env_families.register(type("Bad", (env_families.EnvAdapter,), {"classes": ("PairEnv",)})())
    # The default start method forks: the workers inherit the registration.
    with shmpool.launch(helpers.PairEnv, 2, num_workers=2, name=pool_name, params={"a": Param(0.0)}) as pool:
        pool.reset(seed=0)
        pool.params["a"][1] = 3.0
        assert pool.step([0, 0])[0].tolist() == [[0.0, -0.0], [3.0, -3.0]]


IMPORTS = """
import sys
import gymnasium as gym
import shmpool
assert "shmpool.env_families" not in sys.modules and "shmpool.classic_control" not in sys.modules
from shmpool.env_families import adapter_for
print(type(adapter_for(gym.make("CartPole-v1"))).__name__, "mujoco" in sys.modules)
"""


def test_adapters_import_mujoco_only_for_mujoco_envs() -> None:
    result = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["CartPole", "False"]


def hot(block: shmpool.ParamBlock) -> None:
    """Writes ``block`` often enough that its later common writes take the compiled path, which must
    then be loaded (numba is installed where the tests run)."""
    name = block.names[0]
    for _ in range(param_block.COMPILED_AFTER):
        block.write(None, **{name: float(block[name][0])})
    assert block._compiled is not None, "the compiled writes should be loaded by now"


def test_compiled_writes_keep_every_guarantee_of_write(pool_name: str) -> None:
    """Once a process writes often, its writes of numbers or per-env float64 arrays, to every env or
    to one, run compiled: the same values, versions, refusals (naming the value, writing nothing)
    and waits for a lock held elsewhere as the general path, interleaved with it in any order."""
    params = {
        "a": Param(0.0, low=-10, high=10),
        "b": Param(0.0, low=-10, high=10),
        "spread": Param(dist="uniform", default={"low": 0.0, "high": 1.0}, low=0.0, high=2.0, bind=False),
    }
    with shmpool.launch(helpers.PairEnv, 4, num_workers=2, name=pool_name, params=params) as pool:
        pool.reset(seed=0)
        block = pool.params
        hot(block)
        compiled = block._compiled
        assert compiled is not None
        # The compiled path itself takes these forms (a negative result would hand them to the general path).
        assert compiled.write(None, {"a": 0.5, "b": -0.5}) > 0
        assert compiled.write(None, {"a": np.full(4, 0.5)}) > 0 and compiled.write(1, {"b": np.float64(-0.5)}) > 0
        version = block.write(None, a=1.5, b=-1.5)
        assert block.write(None, a=np.array([1.0, 2.0, 3.0, 4.0]), b=-np.arange(1.0, 5.0)) == version + 1
        assert block.write(2, a=np.float64(7.0), b=-7.0) == version + 2  # one env, numpy and Python floats
        assert block.write(3, a=np.array([8.0]), b=np.array([-8.0])) == version + 3
        assert block.write([0, 1], a=5.0) == version + 4  # ids as a list: the general path, same count
        assert block.write(None, spread={"low": 0.5}) == version + 5  # a distribution: the general path
        expected = {"a": [5.0, 5.0, 7.0, 8.0], "b": [-1.0, -2.0, -7.0, -8.0]}
        assert {name: block[name].tolist() for name in ("a", "b")} == expected
        observations = pool.step(np.zeros(4, int))[0]
        assert observations.tolist() == [list(pair) for pair in zip(*expected.values())]
        assert pool.applied["a"].tolist() == expected["a"]

        before = block.snapshot()
        for bad, match in (
            ({"a": 11.0}, r"params\['a'\]\[0\] = 11.0 rejected"),
            ({"a": float("nan")}, r"params\['a'\]\[0\] = nan rejected"),
            ({"b": np.array([0.0, 0.0, float("inf"), 0.0])}, r"params\['b'\]\[2\] = inf rejected"),
            ({"a": 1.0, "b": -10.5}, r"params\['b'\]\[0\] = -10.5 rejected"),
            ({"a": np.zeros(3)}, "does not fit 4 env"),
        ):
            with pytest.raises(ValueError, match=match):
                block.write(None, **bad)
        with pytest.raises(KeyError, match="no parameter 'c'"):
            block.write(None, c=1.0)
        assert (block.snapshot() == before).all() and block.write([], a=np.array([])) == version + 5

        held = threading.Event()
        release = threading.Event()

        def hold_the_lock() -> None:
            def until_released() -> None:
                held.set()
                release.wait(5.0)

            block._lock.run(1.0, lambda: None, until_released)

        holder = threading.Thread(target=hold_the_lock)
        holder.start()
        try:
            assert held.wait(5.0)
            threading.Timer(0.2, release.set).start()
            assert block.write(None, a=2.0, b=-2.0) == version + 6  # waits for the other thread
        finally:
            release.set()
            holder.join(5.0)
        assert block["a"].tolist() == [2.0] * 4


KILLED_WRITER = """
import sys, numpy as np, shmpool
from shmpool import param_block
with shmpool.attach(sys.argv[1], wait=10) as handle:
    rng = np.random.default_rng(int(sys.argv[2]))
    for i in range(param_block.COMPILED_AFTER):
        handle.params.write(None, a=0.0, b=-0.0)
    assert handle.params._compiled is not None
    x = np.zeros(handle.num_envs)
    assert handle.params._compiled.write(None, {"a": x, "b": -x}) > 0  # the compiled path writes these
    assert handle.params._compiled.write(0, {"a": 0.0, "b": -0.0}) > 0
    print("compiled", flush=True)
    while True:
        x = rng.uniform(-5, 5, handle.num_envs)
        handle.params.write(None, a=x, b=-x)
        number = float(x[0])
        handle.params.write(int(rng.integers(handle.num_envs)), a=number, b=-number)
"""


def test_a_writer_killed_in_compiled_writes_never_publishes_half_a_write(pool_name: str) -> None:
    """Writers SIGKILLed while writing in a tight compiled loop (most often inside the writers'
    mutex) never leave a pair half written where the envs or ``applied`` see it, and never leave the
    lock unusable: the next writer, or the pool's owner as it steps, rolls their write back."""
    params = {"a": Param(0.0, low=-10, high=10), "b": Param(0.0, low=-10, high=10)}
    with shmpool.launch(helpers.PairEnv, 8, num_workers=2, name=pool_name, params=params) as pool:
        pool.reset(seed=0)
        for seed in range(6):
            writer = subprocess.Popen(
                [sys.executable, "-c", KILLED_WRITER, pool.name, str(seed)],
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            try:
                assert writer.stdout is not None and writer.stdout.readline().strip() == "compiled"
                for _ in range(50 + 40 * seed):
                    observations = pool.step(np.zeros(8, int))[0]
                    np.testing.assert_array_equal(observations[:, 0] + observations[:, 1], 0.0)
            finally:
                writer.kill()
                writer.wait(10)
                writer.stdout.close()
            for _ in range(70):  # the owner rolls back a dead writer's half write within 64 steps
                observations = pool.step(np.zeros(8, int))[0]
                np.testing.assert_array_equal(observations[:, 0] + observations[:, 1], 0.0)
                applied = pool.applied.copy()
                np.testing.assert_array_equal(applied["a"] + applied["b"], 0.0)
            block = pool.params.snapshot()
            np.testing.assert_array_equal(block["a"] + block["b"], 0.0)
        assert pool.params.write(None, a=1.0, b=-1.0) > 0  # the lock is free and usable
        assert pool.step(np.zeros(8, int))[0][:, 0].tolist() == [1.0] * 8


@helpers.needs("numba")
def test_a_signal_handlers_exception_during_the_compiled_writes_load_is_the_callers(
    pool_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler that raises while the compiled write loads (it takes a fraction of a second) is no
    numba failure: its exception propagates, nothing warns, and a later write loads it."""
    from shmpool.protocol import compiled

    class Alarm(Exception):
        pass

    def alarm(signum: int, frame: Any) -> None:
        raise Alarm

    real, calls = compiled.write_entry, []

    def interrupted_once(kind: str, count: int) -> Any:
        calls.append(kind)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGALRM)  # its handler runs here, inside the load
        return real(kind, count)

    monkeypatch.setattr(compiled, "write_entry", interrupted_once)
    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        params = {"a": Param(0.0, bind=False)}
        with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
            hot(pool.params)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with pytest.raises(Alarm):
                    pool.params.write(None, a=1.0)
                assert pool.params.write(None, a=2.0) > 0 and pool.params["a"].tolist() == [2.0, 2.0]
            assert calls == ["numbers", "numbers"] and pool.params._compiled._numbers  # loaded the second time
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_a_numba_that_fails_to_compile_leaves_writes_to_the_general_path(
    pool_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If numba cannot compile the fast write (a broken install, say), ``write`` warns once and keeps
    writing through its general path, with the same results."""
    from shmpool.protocol import compiled

    def broken(kind: str, count: int) -> None:
        raise RuntimeError("no LLVM here")

    monkeypatch.setattr(compiled, "write_entry", broken)
    params = {"a": Param(0.0, low=-10, high=10), "b": Param(0.0, low=-10, high=10)}
    with shmpool.launch(helpers.PairEnv, 4, num_workers=1, name=pool_name, params=params) as pool:
        block = pool.params
        hot(block)
        before = block.write([0], a=0.0)
        with pytest.warns(RuntimeWarning, match=r"compiled params writes are unavailable \(RuntimeError: no LLVM"):
            assert block.write(None, a=1.0, b=-1.0) == before + 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: the same kind of write does not try again
            assert block.write(None, a=2.0, b=-2.0) == before + 2
        assert block["a"].tolist() == [2.0] * 4 and block["b"].tolist() == [-2.0] * 4
