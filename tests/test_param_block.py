"""Writes to the ``params`` block (:mod:`shmpool.param_block`): checked against each parameter's dtype,
and atomic across fields for every reader, whichever threads and processes write at once and wherever
a writer dies: a half write is rolled back, by the next writer or by the owner, and never applied.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from contextlib import closing

import helpers
import numpy as np
import pytest

import shmpool
import shmpool.envpool as shm_envpool
from shmpool import Param
from shmpool.hooks import Reset

PAIR_WRITER = """
import sys, numpy as np, shmpool
rng = np.random.default_rng(int(sys.argv[2]))
with shmpool.attach(sys.argv[1], wait=10) as handle:
    print("ready", flush=True)
    while True:
        x = float(rng.integers(1, 1000))
        handle.params.write(rng.choice(4, size=2, replace=False), a=x, b=-x)
"""


def test_threads_and_processes_writing_pairs_never_publish_a_torn_pair(pool_name: str) -> None:
    params = {"a": Param(0.0), "b": Param(0.0), "c": Param(0.0, bind=False)}
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    stop = threading.Event()
    with shmpool.launch(helpers.PairEnv, 4, num_workers=2, name=pool_name, params=params) as pool:
        writer = subprocess.Popen(
            [sys.executable, "-c", PAIR_WRITER, pool_name, "1"], stdout=subprocess.PIPE, text=True, env=helpers.ENV
        )
        try:
            assert writer.stdout.readline().strip() == "ready"
            pool.reset(seed=0)

            def pairs() -> None:
                rng = np.random.default_rng(2)
                while not stop.is_set():
                    x = float(rng.integers(1000, 2000))
                    pool.params.write(rng.choice(4, size=3, replace=False), a=x, b=-x)

            def others() -> None:
                while not stop.is_set():
                    pool.params.write(None, c=1.0)

            threads = [threading.Thread(target=pairs), threading.Thread(target=others)]
            for thread in threads:
                thread.start()
            torn = []
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                observations, *_ = pool.step(np.zeros(4, dtype=np.int64))
                torn += [row.tolist() for row in observations if row[0] != -row[1]]
        finally:
            stop.set()
            sys.setswitchinterval(previous)
            writer.kill()
            writer.wait(5)
        for thread in threads:
            thread.join(5)
        assert torn == []
        assert pool.params.refusals == {"a": 0, "b": 0, "c": 0}


HALF_WRITER = """
import os, signal, sys
import numpy as np
import shmpool

