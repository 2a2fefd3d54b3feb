"""Regressions of the shared-memory protocol: use after close, Ctrl-C, threads, killed writers and
senders, forks, stopped writers, CPUs without total store order (issue 9, defects 1-6, 10, 13).

Anything that crashed the interpreter before the fix (a read of unmapped memory) runs in a
subprocess, so that a SIGSEGV fails the test instead of killing the test run.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import helpers
import numpy as np
import posix_ipc
import pytest

import shmpool
from shmpool import Param

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}


def run_script(code: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter; returns its exit status and output."""
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=ENV, cwd=ROOT
    )


# -- 1. use after close ---------------------------------------------------------------------------

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
    result = run_script(USE_AFTER_CLOSE, pool_name)
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


SENDER_DURING_CLOSE = """
import sys, threading, time
import shmpool
sys.path.insert(0, "tests")
import helpers

pool = shmpool.launch("CartPole-v1", 4, num_workers=2, name=sys.argv[1], hooks=[helpers.EventLog(sys.argv[2])],
                      event_capacity=2, event_payload=3)
pool.reset(seed=0)
outcome = []

def sender():
    try:
        for seq in range(10):  # the ring holds 2 and nobody steps: the third send waits for room
            pool.events.send("Log", None, [0, 0, seq], timeout=None)
        outcome.append("sent all")
    except shmpool.PoolClosedError:
        outcome.append("PoolClosedError")
    except BaseException as exc:
        outcome.append(type(exc).__name__)

thread = threading.Thread(target=sender)
thread.start()
time.sleep(0.5)
started = time.monotonic()
pool.close()
thread.join(5)
print(outcome, thread.is_alive(), time.monotonic() - started < 10)
"""


