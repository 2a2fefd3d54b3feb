"""EnvPool-style async batches (``batch_size``, ``async_reset``, ``send``, ``recv``): each env's
trajectory equals a gymnasium env's whatever the order in which slots finish; parameters, hooks and
episode records keep working; misuse is a clear error, never a hang."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import closing

import gymnasium as gym
import numpy as np
import pytest
from helpers import CountingEnv, run_script

import shmpool
import shmpool.hooks
import shmpool.pool
import shmpool.pool.batches
from shmpool.errors import PoolTimeoutError, WorkerDiedError, WorkerError


class Slow(gym.Wrapper):
    """Sleeps ``seconds`` in every step: slots of different speeds finish in changing orders."""

    def __init__(self, env: gym.Env, seconds: float) -> None:
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):
        time.sleep(self.seconds)
        return self.env.step(action)


def uneven(env_id: int):
    seconds = [0.0, 0.004, 0.0005, 0.002][env_id // 2]
    return lambda: Slow(gym.make("CartPole-v1"), seconds)


def replay(env_id: int, seed: int, actions: list[int], steps: int) -> list[tuple]:
    """What a plain gymnasium env (next-step autoreset by hand) returns for these actions."""
    env = gym.make("CartPole-v1")
    observation, _ = env.reset(seed=seed)
    trajectory, done = [(observation, 0.0, False, False)], False
    for action in actions[: steps - 1]:
        if done:
            observation, _ = env.reset()
            reward, terminated, truncated = 0.0, False, False
        else:
            observation, reward, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
        trajectory.append((observation, reward, terminated, truncated))
    env.close()
    return trajectory


def test_each_env_follows_its_own_trajectory_whatever_order_slots_finish(pool_name: str) -> None:
    env_fns = [uneven(i) for i in range(8)]
    rng = np.random.default_rng(1)
    got: dict[int, list[tuple]] = {i: [] for i in range(8)}
    sent: dict[int, list[int]] = {i: [] for i in range(8)}
    orders = set()
    with shmpool.launch(env_fns, num_workers=4, batch_size=4, name=pool_name) as pool:
        assert pool.batch_size == 4
        pool.async_reset(seed=100)
        for _ in range(120):
            observations, rewards, terminations, truncations, infos = pool.recv()
            env_ids = infos["env_id"]
            assert env_ids.dtype == np.int32 and len(env_ids) == 4
            orders.add(tuple(env_ids.tolist()))
            for row, env_id in enumerate(env_ids):
                got[env_id].append((observations[row], rewards[row], terminations[row], truncations[row]))
            actions = rng.integers(0, 2, 4)
            for row, env_id in enumerate(env_ids):
                sent[env_id].append(int(actions[row]))
            pool.send(actions, env_ids)
    assert len(orders) > 2  # the fast slots came back more often, in several pairings
    assert len(got[0]) > len(got[2])
    for env_id in range(8):
        expected = replay(env_id, 100 + env_id, sent[env_id], len(got[env_id]))
        for step, (mine, theirs) in enumerate(zip(got[env_id], expected)):
            np.testing.assert_array_equal(mine[0], theirs[0], err_msg=f"env {env_id} step {step}")
            assert mine[1:] == theirs[1:], f"env {env_id} step {step}"


def test_recv_order_sent_returns_every_env_once_per_cycle_however_slow_its_slot(pool_name: str) -> None:
    """With slots of 0 to 4 ms per step, first-finished order returns the fast slots more often;
    ``recv_order="sent"`` returns them in the order their steps went out, each env once per cycle,
    and every env still follows its own trajectory."""
    env_fns = [uneven(i) for i in range(8)]
    got: dict[int, list[tuple]] = {i: [] for i in range(8)}
    sent: dict[int, list[int]] = {i: [] for i in range(8)}
    with pytest.raises(ValueError, match="recv_order must be 'finished' or 'sent', got 'fifo'"):
        shmpool.launch(env_fns, num_workers=4, batch_size=4, recv_order="fifo")
    with shmpool.launch(env_fns, num_workers=4, batch_size=2, recv_order="sent", name=pool_name) as pool:
        pool.async_reset(seed=100)
        for cycle in range(15):
            seen = []
            for _ in range(4):  # four recvs of one slot each: one cycle over the 8 envs
                observations, rewards, terminations, truncations, infos = pool.recv()
                seen.extend(infos["env_id"].tolist())
                for row, env_id in enumerate(infos["env_id"].tolist()):
                    got[env_id].append((observations[row], rewards[row], terminations[row], truncations[row]))
                    sent[env_id].append(env_id % 2)
                pool.send(infos["env_id"] % 2, infos["env_id"])
            assert sorted(seen) == list(range(8)), cycle
    for env_id in range(8):
        expected = replay(env_id, 100 + env_id, sent[env_id], len(got[env_id]))
        for step, (mine, theirs) in enumerate(zip(got[env_id], expected)):
            np.testing.assert_array_equal(mine[0], theirs[0], err_msg=f"env {env_id} step {step}")
            assert mine[1:] == theirs[1:], f"env {env_id} step {step}"


def test_a_batch_of_every_env_is_the_synchronous_step(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 4, num_workers=2, seed=3, name=pool_name) as pool:
        assert pool.batch_size == 4
        pool.async_reset(seed=3)
        observations, rewards, *_, infos = pool.recv()
        assert infos["env_id"].tolist() == [0, 1, 2, 3] and rewards.tolist() == [0.0] * 4
        reference, _ = pool.reset(seed=3)
        np.testing.assert_array_equal(observations, reference)
        stepped = pool.step(np.ones(4, dtype=np.int64))
        pool.async_reset(seed=3)
        pool.recv()
        pool.send(np.ones(4, dtype=np.int64))  # env ids default to the last recv's
        again = pool.recv()
        for mine, theirs in zip(again[:4], stepped[:4]):
            np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize(("num_envs", "num_workers"), [(7, 2), (5, 3), (10, 4)])
@pytest.mark.parametrize("explicit", [False, True], ids=["default", "explicit"])
def test_a_batch_of_every_env_has_every_env_with_unequal_slots(
    num_envs: int, num_workers: int, explicit: bool, pool_name: str
) -> None:
    """batch_size == num_envs (the default, or given) makes every recv one batch of all the envs,
    whatever the slots' sizes; any other batch_size needs equal slots."""
    options = {"batch_size": num_envs} if explicit else {}
    with shmpool.launch(CountingEnv, num_envs, num_workers=num_workers, name=pool_name, **options) as pool:
        assert pool.batch_size == num_envs
        pool.async_reset(seed=0)
        for step in range(4):
            observations, *_, infos = pool.recv()
            assert infos["env_id"].tolist() == list(range(num_envs)), f"recv {step}"
            assert observations[:, 0].tolist() == [float(step)] * num_envs  # each env's steps so far
            pool.send(np.ones(num_envs, dtype=np.int64), infos["env_id"])
    with pytest.raises(ValueError, match="unequal slots"):
        shmpool.launch(CountingEnv, num_envs, num_workers=num_workers, batch_size=num_envs - 1, name=pool_name)