class DieHere:
    # Stands for the writer's death in the middle of its write: numpy asks for the values here.
    def __array__(self, dtype=None, copy=None):
        print("dying", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

handle = shmpool.attach(sys.argv[1], wait=10)
block = handle.params
rows = np.array([0, 1])
staged = [(block["a"], np.array([5.0, 5.0])), (block["b"], DieHere())]
block._lock.run(None, lambda: None, block._seqlock.write, rows, staged)
"""


def test_a_writer_killed_mid_write_never_gets_its_half_write_applied(pool_name: str) -> None:
    params = {"a": Param(1.0), "b": Param(-1.0), "c": Param(0.0, bind=False)}
    with shmpool.launch(helpers.PairEnv, 4, num_workers=2, name=pool_name, params=params) as pool:
        pool.reset(seed=0)
        result = helpers.run_script(HALF_WRITER, pool_name)
        assert result.returncode == -signal.SIGKILL and "dying" in result.stdout, result.stderr[-2000:]
        observations, *_ = pool.step(np.zeros(4, dtype=np.int64))
        assert observations.tolist() == [[1.0, -1.0]] * 4  # the odd rows are not read meanwhile
        pool.params.write(None, c=2.0)  # an unrelated write by the next writer rolls the half write back
        for _ in range(2):
            observations, *_ = pool.step(np.zeros(4, dtype=np.int64))
            assert observations.tolist() == [[1.0, -1.0]] * 4
        assert pool.params["a"].tolist() == [1.0] * 4
        assert pool.params.refusals == {"a": 0, "b": 0, "c": 0}
        pool.params.write([0], a=3.0, b=-3.0)  # and the rows take writes again
        observations, *_ = pool.step(np.zeros(4, dtype=np.int64))
        assert observations[0].tolist() == [3.0, -3.0]


def test_the_owner_rolls_back_a_dead_writers_half_write_without_another_writer(pool_name: str) -> None:
    params = {"a": Param(1.0), "b": Param(-1.0)}
    with shmpool.launch(helpers.PairEnv, 4, num_workers=2, name=pool_name, params=params) as pool:
        pool.reset(seed=0)
        result = helpers.run_script(HALF_WRITER, pool_name)
        assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
        for _ in range(70):  # the trainer looks for a dead writer's journal every 64 steps
            pool.step(np.zeros(4, dtype=np.int64))
        pool.params["a"][0] = 7.0  # a raw write, read only once the rows are whole again
        observations, *_ = pool.step(np.zeros(4, dtype=np.int64))
        assert observations[:, 0].tolist() == [7.0, 1.0, 1.0, 1.0]
        assert observations[:, 1].tolist() == [-1.0] * 4


MERGING_WRITER = """
import sys, shmpool
values = [{"low": 0.8}, {"low": 0.1}] if sys.argv[2] == "low" else [{"high": 0.2}, {"high": 0.9}]
refused = 0
with shmpool.attach(sys.argv[1], wait=10) as handle:
    print("ready", flush=True)
    for _ in range(int(sys.argv[3])):
        for value in values:  # each is valid against one of the other writer's two values
            try:
                handle.params.write(None, u=value)
            except ValueError:
                refused += 1
print(refused, flush=True)
"""


def test_concurrent_writers_of_one_distribution_never_store_low_above_high(pool_name: str) -> None:
    params = {"u": Param({"low": 0.1, "high": 0.9}, low=0.0, high=1.0, dist="uniform", bind=False)}
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", MERGING_WRITER, pool_name, side, "3000"],
                stdout=subprocess.PIPE,
                text=True,
                env=helpers.ENV,
            )
            for side in ("low", "high")
        ]
        try:
            for writer in writers:
                assert writer.stdout.readline().strip() == "ready"
            inverted = 0
            while any(writer.poll() is None for writer in writers):
                block = pool.params["u"]
                inverted += int((block["low"] > block["high"]).any())
            assert [writer.wait(60) for writer in writers] == [0, 0]
        finally:
            for writer in writers:
                writer.kill()
                writer.wait(5)
        # A raw read can catch a write in flight, so count only what was left behind and what
        # the workers refused.
        pool.reset(seed=0)
        pool.step(np.zeros(2, dtype=np.int64))
        assert (pool.params["u"]["low"] <= pool.params["u"]["high"]).all()
        assert pool.params.refusals == {"u": 0}


def test_write_refuses_values_the_parameters_dtype_cannot_hold(pool_name: str) -> None:
    params = {
        "i64": Param(0, dtype="int64", bind=False),
        "u8": Param(0, dtype="uint8", bind=False),
        "flag": Param(False, dtype="bool", bind=False),
        "f32": Param(0.0, dtype="float32", bind=False),
        "f32_bounded": Param(0.1, dtype="float32", low=0.0, high=0.1, bind=False),  # a float32 0.1 fits
    }
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        pool.reset(seed=0)
        for name, value in [("u8", 300), ("u8", -1), ("flag", 2), ("f32", 1e300), ("i64", 2.5), ("i64", float("nan"))]:
            with pytest.raises(ValueError, match=name):
                pool.params.write(0, **{name: value})
        pool.params.write(0, i64=2**63 - 1, u8=255, flag=1, f32=3.5, f32_bounded=0.1)
        pool.params.write(1, i64=2**53 + 1)  # beyond float64's whole numbers: stored exactly
        pool.step(np.zeros(2, dtype=np.int64))
        assert pool.params["i64"].tolist() == [2**63 - 1, 2**53 + 1]
        assert pool.applied["i64"].tolist() == [2**63 - 1, 2**53 + 1]
        assert (pool.applied["u8"][0], bool(pool.applied["flag"][0]), pool.applied["f32"][0]) == (255, True, 3.5)
        assert pool.params.refusals == dict.fromkeys(params, 0)


def test_an_attribute_assignment_writes_nothing_and_says_how_to_write(pool_name: str) -> None:
    params = {"length": Param(0.5, low=0.1, high=2.0)}
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        with pytest.raises(AttributeError, match=r"params.length = \.\.\. writes no parameter: say params\['length'\]"):
            pool.params.length = 0.9
        with pytest.raises(AttributeError, match=r"params.lenght = .*\(did you mean 'length'\?\)"):
            pool.params.lenght = 0.9
        assert pool.params["length"].tolist() == [0.5, 0.5] and not hasattr(pool.params, "lenght")


def test_numbers_for_every_env_are_written_as_arrays_of_them_are(pool_name: str) -> None:
    """A number (float, int, numpy float) for a float64 parameter goes the quick way; it must give
    what an array of it gives, and be refused the same way, naming the parameter and the value."""
    params = {"a": Param(1.0, low=0.0, high=10.0, bind=False), "b": Param(1.0, low=-5.0, high=5.0, bind=False)}
    with shmpool.launch("CartPole-v1", 4, num_workers=1, name=pool_name, params=params) as pool:
        version = pool.params.write(None, a=2.5, b=np.float64(-1.5))
        assert pool.params["a"].tolist() == [2.5] * 4 and pool.params["b"].tolist() == [-1.5] * 4
        assert pool.params.write([3, 1, 3], a=7, b=np.array([0.5, 1.0, 2.0])) == version + 1
        assert pool.params["a"].tolist() == [2.5, 7.0, 2.5, 7.0]
        assert pool.params["b"].tolist() == [-1.5, 1.0, -1.5, 2.0]  # env 3 given twice: its last row
        for value, shown in [(10.5, "10.5"), (float("nan"), "nan"), (float("inf"), "inf"), (10**400, "1000000")]:
            with pytest.raises(ValueError, match=rf"CartPole-v1: params\['a'\].* = {shown}"):
                pool.params.write(None, a=value, b=0.0)
        with pytest.raises(ValueError, match=r"params\['b'\]\[2\] = 6"):
            pool.params.write(None, a=1.0, b=np.array([0.0, 0.0, 6.0, 0.0]))
        assert pool.params["a"].tolist() == [2.5, 7.0, 2.5, 7.0]  # nothing of a refused write landed
        pool.params.write(slice(0, 2), a=True)  # a bool is 0 or 1, as numpy stores it
        assert pool.params["a"].tolist() == [1.0, 1.0, 2.5, 7.0]
        pool.reset(seed=0)
        pool.step(np.zeros(4, dtype=np.int64))
        np.testing.assert_array_equal(pool.applied["a"], pool.params["a"])


def test_env_ids_beyond_int64_are_refused_as_given_never_wrapped_onto_an_env(pool_name: str) -> None:
    """An unsigned id past 2**63 once became a negative int64, then an env counted from the end."""
    params = {"a": Param(1.0, bind=False)}
    with shmpool.launch("CartPole-v1", 8, num_workers=2, name=pool_name, params=params, hooks=[Reset()]) as pool:
        for ids in (np.array([2**64 - 1], np.uint64), np.array([2**63], np.uint64), [2**64 - 1], [2**63]):
            shown = str(int(np.asarray(ids)[0]))
            with pytest.raises(ValueError, match=rf"env_ids \[{shown}\] out of range for num_envs=8"):
                pool.params.write(ids, a=6.25)
            with pytest.raises(ValueError, match=rf"env_ids \[{shown}\] out of range"):
                pool.events.send("Reset", ids)
        assert pool.params["a"].tolist() == [1.0] * 8
        pool.params.write(np.array([7], np.uint64), a=6.25)  # an unsigned id in range is the env it names
        assert pool.params["a"].tolist() == [1.0] * 7 + [6.25]
        refused = helpers.shmpool_cli("set", pool_name, "a=2.0", "--envs", str(2**64 - 1))
        assert refused.returncode == 2 and f"[{2**64 - 1}]" in refused.stderr
        assert pool.params["a"].tolist() == [1.0] * 7 + [6.25]
    huge = np.array([0, 1, 2, 2**64 - 1], np.uint64)
    with shmpool.launch("CartPole-v1", 8, num_workers=2, batch_size=4, name=pool_name) as pool:
        pool.async_reset(seed=0)
        pool.recv()
        with pytest.raises(IndexError, match=rf"send: env ids \[0, 1, 2, {2**64 - 1}\] are outside 0..7"):
            pool.send(np.zeros(4, dtype=np.int64), huge)
    with closing(shm_envpool.make("CartPole-v1", env_type="gymnasium", num_envs=4)) as env:
        with pytest.raises(IndexError, match=rf"reset: env ids \[{2**64 - 1}\] are outside 0..3"):
            env.reset(huge[3:])
