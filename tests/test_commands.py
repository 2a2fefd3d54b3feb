"""The command channel (:mod:`shmpool.pool.commands`): a command that Ctrl-C cuts short stays pending and is
finished by the next call, each worker runs it once, so under a storm of Ctrl-Cs the workers stay in
lockstep and the global step counts exactly the steps they took. A partial step
(``Pool.step(actions, env_ids)``, ``PartialSteps``) steps, syncs and counts only the envs asked. The
env steps per second the channel publishes count every step once, from the first step on, idle spells left out.

The storm runs in a subprocess: its SIGINTs go to that interpreter, not to the test run (the test of the
rate raises ``KeyboardInterrupt`` from a SIGUSR1 handler instead, only inside the pool's wait).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import gymnasium as gym
import helpers
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

import shmpool
from shmpool.layout import IDLE_AFTER
from shmpool.pool.commands import ResetEncoder

CTRL_C_STORM = """
import os, random, signal, sys, threading, time
import numpy as np
import shmpool
sys.path.insert(0, "tests")
import helpers

pool = shmpool.launch(lambda: helpers.CountingEnv(length=10**9), 6, num_workers=3, name=sys.argv[1])
pool.reset(seed=0)
main = threading.main_thread()

go = threading.Event()

def storm():
    rng = random.Random(int(sys.argv[2]))
    go.wait()
    for _ in range(300):
        time.sleep(rng.uniform(0.0002, 0.004))
        os.kill(os.getpid(), signal.SIGINT)

thread = threading.Thread(target=storm, daemon=True)
thread.start()  # waits for the thread: no Ctrl-C may come before it returns
interrupts = violations = steps = 0

def steps_through_the_storm():
    global interrupts, violations, steps
    while thread.is_alive() or steps < 10:
        try:
            observations, *_ = pool.step(np.ones(6, dtype=np.int64))
            counts = observations[:, 0]  # steps each env took since the reset
            steps += 1
            if not (counts == pool.global_step).all():
                violations += 1
        except KeyboardInterrupt:
            interrupts += 1

while True:  # a Ctrl-C can also land outside the try above (the loop's test, its except clause)
    try:
        go.set()
        steps_through_the_storm()
        break
    except KeyboardInterrupt:
        interrupts += 1
