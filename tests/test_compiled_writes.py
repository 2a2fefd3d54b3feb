"""The common params writes as one compiled call (:mod:`shmpool.compiled_writes`): every guarantee of
``write`` kept, a writer killed inside them rolled back, and a load that forks, signals and a broken
numba cannot spoil."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import warnings
from typing import Any

import helpers
import numpy as np
import pytest
from helpers import ROOT

import shmpool
from shmpool import Param, param_block


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


FORK_DURING_THE_FIRST_COMPILED_WRITE = """
import os, sys, threading, time
import shmpool

params = {"a": shmpool.Param(0.0, bind=False)}
with shmpool.launch("CartPole-v1", 4, num_workers=1, name=sys.argv[1], params=params) as pool:
    handle = shmpool.attach(pool.name)
    writer = threading.Thread(target=lambda: [handle.params.write(None, a=1.0) for _ in range(40)])
    writer.start()
    while True:  # until the writer's thread is inside numba's compiler, loading the compiled write
        compiler = getattr(sys.modules.get("numba.core.compiler_lock"), "global_compiler_lock", None)
        if compiler is not None and hasattr(sys.modules.get("shmpool.protocol.compiled"), "entry_point"):
            if not compiler._lock.acquire(blocking=False):
                break
            compiler._lock.release()
        time.sleep(0.0002)
    child = os.fork()
    if child == 0:
        for _ in range(40):
            handle.params.write(None, a=2.0)  # its own first compiled write
        os._exit(0)
    writer.join()
    for _ in range(300):
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        os.waitpid(child, 0)
        status = None
    handle.close()
    print("hung" if status is None else os.waitstatus_to_exitcode(status))
"""


@helpers.needs("numba")
def test_a_child_forked_while_another_thread_loads_the_compiled_write_writes_too(pool_name: str) -> None:
    """A fork waits for the compiled write's load: a child forked in the middle of it would inherit
    numba's compiler lock held by a thread it does not have, and hang at its first compiled write."""
    result = helpers.run_script(FORK_DURING_THE_FIRST_COMPILED_WRITE, pool_name, timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "0"