def test_a_sender_waiting_for_room_stops_when_the_pool_closes(pool_name: str, tmp_path: Path) -> None:
    result = run_script(SENDER_DURING_CLOSE, pool_name, str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[0] == "['PoolClosedError'] False True"


# -- 2. Ctrl-C storms -----------------------------------------------------------------------------

CTRL_C_STORM = """
import os, random, signal, sys, threading, time
import numpy as np
import shmpool
sys.path.insert(0, "tests")
import helpers

pool = shmpool.launch(lambda: helpers.CountingEnv(length=10**9), 6, num_workers=3, name=sys.argv[1])
pool.reset(seed=0)
main = threading.main_thread()

def storm():
    rng = random.Random(int(sys.argv[2]))
    for _ in range(300):
        time.sleep(rng.uniform(0.0002, 0.004))
        os.kill(os.getpid(), signal.SIGINT)

thread = threading.Thread(target=storm, daemon=True)
thread.start()
interrupts = violations = steps = 0
while thread.is_alive() or steps < 10:
    try:
        observations, *_ = pool.step(np.ones(6, dtype=np.int64))
        counts = observations[:, 0]  # steps each env took since the reset
        steps += 1
        if not (counts == pool.global_step).all():
            violations += 1
    except KeyboardInterrupt:
        interrupts += 1
observations, *_ = pool.step(np.ones(6, dtype=np.int64))
print(interrupts, violations, observations[:, 0].tolist(), pool.global_step)
pool.close()
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_ctrl_c_storm_keeps_workers_in_lockstep_and_the_step_count_right(pool_name: str, seed: int) -> None:
    result = run_script(CTRL_C_STORM, pool_name, str(seed), timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    interrupts, violations, final = result.stdout.split(" ", 2)
    assert int(interrupts) > 50  # the storm really hit the trainer
    assert int(violations) == 0, result.stdout
    counts, global_step = final.rsplit(" ", 1)
    assert counts == str([float(global_step)] * 6)


# -- 3. threads -----------------------------------------------------------------------------------


def test_threads_sending_events_lose_none(pool_name: str, tmp_path: Path) -> None:
    per_thread = 400
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, inside critical sections too
    try:
        with shmpool.launch(
            "CartPole-v1",
            4,
            num_workers=2,
            name=pool_name,
            hooks=[helpers.EventLog(str(tmp_path))],
            event_payload=3,
            event_capacity=64,
        ) as pool:
            pool.reset(seed=0)

            def sender(thread_id: int) -> None:
                for seq in range(per_thread):
                    pool.events.send("Log", None, [thread_id, seq, 0], timeout=None)  # to both workers

            threads = [threading.Thread(target=sender, args=(k,)) for k in range(4)]
            for thread in threads:
                thread.start()
            while any(thread.is_alive() for thread in threads):
                pool.step(np.zeros(4, dtype=np.int64))
            for _ in range(3):
                pool.step(np.zeros(4, dtype=np.int64))
    finally:
        sys.setswitchinterval(previous)
    delivered = [
        tuple(int(v) for v in line.split()[:2])
        for file in tmp_path.glob("events-*")
        for line in file.read_text().splitlines()
    ]
    assert sorted(delivered) == sorted((k, seq) for k in range(4) for seq in range(per_thread) for _ in range(2))


PAIR_WRITER = """
import sys, numpy as np, shmpool
rng = np.random.default_rng(int(sys.argv[2]))
with shmpool.attach(sys.argv[1], timeout=10) as handle:
    print("ready", flush=True)
    while True:
        x = float(rng.integers(1, 1000))
        handle.params.write(rng.choice(4, size=2, replace=False), a=x, b=-x)
"""


def test_threads_and_processes_writing_pairs_never_publish_a_torn_pair(pool_name: str) -> None:
    params = {"a": Param(0.0), "b": Param(0.0), "c": Param(0.0, bind=False)}
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    stop = threading.Event()
    with shmpool.launch(helpers.PairEnv, 4, num_workers=2, name=pool_name, params=params) as pool:
        writer = subprocess.Popen(
            [sys.executable, "-c", PAIR_WRITER, pool_name, "1"], stdout=subprocess.PIPE, text=True, env=ENV
        )
        try:
            assert writer.stdout.readline().strip() == "ready"
            pool.reset(seed=0)

            def pairs() -> None:
                rng = np.random.default_rng(2)
                while not stop.is_set():
                    x = float(rng.integers(1000, 2000))
                    pool.params.write(rng.choice(4, size=3, replace=False), a=x, b=-x)

            def others() -> None:
                while not stop.is_set():
                    pool.params.write(None, c=1.0)

            threads = [threading.Thread(target=pairs), threading.Thread(target=others)]
            for thread in threads:
                thread.start()
            torn = []
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                observations, *_ = pool.step(np.zeros(4, dtype=np.int64))
                torn += [row.tolist() for row in observations if row[0] != -row[1]]
        finally:
            stop.set()
            sys.setswitchinterval(previous)
            writer.kill()
            writer.wait(5)
        for thread in threads:
            thread.join(5)
        assert torn == []
        assert pool.params.refusals == {"a": 0, "b": 0, "c": 0}


# -- 4. a killed writer's half write ----------------------------------------------------------------

HALF_WRITER = """
import os, signal, sys
import numpy as np
import shmpool

class DieHere:
    # Stands for the writer's death in the middle of its write: numpy asks for the values here.
    def __array__(self, dtype=None, copy=None):
        print("dying", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

handle = shmpool.attach(sys.argv[1], timeout=10)
block = handle.params
rows = np.array([0, 1])
with block._lock.hold(None, lambda: None):
    block._seqlock.write(rows, [(block["a"], np.array([5.0, 5.0])), (block["b"], DieHere())])
"""


def test_a_writer_killed_mid_write_never_gets_its_half_write_applied(pool_name: str) -> None:
    params = {"a": Param(1.0), "b": Param(-1.0), "c": Param(0.0, bind=False)}
    with shmpool.launch(helpers.PairEnv, 4, num_workers=2, name=pool_name, params=params) as pool:
        pool.reset(seed=0)
        result = run_script(HALF_WRITER, pool_name)
        assert result.returncode == -signal.SIGKILL and "dying" in result.stdout, result.stderr[-2000:]
        observations, *_ = pool.step(np.zeros(4, dtype=np.int64))
        assert observations.tolist() == [[1.0, -1.0]] * 4  # the odd rows are not read meanwhile
        pool.params.write(None, c=2.0)  # an unrelated write by the next writer rolls the half write back
        for _ in range(2):
            observations, *_ = pool.step(np.zeros(4, dtype=np.int64))
            assert observations.tolist() == [[1.0, -1.0]] * 4
        assert pool.params["a"].tolist() == [1.0] * 4
        assert pool.params.refusals == {"a": 0, "b": 0, "c": 0}
        pool.params.write([0], a=3.0, b=-3.0)  # and the rows take writes again
        observations, *_ = pool.step(np.zeros(4, dtype=np.int64))
        assert observations[0].tolist() == [3.0, -3.0]


MERGING_WRITER = """
import sys, shmpool
values = [{"low": 0.8}, {"low": 0.1}] if sys.argv[2] == "low" else [{"high": 0.2}, {"high": 0.9}]
refused = 0
with shmpool.attach(sys.argv[1], timeout=10) as handle:
    print("ready", flush=True)
    for _ in range(int(sys.argv[3])):
        for value in values:  # each is valid against one of the other writer's two values
            try:
                handle.params.write(None, u=value)
            except ValueError:
                refused += 1
print(refused, flush=True)
"""


def test_concurrent_writers_of_one_distribution_never_store_low_above_high(pool_name: str) -> None:
    params = {"u": Param({"low": 0.1, "high": 0.9}, low=0.0, high=1.0, dist="uniform", bind=False)}
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", MERGING_WRITER, pool_name, side, "3000"],
                stdout=subprocess.PIPE,
                text=True,
                env=ENV,
            )
            for side in ("low", "high")
        ]
        try:
            for writer in writers:
                assert writer.stdout.readline().strip() == "ready"
            inverted = 0
            while any(writer.poll() is None for writer in writers):
                block = pool.params["u"]
                inverted += int((block["low"] > block["high"]).any())
            assert [writer.wait(60) for writer in writers] == [0, 0]
        finally:
            for writer in writers:
                writer.kill()
                writer.wait(5)
        # A raw read can catch a write in flight, so count only what was left behind and what
        # the workers refused.
        pool.reset(seed=0)
        pool.step(np.zeros(2, dtype=np.int64))
        assert (pool.params["u"]["low"] <= pool.params["u"]["high"]).all()
        assert pool.params.refusals == {"u": 0}


# -- 5. an event for several workers reaches all of them or none ------------------------------------

HALF_SENDER = """
import os, signal, sys
import numpy as np
import shmpool

handle = shmpool.attach(sys.argv[1], timeout=10)
sender = handle.events
def die(record):
    print("dying", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
ids = np.array([0, 3])  # one env of each worker
with sender._lock.hold(None, lambda: None):
    parts = [(0, sender._filler(0, 0, ids[:1], np.array([9.0, 9.0, 9.0]), None)), (1, die)]
    sender._rings.publish(parts)
"""


def test_an_event_to_several_workers_from_a_killed_sender_reaches_none(pool_name: str, tmp_path: Path) -> None:
    with shmpool.launch(
        "CartPole-v1", 4, num_workers=2, name=pool_name, hooks=[helpers.EventLog(str(tmp_path))], event_payload=3
    ) as pool:
        pool.reset(seed=0)
        result = run_script(HALF_SENDER, pool_name)
        assert result.returncode == -signal.SIGKILL and "dying" in result.stdout, result.stderr[-2000:]
        pool.step(np.zeros(4, dtype=np.int64))
        pool.events.send("Log", [1, 2], [1, 1, 1])  # the next sender recovers the rings, then sends
        for _ in range(2):
            pool.step(np.zeros(4, dtype=np.int64))
    delivered = sorted(line.split()[0] for file in tmp_path.glob("events-*") for line in file.read_text().splitlines())
    assert delivered == ["1", "1"]  # the new event in both workers; the dead sender's in neither


# -- 6. forks -------------------------------------------------------------------------------------

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
    result = run_script(FORKER, pool_name)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "child ['ForeignProcessError', 'ForeignProcessError', 'ForeignProcessError']"
    assert lines[1] == "parent 0 [0.5, 0.5, 0.5, 0.5]"


# -- 10. stopped writers --------------------------------------------------------------------------

LOCK_HOLDER = """
import sys, time, shmpool
handle = shmpool.attach(sys.argv[1], timeout=10)
handle.params._lock.hold(None, lambda: None).__enter__()
print("holding", flush=True)
time.sleep(120)
"""


def test_a_stopped_writer_holding_the_lock_makes_writes_time_out_not_hang(pool_name: str, tmp_path: Path) -> None:
    with shmpool.launch(
        "CartPole-v1",
        4,
        num_workers=2,
        name=pool_name,
        params={"length": Param()},
        hooks=[helpers.EventLog(str(tmp_path))],
        event_payload=3,
    ) as pool:
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, pool_name], stdout=subprocess.PIPE, text=True, env=ENV
        )
        outcomes: list[tuple[str, float]] = []
        try:
            assert holder.stdout.readline().strip() == "holding"
            holder.send_signal(signal.SIGSTOP)  # Ctrl-Z

            def try_both() -> None:
                for call in (
                    lambda: pool.events.send("Log", [0], [1, 2, 3], timeout=0.0),
                    lambda: pool.params.write(0, length=0.7),
                ):
                    started = time.monotonic()
                    try:
                        call()
                        outcomes.append(("worked", time.monotonic() - started))
                    except shmpool.WriterLockTimeout as exc:
                        assert exc.holder_pid == holder.pid and "stopped" in str(exc)
                        outcomes.append(("timeout", time.monotonic() - started))

            thread = threading.Thread(target=try_both, daemon=True)
            thread.start()
            thread.join(30)
            assert not thread.is_alive(), "a write hung behind a stopped writer"
        finally:
            holder.kill()
            holder.wait(5)
        assert [what for what, _ in outcomes] == ["timeout", "timeout"], outcomes
        send_wait, write_wait = (seconds for _, seconds in outcomes)
        assert 0.25 <= send_wait < 4.0, outcomes  # a send gives up after at least 0.25 s, long before 5 s
        assert 5.0 <= write_wait < 15.0, outcomes  # a write after 5 s, never a hang
        pool.params.write(0, length=0.7)  # the kernel dropped the dead holder's lock
        assert pool.params["length"][0] == 0.7


# -- 13. memory ordering --------------------------------------------------------------------------


def test_cpus_without_total_store_order_are_refused_with_a_clear_error() -> None:
    from shmpool.protocol import check_memory_model

    with pytest.raises(shmpool.ShmpoolError, match="aarch64.*unsafe"):
        check_memory_model("aarch64")
    check_memory_model("x86_64")


# -- found by attacking the fixes above -------------------------------------------------------------

CLOSE_DURING_STEP = """
import sys, threading, time
import numpy as np
import shmpool
sys.path.insert(0, "tests")
import helpers

pool = shmpool.launch(lambda: helpers.CountingEnv(length=10**9, sleep=float(sys.argv[2])), 2, num_workers=1,
                      name=sys.argv[1])
pool.reset(seed=0)
outcome = []

def stepper():
    try:
        while True:
            pool.step(np.zeros(2, dtype=np.int64))
    except Exception as exc:
        outcome.append(type(exc).__name__)

thread = threading.Thread(target=stepper)
thread.start()
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
        result = run_script(CLOSE_DURING_STEP, pool_name, str(step_seconds))
        assert result.returncode == 0, result.stderr[-2000:]  # before the fix: SIGSEGV in the semaphore wait
        assert result.stdout.strip() == "['PoolClosedError'] False"


INTERRUPTED_WRITER = """
import os, signal, subprocess, sys, time
import numpy as np
import shmpool
sys.path.insert(0, "tests")
import helpers

pool = shmpool.launch("CartPole-v1", 4, num_workers=1, name=sys.argv[1], params={"a": shmpool.Param(0.0, bind=False)},
                      hooks=[helpers.EventLog(sys.argv[2])], event_payload=3, event_capacity=1 << 16)
pool.reset(seed=0)
storm = helpers.start_sigint_storm(os.getpid(), 2.0, 0.0005)
interrupts = rounds = 0
done_at = time.monotonic() + 3.0  # by then the storm is over (time, not storm.poll(): Ctrl-C can wedge that)

def work():
    global interrupts, rounds
    while True:
        try:
            if time.monotonic() > done_at:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # one still in flight must not end the script
                return
            rounds += 1
            if rounds % 1000 == 0:  # drains the ring (a step can be interrupted too: it completes later)
                pool.step(np.zeros(4, dtype=np.int64))
            pool.params.write(None, a=1.0)
            pool.events.send("Log", [0], [1, 2, 3], timeout=0.0)
        except KeyboardInterrupt:
            interrupts += 1

while True:  # an interrupt can also land on the loop's back edge, outside the inner try
    try:
        work()
        break
    except KeyboardInterrupt:
        interrupts += 1
os.waitpid(storm.pid, 0)
storm.returncode = 0
started = time.monotonic()
pool.params.write(None, a=2.0)  # within the lock's 5 s only if no interrupt left the lock held
pool.events.send("Log", [0], [4, 5, 6], timeout=0.0)
other = subprocess.run([sys.executable, "-c",
    "import shmpool, sys\\n"
    "with shmpool.attach(sys.argv[1]) as handle:\\n"
    "    handle.params.write(None, a=3.0)\\n", sys.argv[1]], timeout=30)
print(interrupts, other.returncode, round(time.monotonic() - started) < 3, pool.params["a"].tolist())
pool.close()
"""


def test_ctrl_c_inside_the_writer_lock_never_leaves_it_held(pool_name: str, tmp_path: Path) -> None:
    result = run_script(INTERRUPTED_WRITER, pool_name, str(tmp_path), timeout=120)
    # What is tested is printed before the script closes the pool and exits. Once, on a loaded CI
    # machine, the script was ended by a SIGINT during interpreter shutdown, after that line (the
    # storm's last signals late, as the shutdown restores the default handler): not this test's
    # subject, so that exit is tolerated, and only with the whole line printed.
    printed = result.stdout.strip().split(" ", 3)
    late_sigint = result.returncode == -signal.SIGINT and len(printed) == 4 and printed[3].startswith("[")
    assert result.returncode == 0 or late_sigint, result.stderr[-2000:]
    interrupts, other, quick, values = printed
    assert int(interrupts) > 100
    assert (other, quick, values) == ("0", "True", "[3.0, 3.0, 3.0, 3.0]")


def test_write_refuses_values_the_parameters_dtype_cannot_hold(pool_name: str) -> None:
    params = {
        "i64": Param(0, dtype="int64", bind=False),
        "u8": Param(0, dtype="uint8", bind=False),
        "flag": Param(False, dtype="bool", bind=False),
        "f32": Param(0.0, dtype="float32", bind=False),
        "f32_bounded": Param(0.1, dtype="float32", low=0.0, high=0.1, bind=False),  # a float32 0.1 fits
    }
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        pool.reset(seed=0)
        for name, value in [("u8", 300), ("u8", -1), ("flag", 2), ("f32", 1e300), ("i64", 2.5), ("i64", float("nan"))]:
            with pytest.raises(ValueError, match=name):
                pool.params.write(0, **{name: value})
        pool.params.write(0, i64=2**63 - 1, u8=255, flag=1, f32=3.5, f32_bounded=0.1)
        pool.params.write(1, i64=2**53 + 1)  # beyond float64's whole numbers: stored exactly
        pool.step(np.zeros(2, dtype=np.int64))
        assert pool.params["i64"].tolist() == [2**63 - 1, 2**53 + 1]
        assert pool.applied["i64"].tolist() == [2**63 - 1, 2**53 + 1]
        assert (pool.applied["u8"][0], bool(pool.applied["flag"][0]), pool.applied["f32"][0]) == (255, True, 3.5)
        assert pool.params.refusals == dict.fromkeys(params, 0)


def test_the_trainers_doorbell_count_stays_bounded(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 8, num_workers=4, name=pool_name, seed=0) as pool:
        pool.reset(seed=0)
        for _ in range(2000):
            pool.step(np.zeros(8, dtype=np.int64))
        doorbell = posix_ipc.Semaphore(f"/shmpool-{pool_name}.t")
        try:
            assert doorbell.value <= pool.num_workers  # it grew by 3 a step when only one ring was taken
        finally:
            doorbell.close()


# -- found by reviewing the fixes ----------------------------------------------------------------------

INTERRUPT_WHILE_WAITING = """
import os, signal, subprocess, sys, threading, time
import shmpool

pool = shmpool.launch("CartPole-v1", 2, num_workers=1, name=sys.argv[1], params={"a": shmpool.Param(0.0, bind=False)})
holder = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]], stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "holding"
holder.send_signal(signal.SIGSTOP)
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
try:
    pool.params.write(None, a=1.0)
    outcome = "written"
except KeyboardInterrupt:
    outcome = "KeyboardInterrupt"
waited = time.monotonic() - started
holder.kill()
holder.wait()
pool.params.write(None, a=2.0)  # the lock was left free
print(outcome, waited < 2.0, pool.params["a"].tolist())
pool.close()
"""


def test_ctrl_c_while_waiting_for_the_writer_lock_interrupts_the_wait(pool_name: str) -> None:
    result = run_script(INTERRUPT_WHILE_WAITING, pool_name, LOCK_HOLDER)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "KeyboardInterrupt True [2.0, 2.0]"


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
    result = run_script(FORK_DURING_STEP, pool_name)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "0"


def test_the_owner_rolls_back_a_dead_writers_half_write_without_another_writer(pool_name: str) -> None:
    params = {"a": Param(1.0), "b": Param(-1.0)}
    with shmpool.launch(helpers.PairEnv, 4, num_workers=2, name=pool_name, params=params) as pool:
        pool.reset(seed=0)
        result = run_script(HALF_WRITER, pool_name)
        assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
        for _ in range(70):  # the trainer looks for a dead writer's journal every 64 steps
            pool.step(np.zeros(4, dtype=np.int64))
        pool.params["a"][0] = 7.0  # a raw write, read only once the rows are whole again
        observations, *_ = pool.step(np.zeros(4, dtype=np.int64))
        assert observations[:, 0].tolist() == [7.0, 1.0, 1.0, 1.0]
        assert observations[:, 1].tolist() == [-1.0] * 4


def test_a_handle_of_a_closed_pool_never_locks_a_new_pool_of_the_same_name(pool_name: str) -> None:
    params = {"a": Param(0.0, bind=False)}
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        handle = shmpool.attach(pool.name)
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as new_pool:
        # The handle's lock was never used: its first use opens the file by name, now the new pool's.
        with pytest.raises(shmpool.PoolClosedError, match="replaced"):
            handle._view.lock.hold(1.0, lambda: None).__enter__()
        new_pool.params.write(None, a=1.0)  # and the new pool's writers are not blocked
        handle.close()


def test_env_family_modules_are_attributes_of_shmpool() -> None:
    assert shmpool.classic_control.__name__ == "shmpool.classic_control"
    assert shmpool.adapters.__name__ == "shmpool.adapters"


def _slow_to_build_in_workers(trainer: int) -> helpers.CountingEnv:
    if os.getpid() != trainer:  # the trainer's probe env is quick
        time.sleep(8.0)
    return helpers.CountingEnv()


def test_a_second_ctrl_c_while_a_failed_launch_cleans_up_leaves_no_worker_behind(pool_name: str) -> None:
    """The first Ctrl-C stops the launch while the workers build their envs; the second comes while
    the launch stops them again. That cleanup runs to its end, as close() does, and then the
    Ctrl-C is raised: no worker outlives the segment it was started for."""
    main = threading.main_thread().ident
    timers = [threading.Timer(delay, signal.pthread_kill, (main, signal.SIGINT)) for delay in (0.5, 0.7)]
    for timer in timers:
        timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        shmpool.launch([functools.partial(_slow_to_build_in_workers, os.getpid())] * 2, num_workers=2, name=pool_name)
    for timer in timers:
        timer.join()
    assert time.monotonic() - started < 6.0  # close's grace, then SIGTERM: not the constructors' 8 s


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
    late_sigint = result.returncode == -signal.SIGINT and len(printed) == 4 and printed[3].startswith("[")
    assert result.returncode == 0 or late_sigint, result.stderr[-2000:]
    interrupts, sent_interrupted, rounds, seen = printed
    assert int(interrupts) + int(sent_interrupted) > 100  # the storm really hit the trainer
    assert int(rounds) > 100
    assert seen == "[0, 1, 2, 3, 4, 5]"
