"""A pool's life (:mod:`shmpool.pool.lifecycle`): it belongs to the process that launched it, releases its
segment and workers exactly once (``close()`` from any thread, garbage collection, a launch stopped by
Ctrl-C), and what a caller keeps past ``close()`` stays safe to touch.

A use after close reads memory that close could unmap: a mistake there is a SIGSEGV, so those tests
run their pool in a subprocess, where a crash fails the test instead of ending the test run.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import time
from pathlib import Path

import gymnasium as gym
import helpers
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

import shmpool
import shmpool.hooks


def test_a_pool_nothing_refers_to_is_released_at_once(pool_name: str) -> None:
    """No part of a pool refers back to it: dropping the last reference releases it there and then,
    without waiting for the cyclic garbage collector (so its name is free again at once)."""
    gc.disable()  # a cycle would now keep it for good
    try:
        pool = shmpool.launch(
            "CartPole-v1",
            4,
            num_workers=2,
            name=pool_name,
            params={"length": shmpool.Param(low=0.1, high=1.0)},
            hooks=[shmpool.hooks.ObservationNoise(0.1)],
            batch_size=2,
            profile=True,
        )
        pool.reset(seed=0)
        pool.step([0, 1, 0, 1])
        params = pool.params
        del pool
        assert not os.path.exists(f"/dev/shm/shmpool-{pool_name}")
        with pytest.raises(shmpool.PoolClosedError, match="is closed"):
            params.write(None, length=0.5)
        with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name) as again:
            assert again.num_envs == 2
    finally:
        gc.enable()


USE_AFTER_CLOSE = """
import sys, threading, time
import numpy as np
import shmpool
from shmpool import Param

name = sys.argv[1]
with shmpool.launch("CartPole-v1", 4, num_workers=2, name=name, copy=False, params={"length": Param()}) as pool:
    observations, _ = pool.reset(seed=0)
    lengths = pool.params["length"]
    with shmpool.attach(name) as handle:
        applied = handle.applied
    handle_after_close = handle
junk = [np.ones(1 << 18) for _ in range(200)]  # lets the allocator reuse a freed mapping
print(float(lengths.sum()), float(np.abs(observations).sum() >= 0), float(applied["length"].sum()))
for name_, get in [("pool.params", lambda: pool.params), ("pool.applied", lambda: pool.applied),
                   ("pool.episodes", lambda: pool.episodes), ("pool.step", lambda: pool.step([0, 0, 0, 0])),
                   ("handle.applied", lambda: handle_after_close.applied),
                   ("handle.params", lambda: handle_after_close.params)]:
    try:
        get()
        print(name_, "no error")
    except shmpool.PoolClosedError:
        print(name_, "PoolClosedError")
    except Exception as exc:
        print(name_, type(exc).__name__)
"""


def test_views_kept_after_close_stay_readable_and_every_use_raises_closed(pool_name: str) -> None:
    result = helpers.run_script(USE_AFTER_CLOSE, pool_name)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].split()[0] == "2.0" and lines[0].split()[2] == "2.0"  # CartPole's nominal length 0.5 x 4
    assert lines[1:] == [
        "pool.params PoolClosedError",
        "pool.applied PoolClosedError",
        "pool.episodes PoolClosedError",
        "pool.step PoolClosedError",
        "handle.applied PoolClosedError",
        "handle.params PoolClosedError",
    ]


CLOSE_DURING_STEP = """
import sys, time
import numpy as np
import shmpool
sys.path.insert(0, "tests")
import helpers

pool = shmpool.launch(lambda: helpers.CountingEnv(length=10**9, sleep=float(sys.argv[2])), 2, num_workers=1,
                      name=sys.argv[1])
pool.reset(seed=0)

def step_on():
    while True:
        pool.step(np.zeros(2, dtype=np.int64))