def test_params_hooks_and_episode_records_work_in_batches(pool_name: str) -> None:
    params = {"length": shmpool.Param(low=0.1, high=3.0)}
    hooks = [shmpool.hooks.RewardScale(2.0)]
    with shmpool.launch(
        "CartPole-v1", 4, num_workers=2, batch_size=2, params=params, hooks=hooks, seed=0, name=pool_name
    ) as pool:
        pool.async_reset(seed=0)
        pool.params.write(None, length=1.5)  # before any step: every step below sees it
        stepped = 0
        for _ in range(6):
            _, rewards, *_, infos = pool.recv()
            if rewards.any():  # a step (the first batch of each slot is its reset)
                stepped += 1
                assert rewards.tolist() == [2.0, 2.0]  # RewardScale ran in the workers
                assert pool.applied["length"][infos["env_id"]].tolist() == [1.5, 1.5]
            pool.send(np.ones(2, dtype=np.int64), infos["env_id"])
        assert stepped >= 4
        finished, ended_in = 0, set()
        deadline = time.monotonic() + 60  # a loaded machine can starve one worker of the CPU for a while
        # Always pushing right: every episode ends within a few dozen steps.
        while (len(ended_in) < 4 or finished < 8) and time.monotonic() < deadline:
            _, _, terminations, truncations, infos = pool.recv()
            finished += int((terminations | truncations).sum())
            ended_in.update(infos["env_id"][terminations | truncations].tolist())
            if "episode" in infos:
                assert (infos["episode"]["l"][infos["_episode"]] > 0).all()
            pool.send(np.ones(2, dtype=np.int64), infos["env_id"])
        for _ in range(2):  # the two slots still in flight
            _, _, terminations, truncations, _ = pool.recv()
            finished += int((terminations | truncations).sum())
        records = pool.episodes.read()
        assert ended_in == {0, 1, 2, 3} and len(records) == finished
        assert set(records["env_id"].tolist()) == ended_in


