"""Control calls (``env_apply``, ``call``, ``get_attr``, ``set_attr``) as shmpool.calls carries them:
an exception or a result that pickles in the worker but does not unpickle in the trainer,
``KeyboardInterrupt``/``SystemExit`` raised by an applied function (in worker processes and in the
trainer's slot), and calls retried under a Ctrl-C storm.

Each pool gets a short ``timeout``: a call left unfinished shows as a ``PoolTimeoutError`` at the next
step within seconds, instead of the default minute.
"""

from __future__ import annotations

import json
import time

import gymnasium as gym
import numpy as np
import pytest
from helpers import CountingEnv, run_script

import shmpool
from shmpool.errors import RemoteTraceback, WorkerError

#: Env 3 is in worker 1's slot: a worker process, or the trainer's own slot with ``trainer_slot=True``.
SLOTS = pytest.mark.parametrize("trainer_slot", [False, True], ids=["workers", "trainer_slot"])


def counting() -> gym.Env:
    return CountingEnv(length=1000)


def launch(name: str, trainer_slot: bool) -> shmpool.Pool:
    pool = shmpool.launch(counting, 4, num_workers=2, trainer_slot=trainer_slot, name=name, timeout=10.0)
    pool.reset(seed=0)
    return pool


def assert_usable(pool: shmpool.Pool, steps: int) -> None:
    """The next step finishes at once (nothing waits for an unfinished call), in lockstep."""
    started = time.monotonic()
    observations, *_ = pool.step(np.ones(4, dtype=np.int64))
    assert time.monotonic() - started < 2.0
    assert observations[:, 0].tolist() == [float(steps)] * 4 and pool.global_step == steps
    assert pool.get_attr("length") == (1000,) * 4


class EnvError(Exception):
    """An exception whose ``__init__`` takes other arguments than it passes on: pickle's default
    rebuild, ``EnvError(*args)``, fails."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def raise_env_error(env: gym.Env) -> None:
    raise EnvError("boom", 7)


class Unrebuildable(Exception):
    """Pickles in the worker, but fails to unpickle in the trainer (as an exception of a module only
    the workers can import would)."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_refuse, ())


class Unpicklable(Exception):
    """Does not pickle at all: it holds a generator."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.pending = (x for x in [1])


class ArrivesBroken:
    """A result that pickles in the worker but fails to unpickle in the trainer."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_refuse, ())


def _refuse() -> None:
    raise ImportError("this object cannot be rebuilt here")


def raise_unrebuildable(env: gym.Env) -> None:
    raise Unrebuildable("cannot come back")


def raise_unpicklable(env: gym.Env) -> None:
    raise Unpicklable("cannot leave")


def raise_keyboard_interrupt(env: gym.Env) -> None:
    raise KeyboardInterrupt


def raise_system_exit(env: gym.Env) -> None:
    raise SystemExit(3)


def return_broken(env: gym.Env) -> ArrivesBroken:
    return ArrivesBroken()


@SLOTS
def test_an_exception_whose_init_takes_two_arguments_keeps_its_type_and_the_pool_stays_usable(
    pool_name: str, trainer_slot: bool
) -> None:
    with launch(pool_name, trainer_slot) as pool:
        with pytest.raises(EnvError) as caught:
            pool.env_apply(raise_env_error, env_ids=[3])
        error = caught.value
        assert str(error) == "boom" and error.code == 7
        assert any(note.startswith("raised by env 3 (worker 1,") for note in error.__notes__), error.__notes__
        assert not any("before any env" in note for note in error.__notes__)
        assert isinstance(error.__cause__, RemoteTraceback) and "raise_env_error" in error.__cause__.text
        assert_usable(pool, 1)
        with pytest.raises(EnvError):  # and again, from both slots at once: the first one's is raised
            pool.env_apply(raise_env_error)
        assert_usable(pool, 2)


@SLOTS
def test_an_exception_that_cannot_be_rebuilt_is_a_worker_error_naming_its_type_env_and_traceback(
    pool_name: str, trainer_slot: bool
) -> None:
    with launch(pool_name, trainer_slot) as pool:
        for function, type_name, message, problem in [
            (raise_unrebuildable, "Unrebuildable", "cannot come back", "could not be rebuilt here (ImportError"),
            (raise_unpicklable, "Unpicklable", "cannot leave", "it cannot be pickled"),
        ]:
            with pytest.raises(WorkerError) as caught:
                pool.env_apply(function, env_ids=[3])
            error = caught.value
            assert isinstance(error, shmpool.ShmpoolError)
            assert f"{type_name}: {message} (raised by env 3 (worker 1," in str(error) and problem in str(error)
            assert error.worker_id == 1 and error.env_id == 3
            assert isinstance(error.__cause__, RemoteTraceback) and function.__name__ in error.__cause__.text
            assert_usable(pool, 1 if function is raise_unrebuildable else 2)


