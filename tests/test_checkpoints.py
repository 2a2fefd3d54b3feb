"""Checkpoints: a pool's (or handle's) ``state_dict()`` restores into a fresh pool, whose draws then
continue as the saved pool's would have; curricula checkpoint alongside and continue identically."""

from __future__ import annotations

import json
import pickle
import warnings
from typing import Any

import helpers
import numpy as np
import pytest

import shmpool
from shmpool import Param
from shmpool.curricula import ADR, Threshold

NUM_ENVS = 6
PARAMS = {
    "a": Param(dist="uniform", default={"low": 0.0, "high": 1.0}, low=-5.0, high=5.0, when="reset", bind=False),
    "b": Param(dist="normal", default={"mean": 0.0, "std": 1.0}, low=-10.0, high=10.0, bind=False),  # per step
    "c": Param(2.0, low=0.0, high=10.0, bind=False),
    "k": Param(3, dtype="int64", shape=(2,), low=0, high=100, when="reset", bind=False),
}
ONES = np.ones(NUM_ENVS, dtype=np.int64)


def launch(name: str, **options: Any) -> shmpool.Pool:
    """A pool of envs whose episodes last 3 steps, with every kind of parameter."""
    settings: dict[str, Any] = {"num_workers": 2, "params": PARAMS, "seed": 7, "env_kwargs": {"length": 3}}
    return shmpool.launch(helpers.CountingEnv, NUM_ENVS, name=name, **{**settings, **options})


def play(pool: shmpool.Pool, steps: int, seed: int | None = None) -> list[np.ndarray]:
    """``applied`` after a reset (when ``seed`` is given) and after each of ``steps`` steps."""
    seen = []
    if seed is not None:
        pool.reset(seed=seed)
        seen.append(pool.applied.copy())
    for _ in range(steps):
        pool.step(ONES)
        seen.append(pool.applied.copy())
    return seen


def assert_same_records(got: np.ndarray, expected: np.ndarray, where: str) -> None:
    assert got.dtype == expected.dtype
    for name in expected.dtype.names or ():
        np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{name} {where}")


