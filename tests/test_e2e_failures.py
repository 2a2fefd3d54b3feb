"""Faults surface as named exceptions within seconds, and leave no process or segment behind: an env
that fails, a worker too slow for ``timeout``, a trainer that dies (its workers notice within seconds,
even inside a hanging env step, and remove only what they opened), bad actions and bad launch options.
A worker that dies while the trainer waits for it: test_waiting.py."""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import time
import weakref

import helpers
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import shmpool
from shmpool import PoolBrokenError, PoolClosedError, PoolTimeoutError, RemoteTraceback, WorkerError


def test_env_raising_in_step_names_worker_env_and_traceback(pool_name: str) -> None:
    factory = lambda: helpers.CountingEnv(length=100, raise_at=3, raise_seed=103)  # noqa: E731
    pool = shmpool.launch(factory, 4, num_workers=2, name=pool_name)
    pool.reset(seed=100)  # env i gets seed 100 + i: env 3, in worker 1, is the one that raises
    pool.step([0, 0, 0, 0])
    pool.step([0, 0, 0, 0])
    started = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        pool.step([0, 0, 0, 0])
    assert time.monotonic() - started < 10.0  # at once, not after a timeout (60 s)
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


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_env_raising_in_its_autoreset_inside_a_step_is_named(mode: AutoresetMode, pool_name: str) -> None:
    with shmpool.launch(helpers.FailsItsAutoreset, 4, num_workers=2, name=pool_name, autoreset_mode=mode) as pool:
        pool.reset(seed=0)  # env 3, the second env of worker 1, fails at its autoreset
        with pytest.raises(WorkerError) as caught:
            for _ in range(5):
                pool.step(np.zeros(4, dtype=np.int64))
        assert (caught.value.worker_id, caught.value.env_id) == (1, 3)
        assert "the autoreset exploded on purpose" in caught.value.__cause__.text


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


class CrashesIfCollectedElsewhere:
    """Garbage (a reference cycle) whose finalizer crashes natively in any process but its maker's,
    as a native object that a fork copied without its threads does (a Ray actor handle)."""

    def __init__(self) -> None:
        self.maker, self.cycle = os.getpid(), self

    def __del__(self) -> None:
        if os.getpid() != self.maker:
            helpers.crash_natively_here("segfault")


def test_the_trainers_garbage_is_never_collected_in_forked_workers(pool_name: str) -> None:
    gc.collect()
    gc.disable()  # the garbage must still be there, uncollected, when the workers fork
    try:
        garbage = weakref.ref(CrashesIfCollectedElsewhere())
        with shmpool.launch(helpers.CountingEnv, 2, num_workers=2, start_method="fork", name=pool_name) as pool:
            assert gc.get_freeze_count() == 0  # the trainer freezes none of its own objects
            pool.env_apply(lambda env: gc.collect())  # in the workers: the copy must stay uncollected
            pool.reset(seed=0)
            pool.step([1, 1])
    finally:
        gc.enable()
    gc.collect()
    assert garbage() is None  # collected here, in its maker


def test_step_timeout_then_bounded_close(pool_name: str) -> None:
    pool = shmpool.launch(
        lambda: helpers.CountingEnv(length=100, sleep=30), 2, num_workers=2, name=pool_name, timeout=0.5
    )
    pool.reset()
    started = time.monotonic()
    with pytest.raises(PoolTimeoutError, match=r"\[0, 1\] did not finish step within 0.5 s.*launch\(timeout=...\)"):
        pool.step([0, 0])
    assert time.monotonic() - started < 10.0  # the 0.5 s timeout, not the 30 s step
    pids = pool.worker_pids
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 20.0  # close command, SIGTERM, SIGKILL: not the 30 s step
    assert helpers.wait_gone(pids, 1.0) == []


def _stall() -> None:
    time.sleep(60)


