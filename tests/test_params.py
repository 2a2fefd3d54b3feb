"""Parameters written in the shared block reach the envs when their ``when`` says, exactly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import warnings
from typing import Any

import gymnasium as gym
import helpers
import numpy as np
import pytest
from helpers import ROOT

import shmpool
from shmpool import Param


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


def scale_g(env: gym.Env, value: float) -> None:
    env.unwrapped.g = 2 * value


@pytest.mark.parametrize("engine", helpers.ENGINES)
def test_a_rebuild_param_bound_elsewhere_is_refused_at_launch(engine: str, pool_name: str) -> None:
    """A rebuild parameter's value is the constructor keyword of its name: the python engine left
    any other ``bind`` unused (the env was built with ``g``, not through ``scale_g``, and bind=False
    still reached the constructor) without a word, and the numba engine took bind=False and built
    the env without the value. Its own name as the bind says the same, and runs."""
    for bind in (scale_g, "max_speed", False):
        message = rf"params\['g'\] of Pendulum-v1: .*keyword 'g'.*bind={re.escape(repr(bind))}"
        with pytest.raises(ValueError, match=message):
            shmpool.launch(
                "Pendulum-v1", 2, name=pool_name, engine=engine, params={"g": Param(10.0, when="rebuild", bind=bind)}
            )
    params = {"g": Param(10.0, when="rebuild", bind="g")}
    with shmpool.launch("Pendulum-v1", 2, num_workers=1, name=pool_name, engine=engine, params=params) as pool:
        pool.params["g"][1] = 3.0
        pool.reset(seed=0)
        assert pool.get_attr("g") == (10.0, 3.0)


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
