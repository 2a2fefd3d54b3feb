"""``launch(trainer_slot=True)``: the last slot stepped in the trainer's process. Everything a
worker process's slot does (results, parameters, hooks, infos, episodes, calls, async batches,
failures) must come out the same."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from helpers import CountingEnv, InfoEnv, needs, run_script

import shmpool
import shmpool.hooks
from shmpool.errors import PoolBrokenError, WorkerError
from shmpool.system import usable_cores


def run(pool: shmpool.Pool, steps: int, seed: int) -> list:
    """Observations, rewards, flags and infos of ``steps`` steps with fixed actions (a parameter
    written halfway), episode durations (wall-clock time) left out."""
    out = [pool.reset(seed=seed)]
    rng = np.random.default_rng(seed)
    for step in range(steps):
        if step == steps // 2 and pool.config.params:
            pool.params.write(None, length=np.linspace(0.3, 0.9, pool.num_envs))
        *results, infos = pool.step(rng.integers(0, 2, pool.num_envs))
        infos.get("episode", {}).pop("t", None)
        out.append((*results, infos))
    return out


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_the_trainer_slot_returns_what_worker_processes_return(mode: str, pool_name: str) -> None:
    options = dict(
        num_workers=2,
        autoreset_mode=mode,
        params={"length": shmpool.Param(low=0.1, high=2.0)},
        hooks=[shmpool.hooks.RewardScale(0.5), shmpool.hooks.ObservationNoise(0.01)],
        info_params=True,
        seed=3,
    )
    results = []
    for trainer_slot in (False, True):
        with shmpool.launch("CartPole-v1", 6, name=pool_name, trainer_slot=trainer_slot, **options) as pool:
            assert len(pool.worker_pids) == (1 if trainer_slot else 2)
            results.append((run(pool, 60, seed=3), pool.episodes.read(), pool.applied["length"].copy()))
    (steps, episodes, applied), (local_steps, local_episodes, local_applied) = results
    assert repr(steps) == repr(local_steps)  # observations, rewards, flags, infos, final_obs: all of it
    untimed = [name for name in episodes.dtype.names if name != "time"]
    assert len(episodes) > 3 and episodes[untimed].tobytes() == local_episodes[untimed].tobytes()
    np.testing.assert_array_equal(applied, local_applied)


class EveryStepHook:
    """A hook of the user's own: code the default placement keeps out of the trainer."""

    def after_step(self, batch: Any) -> None:
        pass


def set_length(env: Any, value: Any) -> None:
    """A binding of the user's own."""
    env.unwrapped.length = float(value)


def kick_by_hand(env: Any, amounts: Any) -> None:
    """A kick of the user's own, which a library hook (Perturb) would run."""
    env.unwrapped.state = env.unwrapped.state + 0.0


def test_by_default_gymnasiums_envs_take_the_trainer_slot_when_no_core_is_spare(pool_name: str) -> None:
    """The default placement (``trainer_slot=None``): the trainer steps a slot itself when the workers
    take every usable core, for gymnasium's own envs only; an explicit choice always holds."""
    workers = max(2, usable_cores())  # as many workers as cores: none left for the trainer
    if "shmpool-test/Counting-v0" not in gym.registry:
        gym.register("shmpool-test/Counting-v0", entry_point="helpers:CountingEnv")
    for env, engine, expected in [
        ("CartPole-v1", "python", True),
        ("CartPole-v1", "numba", True),
        (lambda: gym.make("CartPole-v1"), "python", False),  # the user's own code: kept in workers
        ("shmpool-test/Counting-v0", "python", False),  # registered, but not gymnasium's code
    ]:
        if engine == "numba" and importlib.util.find_spec("numba") is None:
            continue
        with shmpool.launch(env, workers, num_workers=workers, engine=engine, name=pool_name) as pool:
            assert pool.config.trainer_slot is expected, (env, engine)
            assert len(pool.worker_pids) == workers - expected
            pool.reset(seed=0)
            pool.step(np.zeros(workers, dtype=np.int64))
    worker_only = [
        {"worker_init": functools.partial(os.environ.setdefault, "SHMPOOL_TEST_INIT", "1")},
        {"hooks": [EveryStepHook()]},
        {"hooks": [shmpool.hooks.Perturb(0.1, kick=kick_by_hand)]},  # shmpool's hook, carrying the user's code
        {"params": {"length": shmpool.Param(0.5, low=0.1, high=2.0, bind=set_length)}},
        {"trainer_slot": False},
        {"batch_size": 1},  # async batches (one slot each): the trainer's policy overlaps the steps
    ]
    for options in worker_only:  # code of the user's, async batches, or an explicit choice: workers only
        with shmpool.launch("CartPole-v1", workers, num_workers=workers, name=pool_name, **options) as pool:
            assert not pool.config.trainer_slot and len(pool.worker_pids) == workers, options
    with shmpool.launch("CartPole-v1", 4, num_workers=1, name=pool_name) as pool:
        assert not pool.config.trainer_slot and len(pool.worker_pids) == 1  # one slot: always a worker
    if usable_cores() > 2:
        with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name) as pool:
            assert not pool.config.trainer_slot  # a core is left for the trainer