observations, *_ = pool.step(np.ones(6, dtype=np.int64))
print(interrupts, violations, observations[:, 0].tolist(), pool.global_step)
pool.close()
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_ctrl_c_storm_keeps_workers_in_lockstep_and_the_step_count_right(pool_name: str, seed: int) -> None:
    result = helpers.run_script(CTRL_C_STORM, pool_name, str(seed), timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    interrupts, violations, final = result.stdout.split(" ", 2)
    assert int(interrupts) > 50  # the storm really hit the trainer
    assert int(violations) == 0, result.stdout
    counts, global_step = final.rsplit(" ", 1)
    assert counts == str([float(global_step)] * 6)


def test_a_reset_cut_short_after_it_was_written_still_runs_with_the_launch_seed(
    pool_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that comes once the reset's seeds are written into the segment is held back until
    the reset is pending: the next call then finishes that reset, seeded from the launch seed, instead
    of forgetting it (and an env's first reset would then run unseeded)."""
    write = ResetEncoder.write

    def write_then_ctrl_c(self: ResetEncoder, *args: Any) -> None:
        write(self, *args)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # to this thread: see test_batches

    reference = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    with shmpool.launch("CartPole-v1", 4, num_workers=2, seed=10, name=pool_name) as pool:
        monkeypatch.setattr(ResetEncoder, "write", write_then_ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            pool.reset()
        monkeypatch.undo()
        reference.reset(seed=10)  # the interrupted reset, finished by the next call
        np.testing.assert_array_equal(pool.reset()[0], reference.reset()[0])
    reference.close()


@pytest.mark.parametrize("trainer_slot", [False, True])
def test_a_partial_step_moves_only_the_envs_asked_and_their_parameters(pool_name: str, trainer_slot: bool) -> None:
    """The envs left out neither step, nor count a step, nor take a parameter change, until their
    own next step; the envs asked follow their gymnasium trajectories and come back in that order."""
    spec = {"length": shmpool.Param(0.5, low=0.1, high=2.0)}
    singles = [gym.make("CartPole-v1") for _ in range(4)]
    launched = shmpool.launch(
        "CartPole-v1", 4, num_workers=2, seed=0, params=spec, trainer_slot=trainer_slot, name=pool_name
    )
    with launched as pool:
        pool.reset()
        for i, single in enumerate(singles):
            single.reset(seed=i)
        pool.params["length"][:] = 0.8
        observations, rewards, _, _, infos = pool.step(np.array([1, 0]), env_ids=[3, 0])
        np.testing.assert_array_equal(pool.applied["length"], [0.8, 0.5, 0.5, 0.8])
        for row, (i, action) in enumerate([(3, 1), (0, 0)]):
            set_length(singles[i], 0.8)
            np.testing.assert_array_equal(observations[row], singles[i].step(action)[0])
        assert rewards.shape == (2,) and infos == {}
        assert pool.global_step == 1
        observations = pool.step(np.ones(4, dtype=np.int64))[0]
        np.testing.assert_array_equal(pool.applied["length"], [0.8] * 4)
        for i, single in enumerate(singles):
            set_length(single, 0.8)
            np.testing.assert_array_equal(observations[i], single.step(1)[0])
        for _ in range(200):  # episodes end for env 1 only
            pool.step([0], env_ids=[1])
        lengths = {record["env_id"]: record["length"] for record in pool.episodes.read()}
        assert set(lengths) == {1}  # the others took 2 steps, far from any episode's end


def test_a_partial_step_of_envs_whose_parameters_did_not_change_leaves_the_others_change_waiting(
    pool_name: str,
) -> None:
    """A parameter that is not a plain float64 (a distribution here) written for env 1 only: a partial
    step of env 0 found no changed row of its own, and broke the pool reshaping none."""
    spec = {
        "masspole": shmpool.Param(dist="uniform", low=0.05, high=0.5),
        "length": shmpool.Param(0.5, dtype="float32"),
    }
    with shmpool.launch("CartPole-v1", 2, num_workers=1, seed=0, params=spec, name=pool_name) as pool:
        pool.reset(seed=0)
        pool.params.write(1, masspole={"high": 0.3}, length=0.7)
        pool.step(np.array([0]), env_ids=[0])
        assert pool.applied["length"].tolist() == [0.5, 0.5]  # env 1's change waits for its own step
        pool.step(np.zeros(2, np.int64))
        assert pool.applied["length"].tolist() == pytest.approx([0.5, 0.7])


def set_length(env: gym.Env, length: float) -> None:
    """CartPole's pole ``length``, with what its ``__init__`` derives from it (as the pool sets it)."""
    env.unwrapped.length = length
    env.unwrapped.polemass_length = env.unwrapped.masspole * length


def test_a_partial_step_is_refused_where_it_cannot_run(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 4, num_workers=2, seed=0, name=pool_name) as pool:
        pool.reset(options={"reset_mask": np.array([True, True, False, False])})
        with pytest.raises(gym.error.ResetNeeded, match="never reset"):
            pool.step([0], env_ids=[2])
        pool.step([0, 1], env_ids=[1, 0])  # those were reset
        with pytest.raises(ValueError, match="env ids repeat"):
            pool.step([0, 0], env_ids=[1, 1])
        with pytest.raises(IndexError, match="outside 0..3"):
            pool.step([0], env_ids=[4])
    with shmpool.launch(
        "CartPole-v1", 4, num_workers=2, hooks=[shmpool.hooks.RewardScale(2.0)], name=pool_name
    ) as pool:
        pool.reset(seed=0)
        with pytest.raises(ValueError, match="a pool with hooks steps whole slots"):
            pool.step([0], env_ids=[2])
        pool.step([0] * 4)  # still usable
    autoreset = gym.vector.AutoresetMode.DISABLED
    with shmpool.launch("CartPole-v1", 2, num_workers=2, autoreset_mode=autoreset, name=pool_name) as pool:
        pool.reset(seed=0)
        terminated = False
        while not terminated:
            terminated = pool.step([1], env_ids=[0])[2][0]
        with pytest.raises(RuntimeError, match=r"the episodes of envs \[0\] ended"):
            pool.step([1], env_ids=[0])
        pool.step([1], env_ids=[1])  # env 1 did not end


def test_a_step_that_ctrl_c_cut_short_counts_once_in_the_steps_per_second(pool_name: str) -> None:
    """A step that Ctrl-C interrupts while the trainer waits for the workers is finished by the next
    call; it counted in the env steps (so in the published steps per second) only when nothing
    interrupted it, and a trainer hit by Ctrl-C in nearly every step published a rate far too low."""
    signum, stop, interrupts = signal.SIGUSR1, threading.Event(), 0

    def ctrl_c_in_the_wait(number: int, frame: Any) -> None:
        while frame is not None and frame.f_code.co_name != "wait_until":  # the doorbell's wait
            frame = frame.f_back
        if frame is not None:  # elsewhere (between calls, say) it would not be the pool's to finish
            raise KeyboardInterrupt

    def every_3_ms(thread: int) -> None:
        while not stop.wait(0.003):
            signal.pthread_kill(thread, signum)

    envs = [lambda: helpers.CountingEnv(length=10**9, sleep=0.005)] * 4  # 10 ms a step: 2 envs a worker
    with shmpool.launch(envs, num_workers=2, trainer_slot=False, name=pool_name) as pool:
        pool.reset(seed=0)
        previous = signal.signal(signum, ctrl_c_in_the_wait)
        sender = threading.Thread(target=every_3_ms, args=(threading.get_ident(),))
        started = time.monotonic()
        sender.start()
        try:
            while pool.global_step < 140:  # the rate is published once a second has passed, every 64 steps
                try:
                    pool.step(np.ones(4, np.int64))
                except KeyboardInterrupt:
                    interrupts += 1
        finally:
            stop.set()
            sender.join()
            signal.signal(signum, previous)  # after the signals it sent: those are handled before the change
        measured = 4 * pool.global_step / (time.monotonic() - started)
        published = pool.stats.steps_per_second
    assert interrupts > 70  # about every step was interrupted
    assert measured / 2 < published < measured * 2, (published, measured)


def step_until_published(pool: shmpool.Pool, shown: int) -> tuple[int, float]:
    """Steps ``pool`` until its published steps per second change from ``shown``; returns the new rate
    and the env steps per second these steps took, measured here."""
    actions, steps, started = np.zeros(pool.num_envs, np.int64), 0, time.monotonic()
    while time.monotonic() - started < 10.0:
        for _ in range(16):
            pool.step(actions)
        steps += 16
        published = pool.stats.steps_per_second
        if published != shown:
            return published, steps * pool.num_envs / (time.monotonic() - started)
    raise AssertionError(f"pool {pool.name!r} published no new rate in 10 s of steps")


def test_the_steps_per_second_count_from_the_first_step_not_from_launch(pool_name: str) -> None:
    """The rate's window started at launch: a trainer that set up for a while before its first
    step saw a first rate far below the one it stepped at."""
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name) as pool:
        pool.reset(seed=0)
        time.sleep(1.5)  # building a model, say
        published, measured = step_until_published(pool, 0)
    assert measured / 3 < published < measured * 3, (published, measured)


def test_the_steps_per_second_after_an_idle_spell_count_from_its_end(pool_name: str) -> None:
    """A pool idle for a while (a long update) reads as a rate of 0 (``layout.current_rate``); the
    first rate published once it steps again averaged over the idle spell, far below the real one."""
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name) as pool:
        pool.reset(seed=0)
        before, _ = step_until_published(pool, 0)
        time.sleep(IDLE_AFTER + 0.5)
        assert pool.stats.steps_per_second == 0  # idle
        published, measured = step_until_published(pool, before)
    assert measured / 3 < published < measured * 3, (published, measured)


def test_rollouts_shorter_than_a_second_between_long_updates_publish_their_rate(pool_name: str) -> None:
    """A rollout of 128 steps (half a second) then an update longer than ``IDLE_AFTER``: the rate's
    window, restarted at every idle spell, never reached a second, and the pool showed 0 for good.
    The first step after the update publishes the rollout's rate."""
    # Steps of some 4 ms (two 2-ms envs in one worker): scheduling hiccups weigh little against them.
    envs = [lambda: helpers.CountingEnv(length=10**9, sleep=0.002)] * 2
    with shmpool.launch(envs, num_workers=1, trainer_slot=False, name=pool_name) as pool:
        pool.reset(seed=0)
        actions = np.ones(2, np.int64)
        started = time.monotonic()
        for _ in range(128):
            pool.step(actions)
        measured = 2 * 128 / (time.monotonic() - started)
        time.sleep(IDLE_AFTER + 0.5)  # the update
        pool.step(actions)
        published = pool.stats.steps_per_second
    assert measured / 3 < published < measured * 3, (published, measured)
