"""Curricula move parameters the way their papers say, and resume from their saved state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shmpool
from shmpool import Param
from shmpool.curricula import ADR, Threshold
from shmpool.errors import PoolClosedError

ROOT = Path(__file__).resolve().parents[1]


def records_for(pool: shmpool.Pool, envs: list[int], values: dict[str, list[float]], score: float) -> np.ndarray:
    """Synthetic finished-episode records, as the workers would write them."""
    records = np.zeros(len(envs), dtype=pool.episodes.dtype)
    records["env_id"] = envs
    records["return"] = score
    for name, column in values.items():
        records["params"][name] = column
    return records


def feed_boundaries(adr: ADR, pool: shmpool.Pool, score: float, rounds: int) -> None:
    """Plays episodes that use exactly what ADR pinned (or the middle of the range when not pinned)."""
    for _ in range(rounds):
        envs = list(range(pool.num_envs))
        values = {name: [] for name in adr.ranges}
        for env in envs:
            pin = adr.pinned.get(env)
            for name, (low, high) in adr.ranges.items():
                values[name].append(pin[2] if pin and pin[0] == name else (low + high) / 2)
        adr.update(records_for(pool, envs, values, score), pool.params)


PARAMS = {
    "length": Param(dist="uniform", default={"low": 0.5, "high": 0.5}, low=0.1, high=1.5, when="reset"),
    "gravity": Param(dist="uniform", default={"low": 9.8, "high": 9.8}, low=5.0, high=15.0, when="reset"),
}


def test_adr_widens_on_success_and_narrows_on_failure(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 8, num_workers=1, name=pool_name, params=PARAMS) as pool:
        adr = ADR(delta=0.1, p_boundary=1.0, buffer=3, low_threshold=100, high_threshold=400, seed=0)
        adr.update(records_for(pool, [], {}, 0.0), pool.params)  # starts: ranges at the nominal values
        assert adr.ranges == {"length": [0.5, 0.5], "gravity": [9.8, 9.8]}
        feed_boundaries(adr, pool, score=500.0, rounds=12)
        wide = {name: list(bounds) for name, bounds in adr.ranges.items()}
        assert wide["length"][0] < 0.5 < wide["length"][1] and wide["gravity"][0] < 9.8 < wide["gravity"][1]
        assert wide["length"][0] >= 0.1 and wide["gravity"][1] <= 15.0  # never past the hard bounds
        # Pinned envs carry the boundary in the block; the others the whole range.
        for env, (name, _side, value, _) in adr.pinned.items():
            assert pool.params[name]["low"][env] == pool.params[name]["high"][env] == value
        feed_boundaries(adr, pool, score=10.0, rounds=40)
        assert adr.ranges["length"][1] - adr.ranges["length"][0] < wide["length"][1] - wide["length"][0]
        assert adr.ranges["length"][0] <= 0.5 <= adr.ranges["length"][1]  # narrowing stops at nominal
        steady = {name: list(bounds) for name, bounds in adr.ranges.items()}
        feed_boundaries(adr, pool, score=250.0, rounds=10)  # between the thresholds: nothing moves
        assert adr.ranges == steady


def test_adr_state_round_trips(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 8, num_workers=1, name=pool_name, params=PARAMS) as pool:
        adr = ADR(delta=0.1, p_boundary=0.7, buffer=2, low_threshold=100, high_threshold=400, seed=3)
        adr.update(records_for(pool, [], {}, 0.0), pool.params)
        feed_boundaries(adr, pool, score=500.0, rounds=5)
        saved = json.loads(json.dumps(adr.state()))
        twin = ADR(delta=0.1, p_boundary=0.7, buffer=2, low_threshold=100, high_threshold=400, seed=99)
        twin.load(saved)
        assert twin.ranges == adr.ranges and twin.buffers == adr.buffers and twin.nominal == adr.nominal
        assert [twin._random.random() for _ in range(5)] == [adr._random.random() for _ in range(5)]


def test_threshold_steps_a_parameter(pool_name: str) -> None:
    with shmpool.launch(
        "CartPole-v1", 4, num_workers=1, name=pool_name, params={"length": Param(low=0.1, high=0.7)}
    ) as pool:
        curriculum = Threshold("length", step=0.15, target=100.0, window=4)
        records = np.zeros(4, dtype=pool.episodes.dtype)
        records["return"] = [90, 120, 110, 100]
        assert curriculum.update(records, pool.params)  # mean 105 >= 100: one step up
        assert pool.params["length"].tolist() == [0.65] * 4
        records["return"] = 50
        records["params"]["length"] = 0.65  # the value the episodes ran at, as the workers record it
        assert curriculum.update(records, pool.params) == []
        records["return"] = 200
        curriculum.update(records, pool.params)
        assert pool.params["length"].tolist() == [0.7] * 4  # clipped to the hard bound
        twin = Threshold("length", step=0.15, target=100.0, window=4)
        twin.load(json.loads(json.dumps(curriculum.state())))
        assert twin.value == 0.7 and twin.changes == curriculum.changes
        with pytest.raises(KeyError, match="no episode metric 'success'"):
            Threshold("length", step=0.1, target=1, metric="success").update(records, pool.params)


def test_threshold_at_the_bound_of_a_float32_parameter_moves_and_logs_nothing(pool_name: str) -> None:
    """0.8 + 0.3 is 1.1 to a float32 parameter, as its bound 1.1 is: a window at the target there
    moved it to the value it held, and logged ``length: 1.1 -> 1.1``."""
    params = {"length": Param(0.5, low=0.1, high=1.1, dtype="float32")}
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        curriculum = Threshold("length", step=0.3, target=100.0, window=1)
        records = np.zeros(1, dtype=pool.episodes.dtype)
        records["return"] = 150
        log: list[str] = []
        for _ in range(4):
            records["params"]["length"] = pool.params["length"][0]  # the value the episode ran at
            curriculum.update(records, pool.params, log)
        assert log == ["length: 0.5 -> 0.8 (mean return 150)", "length: 0.8 -> 1.1 (mean return 150)"]
        assert curriculum.changes == 2 and pool.params["length"].tolist() == [np.float32(1.1)] * 2


def test_threshold_steps_finer_than_the_parameters_dtype_add_up_until_the_stored_value_moves(pool_name: str) -> None:
    """float16 holds no value between 0.5 and 0.50049: steps of 1e-4 each leave it at 0.5, and
    together move it (comparing stored values alone, they stalled it for good)."""
    params = {"length": Param(0.5, low=0.1, high=1.0, dtype="float16")}
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        curriculum = Threshold("length", step=1e-4, target=100.0, window=1)
        records = np.zeros(1, dtype=pool.episodes.dtype)
        records["return"] = 150
        log: list[str] = []
        for _ in range(6):
            records["params"]["length"] = pool.params["length"][0]
            curriculum.update(records, pool.params, log)
        assert log == ["length: 0.5 -> 0.500488 (mean return 150)"] and curriculum.changes == 1
        assert pool.params["length"].tolist() == [0.50048828125] * 2


def episodes_until(pool: shmpool.Pool, count: int, length: float) -> np.ndarray:
    """Steps ``pool`` with random actions until ``count`` episodes that ended with pole length
    ``length`` are among the records read; returns every record read."""
    read, actions = [], np.random.default_rng(0)
    for _ in range(20_000):
        if sum(int((part["params"]["length"] == length).sum()) for part in read) >= count:
            return np.concatenate(read)
        pool.step(actions.integers(0, 2, pool.num_envs))
        read.append(pool.episodes.read())
    raise AssertionError(f"fewer than {count} episodes at length {length} in 20,000 steps")


def test_threshold_judges_only_the_episodes_run_at_the_value_it_wrote(pool_name: str) -> None:
    """After a move, the episodes that ended at the old value did move it again, as many times as
    they filled the window: 60 episodes at 0.5 made three moves, to 0.8, none judged at 0.6 or 0.7.
    A value written by someone else is where it goes on from, judged by the episodes run at it."""
    params = {"length": Param(0.5, low=0.1, high=2.0, when="reset")}
    with shmpool.launch("CartPole-v1", 16, num_workers=1, name=pool_name, params=params) as pool:
        pool.reset(seed=0)
        curriculum = Threshold("length", step=0.1, target=0.0, window=20)  # every full window moves it
        first = episodes_until(pool, 60, 0.5)
        moves = curriculum.update(first, pool.params)
        assert moves == [f"length: 0.5 -> 0.6 (mean return {np.mean(first['return'][:20]):.3g})"]
        second = episodes_until(pool, 20, 0.6)
        assert (second["params"]["length"] == 0.5).any()  # episodes that began before the move
        log = curriculum.update(second, pool.params)
        at_new = second["return"][second["params"]["length"] == 0.6][:20]
        assert log == [f"length: 0.6 -> 0.7 (mean return {np.mean(at_new):.3g})"]
        assert pool.params["length"].tolist() == pytest.approx([0.7] * 16)
        pool.params.write(None, length=0.3)  # another writer, or a checkpoint loaded: it goes on from there
        third = episodes_until(pool, 20, 0.3)
        assert curriculum.update(third, pool.params)[0].startswith("length: 0.3 -> 0.4")


def test_curriculum_script_attaches_steers_and_resumes(pool_name: str, tmp_path: Path) -> None:
    state = tmp_path / "adr.json"
    command = [
        sys.executable,
        "scripts/curriculum.py",
        "--pool",
        pool_name,
        "--algo",
        "adr",
        "--state",
        str(state),
        "--low-threshold",
        "5",
        "--high-threshold",
        "15",
        "--buffer",
        "2",
        "--p-boundary",
        "1",
        "--poll",
        "0.01",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    lows = [0.5]
    for attempt in range(2):
        with shmpool.launch("CartPole-v1", 8, num_workers=2, name=pool_name, params=PARAMS, seed=attempt) as pool:
            curriculum = subprocess.Popen(
                command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
            )
            first_lines = [curriculum.stdout.readline() for _ in range(attempt + 1)]
            assert first_lines[-1].startswith("attached to"), first_lines
            pool.reset()
            deadline = time.monotonic() + 30
            while not state.exists() or not json.loads(state.read_text())["ranges"]["length"][0] < lows[-1]:
                assert time.monotonic() < deadline, "ADR should widen: CartPole returns here are above 15"
                pool.step(pool.action_space.sample())
            lows.append(json.loads(state.read_text())["ranges"]["length"][0])
        output = "".join(first_lines) + curriculum.communicate(timeout=20)[0]
        assert curriculum.returncode == 0, output
        assert "the pool has gone away" in output
    assert output.startswith("resumed from")  # the second run went on from the first one's ranges
    assert lows[0] > lows[1] > lows[2]


def test_adr_widens_a_float32_parameter_as_far_as_a_float64_one(pool_name: str) -> None:
    """Boundaries are kept as the block stores them, so a pinned float32 episode is recognised by
    its record (a float64 boundary such as 0.425 never equals the float32 value drawn from it)."""
    ranges = {}
    for dtype in ("float64", "float32"):
        params = {"length": Param(dist="uniform", default={"low": 0.5, "high": 0.5}, low=0.1, high=1.5, dtype=dtype)}
        with shmpool.launch("CartPole-v1", 8, num_workers=1, name=f"{pool_name}{dtype}", params=params) as pool:
            adr = ADR(delta=0.05, p_boundary=1.0, buffer=2, low_threshold=100, high_threshold=400, seed=0)
            adr.update(records_for(pool, [], {}, 0.0), pool.params)
            feed_boundaries(adr, pool, score=500.0, rounds=20)
            ranges[dtype] = adr.ranges["length"]
    low, high = ranges["float32"]
    assert low < 0.5 - 0.07 * 3 and high > 0.5 + 0.07 * 3  # moved many times, not once
    np.testing.assert_allclose(ranges["float32"], ranges["float64"], rtol=1e-5)


def test_adr_needs_finite_hard_bounds(pool_name: str) -> None:
    params = {"length": Param(dist="uniform", default={"low": 0.5, "high": 0.5}, when="reset")}
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        adr = ADR(low_threshold=100, high_threshold=400)
        with pytest.raises(
            ValueError, match=r"'length' needs finite bounds \(Param\(low=..., high=...\)\), has \[-inf"
        ):
            adr.update(records_for(pool, [], {}, 0.0), pool.params)


def test_threshold_changes_only_with_the_write_and_reapplies_its_value_when_resumed(pool_name: str) -> None:
    params = {"length": Param(0.5, low=0.1, high=0.9)}
    curriculum = Threshold("length", step=0.1, target=100.0, window=2)
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        records = np.zeros(1, dtype=pool.episodes.dtype)
        records["return"] = 150
        assert curriculum.update(records, pool.params) == []  # one score of two
    with pytest.raises(PoolClosedError):  # the pool closed under the curriculum: its write fails
        curriculum.update(records, pool.params)
    assert curriculum.value == 0.5 and curriculum.changes == 0  # so it did not move either
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        assert curriculum.update(records, pool.params) != []  # the window still holds the scores: it moves now
        assert curriculum.value == pytest.approx(0.6) and pool.params["length"].tolist() == pytest.approx([0.6] * 2)
        saved = json.loads(json.dumps(curriculum.state()))
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        resumed = Threshold("length", step=0.1, target=100.0, window=2)
        resumed.load(saved)
        assert resumed.update(records[:0], pool.params) == []
        assert pool.params["length"].tolist() == pytest.approx([0.6] * 2)  # the new pool runs what it believes


class ClosingAfterWrites:
    """A pool's params that close the pool after ``writes`` writes: the pool goes away in the middle
    of a curriculum's update, as when the trainer exits while a curriculum process runs."""

    def __init__(self, pool: shmpool.Pool, writes: int) -> None:
        self._pool, self._block, self._left = pool, pool.params, writes

    def __getattr__(self, name: str) -> object:
        return getattr(self._block, name)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._block[name]

    def __len__(self) -> int:
        return len(self._block)

    def write(self, env_ids: object, **values: object) -> int:
        version = self._block.write(env_ids, **values)
        self._left -= 1
        if self._left == 0:
            self._pool.close()
        return version