TORCH_PLACEMENT = """
import json, sys, torch, shmpool
from shmpool.system import usable_cores
placements = []
for threads in (usable_cores(), 1):  # torch's default (every core), and one thread
    torch.set_num_threads(threads)
    for options in ({}, {"num_workers": 2}, {"batch_size": 4}):
        with shmpool.launch("CartPole-v1", 8, name=sys.argv[1], **options) as pool:
            pool.reset(seed=0)
            pool.step([0] * 8)
            placements.append((pool.config.num_workers, bool(pool.config.trainer_slot), len(pool.worker_pids)))
print(json.dumps(placements))
"""


@needs("torch")
def test_a_trainer_computing_with_torch_on_every_core_steps_every_env_itself(pool_name: str) -> None:
    """On a machine of few cores, torch's threads spin after each parallel region (a policy's forward)
    on every core: a default launch then keeps every env in the trainer's slot, with no worker
    process. With one torch thread, or a placement chosen by hand, the default is as before."""
    result = run_script(TORCH_PLACEMENT, pool_name)
    assert result.returncode == 0, result.stderr[-3000:]
    placements = json.loads(result.stdout)  # (workers, trainer slot, worker processes) of each launch
    with_torch, with_one_thread = placements[:3], placements[3:]
    assert with_torch[1:] == with_one_thread[1:]  # num_workers given, or async batches: as chosen
    if usable_cores() <= 2 and with_one_thread[0][1]:  # where the default took a trainer slot
        assert with_torch[0] == [1, True, 0]
    else:  # measured on 2 cores only: with more, the workers' parallel steps are kept
        assert with_torch[0] == with_one_thread[0]


def test_the_trainer_slot_runs_its_own_copies_of_the_hooks(pool_name: str) -> None:
    """As a worker process does: a hook's per-slot state (its random streams, the rows it kicked)
    stays with the pool, so one hook object serves pools of other sizes, one after another or side
    by side, each as if it had its own."""
    perturb = shmpool.hooks.Perturb(0.5, every=1)
    results = {}
    for count in (2, 4, 2):
        with shmpool.launch(
            "CartPole-v1", count, num_workers=1, trainer_slot=True, hooks=[perturb], seed=0, name=pool_name
        ) as pool:
            observations = [pool.reset(seed=0)[0]]
            for _ in range(5):
                observations.append(pool.step(np.zeros(count, dtype=np.int64))[0])
            results.setdefault(count, []).append(np.array(observations))
    np.testing.assert_array_equal(*results[2])  # the third pool as the first: nothing carried over
    assert perturb.__dict__.get("_streams") is None and not perturb.__dict__.get("_kicked")  # untouched


def test_calls_infos_and_async_batches_reach_the_trainer_slot(pool_name: str) -> None:
    with shmpool.launch(InfoEnv, 4, num_workers=2, batch_size=2, trainer_slot=True, name=pool_name) as pool:
        assert pool.env_apply(lambda env: os.getpid()) == [pool.worker_pids[0]] * 2 + [os.getpid()] * 2
        pool.set_attr("t", [0, 0, 5, 5])
        assert pool.get_attr("t") == (0, 0, 5, 5)
        _, infos = pool.reset(seed=1)
        assert infos["_start"].all()
        pool.async_reset(seed=1)
        seen = set()
        deadline = time.monotonic() + 5.0
        # The trainer's slot steps within send, so it is often first; the worker's slot comes back
        # as soon as it has finished first (a loaded machine can make that take many batches).
        while seen != {(0, 1), (2, 3)} and time.monotonic() < deadline:
            observations, _, _, _, infos = pool.recv()
            seen.add(tuple(infos["env_id"].tolist()))
            pool.send(np.ones(2, dtype=np.int64), infos["env_id"])
        assert seen == {(0, 1), (2, 3)}


def test_an_env_failing_in_the_trainer_slot_is_a_worker_error(pool_name: str) -> None:
    def fragile() -> gym.Env:
        return CountingEnv(raise_at=2, raise_seed=3)  # env 3 (the trainer's slot) raises at its 2nd step

    with shmpool.launch(fragile, 4, num_workers=2, trainer_slot=True, name=pool_name) as pool:
        pool.reset(seed=0)
        pool.step(np.ones(4, dtype=np.int64))
        with pytest.raises(WorkerError, match="env 3") as caught:
            pool.step(np.ones(4, dtype=np.int64))
        assert caught.value.worker_id == 1 and "boom at step 2" in caught.value.traceback_text
        with pytest.raises(PoolBrokenError):
            pool.step(np.ones(4, dtype=np.int64))