thread, outcome = helpers.outcome_in_thread(step_on)
time.sleep(0.1)
pool.close()
thread.join(10)
print(outcome, thread.is_alive())
"""


@pytest.mark.parametrize("step_seconds", [0.0, 0.3])
def test_close_from_another_thread_during_step_raises_closed_in_the_stepper(
    pool_name: str, step_seconds: float
) -> None:
    for _ in range(3):  # the race lands differently each time
        result = helpers.run_script(CLOSE_DURING_STEP, pool_name, str(step_seconds))
        # A close that released the doorbell under the stepper's wait would end the script with SIGSEGV.
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() == "['PoolClosedError'] False"


CLOSE_DURING_A_LONG_SLOT_STEP = """
import os, sys, threading, time
import numpy as np
import shmpool
import shmpool.pool.pool
sys.path.insert(0, "tests")
import helpers

shmpool.pool.pool.CLOSE_WAIT = 0.2  # how long close() waits for another thread's call to end, shortened
TRAINER = os.getpid()
in_step = threading.Event()

class SlowToStep(helpers.CountingEnv):
    stepping, closed_while_stepping = False, []

    def step(self, action):
        SlowToStep.stepping = True
        in_step.set()
        try:
            return super().step(action)
        finally:
            SlowToStep.stepping = False

    def close(self):
        if os.getpid() != TRAINER:
            time.sleep(0.3)  # a worker slow to stop: both closes wait for it
        SlowToStep.closed_while_stepping.append(SlowToStep.stepping)
        super().close()

def names(pool_name):
    return sorted(name for name in os.listdir("/dev/shm") if pool_name in name)

# Only the trainer's slot steps slowly (1.5 s): the worker's env is done at once.
pool = shmpool.launch(lambda: SlowToStep(length=10**9, sleep=1.5 if os.getpid() == TRAINER else 0.0), 2,
                      num_workers=2, trainer_slot=True, name=sys.argv[1])
pool.reset(seed=0)
workers = pool.worker_pids
SlowToStep.closed_while_stepping.clear()  # the env launch probed and closed
errors = []

def closer():
    try:
        pool.close()
    except Exception as exc:
        errors.append(repr(exc))

thread, outcome = helpers.outcome_in_thread(lambda: pool.step(np.zeros(2, dtype=np.int64)), "stepped")
in_step.wait(10)
closers = [threading.Thread(target=closer) for _ in range(2)]  # two at once: one stops the workers
for closing in closers:
    closing.start()
for closing in closers:
    closing.join(10)
alive = [pid for pid in workers if os.path.exists(f"/proc/{pid}")]
print(errors, names(sys.argv[1]), alive, SlowToStep.closed_while_stepping, flush=True)
# The name is free at once; the old pool's handles, closed later, must leave the new pool's be.
with shmpool.launch("CartPole-v1", 2, num_workers=1, name=sys.argv[1]) as again:
    thread.join(10)
    deadline = time.monotonic() + 5
    while not SlowToStep.closed_while_stepping and time.monotonic() < deadline:
        time.sleep(0.01)
    again.reset(seed=0)
    again.step(np.zeros(2, dtype=np.int64))
    print(outcome, thread.is_alive(), SlowToStep.closed_while_stepping, len(names(sys.argv[1])) > 0)
"""


def test_close_while_another_threads_slot_step_outlasts_its_wait_keeps_that_steps_handles(pool_name: str) -> None:
    """The workers and names go when close() returns (two closes at once, too); the envs and
    semaphores the step still uses close once it ends (a semaphore closed under a sleeping wait is
    memory unmapped under it), leaving a new pool of the same name alone."""
    result = helpers.run_script(CLOSE_DURING_A_LONG_SLOT_STEP, pool_name)
    assert result.returncode == 0, result.stderr[-2000:]
    closed, ended = result.stdout.splitlines()
    assert closed == "[] [] [] []"
    assert ended == "['PoolClosedError'] False [False] True"  # the step ends, as a closed pool's; then they close


EXIT_DURING_A_STEP = """
import os, sys, threading, time
import numpy as np
import shmpool
sys.path.insert(0, "tests")
import helpers