def test_misuse_is_a_clear_error(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 2, num_workers=2, autoreset_mode="Disabled", name=pool_name) as pool:
        with pytest.raises(ValueError, match="not DISABLED"):
            pool.async_reset()
    with pytest.raises(ValueError, match=r"batch_size=3 is not a whole number of slots: .* batch sizes that fit: \["):
        shmpool.launch("CartPole-v1", 4, num_workers=2, batch_size=3, name=pool_name)
    with pytest.raises(ValueError, match="batch_size must be between 1 and 4"):
        shmpool.launch("CartPole-v1", 4, num_workers=2, batch_size=5, name=pool_name)
    with shmpool.launch("CartPole-v1", 4, num_workers=2, batch_size=2, name=pool_name) as pool:
        with pytest.raises(RuntimeError, match="recv needs 2 envs in flight, but only 0"):
            pool.recv()
        with pytest.raises(RuntimeError, match="no recv"):
            pool.send(np.ones(2, dtype=np.int64))
        pool.async_reset(seed=0)
        *_, infos = pool.recv()
        others = [2, 3] if infos["env_id"][0] == 0 else [0, 1]
        with pytest.raises(RuntimeError, match="have no results returned by recv"):
            pool.send(np.ones(2, dtype=np.int64), others)
        with pytest.raises(IndexError, match="outside 0..3"):
            pool.send(np.ones(2, dtype=np.int64), [7, 8])
        with pytest.raises(ValueError, match="whole slots"):
            pool.send(np.ones(1, dtype=np.int64), infos["env_id"][:1])
        with pytest.raises(ValueError, match="shape"):
            pool.send(np.ones(3, dtype=np.int64), infos["env_id"])
        with pytest.raises(RuntimeError, match="async batches in flight"):
            pool.step(np.ones(4, dtype=np.int64))
        pool.send(np.ones(2, dtype=np.int64), infos["env_id"])
        assert pool.get_attr("spec")[0].id == "CartPole-v1"  # a control call waits for the slot in flight
        pool.recv()
        pool.recv()
        with pytest.raises(RuntimeError, match="recv needs 2 envs in flight"):
            pool.recv()
        pool.send(np.ones(2, dtype=np.int64), [2, 3])
        # A reset refused for its arguments changes nothing: the batch in flight is still there.
        for refused in (lambda: pool.reset(seed=-1), lambda: pool.async_reset(options={"level": object()})):
            with pytest.raises((ValueError, TypeError)):
                refused()
            with pytest.raises(RuntimeError, match="async batches in flight"):
                pool.step(np.ones(4, dtype=np.int64))
        pool.get_attr("spec")  # envs 2 and 3 now have results that no recv returned
        with pytest.raises(RuntimeError, match=r"leaves out envs \[3\], whose async results no recv"):
            pool.reset(options={"reset_mask": np.array([True, True, True, False])})
        pool.reset(options={"reset_mask": np.array([False, False, True, True])})  # envs 0, 1: returned, nothing lost
        observations, _ = pool.reset(seed=0)  # back to synchronous steps
        assert observations.shape == (4, 4)
        pool.step(np.ones(4, dtype=np.int64))


