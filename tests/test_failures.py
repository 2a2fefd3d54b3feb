"""Faults surface as named exceptions within seconds, and leave no process or segment behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import helpers
import numpy as np
import pytest

import shmpool
from shmpool import PoolBrokenError, PoolClosedError, PoolTimeoutError, RemoteTraceback, WorkerDiedError, WorkerError

ROOT = Path(__file__).resolve().parents[1]


def test_env_raising_in_step_names_worker_env_and_traceback(pool_name: str) -> None:
    factory = lambda: helpers.CountingEnv(length=100, raise_at=3, raise_seed=103)  # noqa: E731
    pool = shmpool.launch(factory, 4, num_workers=2, name=pool_name)
    pool.reset(seed=100)  # env i gets seed 100 + i: env 3, in worker 1, is the one that raises
    pool.step([0, 0, 0, 0])
    pool.step([0, 0, 0, 0])
    started = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        pool.step([0, 0, 0, 0])
    assert time.monotonic() - started < 2.0
    error = caught.value
    assert (error.worker_id, error.env_id) == (1, 3)
    assert "worker 1" in str(error) and "env 3" in str(error) and "boom at step 3" in str(error)
    assert isinstance(error.__cause__, RemoteTraceback)
    assert "explode_here" in error.__cause__.text and "ZeroDivisionError" in error.__cause__.text
    with pytest.raises(PoolBrokenError) as broken:
        pool.step([0, 0, 0, 0])
    assert broken.value.__cause__ is error
    pool.close()
    pool.close()  # idempotent


def test_env_raising_in_reset_and_in_constructor(pool_name: str) -> None:
    with shmpool.launch(lambda: helpers.CountingEnv(raise_in_reset=True), 3, num_workers=3, name=pool_name) as pool:
        with pytest.raises(WorkerError, match="during reset.*reset exploded on purpose") as caught:
            pool.reset()
        assert caught.value.worker_id == 0 and caught.value.env_id == 0

    built = []

    def factory() -> helpers.CountingEnv:
        built.append(1)
        # The trainer's probe env (the first one made in this process) succeeds; the workers' fail.
        return helpers.CountingEnv(raise_in_init=os.getpid() != trainer_pid)

    trainer_pid = os.getpid()
    with pytest.raises(WorkerError, match="during launch.*refused to be built") as caught:
        shmpool.launch(factory, 4, num_workers=2, name=pool_name + "2")
    assert caught.value.env_id in (0, 2)


def test_worker_killed_between_steps(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=0)
        os.kill(pool.worker_pids[1], signal.SIGKILL)
        time.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(WorkerDiedError, match="worker 1 .*SIGKILL") as caught:
            pool.step([0, 1, 0, 1])
        assert time.monotonic() - started < 2.0
        assert caught.value.worker_id == 1 and caught.value.exitcode == -signal.SIGKILL


def test_worker_killed_mid_step(pool_name: str) -> None:
    with shmpool.launch(lambda: helpers.CountingEnv(length=100, sleep=0.3), 2, num_workers=2, name=pool_name) as pool:
        pool.reset()
        victim = pool.worker_pids[0]
        threading.Timer(0.1, os.kill, (victim, signal.SIGKILL)).start()
        started = time.monotonic()
        with pytest.raises(WorkerDiedError, match="worker 0"):
            pool.step([1, 1])
        assert time.monotonic() - started < 2.0


def test_step_timeout_then_bounded_close(pool_name: str) -> None:
    pool = shmpool.launch(
        lambda: helpers.CountingEnv(length=100, sleep=30), 2, num_workers=2, name=pool_name, timeout=0.5
    )
    pool.reset()
    started = time.monotonic()
    with pytest.raises(PoolTimeoutError, match=r"worker\(s\) \[0, 1\] did not finish step within 0.5 s"):
        pool.step([0, 0])
    assert time.monotonic() - started < 2.0
    pids = pool.worker_pids
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 6.0
    assert helpers.wait_gone(pids, 1.0) == []


def test_use_after_close_raises(pool_name: str) -> None:
    pool = shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name)
    pids = pool.worker_pids
    pool.close()
    assert pool.closed and helpers.wait_gone(pids, 1.0) == []
    for call in (lambda: pool.reset(), lambda: pool.step([0, 0])):
        with pytest.raises(PoolClosedError, match="closed"):
            call()


def test_garbage_collection_closes(pool_name: str) -> None:
    import gc

    pool = shmpool.launch("CartPole-v1", 2, num_workers=2, name=pool_name)
    pids = pool.worker_pids
    del pool
    gc.collect()
    assert helpers.wait_gone(pids, 3.0) == []
    assert not [n for n in os.listdir("/dev/shm") if pool_name in n]


@pytest.mark.parametrize(
    "actions, message",
    [
        ([0, 1, 2], r"shape \(3,\), expected \(4,\)"),
        (np.array(["a", "b", "c", "d"]), "dtype <U1, which cannot be cast to int64"),
        ([0, 1, 5, 0], r"env 2: action 5 .* outside Discrete\(2\)"),
        ([0, -1, 0, 0], r"env 1: action -1 .* outside Discrete\(2\)"),
        (np.array([0.0, 1.0, 0.0, 1.0]), "float64, which cannot be cast"),
    ],
)
def test_bad_actions_are_refused_before_sending(actions, message: str, pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name) as pool:
        first, _ = pool.reset(seed=0)
        with pytest.raises(ValueError, match=message) as caught:
            pool.step(actions)
        assert "CartPole-v1" in str(caught.value)
        # Nothing reached the workers: the next step continues from the reset state.
        import gymnasium as gym
        from gymnasium.vector import SyncVectorEnv

        reference = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(4)])
        reference.reset(seed=0)
        np.testing.assert_array_equal(pool.step([1, 1, 0, 0])[0], reference.step(np.array([1, 1, 0, 0]))[0])
        reference.close()


def test_box_action_shape_is_checked(pool_name: str) -> None:
    with shmpool.launch("Pendulum-v1", 2, num_workers=1, name=pool_name) as pool:
        pool.reset(seed=0)
        with pytest.raises(ValueError, match=r"Pendulum-v1: actions has shape \(2,\), expected \(2, 1\)"):
            pool.step(np.zeros(2))
        pool.step(np.zeros((2, 1)))  # float64 into the float32 Box is cast


def _run_child(script: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"},
        **kwargs,
    )


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_trainer_killed_workers_exit_and_segment_goes(start_method: str, pool_name: str) -> None:
    child = _run_child(
        f"""
        import json, sys, time, shmpool
        if __name__ == "__main__":
            pool = shmpool.launch("CartPole-v1", 4, num_workers=2, name={pool_name!r}, start_method={start_method!r})
            pool.reset(seed=0)
            print(json.dumps(pool.worker_pids), flush=True)
            while True:
                pool.step([0, 1, 0, 1])
        """
    )
    try:
        pids = json.loads(child.stdout.readline())
        time.sleep(0.2)
        child.kill()
        child.wait(5)
        assert helpers.wait_gone(pids, 5.0) == []
        deadline = time.monotonic() + 2.0
        while [n for n in os.listdir("/dev/shm") if pool_name in n] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [n for n in os.listdir("/dev/shm") if pool_name in n]
    finally:
        child.kill()
        child.communicate()


def test_ctrl_c_during_step_leaves_nothing(pool_name: str) -> None:
    child = _run_child(
        f"""
        import json, shmpool, helpers
        with shmpool.launch(lambda: helpers.CountingEnv(length=10**9, sleep=0.05), 4, num_workers=2,
                            name={pool_name!r}) as pool:
            pool.reset()
            print(json.dumps(pool.worker_pids), flush=True)
            while True:
                pool.step([0, 1, 0, 1])
        """,
        start_new_session=True,  # its own process group, as a terminal would make
    )
    try:
        pids = json.loads(child.stdout.readline())
        time.sleep(0.3)
        os.killpg(child.pid, signal.SIGINT)  # Ctrl-C reaches every process of the group
        _, stderr = child.communicate(timeout=10)
        assert child.returncode != 0
        assert stderr.count("Traceback (most recent call last)") == 1, stderr
        assert stderr.count("KeyboardInterrupt") == 1, stderr
        assert helpers.wait_gone(pids, 2.0) == []
        assert not [n for n in os.listdir("/dev/shm") if pool_name in n]
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()


def test_whole_group_killed_then_gc_removes_the_segment(pool_name: str) -> None:
    child = _run_child(
        f"""
        import json, time, shmpool
        pool = shmpool.launch("CartPole-v1", 2, num_workers=2, name={pool_name!r})
        print(json.dumps(pool.worker_pids), flush=True)
        time.sleep(60)
        """,
        start_new_session=True,
    )
    pids = json.loads(child.stdout.readline())
    os.killpg(child.pid, signal.SIGKILL)  # trainer and workers at once: nobody can clean up
    child.communicate()
    assert helpers.wait_gone(pids, 2.0) == []
    assert [n for n in os.listdir("/dev/shm") if pool_name in n]
    result = subprocess.run(
        [sys.executable, "-m", "shmpool", "gc"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert pool_name in result.stdout
    assert not [n for n in os.listdir("/dev/shm") if pool_name in n]