TRAINER = os.getpid()
# The worker's env is stuck in its step: a daemon thread's step waits on the trainer's doorbell.
pool = shmpool.launch(lambda: helpers.CountingEnv(length=10**9, sleep=0.0 if os.getpid() == TRAINER else 20.0), 2,
                      num_workers=1, name=sys.argv[1])
pool.reset(seed=0)
print(pool.worker_pids[0], flush=True)
threading.Thread(target=pool.step, args=(np.zeros(2, dtype=np.int64),), daemon=True).start()
time.sleep(0.3)
"""


def test_an_exit_while_a_daemon_threads_step_sleeps_stops_the_workers_under_no_unmapped_wait(pool_name: str) -> None:
    """The exit's finalizer stops the workers and removes the names, and leaves the doorbells' semaphores
    open under that step's wait (closed, they crashed the exit with SIGSEGV three times in four)."""
    for _ in range(2):
        result = helpers.run_script(EXIT_DURING_A_STEP, pool_name)
        assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
        assert not os.path.exists(f"/proc/{int(result.stdout)}")
        assert not [name for name in os.listdir("/dev/shm") if pool_name in name]


ENV_APPLY_DURING_CLOSE = """
import os, sys, time
import shmpool
import shmpool.pool.pool
sys.path.insert(0, "tests")
import helpers

shmpool.pool.pool.CLOSE_WAIT = 0.2
TRAINER = os.getpid()

def nap(env):  # in the trainer's slot, past close()'s wait; in the worker, past its stop (SIGTERM)
    time.sleep(3.0 if os.getpid() == TRAINER else 10.0)

pool = shmpool.launch(helpers.CountingEnv, 2, num_workers=2, trainer_slot=True, start_method="fork", timeout=None,
                      name=sys.argv[1])
pool.reset(seed=0)
thread, outcome = helpers.outcome_in_thread(lambda: pool.env_apply(nap), "applied")
time.sleep(0.3)
pool.close()
thread.join(20)
print(outcome)
"""


def test_a_control_call_whose_worker_a_close_stopped_raises_closed(pool_name: str) -> None:
    """The call reads its answer from a worker that close() terminated under it: the pool was closed
    (it raised an IndexError, the workers' list being empty by then)."""
    result = helpers.run_script(ENV_APPLY_DURING_CLOSE, pool_name)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "['PoolClosedError']"


FORKER = """
import os, sys
import numpy as np
import shmpool

pool = shmpool.launch("CartPole-v1", 4, num_workers=2, name=sys.argv[1], params={"length": shmpool.Param()})
pool.reset(seed=0)
expected, *_ = pool.step(np.zeros(4, dtype=np.int64))
pid = os.fork()
if pid == 0:
    codes = []
    for call in (lambda: pool.step(np.ones(4, dtype=np.int64)), lambda: pool.params.write(0, length=0.9),
                 lambda: pool.reset(seed=5)):
        try:
            call()
            codes.append("worked")
        except shmpool.ShmpoolError as exc:
            codes.append(type(exc).__name__)
    print("child", codes, flush=True)
    sys.exit(0)  # a normal exit: atexit handlers run in the child
_, status = os.waitpid(pid, 0)
observations, *_ = pool.step(np.zeros(4, dtype=np.int64))
print("parent", os.waitstatus_to_exitcode(status), pool.params["length"].tolist(), flush=True)
pool.close()
"""


def test_a_forked_child_cannot_touch_its_parents_pool_and_its_exit_spares_the_workers(pool_name: str) -> None:
    result = helpers.run_script(FORKER, pool_name)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "child ['ForeignProcessError', 'ForeignProcessError', 'ForeignProcessError']"
    assert lines[1] == "parent 0 [0.5, 0.5, 0.5, 0.5]"