def test_ctrl_c_waits_for_the_trainer_slot_and_keeps_lockstep(pool_name: str) -> None:
    slow = [lambda: CountingEnv(length=50, sleep=0.1)] * 4
    with shmpool.launch(slow, num_workers=2, trainer_slot=True, name=pool_name) as pool:
        pool.reset(seed=0)
        timer = threading.Timer(0.05, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            pool.step(np.ones(4, dtype=np.int64))
        timer.join()
        assert time.monotonic() - started >= 0.15  # the slot's two steps ran to their end first
        observations, *_ = pool.step(np.ones(4, dtype=np.int64))
        assert observations[:, 0].tolist() == [2.0] * 4 and pool.global_step == 2


def test_a_signal_handlers_exception_mid_step_breaks_the_pool_instead_of_hanging_it(pool_name: str) -> None:
    """A handler that raises SystemExit (a preemption's SIGTERM, say) in the middle of the trainer's
    slot's step leaves its envs part-stepped: the next call says so at once, naming the env and the
    exception, instead of waiting forever for the interrupted step."""
    slow = [lambda: CountingEnv(length=50, sleep=0.05)] * 4

    def leave(signum: int, frame: Any) -> None:
        raise SystemExit(143)

    previous = signal.signal(signal.SIGUSR1, leave)
    try:
        with shmpool.launch(slow, num_workers=2, trainer_slot=True, name=pool_name) as pool:
            pool.reset(seed=0)
            timer = threading.Timer(0.05, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1))
            timer.start()
            with pytest.raises(SystemExit):
                pool.step(np.ones(4, dtype=np.int64))
            timer.join()
            started = time.monotonic()
            with pytest.raises(WorkerError, match=r"env [23], cut short in the trainer's process") as caught:
                pool.state_dict()
            assert time.monotonic() - started < 5.0 and "SystemExit: 143" in caught.value.traceback_text
            with pytest.raises(PoolBrokenError):
                pool.step(np.ones(4, dtype=np.int64))
    finally:
        signal.signal(signal.SIGUSR1, previous)


_POOLS: list[shmpool.Pool] = []  # what a function run in the trainer's slot reaches the pool by


def _call_the_pool(env: gym.Env) -> Any:
    return _POOLS[0].get_attr("gravity")


def test_a_function_the_trainer_slot_runs_cannot_call_the_pool(pool_name: str) -> None:
    """A call from inside a call of the same thread would wait for itself forever: it is refused."""
    with shmpool.launch("CartPole-v1", 4, num_workers=2, trainer_slot=True, name=pool_name) as pool:
        pool.reset(seed=0)
        _POOLS[:] = [pool]
        with pytest.raises(RuntimeError, match=f"pool '{pool_name}' is in the middle of a call in this thread"):
            pool.env_apply(_call_the_pool, env_ids=[3])  # env 3: the trainer's slot
        _POOLS.clear()
        assert pool.get_attr("gravity") == (9.8,) * 4
        assert pool.step(np.ones(4, dtype=np.int64))[0].shape == (4, 4)


def _interrupt_the_trainer(env: gym.Env, payload: bytes, trainer: int, marker: str) -> int:
    """In the first worker process to get here, Ctrl-C to the trainer, which is still sending the
    others their part (the marker file makes it one Ctrl-C, not one per worker)."""
    if os.getpid() != trainer:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return len(payload)
        os.kill(trainer, signal.SIGINT)
    return len(payload)


def test_ctrl_c_during_a_control_call_leaves_the_trainer_slot_usable(pool_name: str, tmp_path: Path) -> None:
    """The trainer's slot runs its part of a call under the same held-back Ctrl-C as the sends: a
    Ctrl-C raised after them finds the call pending with that part done, and the next call finishes
    it instead of waiting for the slot forever."""
    with shmpool.launch("CartPole-v1", 3, num_workers=3, trainer_slot=True, name=pool_name, timeout=20.0) as pool:
        pool.reset(seed=0)
        big = b"x" * 30_000_000  # worker 0 reads its part and signals while the trainer writes worker 1's
        with pytest.raises(KeyboardInterrupt):
            pool.env_apply(_interrupt_the_trainer, [0, 1, 2], args=(big, os.getpid(), str(tmp_path / "sent")))
        started = time.monotonic()
        assert list(pool.get_attr("gravity")) == [9.8] * 3
        assert time.monotonic() - started < 5.0
        observations, *_ = pool.step(np.ones(3, dtype=np.int64))
        assert observations.shape == (3, 4)
