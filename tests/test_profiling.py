"""The phase profile: where a step's time goes, in the trainer and in the workers."""

from __future__ import annotations

import re
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from test_scripts import bench_lines

import shmpool
from shmpool.profiling import TRAINER_PHASES, WORKER_PHASES

ROOT = Path(__file__).resolve().parents[1]


def test_phase_profile_times_every_phase_that_runs(pool_name: str) -> None:
    params = {"length": shmpool.Param(low=0.1, high=2.0)}
    hooks = [shmpool.hooks.ObservationNoise(0.01)]
    with shmpool.launch(
        "CartPole-v1",
        8,
        num_workers=2,
        trainer_slot=False,  # the workers' step falls within the trainer's wait
        name=pool_name,
        seed=0,
        profile=True,
        params=params,
        hooks=hooks,
    ) as pool:
        pool.reset(seed=0)
        for step in range(200):
            pool.params.write(None, length=0.5 + 0.001 * step)
            pool.step(np.zeros(8, dtype=np.int64))
        profile = pool.phase_profile()
    assert list(profile["trainer"]) == list(TRAINER_PHASES)
    assert list(profile["workers"]) == list(WORKER_PHASES)
    trainer, workers = profile["trainer"], profile["workers"]
    for phase in ("action check", "command", "wait", "results", "episode stats"):
        assert trainer[phase] > 0, phase
    assert trainer["own slot"] == 0  # every env in a worker
    for phase in ("params sync", "after_step", "env loop", "episode accounting", "events", "whole step"):
        assert workers[phase] > 0, phase
    assert workers["infos"] == 0  # CartPole reports no infos
    parts = sum(workers[phase] for phase in WORKER_PHASES if phase not in ("infos", "whole step"))
    assert parts <= workers["whole step"]  # the parts fit in the whole
    assert workers["whole step"] <= trainer["wait"] * 1.05  # and the workers' step in the trainer's wait


def test_the_trainers_own_slot_is_its_own_phase_within_the_command(pool_name: str) -> None:
    """With ``trainer_slot``, the trainer steps a slot's envs inside its command: that time is shown
    apart, so that the command's own cost can be read as the difference."""
    with shmpool.launch("CartPole-v1", 8, num_workers=2, trainer_slot=True, name=pool_name, profile=True) as pool:
        pool.reset(seed=0)
        for _ in range(200):
            pool.step(np.zeros(8, dtype=np.int64))
        trainer = pool.phase_profile()["trainer"]
    assert 0 < trainer["own slot"] < trainer["command"]


def test_phase_profile_needs_profile_at_launch(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name) as pool:
        with pytest.raises(ValueError, match="profile=True"):
            pool.phase_profile()


def test_bench_profile_prints_the_phase_table() -> None:
    lines = bench_lines("--profile", "--window-seconds", "0.3")  # long enough for some 300 events
    assert "us per step" in lines[0]
    header = "plain | 3 built-in hooks | 3 params written/step | Perturb, 1,000 wake-ups/s | Perturb, 1,000 events/s"
    assert lines[1][28:].split() == header.replace("|", "").split()
    worker_rows = {line[8:28].strip(): line[28:].split() for line in lines[2:] if line.startswith("worker")}
    assert float(worker_rows["env loop"][0]) > 0
    # Which phases ran, not how long they took (timings compared across columns flip on a busy machine):
    # without parameters or hooks the worker never enters those phases; with them it does.
    assert float(worker_rows["params sync"][0]) == 0 < float(worker_rows["params sync"][2])
    assert float(worker_rows["events"][0]) == 0 < float(worker_rows["events"][4])
    (events,) = [line for line in lines if line.startswith("events: ")]
    sent, *costs = re.findall(r"\d+\.?\d*", events.replace("1,000", ""))
    assert int(sent) > 100 and len(costs) == 5, events  # sent; deliver, hook, step, send wall, send CPU


def test_phase_profile_covers_the_steps_since_the_last_reset(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name, profile=True) as pool:
        pool.reset(seed=0)
        pool.reset(seed=1)
        profile = pool.phase_profile()
        assert all(v == 0 for side in profile.values() for v in side.values())  # no step yet
        for _ in range(20):
            pool.step(np.zeros(4, dtype=np.int64))
        assert pool.phase_profile()["workers"]["env loop"] > 0
        pool.reset(seed=2)
        for _ in range(20):  # partial steps: their own checker's time is the action check too
            pool.step(np.zeros(2, dtype=np.int64), env_ids=[1, 2])
        assert pool.phase_profile()["trainer"]["action check"] > 0


class _Sleeps(gym.Wrapper):
    """Sleeps ``seconds`` in every step: a step time the profile must report."""

    def __init__(self, seconds: float) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.seconds = seconds

    def step(self, action):
        time.sleep(self.seconds)
        observation, reward, terminated, truncated, _ = self.env.step(action)
        return observation, reward, terminated, truncated, {"slept": self.seconds}


def test_async_profile_counts_each_workers_own_steps(pool_name: str) -> None:
    """With batches of one slot, each send steps one of the two workers: a worker's phases are per
    step of that worker, not per send of the pool (which would halve them)."""
    seconds = 0.002
    with shmpool.launch(
        lambda: _Sleeps(seconds), 2, num_workers=2, batch_size=1, name=pool_name, seed=0, profile=True
    ) as pool:
        pool.async_reset(seed=0)
        for _ in range(40):
            _, _, _, _, infos = pool.recv()
            pool.send(np.zeros(1, dtype=np.int64), infos["env_id"])
        pool.recv(), pool.recv()  # nothing in flight: a worker mid-step has timed its env loop, not yet its step
        profile = pool.phase_profile()
    workers, trainer = profile["workers"], profile["trainer"]
    # Most steps sleep (an autoreset step resets instead); per send it would be about half.
    assert 0.75 * seconds * 1e6 <= workers["env loop"] < 2.5 * seconds * 1e6
    assert workers["whole step"] >= workers["env loop"]
    assert trainer["wait"] > 0 and trainer["results"] > 0  # recv's wait and results are timed too
    assert trainer["action check"] > 0 and trainer["infos"] > 0  # send's check and recv's infos as well