FORK_DURING_STEP = """
import os, sys, threading, time
import numpy as np
import shmpool
sys.path.insert(0, "tests")
import helpers

pool = shmpool.launch(lambda: helpers.CountingEnv(length=10**9, sleep=0.5), 2, num_workers=1, name=sys.argv[1])
pool.reset(seed=0)
stepper = threading.Thread(target=pool.step, args=(np.zeros(2, dtype=np.int64),))
stepper.start()
time.sleep(0.1)  # the parent's thread is inside step(), holding the pool's call lock
pid = os.fork()
if pid == 0:
    started = time.monotonic()
    try:
        pool.step(np.zeros(2, dtype=np.int64))
        code = 1
    except shmpool.ForeignProcessError:
        code = 0 if time.monotonic() - started < 2.0 else 2
    os._exit(code)
_, status = os.waitpid(pid, 0)
stepper.join()
print(os.waitstatus_to_exitcode(status))
pool.close()
"""


def test_a_child_forked_while_a_thread_steps_gets_an_error_not_a_hang(pool_name: str) -> None:
    result = helpers.run_script(FORK_DURING_STEP, pool_name)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "0"


def _ctrl_c_from_building_workers(trainer: int, folder: str) -> helpers.CountingEnv:
    """In a worker, a Ctrl-C to the trainer as the env builds (the other worker's a little later),
    then a long build; in the trainer (its probe env), a quick one. Sent from the workers, not by
    timers: on a loaded machine a timer could fire before the workers started, or after the cleanup."""
    if os.getpid() != trainer:
        try:
            os.close(os.open(os.path.join(folder, "first"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            time.sleep(0.3)  # the trainer is cleaning up by then: it waits 2 s for workers that do not answer
            os.kill(trainer, signal.SIGINT)
            os.close(os.open(os.path.join(folder, "second"), os.O_CREAT))
        else:
            os.kill(trainer, signal.SIGINT)
        time.sleep(8.0)
    return helpers.CountingEnv()


def test_a_second_ctrl_c_while_a_failed_launch_cleans_up_leaves_no_worker_behind(
    pool_name: str, tmp_path: Path
) -> None:
    """The first Ctrl-C stops the launch while the workers build their envs; the second comes while
    the launch stops them again. That cleanup runs to its end, as close() does, and then the
    Ctrl-C is raised: no worker outlives the segment it was started for."""
    with pytest.raises(KeyboardInterrupt):
        factory = functools.partial(_ctrl_c_from_building_workers, os.getpid(), str(tmp_path))
        shmpool.launch([factory] * 2, num_workers=2, name=pool_name)
    assert (tmp_path / "second").exists()  # both Ctrl-Cs came
    # From the first Ctrl-C: close's grace, then SIGTERM, not the constructors' 8 s.
    assert time.time() - (tmp_path / "first").stat().st_mtime < 6.0
    assert helpers.shm_entries(pool_name) == []  # the segment and doorbells went before the Ctrl-C was raised


def _restores_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_worker_init_that_restores_ctrl_c_does_not_let_it_kill_the_workers(pool_name: str) -> None:
    reference = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
    actions = np.zeros(2, dtype=np.int64)
    with shmpool.launch("CartPole-v1", 2, num_workers=2, name=pool_name, worker_init=_restores_ctrl_c) as pool:
        np.testing.assert_array_equal(pool.reset(seed=0)[0], reference.reset(seed=0)[0])
        os.kill(pool.worker_pids[0], signal.SIGINT)  # as a terminal's Ctrl-C reaches the whole group
        time.sleep(0.3)
        assert helpers.pid_alive(pool.worker_pids[0])
        observations, rewards, terminations, truncations, _ = pool.step(actions)
        expected = reference.step(actions)
        # The worker stepped its env on from where the reset left it, as if no Ctrl-C had come.
        np.testing.assert_array_equal(observations, expected[0])
        assert rewards.tolist() == [1.0, 1.0] and not terminations.any() and not truncations.any()
    reference.close()
