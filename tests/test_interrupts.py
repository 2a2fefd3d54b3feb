"""Ctrl-C held back for work that must not stop halfway (``shmpool.interrupts``), and the suite's
Ctrl-C tests, which must not depend on how the suite was started."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import helpers
import numpy as np
import pytest

import shmpool
from shmpool.errors import PoolClosedError

# In-process (a SIGINT to the test's own thread) and through a script that starts a helper it must
# kill (a writer stopped while it holds the lock): each needs a Python handler for SIGINT.
CTRL_C_TESTS = [
    "tests/test_batches.py::test_ctrl_c_in_recv_loses_no_batch",
    "tests/test_protocol.py::test_ctrl_c_while_waiting_for_the_writer_lock_interrupts_the_wait",
]


def _ignore_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job: inherited across exec


def test_ctrl_c_tests_pass_when_the_suite_starts_with_ctrl_c_ignored() -> None:
    """``pytest &`` starts with SIGINT ignored, which Python and every child inherit: the suite's
    fixture gives each test Python's handler back, whatever ran before, in either order."""
    for order in (CTRL_C_TESTS, CTRL_C_TESTS[::-1]):
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *order],  # in this order
            cwd=helpers.ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=_ignore_ctrl_c,
        )
        assert result.returncode == 0, result.stdout[-3000:]


@contextlib.contextmanager
def handling(pool: shmpool.Pool, handler: Callable[[], Any]) -> Iterator[list[Any]]:
    """``handler`` as the Python handler of SIGUSR1 (restored after), which the main thread gets
    while one of ``pool``'s calls is in flight; yields the list of what the handler returned or raised."""
    outcomes: list[Any] = []
    signum = signal.SIGUSR1

    def send(after: float) -> None:
        threading.Timer(after, signal.pthread_kill, (threading.main_thread().ident, signum)).start()

    def run(number: int, frame: Any) -> None:
        if not pool._calls.held_here():  # landed between two calls: once more
            send(0.01)
            return
        try:
            outcomes.append(handler())
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcomes.append(exc)

    previous = signal.signal(signum, run)
    try:
        send(0.05)
        yield outcomes
    finally:
        signal.signal(signum, previous)


def slow_envs() -> list[Callable[[], Any]]:
    return [lambda: helpers.CountingEnv(length=1000, sleep=0.01)] * 4


@pytest.mark.parametrize("trainer_slot", [True, False])
def test_a_signal_handler_calling_the_pool_mid_step_is_refused_not_deadlocked(
    trainer_slot: bool, pool_name: str
) -> None:
    """A checkpoint taken in a signal handler that lands mid-step would wait for the step, which
    waits for the handler: it raises, and the step goes on."""
    with shmpool.launch(slow_envs(), num_workers=2, trainer_slot=trainer_slot, name=pool_name) as pool:
        pool.reset(seed=0)
        with handling(pool, pool.state_dict) as outcomes:
            while not outcomes:
                pool.step(np.ones(4, dtype=np.int64))
        assert isinstance(outcomes[0], RuntimeError) and "in the middle of a call in this thread" in str(outcomes[0])
        assert pool.state_dict() is not None  # once the step is over, as usual


@pytest.mark.parametrize("trainer_slot", [True, False])
def test_close_from_a_signal_handler_mid_step_closes_once_the_step_lets_go(trainer_slot: bool, pool_name: str) -> None:
    """The interrupted step still uses the segment: the release waits for it (no fixed wait), and
    what follows is PoolClosedError, not an error from released memory."""
    with shmpool.launch(slow_envs(), num_workers=2, trainer_slot=trainer_slot, name=pool_name) as pool:
        pool.reset(seed=0)
        workers = pool.worker_pids
        with handling(pool, pool.close):
            started = time.monotonic()
            with pytest.raises(PoolClosedError):
                while True:
                    pool.step(np.ones(4, dtype=np.int64))
        assert time.monotonic() - started < 2.0
    # The with block's close() returns once the release that the handler's close left for later is done.
    assert not helpers.shm_entries(pool_name) and not [pid for pid in workers if helpers.pid_alive(pid)]


def test_what_a_signal_handler_raises_while_the_trainer_sleeps_is_what_the_step_raises(pool_name: str) -> None:
    """A preemption handler's exception (``SystemExit`` from a SIGTERM handler, say) raised while the
    trainer sleeps on its doorbell for the workers reaches the caller as it was raised, not as a lost
    signal; the pool steps on after it."""

    class Preempted(Exception):
        pass

    signum = signal.SIGUSR1
    timers: list[threading.Timer] = []

    def send() -> None:
        timers.append(threading.Timer(0.02, signal.pthread_kill, (threading.main_thread().ident, signum)))
        timers[-1].start()

    def preempt(number: int, frame: Any) -> None:
        asleep = frame  # the doorbell's wait (nearly always its sleep: a 10-ms step outlasts the spin)
        while asleep is not None and asleep.f_code.co_name != "wait_until":
            asleep = asleep.f_back
        if asleep is None:  # landed outside the doorbell's wait: once more
            send()
            return
        raise Preempted

    with shmpool.launch(slow_envs(), num_workers=2, trainer_slot=False, name=pool_name) as pool:
        pool.reset(seed=0)
        previous = signal.signal(signum, preempt)
        try:
            send()
            with pytest.raises(Preempted):
                for _ in range(300):  # 3 s of 10-ms steps
                    pool.step(np.ones(4, dtype=np.int64))
        finally:
            for timer in timers:  # none may fire once the default action (exit) is back
                timer.cancel()
                timer.join()
            signal.signal(signum, previous)
        _, rewards, *_ = pool.step(np.ones(4, dtype=np.int64))
        assert rewards.shape == (4,)