@pytest.mark.parametrize("algo", ["adr", "threshold"])
def test_moves_made_before_the_pool_closes_midway_are_kept_in_the_log(pool_name: str, algo: str) -> None:
    params = PARAMS | {"x": Param(0.0, bind=False)}
    with shmpool.launch("CartPole-v1", 4, num_workers=1, name=pool_name, params=params) as pool:
        lines: list[str] = []
        if algo == "adr":
            curriculum: ADR | Threshold = ADR(
                ["length"], delta=0.1, p_boundary=1.0, buffer=1, low_threshold=-1, high_threshold=0, seed=0
            )
            curriculum.update(records_for(pool, [0, 1, 2, 3], {"length": [0.5] * 4}, 0.0), pool.params)  # pins all
            records = records_for(pool, [0, 1, 2, 3], {"length": [0.5] * 4}, 500.0)  # each scores its boundary
            writes = 2  # records move boundaries and re-pin their envs; the pool closes after two writes
        else:
            curriculum = Threshold("x", step=1.0, target=10.0, window=1)
            # Each moves x (the second ran at the value the first moved it to): the second write fails.
            records = records_for(pool, [0, 1], {"x": [0.0, 1.0]}, 500.0)
            writes = 1
        with pytest.raises(PoolClosedError):
            curriculum.update(records, ClosingAfterWrites(pool, writes), lines)  # type: ignore[arg-type]
        assert lines and lines[0].startswith("length: [0.5, 0.5] -> [" if algo == "adr" else "x: 0 -> 1"), lines