def assert_same_state(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got.keys() == expected.keys()
    assert got["schema"] == expected["schema"] and got["param_seed"] == expected["param_seed"]
    np.testing.assert_array_equal(got["episode_index"], expected["episode_index"])
    assert got["params"].keys() == expected["params"].keys()
    for name, value in expected["params"].items():
        if isinstance(value, dict):
            for argument, column in value.items():
                np.testing.assert_array_equal(got["params"][name][argument], column, err_msg=f"{name}.{argument}")
        else:
            np.testing.assert_array_equal(got["params"][name], value, err_msg=name)


def assert_plain(value: Any, where: str = "state") -> None:
    """Only dicts, lists, str, numbers, None and numeric numpy arrays: what pickle and torch.save store."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str), where
            assert_plain(item, f"{where}[{key!r}]")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            assert_plain(item, f"{where}[{index}]")
    elif isinstance(value, np.ndarray):
        assert value.dtype.kind in "biuf", where
    else:
        assert value is None or isinstance(value, (str, int, float, bool)), f"{where} is a {type(value).__name__}"


def scramble(pool: shmpool.Pool) -> None:
    """Writes of every kind, as a curriculum would make them: validated, raw, distribution arguments."""
    pool.params.write([1, 4], a={"low": -2.0, "high": 3.0}, c=5.0)
    pool.params.write([0], k=[7, 9])
    pool.params["b"]["std"][2] = 0.5
    pool.params["c"][5] = 8.5


def test_state_round_trips_through_pickle_into_a_fresh_pool(pool_name: str) -> None:
    with launch(pool_name) as pool:
        play(pool, 4, seed=0)
        scramble(pool)
        state = pool.state_dict()
        assert_plain(dict(state))
        assert state["episode_index"].tolist() == [1] * NUM_ENVS  # episodes 0 and 1 (autoreset at step 4)
        assert state["params"]["a"]["low"].tolist() == [0.0, -2.0, 0.0, 0.0, -2.0, 0.0]
        assert state["params"]["c"].tolist() == [2.0, 5.0, 2.0, 2.0, 5.0, 8.5]
        assert state["params"]["k"][0].tolist() == [7, 9] and state["params"]["k"].dtype == np.int64
        saved = pickle.loads(pickle.dumps(state))
    with launch(pool_name + "2", num_workers=1) as fresh:
        fresh.load_state_dict(saved)
        assert_same_state(dict(fresh.state_dict()), dict(state))
        fresh.reset(seed=0)  # the workers pick the values up at their next step or reset
        assert fresh.applied["c"].tolist() == [2.0, 5.0, 2.0, 2.0, 5.0, 8.5]
        assert fresh.applied["k"][0].tolist() == [7, 9]


@pytest.mark.parametrize("through", ["pool", "handle"])
def test_a_fresh_pool_continues_the_same_draws(pool_name: str, through: str) -> None:
    with launch(pool_name) as pool:
        play(pool, 7, seed=0)
        scramble(pool)
        play(pool, 2)
        if through == "handle":
            with shmpool.attach(pool.name) as handle:
                state = handle.state_dict()
            assert_same_state(dict(state), dict(pool.state_dict()))
        else:
            state = pool.state_dict()
        saved = pickle.loads(pickle.dumps(state))
        expected = play(pool, 10, seed=100)  # the saved pool goes on: its next episodes and steps
    # Another worker count: draws do not depend on it.
    with launch(pool_name + "2", num_workers=1) as fresh:
        unrestored = play(fresh, 0, seed=100)[0]
        assert not np.array_equal(unrestored["a"], expected[0]["a"])  # so the checkpoint is what matters
        if through == "handle":
            with shmpool.attach(fresh.name) as handle:
                handle.load_state_dict(saved)
        else:
            fresh.load_state_dict(saved)
        got = play(fresh, 10, seed=100)
    assert len(got) == len(expected) == 11
    for step, (mine, theirs) in enumerate(zip(got, expected)):
        assert_same_records(mine, theirs, f"after step {step}")


def test_schema_mismatch_names_every_differing_field(pool_name: str) -> None:
    with launch(pool_name, num_workers=1) as pool:
        state = pool.state_dict()
        with pytest.raises(ValueError, match="not a shmpool pool state of version 1"):
            pool.load_state_dict({**state, "version": 99})
        swapped = json.loads(json.dumps(state["schema"]))
        swapped["params"].reverse()
        with pytest.raises(ValueError, match=r"the order of params \(state \['k', 'c', 'b', 'a'\]"):
            pool.load_state_dict({**state, "schema": swapped})
    other = {**PARAMS, "c": Param(2.0, low=0.0, high=20.0, bind=False), "d": Param(1.0, bind=False)}
    with shmpool.launch(helpers.CountingEnv, 4, num_workers=1, name=pool_name + "2", params=other, seed=7) as fresh:
        before = fresh.state_dict()
        with pytest.raises(ValueError) as caught:
            fresh.load_state_dict(state)
        message = str(caught.value)
        assert "num_envs (state 6, pool 4)" in message
        assert "params['c'].high (state [10.0], pool [20.0])" in message
        assert "only the pool has ['d']" in message
        assert_same_state(dict(fresh.state_dict()), dict(before))  # nothing was written


def test_another_draw_seed_is_refused_unless_asked(pool_name: str) -> None:
    with launch(pool_name, num_workers=1) as pool:
        pool.reset(seed=0)
        scramble(pool)
        state = pool.state_dict()
    with launch(pool_name + "2", num_workers=1, seed=8) as fresh:
        with pytest.raises(ValueError, match=r"param_seed differs \(state 7, pool 8\).*seed=7"):
            fresh.load_state_dict(state)
        assert fresh.params["c"].tolist() == [2.0] * NUM_ENVS
        fresh.load_state_dict(state, same_draws=False)
        assert fresh.params["c"].tolist() == [2.0, 5.0, 2.0, 2.0, 5.0, 8.5]


def test_a_value_the_bounds_refuse_is_not_loaded(pool_name: str) -> None:
    with launch(pool_name, num_workers=1) as pool:
        state = pool.state_dict()
        state["params"]["c"] = state["params"]["c"].copy()
        state["params"]["c"][3] = 11.0
        state["episode_index"] = np.full(NUM_ENVS, 5)
        with pytest.raises(ValueError, match=r"params\['c'\]\[3\] = 11.0 rejected: outside \[0.0, 10.0\]"):
            pool.load_state_dict(state)
        assert pool.state_dict()["episode_index"].tolist() == [-1] * NUM_ENVS


def test_a_value_the_workers_refused_is_saved_as_what_the_env_runs_with(pool_name: str) -> None:
    """A raw store out of bounds stays in the block, but the env keeps running its last good value:
    the checkpoint saves that value, so that it loads, and says so."""
    with launch(pool_name, num_workers=1) as pool:
        pool.reset(seed=0)
        pool.params["c"][1] = 99.0  # refused by the worker at its next step: env 1 keeps 2.0
        pool.params["a"]["low"][4] = 3.0  # low above high: refused, env 4 keeps drawing from [0, 1]
        with pytest.warns(RuntimeWarning, match="rejected"):
            pool.step(ONES)
        assert pool.params["c"][1] == 99.0 and pool.applied["c"][1] == 2.0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state = pool.state_dict()
    said = sorted(str(warning.message) for warning in caught)
    assert len(said) == 2
    assert "params['a'] of env(s) [4] hold(s) {'low': 3.0, 'high': 1.0}, which the workers refused" in said[0]
    assert "({'low': 0.0, 'high': 1.0} for env 4)" in said[0]
    assert "params['c'] of env(s) [1] hold(s) 99.0" in said[1] and "(2.0 for env 1)" in said[1]
    assert state["params"]["c"].tolist() == [2.0] * NUM_ENVS
    assert state["params"]["a"]["low"][4] == 0.0 and state["params"]["a"]["high"][4] == 1.0
    with launch(pool_name, num_workers=2) as fresh:
        fresh.load_state_dict(state)  # loads: nothing in it was refused
        fresh.reset(seed=0)
        assert fresh.applied["c"].tolist() == [2.0] * NUM_ENVS


def test_a_state_with_refused_values_continues_as_the_saved_pool(pool_name: str) -> None:
    """The checkpoint of a refused row holds what its worker accepted last: the distribution an env
    draws from (not its last draw, which a restored pool would then draw forever) and a ``reset``
    value written but not yet taken, so a restored pool goes on as the saved one."""
    with launch(pool_name, num_workers=1) as pool:
        pool.reset(seed=0)
        pool.params.write([1], k=[5, 5])  # accepted at the next step, taken at env 1's next reset
        pool.step(ONES)
        pool.params["k"][1] = [200, 200]  # refused: env 1 still takes [5, 5] at its next reset
        pool.params["a"]["low"][2] = 3.0  # refused: env 2 goes on drawing from [0, 1]
        pool.params["b"]["std"][3] = -1.0  # refused: env 3 goes on drawing from normal(0, 1) every step
        with pytest.warns(RuntimeWarning, match="rejected"):
            pool.step(ONES)
        with pytest.warns(RuntimeWarning, match="which the workers refused"):
            state = pool.state_dict()
        expected = play(pool, 8, seed=100)
    assert state["params"]["k"][1].tolist() == [5, 5]
    assert {argument: state["params"]["a"][argument][2] for argument in ("low", "high")} == {"low": 0.0, "high": 1.0}
    assert state["params"]["b"]["std"][3] == 1.0
    assert len({float(seen["a"][2]) for seen in expected}) > 1  # env 2 still draws
    with launch(pool_name + "2", num_workers=2) as fresh:
        fresh.load_state_dict(state)
        got = play(fresh, 8, seed=100)
    for step, (mine, theirs) in enumerate(zip(got, expected)):
        assert_same_records(mine, theirs, f"after step {step}")


def test_a_refused_value_of_an_env_that_has_drawn_nothing_is_saved_as_its_launch_value(pool_name: str) -> None:
    """Before its first reset an env has drawn nothing, and its worker has accepted its launch value:
    the state saves that."""
    with launch(pool_name, num_workers=1) as pool:
        pool.params["a"]["low"][2] = 3.0  # low above high, before any reset
        with pytest.warns(RuntimeWarning, match=r"\({'low': 0.0, 'high': 1.0} for env 2\)"):
            state = pool.state_dict()
    assert state["params"]["a"]["low"][2] == 0.0 and state["params"]["a"]["high"][2] == 1.0
    with launch(pool_name, num_workers=2) as fresh:
        fresh.params.write([2], a={"low": 0.25, "high": 0.75})
        fresh.load_state_dict(state)
        assert fresh.params["a"]["low"].tolist() == [0.0] * NUM_ENVS
        assert fresh.params["a"]["high"].tolist() == [1.0] * NUM_ENVS


def test_episode_counters_that_could_overflow_are_refused_by_value(pool_name: str) -> None:
    """A counter is checked by value, whatever its dtype, against a bound (2**62) that leaves room for
    more resets than any run makes: cast as it comes, a uint64 of 2**64-1 would load as -1, and an
    int64 of 2**63-1 would wrap to -2**63 at the next reset, a state the pool could not load back."""
    limit = 1 << 62
    with launch(pool_name, num_workers=1) as pool:
        state = pool.state_dict()
        before = dict(pool.state_dict())
        overflowing = [
            np.full(NUM_ENVS, 2**64 - 1, dtype=np.uint64),
            np.full(NUM_ENVS, 2**63, dtype=np.uint64),
            np.full(NUM_ENVS, 2**63 - 1, dtype=np.int64),
            np.full(NUM_ENVS, limit, dtype=np.int64),
            np.full(NUM_ENVS, -2, dtype=np.int8),
        ]
        for indices in overflowing:
            with pytest.raises(ValueError, match=rf"in \[-1, 2\*\*62\), got episode_index\[0\] = {indices[0]}$"):
                pool.load_state_dict({**state, "episode_index": indices})
            assert_same_state(dict(pool.state_dict()), before)  # nothing was written
        with pytest.raises(ValueError, match=r"episode_index must be 6 integers .* got bool of shape \(6,\)"):
            pool.load_state_dict({**state, "episode_index": np.zeros(NUM_ENVS, dtype=bool)})
        # Counters just below the bound, unsigned: they load, and the next reset goes on from them.
        pool.load_state_dict({**state, "episode_index": np.full(NUM_ENVS, limit - 2, dtype=np.uint64)})
        pool.reset(seed=0)
        own = pool.state_dict()
        assert own["episode_index"].tolist() == [limit - 1] * NUM_ENVS and own["episode_index"].dtype == np.int64
        pool.load_state_dict(own)  # a pool's own state always loads back
        assert pool.state_dict()["episode_index"].tolist() == [limit - 1] * NUM_ENVS


def test_a_malformed_state_is_refused_whole_naming_the_field(pool_name: str) -> None:
    """Every field is checked before anything is written, and a malformed one is a ValueError naming
    the field and its value: a ``dist`` parameter without ``high`` is refused rather than merged with
    the pool's own ``high`` as a partial write, and a None seed or a name that is not a str says so
    rather than raising a bare TypeError."""
    with launch(pool_name, num_workers=1) as pool:
        good = pool.state_dict()
        before = dict(pool.state_dict())
        good["params"]["c"] = np.full(NUM_ENVS, 5.0)  # so that a write, whole or partial, would show
        good["params"]["a"] = {"low": np.full(NUM_ENVS, -1.0), "high": np.full(NUM_ENVS, 4.0)}
        good["episode_index"] = np.full(NUM_ENVS, 3)
        renamed = json.loads(json.dumps(good["schema"]))
        renamed["params"][0]["name"] = ["a"]

        def params(**values: Any) -> dict[str, Any]:
            return {**good, "params": {**good["params"], **values}}

        cases: list[tuple[dict[str, Any], str]] = [
            (
                params(a={"low": np.full(NUM_ENVS, 0.5)}),
                r"params\['a'\] is a uniform parameter, which needs the arguments \['low', 'high'\]: "
                r"it lacks \['high'\]$",
            ),
            (
                params(a={**good["params"]["a"], "std": np.ones(NUM_ENVS)}),
                r"params\['a'\] is a uniform parameter, .*: it has unknown \['std'\]$",
            ),
            (params(a=np.zeros(NUM_ENVS)), r"params\['a'\] must be a dict of the uniform arguments \['low', 'high'\]"),
            (params(c={"low": np.zeros(NUM_ENVS)}), r"params\['c'\] must be an array \(not a dict\)"),
            (params(c=None), r"the state's params\['c'\] = None is not an array of numbers"),
            (params(c=[[1.0], [1.0, 2.0]]), r"the state's params\['c'\] = \[\[1.0\], \[1.0, 2.0\]\] is not an array"),
            (params(b={"mean": ["x"] * NUM_ENVS, "std": 1.0}), r"the state's params\['b'\]\['mean'\] = \['x'"),
            (params(zz=1.0), r"params must hold exactly \['a', 'b', 'c', 'k'\], got \['a', 'b', 'c', 'k', 'zz'\]"),
            ({**good, "params": None}, r"the state's params must hold exactly .*, got a NoneType"),
            ({**good, "param_seed": None}, r"the state's param_seed must be an integer, got None \(NoneType\)"),
            ({**good, "param_seed": "7"}, r"the state's param_seed must be an integer, got '7' \(str\)"),
            ({**good, "param_seed": 2**63}, r"the state's param_seed = 9223372036854775808 is outside the int64 seeds"),
            ({**good, "schema": renamed}, r"schema\['params'\]\[0\]\['name'\] must be a str, got \['a'\] \(list\)"),
            ({**good, "episode_index": [0, 1]}, r"episode_index must be 6 integers .*, got int64 of shape \(2,\)"),
            ({**good, "version": np.array([1, 1])}, r"not a shmpool pool state of version 1 \(got version array"),
        ]
        for state, message in cases:
            with pytest.raises(ValueError, match=message):
                pool.load_state_dict(state)
            assert_same_state(dict(pool.state_dict()), before)  # nothing was written
        # With same_draws=False the seed need not be the pool's, but it must still be a seed.
        with pytest.raises(ValueError, match="param_seed must be an integer, got None"):
            pool.load_state_dict({**good, "param_seed": None}, same_draws=False)
        pool.load_state_dict(good)  # what the cases broke, whole: it loads
        assert pool.params["c"].tolist() == [5.0] * NUM_ENVS and pool.params["a"]["high"].tolist() == [4.0] * NUM_ENVS
        assert pool.state_dict()["episode_index"].tolist() == [3] * NUM_ENVS


# -- curricula ------------------------------------------------------------------------------------

CURRICULUM_PARAMS = {
    "length": Param(dist="uniform", default={"low": 0.5, "high": 0.5}, low=0.1, high=1.5, when="reset", bind=False),
    "gravity": Param(dist="uniform", default={"low": 9.8, "high": 9.8}, low=5.0, high=15.0, when="reset", bind=False),
    "c": Param(2.0, low=0.0, high=3.0, bind=False),
}


def feed(pool: shmpool.Pool, adr: ADR, threshold: Threshold, rounds: int, start: int) -> list[Any]:
    """Synthetic episodes that use what ADR pinned; scores rise and fall so boundaries move both ways.
    Returns what each round changed: logs, ranges, pins and the block."""
    trace: list[Any] = []
    for round_ in range(start, start + rounds):
        records = np.zeros(NUM_ENVS, dtype=pool.episodes.dtype)
        records["env_id"] = np.arange(NUM_ENVS)
        records["return"] = [(round_ * 37 + env * 11) % 500 for env in range(NUM_ENVS)]
        records["params"]["c"] = pool.params["c"]  # run at the value the threshold wrote
        for env in range(NUM_ENVS):
            pin = adr.pinned.get(env)
            for name, (low, high) in adr.ranges.items():
                records["params"][name][env] = pin[2] if pin and pin[0] == name else (low + high) / 2
        log = adr.update(records, pool.params) + threshold.update(records, pool.params)
        trace.append((log, json.dumps(adr.state_dict()), threshold.state_dict(), pool.params.snapshot().tobytes()))
    return trace


def test_curricula_continue_identically_from_a_checkpoint(pool_name: str) -> None:
    def curricula(seed: int) -> tuple[ADR, Threshold]:
        adr = ADR(delta=0.1, p_boundary=0.6, buffer=2, low_threshold=150, high_threshold=300, seed=seed)
        return adr, Threshold("c", step=0.25, target=200.0, window=3)

    options = {"num_workers": 1, "params": CURRICULUM_PARAMS, "seed": 3}
    with shmpool.launch(helpers.CountingEnv, NUM_ENVS, name=pool_name, **options) as pool:
        adr, threshold = curricula(seed=0)
        feed(pool, adr, threshold, rounds=8, start=0)
        assert adr.pinned and any(adr.buffers.values())  # a checkpoint mid-way: pins and scores pending
        saved = pickle.dumps((pool.state_dict(), json.dumps(adr.state_dict()), json.dumps(threshold.state_dict())))
        expected = feed(pool, adr, threshold, rounds=12, start=8)
    assert any(log for log, *_ in expected)  # boundaries and the threshold moved after the checkpoint
    pool_state, adr_state, threshold_state = pickle.loads(saved)
    with shmpool.launch(helpers.CountingEnv, NUM_ENVS, name=pool_name + "2", **options) as fresh:
        fresh.load_state_dict(pool_state)
        twin_adr, twin_threshold = curricula(seed=99)
        twin_adr.low_threshold = 0.0  # settings come from the state too
        twin_adr.load_state_dict(json.loads(adr_state))
        twin_threshold.load_state_dict(json.loads(threshold_state))
        got = feed(fresh, twin_adr, twin_threshold, rounds=12, start=8)
    assert got == expected


def test_curriculum_state_dicts_refuse_another_curriculum() -> None:
    adr, threshold = ADR(low_threshold=0, high_threshold=1), Threshold("c", step=1.0, target=1.0)
    with pytest.raises(ValueError, match="not a state_dict\\(\\) of 'adr' \\(algo 'threshold'\\)"):
        adr.load_state_dict(threshold.state_dict())
    with pytest.raises(ValueError, match="this state moves 'c', this Threshold moves 'd'"):
        Threshold("d", step=1.0, target=1.0).load_state_dict(threshold.state_dict())