def test_a_failing_or_dying_worker_surfaces_in_recv(pool_name: str) -> None:
    def fragile() -> gym.Env:
        return gym.make("CartPole-v1")

    with shmpool.launch(
        lambda: CountingEnv(raise_at=2, raise_seed=3), 4, num_workers=2, batch_size=2, name=pool_name
    ) as pool:
        pool.async_reset(seed=0)
        *_, infos = pool.recv()
        with pytest.raises(ValueError, match=rf"env {infos['env_id'][1]}: action 7"):
            pool.send(np.array([1, 7]), infos["env_id"])  # out of the space: refused here, named by env id
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # the other slot may run many batches while env 3 fails
            pool.send(np.ones(2, dtype=np.int64), infos["env_id"])
            try:
                *_, infos = pool.recv()
            except WorkerError as error:
                assert "env 3" in str(error) and "during recv" in str(error) and error.env_id == 3
                break
        else:
            pytest.fail("env 3's failure never surfaced")
    slow = [lambda: Slow(gym.make("CartPole-v1"), 0.2)] * 4  # a step takes 0.4 s: the kill lands mid-step
    with shmpool.launch(slow, num_workers=2, batch_size=2, name=pool_name) as pool:
        pool.async_reset(seed=0)
        *_, infos = pool.recv()
        victim = pool.worker_pids[int(infos["env_id"][0]) // 2]
        pool.send(np.ones(2, dtype=np.int64), infos["env_id"])
        pool.recv()  # the other slot's reset
        os.kill(victim, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(WorkerDiedError):
            pool.recv()
        assert time.monotonic() - started < 5.0


class HangsAtStep2(CountingEnv):
    """Env 3 (seed 3) hangs at its second step; the others keep stepping."""

    def step(self, action):
        if self.t >= 1 and self.seed_used == 3:
            time.sleep(30)
        return super().step(action)


@pytest.mark.parametrize("fault", ["hang", "kill"])
def test_a_stuck_or_dead_worker_surfaces_while_others_keep_finishing(fault: str, pool_name: str) -> None:
    """A loop fed by one worker's batches must not go on without the other's envs: its death or its
    lateness past ``timeout`` is raised within about that time, ready batches or not."""
    env = HangsAtStep2 if fault == "hang" else CountingEnv
    with shmpool.launch(lambda: env(length=1000), 4, num_workers=2, batch_size=2, timeout=1.0, name=pool_name) as pool:
        pool.async_reset(seed=0)
        started, batches, killed = time.monotonic(), {0: 0, 1: 0}, None
        with pytest.raises(PoolTimeoutError if fault == "hang" else WorkerDiedError) as raised:
            while time.monotonic() - started < 10:
                *_, infos = pool.recv()
                worker = int(infos["env_id"][0]) // 2
                batches[worker] += 1
                pool.send(np.ones(2, dtype=np.int64), infos["env_id"])
                if fault == "kill" and killed is None and batches[1]:
                    killed = time.monotonic()  # worker 1 now steps the batch just sent: dies mid-step
                    os.kill(pool.worker_pids[1], signal.SIGKILL)
        assert time.monotonic() - (killed or started) < 2.0
        assert "[1]" in str(raised.value) or "worker 1" in str(raised.value)
        assert batches[0] > 2  # fed by worker 0 all along


class StepAsReward:
    """Rewards each env with the global step its hooks see."""

    def after_step(self, ctx: shmpool.hooks.HookContext) -> None:
        ctx.rewards[:] = ctx.global_step


def test_reset_after_batches_brings_every_worker_back_to_the_pools_step(pool_name: str) -> None:
    """In async mode each worker counts its own steps; reset() (back to step()) realigns them with
    ``pool.global_step``, so hooks, ``at_step`` events and records agree again."""
    with shmpool.launch(
        "CartPole-v1", 4, num_workers=2, batch_size=2, hooks=[StepAsReward()], seed=0, name=pool_name
    ) as pool:
        pool.async_reset(seed=0)
        for _ in range(21):  # worker 0 steps more often than worker 1: their counts part
            *_, infos = pool.recv()
            pool.send(np.zeros(2, dtype=np.int64), infos["env_id"])
        pool.reset(seed=0)
        for _ in range(3):
            step = pool.global_step
            rewards = pool.step(np.ones(4, dtype=np.int64))[1]
            assert rewards.tolist() == [float(step)] * 4


def env_row(infos: dict, row: int) -> dict:
    """One row of gymnasium vector infos as that env's own info dict (keys masked out left out)."""
    out = {}
    for key, value in infos.items():
        mask = infos.get(f"_{key}")
        if str(key).startswith("_") or key == "env_id" or (mask is not None and not mask[row]):
            continue
        if isinstance(value, dict):
            out[key] = env_row(value, row)
        else:
            out[key] = value[row].tolist() if isinstance(value[row], np.ndarray) else value[row]
    return out


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_batches_carry_each_envs_infos_final_obs_and_episodes(mode: str, pool_name: str) -> None:
    from helpers import InfoEnv

    rng = np.random.default_rng(2)
    got: dict[int, list] = {i: [] for i in range(6)}
    sent: dict[int, list[int]] = {i: [] for i in range(6)}
    with shmpool.launch(InfoEnv, 6, num_workers=3, batch_size=2, autoreset_mode=mode, name=pool_name) as pool:
        pool.async_reset(seed=7)
        for _ in range(60):
            observations, rewards, terminations, truncations, infos = pool.recv()
            for row, env_id in enumerate(infos["env_id"].tolist()):
                info = env_row(infos, row)
                final = infos["final_obs"][row].tolist() if infos.get("_final_obs", [False] * 2)[row] else None
                got[env_id].append(
                    (observations[row].tolist(), float(rewards[row]), bool(terminations[row]), info, final)
                )
            actions = rng.integers(0, 2, 2)
            for row, env_id in enumerate(infos["env_id"].tolist()):
                sent[env_id].append(int(actions[row]))
            pool.send(actions, infos["env_id"])
    for env_id in range(6):
        with closing(gym.vector.SyncVectorEnv([InfoEnv], autoreset_mode=mode)) as reference:
            observations, infos = reference.reset(seed=7 + env_id)
            expected = [(observations[0].tolist(), 0.0, False, env_row(infos, 0), None)]
            for action in sent[env_id][: len(got[env_id]) - 1]:
                observations, rewards, terminations, _, infos = reference.step(np.array([action]))
                final = infos["final_obs"][0].tolist() if infos.get("_final_obs", [False])[0] else None
                info = env_row({k: v for k, v in infos.items() if k not in ("final_obs", "_final_obs")}, 0)
                expected.append((observations[0].tolist(), float(rewards[0]), bool(terminations[0]), info, final))
        mine = [
            (o, r, t, {k: v for k, v in i.items() if k not in ("episode", "final_obs")}, f)
            for o, r, t, i, f in got[env_id]
        ]
        assert mine == expected, f"env {env_id}"
        ended = [i["episode"] for _, _, t, i, _ in got[env_id] if "episode" in i]
        assert all(episode["l"] == 4 and episode["r"] == 4.0 for episode in ended) and ended


@pytest.mark.parametrize("recv_order", ["finished", "sent"])
def test_ctrl_c_in_recv_loses_no_batch(pool_name: str, recv_order: str) -> None:
    slow = [lambda: Slow(gym.make("CartPole-v1"), 0.15)] * 4  # a slot's step takes 0.3 s
    with shmpool.launch(slow, num_workers=2, batch_size=2, recv_order=recv_order, name=pool_name) as pool:
        pool.async_reset(seed=0)
        sent = []
        for _ in range(2):
            *_, infos = pool.recv()
            pool.send(np.ones(2, dtype=np.int64), infos["env_id"])
            sent.append(tuple(infos["env_id"].tolist()))
        timer = threading.Timer(0.1, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            pool.recv()
        timer.join()
        got = []
        for _ in range(2):
            observations, *_, infos = pool.recv()
            got.append(tuple(infos["env_id"].tolist()))
            assert (observations[:, 0] != 0).all()  # a step's observations, not the reset's
        assert sorted(got) == sorted(sent)


@pytest.mark.parametrize("recv_order", ["finished", "sent"])
@pytest.mark.parametrize("where", ["marking ready", "handing out"])
def test_a_ctrl_c_held_back_inside_recv_loses_no_batch(
    pool_name: str, monkeypatch: pytest.MonkeyPatch, where: str, recv_order: str
) -> None:
    """A Ctrl-C that arrives while recv changes its queue is raised when that block ends: in the
    block that marks finished workers ready, or in the one that hands a batch out (held until recv
    returns); either way no batch is lost, and every slot keeps coming back. A real SIGINT, sent
    from inside the block every time it runs."""

    class CtrlCInside(shmpool.pool.batches.interrupts_deferred):  # type: ignore[misc]
        def __enter__(self) -> None:
            super().__enter__()
            # To this thread: a signal to the process may be taken by another thread, whose
            # handler could then run after the block, when the test no longer expects it.
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

        hold = __enter__

    # batches marks workers ready; pool holds Ctrl-C back from the hand-out to recv's return.
    module = shmpool.pool.batches if where == "marking ready" else shmpool.pool.pool
    actions = np.zeros(2, dtype=np.int64)
    with shmpool.launch(CountingEnv, 4, num_workers=2, batch_size=2, recv_order=recv_order, name=pool_name) as pool:
        pool.async_reset(seed=0)
        interrupts = 0
        monkeypatch.setattr(module, "interrupts_deferred", CtrlCInside)
        try:
            for _ in range(6):  # a recv with a worker already queued marks none: it may return
                try:
                    *_, infos = pool.recv()
                except KeyboardInterrupt:
                    interrupts += 1
                    continue
                pool.send(actions, infos["env_id"])
        finally:
            monkeypatch.undo()
        assert interrupts >= (6 if where == "handing out" else 1)
        returned: list[tuple[int, ...]] = []
        give_up = time.monotonic() + 20  # a lost batch never comes back; a slot may wait for a core
        while len(set(returned)) < 2 and time.monotonic() < give_up:
            observations, *_, infos = pool.recv()
            ids = tuple(infos["env_id"].tolist())
            returned.append(ids)
            # Both envs of a slot step together: the same count, whatever was interrupted.
            assert observations[0, 0] == observations[1, 0], ids
            pool.send(actions, infos["env_id"])
        assert sorted(set(returned)) == [(0, 1), (2, 3)]  # both slots keep coming back


ASYNC_STORM = """
import os, signal, subprocess, sys, time
import numpy as np
import shmpool
sys.path.insert(0, "tests")
import helpers

pool = shmpool.launch(lambda: helpers.CountingEnv(length=10**9), 6, num_workers=3, batch_size=2, name=sys.argv[1])
pool.async_reset(seed=0)
storm = helpers.start_sigint_storm(os.getpid(), 2.0, 0.0005)
Sent = shmpool.StepSentInterrupt
actions = np.ones(2, dtype=np.int64)
interrupts = sent_interrupted = rounds = 0
batch = None  # a batch received and not sent yet
done_at = time.monotonic() + 3.0  # by then the storm is over

def work():
    # No call between a pool call's return and the store of what it says (a Ctrl-C is raised only
    # at a call or a loop's back edge): the script's own bookkeeping must not lose a batch either.
    global interrupts, sent_interrupted, rounds, batch
    while True:
        try:
            if time.monotonic() > done_at:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                return
            if batch is None:
                batch = pool.recv()
            pool.send(actions, batch[4]["env_id"])
            batch = None
            rounds += 1
        except Sent:
            batch = None
            sent_interrupted += 1
        except KeyboardInterrupt:
            interrupts += 1

def until_done(body):
    # An interrupt can also land on a loop's back edge, outside the try in it: each level catches
    # what the one below lets out; two levels leave a window too small to be hit.
    global interrupts, sent_interrupted, batch
    while True:
        try:
            body()
            return
        except Sent:
            batch = None
            sent_interrupted += 1
        except KeyboardInterrupt:
            interrupts += 1

until_done(lambda: until_done(work))
os.waitpid(storm.pid, 0)
storm.returncode = 0
if batch is not None:
    pool.send(actions, batch[4]["env_id"])
seen = set()
give_up = time.monotonic() + 20  # a lost batch never comes back; others may wait for a core a while
while len(seen) < 6 and time.monotonic() < give_up:  # every env still flows, none handed out twice
    observations, rewards, terminations, truncations, infos = pool.recv()
    seen.update(infos["env_id"].tolist())
    pool.send(actions, infos["env_id"])
print(interrupts, sent_interrupted, rounds, sorted(seen))
pool.close()
"""


def test_ctrl_c_storm_in_async_recv_and_send_loses_no_batch_and_sends_none_twice(pool_name: str) -> None:
    """A Ctrl-C in recv hands nothing out (the next recv returns the batch); one in send either
    sent nothing (KeyboardInterrupt) or sent the step (StepSentInterrupt). A batch lost makes a
    later recv raise for want of envs in flight; one sent twice makes send raise."""
    result = run_script(ASYNC_STORM, pool_name, timeout=120)
    printed = result.stdout.strip().split(" ", 3)
    # The storm's last signals can arrive during interpreter shutdown, after the line is printed
    # and the default handler is back: not this test's subject, so that exit is accepted, and only
    # with the whole line printed.
    late_sigint = result.returncode == -signal.SIGINT and len(printed) == 4 and printed[3].startswith("[")
    assert result.returncode == 0 or late_sigint, result.stderr[-2000:]
    interrupts, sent_interrupted, rounds, seen = printed
    assert int(interrupts) + int(sent_interrupted) > 100  # the storm really hit the trainer
    assert int(rounds) > 100
    assert seen == "[0, 1, 2, 3, 4, 5]"


class SlowThird(CountingEnv):
    """The env reset with seed 3 takes 0.3 s per step; the others none."""

    def step(self, action):
        if self.seed_used == 3:
            time.sleep(0.3)
        return super().step(action)


def test_a_worker_collected_late_lends_no_deadline_to_one_sent_later(pool_name: str) -> None:
    """A worker that finished long before the trainer collects it must not make a worker sent just now
    look late: ``timeout`` counts from each worker's own send."""
    with shmpool.launch(
        lambda: SlowThird(length=1000), 4, num_workers=4, batch_size=2, timeout=1.0, name=pool_name
    ) as pool:
        pool.async_reset(seed=0)
        pool.recv()
        pool.recv()
        pool.send(np.zeros(1, dtype=np.int64), [0])  # done at once, collected only by the next wait
        time.sleep(1.2)  # a policy update, an evaluation: longer than the timeout
        pool.send(np.zeros(1, dtype=np.int64), [3])  # 0.3 s
        assert sorted(pool.recv()[4]["env_id"].tolist()) == [0, 3]
        pool.send(np.zeros(1, dtype=np.int64), [0])
        time.sleep(1.2)
        pool.send(np.zeros(1, dtype=np.int64), [3])
        assert pool.get_attr("t")[3] == 2  # a control call waits for both the same way


@pytest.mark.parametrize("recv_order", ["finished", "sent"])
def test_a_worker_that_dies_is_reported_at_once_while_an_older_one_still_steps(pool_name: str, recv_order: str) -> None:
    """With ``recv_order="sent"``, recv waits for the oldest commands; a death among the others is
    still found by the wait's checks, not once the oldest slot finishes its 5 s step. (Env 1 steps
    for 3 s, so that the kill lands mid-step however loaded the machine: a worker that finished its
    command before it died has a batch ready, and is reported when it is next needed.)"""
    env_fns = [lambda: Slow(gym.make("CartPole-v1"), 5.0), lambda: Slow(gym.make("CartPole-v1"), 3.0)]
    with shmpool.launch(env_fns, num_workers=2, batch_size=1, recv_order=recv_order, name=pool_name) as pool:
        pool.async_reset(seed=0)
        for _ in range(2):  # env 0 is then stepping for 5 s, env 1 for 3 s
            *_, infos = pool.recv()
            pool.send(np.zeros(1, dtype=np.int64), infos["env_id"])
        os.kill(pool.worker_pids[1], signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(WorkerDiedError, match=r"worker 1 .* killed by signal SIGKILL during recv"):
            while True:
                *_, infos = pool.recv()
                pool.send(np.zeros(1, dtype=np.int64), infos["env_id"])
        assert time.monotonic() - started < 2.0