def test_a_curriculum_resumes_only_from_a_state_of_its_own_kind_and_parameters(pool_name: str) -> None:
    """``load`` refuses another parameter's or curriculum's state, as ``load_state_dict`` does: a
    Threshold loaded from gravity's state wrote gravity's value into force_mag. A loaded ADR pins
    its envs afresh, as its docstring says."""
    gravity = Threshold("gravity", step=1.0, target=1e9)
    gravity.value = 9.8
    with pytest.raises(ValueError, match="this state moves 'gravity', this Threshold moves 'force_mag'"):
        Threshold("force_mag", step=1.0, target=1e9).load(gravity.state())
    settings = {"low_threshold": 100, "high_threshold": 400}
    with pytest.raises(ValueError, match=r"not a state\(\) of 'threshold' \(algo 'adr'\)"):
        Threshold("gravity", step=1.0, target=1e9).load(ADR(**settings).state())
    with shmpool.launch("CartPole-v1", 4, num_workers=1, name=pool_name, params=PARAMS) as pool:
        adr = ADR(p_boundary=1.0, **settings)
        adr.update(records_for(pool, [0, 1], {"length": [0.5, 0.5], "gravity": [9.8, 9.8]}, 0.0), pool.params)
        assert adr.pinned
        with pytest.raises(
            ValueError, match=r"this state steers \['gravity', 'length'\], this ADR steers \['length'\]"
        ):
            ADR(["length"], **settings).load(adr.state())
        with pytest.raises(ValueError, match=r"not a state\(\) of 'adr' \(algo 'threshold'\)"):
            ADR(**settings).load(gravity.state())
        resumed = ADR(p_boundary=1.0, **settings)
        resumed.pinned = dict(adr.pinned)  # as if it had run before
        resumed.load(adr.state())
        assert resumed.pinned == {} and resumed.ranges == adr.ranges
    unstarted = ADR(["length"], **settings).state()  # saved before any episode ended: no ranges yet
    ADR(["length"], **settings).load(unstarted)
    assert Threshold("x", step=1.0, target=1.0, window=np.int64(5)).state_dict()["settings"]["window"] == 5


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: ADR("length", low_threshold=0, high_threshold=1),
            TypeError,
            r"the one name 'length' \(use \['length'\]\)",
        ),
        (lambda: ADR(delta=float("nan"), low_threshold=0, high_threshold=1), ValueError, "delta=nan"),
        (lambda: ADR(low_threshold=float("nan"), high_threshold=1), ValueError, "thresholds nan and 1"),
        (lambda: ADR(buffer=2.5, low_threshold=0, high_threshold=1), ValueError, r"ADR\(buffer=...\) .* got 2.5"),
        (lambda: ADR(metric=None, low_threshold=0, high_threshold=1), TypeError, r"ADR\(metric=...\)"),
        (lambda: Threshold("length", step=float("nan"), target=1), ValueError, "step=nan"),
        (lambda: Threshold("length", step=0.1, target=float("nan")), ValueError, "target=nan"),
        (lambda: Threshold(["length"], step=0.1, target=1), TypeError, r"parameter's name, got \['length'\]"),
        (lambda: Threshold("length", step=0.1, target=1, window=0), ValueError, r"window=...\) .* got 0"),
    ],
)
def test_curricula_refuse_bad_settings_when_made(make: Any, error: type[Exception], message: str) -> None:
    """Not at the first update: a NaN delta stored a NaN boundary that made every later update fail,
    and ADR("length") steered the parameters 'l', 'e', 'n', ..."""
    with pytest.raises(error, match=message):
        make()