@SLOTS
def test_keyboard_interrupt_and_system_exit_raised_by_an_applied_function_finish_the_call(
    pool_name: str, trainer_slot: bool
) -> None:
    with launch(pool_name, trainer_slot) as pool:
        with pytest.raises(KeyboardInterrupt) as interrupted:
            pool.env_apply(raise_keyboard_interrupt, env_ids=[3])
        assert any("env 3 (worker 1," in note for note in interrupted.value.__notes__)
        assert_usable(pool, 1)
        with pytest.raises(SystemExit) as exited:
            pool.env_apply(raise_system_exit, env_ids=[0, 3])
        assert exited.value.code == 3
        assert_usable(pool, 2)


@SLOTS
def test_a_result_the_trainer_cannot_unpickle_is_a_clear_error_and_the_pool_stays_usable(
    pool_name: str, trainer_slot: bool
) -> None:
    with launch(pool_name, trainer_slot) as pool:
        with pytest.raises(WorkerError, match=r"ImportError: this object cannot be rebuilt here") as caught:
            pool.env_apply(return_broken, env_ids=[2, 3])
        error = caught.value
        assert "raised by the result of env 2 (worker 1," in str(error) and "cannot unpickle this result" in str(error)
        assert error.worker_id == 1 and error.env_id == 2 and "_refuse" in error.traceback_text
        assert_usable(pool, 1)
        assert pool.env_apply(lambda env: env.unwrapped.seed_used, env_ids=[2, 3]) == [2, 3]


# -- calls retried under a Ctrl-C storm -------------------------------------------------

CALLS_UNDER_A_STORM = """
import json, os, signal, subprocess, sys, time
import numpy as np
import shmpool
sys.path.insert(0, "tests")
import helpers

pool = shmpool.launch(lambda: helpers.CountingEnv(length=1000), 4, num_workers=2, name=sys.argv[1],
                      trainer_slot=sys.argv[2] == "1")
pool.reset(seed=0)
storm = helpers.start_sigint_storm(os.getpid(), 2.5, 0.02, random_gap=False)
interrupted_at, completed_at, wrong = [], [], 0
done_at = time.monotonic() + 3.5  # by then the storm is over (time, not storm.poll(): Ctrl-C can wedge that)

def work():
    global wrong
    while True:
        try:
            if time.monotonic() > done_at:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # one still in flight must not end the script
                return
            lengths = pool.get_attr("length")
            completed_at.append(time.monotonic())
            wrong += lengths != (1000,) * 4
        except KeyboardInterrupt:
            interrupted_at.append(time.monotonic())

while True:  # an interrupt can also land on the loop's back edge, outside the inner try
    try:
        work()
        break
    except KeyboardInterrupt:
        interrupted_at.append(time.monotonic())
os.waitpid(storm.pid, 0)
storm.returncode = 0
started = time.monotonic()
observations, *_ = pool.step(np.ones(4, dtype=np.int64))
step_seconds = time.monotonic() - started
during = [t for t in completed_at if interrupted_at[0] < t < interrupted_at[-1]] if interrupted_at else []
marks = [interrupted_at[0], *during, interrupted_at[-1]] if interrupted_at else []
longest_gap = max((b - a for a, b in zip(marks, marks[1:])), default=0.0)
print(json.dumps({"interrupts": len(interrupted_at), "during": len(during), "longest_gap": longest_gap, "wrong": wrong,
                  "counts": observations[:, 0].tolist(), "global_step": pool.global_step,
                  "step_seconds": step_seconds, "lengths": list(pool.get_attr("length"))}))
pool.close()
"""


@SLOTS
def test_calls_retried_under_a_ctrl_c_storm_complete_and_the_pool_still_steps(
    pool_name: str, trainer_slot: bool
) -> None:
    """Ctrl-C every 20 ms for 2.5 s; each get_attr cut short is retried, and one completes every few
    milliseconds. A retry of a call whose answers were already read must not wait for more: a 50 ms
    wait would be cut short again, and so would every retry after it, so that no call completed from
    the first such Ctrl-C to the storm's end."""
    result = run_script(CALLS_UNDER_A_STORM, pool_name, str(int(trainer_slot)))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["interrupts"] > 30, report  # the storm really hit the trainer
    assert report["during"] >= 10 and report["longest_gap"] < 1.0, report
    assert report["wrong"] == 0, report
    assert report["counts"] == [1.0] * 4 and report["global_step"] == 1, report
    assert report["step_seconds"] < 1.0 and report["lengths"] == [1000] * 4, report