def test_a_slow_launch_names_launch_timeout(pool_name: str) -> None:
    """The launch waits ``launch_timeout``, not ``timeout``: its message names the option to raise."""
    started = time.monotonic()
    with pytest.raises(PoolTimeoutError, match=r"did not finish launch within 1.0 s .* launch\(launch_timeout=...\)"):
        shmpool.launch("CartPole-v1", 2, num_workers=2, worker_init=_stall, launch_timeout=1.0, name=pool_name)
    assert time.monotonic() - started < 15.0


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
    import gymnasium as gym
    from gymnasium.vector import SyncVectorEnv

    reference = SyncVectorEnv([lambda: gym.make("Pendulum-v1") for _ in range(2)])
    unconverted = SyncVectorEnv([lambda: gym.make("Pendulum-v1") for _ in range(2)])
    with shmpool.launch("Pendulum-v1", 2, num_workers=1, name=pool_name) as pool:
        np.testing.assert_array_equal(pool.reset(seed=0)[0], reference.reset(seed=0)[0])
        unconverted.reset(seed=0)
        with pytest.raises(ValueError, match=r"Pendulum-v1: actions has shape \(2,\), expected \(2, 1\)"):
            pool.step(np.zeros(2))
        actions = np.array([[0.3], [-1.7]])  # float64 values that float32 cannot hold exactly
        ours = pool.step(actions)
        theirs = reference.step(actions.astype(np.float32))  # the envs got float32 actions...
        for index in range(4):
            np.testing.assert_array_equal(ours[index], theirs[index], err_msg=f"item {index}")
        # ...which the rewards tell apart from float64 ones (Pendulum's cost has 0.001 * u**2).
        assert not np.array_equal(ours[1], unconverted.step(actions)[1])
    reference.close()
    unconverted.close()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_trainer_killed_workers_exit_and_segment_goes(start_method: str, pool_name: str) -> None:
    child = helpers.start_script(
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
    child = helpers.start_script(
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


@pytest.mark.alone  # another test's launch would remove the stale pool before gc
def test_whole_group_killed_then_gc_removes_the_segment(pool_name: str) -> None:
    child = helpers.start_script(
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
    result = helpers.shmpool_cli("gc")
    assert result.returncode == 0, result.stderr
    # A pool launched meanwhile by another process (the machine is shared; CI runs one suite at a
    # time) sweeps dead pools too, and may get there first: then gc finds nothing left of this one.
    swept_by_another = (
        not [n for n in os.listdir("/dev/shm") if pool_name in n] and "nothing to remove" in result.stdout
    )
    assert pool_name in result.stdout or swept_by_another, result.stdout
    assert not [n for n in os.listdir("/dev/shm") if pool_name in n]


def test_launch_under_the_name_of_a_live_pool_raises_pool_exists(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params={"length": shmpool.Param()}) as pool:
        pool.reset(seed=0)
        before = helpers.shm_entries(pool_name)
        with pytest.raises(shmpool.PoolExistsError, match=re.escape(pool_name)) as caught:
            shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name)
        assert isinstance(caught.value, FileExistsError) and isinstance(caught.value, shmpool.ShmpoolError)
        # The live pool lost nothing: its segment and doorbells, its workers, its name.
        assert helpers.shm_entries(pool_name) == before
        pool.params.write(None, length=0.7)
        pool.step([0, 1])
        assert pool.applied["length"].tolist() == [0.7, 0.7]
        with shmpool.attach(pool_name) as handle:
            assert handle.alive and handle.params["length"].tolist() == [0.7, 0.7]


@pytest.mark.alone  # another test's launch would remove the stale pool first
def test_the_next_launch_removes_a_pool_whose_owner_and_workers_died(pool_name: str) -> None:
    dead, alive = pool_name + "-dead", pool_name + "-alive"
    owner = """
        import json, sys, shmpool
        pool = shmpool.launch("CartPole-v1", 2, num_workers=1, name=NAME)
        print(json.dumps(pool.worker_pids), flush=True)
        sys.stdin.read()  # until the test closes stdin (or kills it)
        pool.close()
        """
    victim = helpers.start_script(owner.replace("NAME", repr(dead)), stdin=subprocess.PIPE)
    survivor = helpers.start_script(owner.replace("NAME", repr(alive)), stdin=subprocess.PIPE)
    try:
        workers = json.loads(victim.stdout.readline())
        json.loads(survivor.stdout.readline())
        # The workers first, then the owner: while the owner lives, no launch on this machine may
        # take the segment, so the one below is the first to see it stale (its owner a zombie).
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        assert helpers.wait_gone(workers, 5.0) == []
        os.kill(victim.pid, signal.SIGKILL)
        assert helpers.wait_gone([victim.pid], 5.0) == []
        assert f"shmpool-{dead}" in helpers.shm_entries(dead)  # nobody could clean up
        with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name + "-new") as pool:
            assert helpers.shm_entries(dead) == []  # swept: the dead owner's segment and doorbells
            pool.reset(seed=0)
            pool.step([0, 1])
            with shmpool.attach(alive) as handle:  # a live owner's pool is left alone
                assert handle.alive
    finally:
        victim.kill()
        victim.communicate(timeout=10)
        survivor.communicate(input="", timeout=30)  # closes its pool
    assert survivor.returncode == 0


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks, None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _family(root: int) -> dict[int, int]:
    """Every live process below ``root`` (helpers such as the forkserver included): pid -> start ticks."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as file:
                    data = file.read()
            except OSError:
                continue
            parents[int(entry)] = int(data[data.rindex(b")") + 2 :].split()[1])
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            ticks = _start_ticks(pid)
            if ppid == parent and pid not in found and ticks is not None:
                found[pid] = ticks
                frontier.append(pid)
    return found


def _survivors(family: dict[int, int], seconds: float) -> dict[int, str]:
    """Waits up to ``seconds`` for every process of ``family`` to end; the survivors and their command lines."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [pid for pid, ticks in family.items() if _start_ticks(pid) == ticks]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    found = {}
    for pid in alive:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                found[pid] = file.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            found[pid] = "?"
    return found


def _clean_up(child: subprocess.Popen[str], family: dict[int, int], marker: str) -> None:
    """Kills the trainer ``child`` and the processes of ``family`` it started that still run (only
    after a failure), first, as they hold the child's output pipes open; then removes what they left
    in /dev/shm under ``marker``."""
    child.kill()
    for pid, ticks in family.items():
        if _start_ticks(pid) == ticks:
            os.kill(pid, signal.SIGKILL)
    _survivors(family, 5.0)
    child.communicate(timeout=10)
    helpers.remove_shm_entries(marker)


def _wait_no_entries(marker: str, seconds: float) -> list[str]:
    """Waits up to ``seconds`` for /dev/shm to hold nothing named with ``marker``; returns what is left."""
    deadline = time.monotonic() + seconds
    while helpers.shm_entries(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    return helpers.shm_entries(marker)


def _identities(name: str) -> dict[str, tuple[int, int]]:
    """(st_dev, st_ino) of the segment and semaphore files of the pool called ``name``."""
    files = [f for f in os.listdir(helpers.SHM_DIR) if f == f"shmpool-{name}" or f.startswith(f"sem.shmpool-{name}.")]
    return {
        f: (os.lstat(os.path.join(helpers.SHM_DIR, f)).st_dev, os.lstat(os.path.join(helpers.SHM_DIR, f)).st_ino)
        for f in files
    }


HANGING_TRAINER = """
import functools, json, sys, shmpool, helpers
if __name__ == "__main__":
    hanging = functools.partial(helpers.CountingEnv, length=10**9, sleep=1000)  # importable by every start method
    pool = shmpool.launch(hanging, 2, num_workers=2, name=sys.argv[1], start_method=sys.argv[2], timeout=None)
    pool.reset()
    print(json.dumps(pool.worker_pids), flush=True)
    pool.step([0, 0])  # never returns: every env sleeps 1000 s in its step
"""


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_trainer_killed_during_a_hanging_step_leaves_no_process_and_no_memory(
    start_method: str, pool_name: str
) -> None:
    """A worker notices its owner's death within seconds even inside a hanging env step, with every
    start method, and nothing the trainer started (forkserver, resource tracker) outlives it."""
    child = helpers.start_script(HANGING_TRAINER, pool_name, start_method)
    family: dict[int, int] = {}
    try:
        workers = json.loads(child.stdout.readline())
        time.sleep(0.5)  # the workers are inside env.step now, sleeping
        family = _family(child.pid)
        assert set(workers) <= set(family), (workers, family)
        child.kill()
        child.wait(5)
        assert _survivors(family, 3.0) == {}
        assert _wait_no_entries(pool_name, 1.0) == []
    finally:
        _clean_up(child, family, pool_name)


IDLE_TRAINER = """
import json, sys, time, shmpool
pool = shmpool.launch("CartPole-v1", 2, num_workers=1, name=sys.argv[1], start_method="fork")
print(json.dumps(pool.worker_pids), flush=True)
time.sleep(60)
"""


def test_late_worker_of_a_dead_owner_spares_a_new_pool_of_the_same_name(pool_name: str) -> None:
    """A worker cleaning up after its dead owner removes only the objects it opened: a new pool that
    took the same name meanwhile keeps its segment and doorbells."""
    child = helpers.start_script(IDLE_TRAINER, pool_name)
    family: dict[int, int] = {}
    try:
        [worker] = json.loads(child.stdout.readline())
        family = _family(child.pid)
        os.kill(worker, signal.SIGSTOP)  # a worker as slow to notice as can be: it cannot run until SIGCONT
        child.kill()
        child.wait(5)
        # The new launch sweeps the dead owner's segment and semaphores, then makes its own under the same name.
        with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, seed=0) as pool:
            pool.reset()
            mine = _identities(pool_name)
            assert f"shmpool-{pool_name}" in mine and len(mine) == 3, mine  # segment, trainer and worker doorbells
            os.kill(worker, signal.SIGCONT)
            assert _survivors(family, 5.0) == {}
            assert _identities(pool_name) == mine  # the late worker removed nothing of the new pool
            with shmpool.attach(pool_name) as handle:
                assert handle.alive
            for _ in range(50):
                pool.step(pool.action_space.sample())
        assert _wait_no_entries(pool_name, 1.0) == []
    finally:
        _clean_up(child, family, pool_name)
