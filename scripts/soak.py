"""Soak test: one pool steps for millions of env steps while hostile processes hammer it.

The trainer steps a pool of CartPole-v1 envs (each wrapped to count its own calls) with two hooks,
while at the same time:

- two attached **writer** processes write ``params.write(env_ids, a=x, b=-x)`` (a pair that must
  land atomically) and move the arguments of two ``dist="uniform"`` parameters one argument at a
  time (``u={"low": ...}``), which is valid only if ``write()`` merges with what the block holds
  under the writers' lock; writer 0 is SIGKILLed and restarted every ``--kill-every`` seconds;
- two attached **sender** processes, each with several threads, send events to random envs of both
  workers and record each one once ``send()`` has returned;
- the trainer itself takes a SIGINT every 20-200 ms (KeyboardInterrupt anywhere in its loop,
  ``pool.step`` and its own ``params.write`` included), catches it and keeps stepping.

What it checks, each as a counter that must stay 0:

- **torn reads**: a hook checks in every ``before_step`` that each env's ``ctx.params`` and
  ``ctx.applied`` hold ``a == -b`` and ``low <= high``; the trainer checks ``pool.applied`` after
  every step;
- **merges**: no ``write()`` of writer-owned ``u`` ranges is refused (each is valid after the
  previous one) and no worker ever refuses a value (``pool.params.refusals``), so no stale merge of
  the contested ``v`` range (writer 0 writes only ``low``, writer 1 only ``high``) stored low > high;
- **lockstep**: after every step all envs report the same count of calls, the pool's global step;
- **events**: every sent event reaches each worker owning one of its envs exactly once, with those
  envs, in each sending thread's order; none is delivered that was not sent;
- **the pool survives**: no pool error, no hang, no writer or sender error; after ``close()`` no
  ``/dev/shm`` entry of the pool and no child process is left.

It prints a progress line every few seconds, then a table, and exits 1 if any check failed.

    python scripts/soak.py                      # 10 million env steps
    python scripts/soak.py --quick              # about 30 s, for CI
    python scripts/soak.py --seconds 600        # ten minutes, whatever the step count

A Ctrl-C from the terminal (beyond the script's own) stops the run early and still prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _settings
import gymnasium as gym
import numpy as np

import shmpool
from shmpool.protocol import W_HOLDER
from shmpool.system import descendants

HOOK_LOG = "Log"
#: The bounds of every parameter; the writer-owned ``u`` ranges turn back before reaching them.
BOUND = 1e9
U_TURN = 1e7


@dataclass
class Settings:
    """What the soak runs."""

    env_steps: int = 10_000_000
    """env steps to run (pool steps x num_envs)."""
    seconds: float = 0.0
    """stop after this many seconds even if env_steps is not reached (0: no limit)."""
    num_envs: int = 16
    """envs in the pool."""
    num_workers: int = 2
    """worker processes of the pool."""
    sender_threads: int = 3
    """threads sending events in each of the two sender processes."""
    kill_every: float = 3.0
    """mean seconds between SIGKILLs of writer 0 (restarted at once; 0: never)."""
    interrupt_min: float = 0.02
    """shortest pause between two SIGINTs to the trainer (seconds)."""
    interrupt_max: float = 0.2
    """longest pause between two SIGINTs to the trainer (seconds; 0: no SIGINTs)."""
    write_pause: float = 0.001
    """seconds each writer sleeps between two writes."""
    send_pause: float = 0.002
    """mean seconds each sender thread sleeps between two sends."""
    trainer_write_every: int = 50
    """the trainer also writes an a/b pair every this many steps (0: never)."""
    progress_every: float = 5.0
    """seconds between progress lines."""
    hang_seconds: float = 60.0
    """a step loop that makes no progress this long counts as a hang (the workers are then killed)."""
    seed: int = 0
    """seed of the pool, the actions and the hostile processes' choices."""
    logs: str = ""
    """folder for the event and check logs (default: a temporary one, removed at the end)."""
    quick: bool = False
    """a CI-sized run: at most 25 s, writer 0 killed every 1.5 s."""


@dataclass
class Role:
    """What a child process of the soak is (internal flags, not in --help)."""

    role: str = "trainer"
    index: int = 0
    pool: str = ""
    folder: str = ""


def parse_settings(argv: list[str] | None = None) -> tuple[Settings, Role]:
    """Builds Settings (each field a flag, documented by --help) and the process's Role."""
    parser = _settings.build_parser(Settings, description=__doc__)  # options left out parse as None
    for role_field in dataclasses.fields(Role):
        parser.add_argument("--" + role_field.name, type=type(role_field.default), help=argparse.SUPPRESS)
    given = vars(parser.parse_args(argv))
    role = Role(**{f.name: given.pop(f.name) for f in dataclasses.fields(Role) if given[f.name] is not None})
    for f in dataclasses.fields(Role):
        given.pop(f.name, None)
    if given["quick"]:
        quick = {"seconds": 25.0, "kill_every": 1.5, "progress_every": 5.0, "hang_seconds": 30.0}
        given.update({key: value for key, value in quick.items() if given[key] is None})
    settings = Settings(**{key: value for key, value in given.items() if value is not None})
    if settings.num_workers < 2 or settings.num_envs < 2 * settings.num_workers:
        parser.error("--num-workers must be >= 2 and --num-envs at least twice that (events must span workers)")
    return settings, role


# -- what runs in the workers -------------------------------------------------------------------


class StepCounterEnv(gym.Wrapper):
    """CartPole-v1 that reports in its info ``t``: how many times it was stepped or reset. Every env
    of a pool that steps in lockstep reports the same ``t`` (the pool's steps, plus its resets),
    whether a step was an env step or a next-step autoreset."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.calls = 0

    def reset(self, **kwargs: Any) -> Any:
        self.calls += 1
        observation, info = self.env.reset(**kwargs)
        return observation, {**info, "t": self.calls}

    def step(self, action: Any) -> Any:
        self.calls += 1
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, reward, terminated, truncated, {**info, "t": self.calls}


def make_env() -> gym.Env:
    return StepCounterEnv()


class ParamCheck:
    """Checks, in every ``before_step``, each env's ``ctx.params`` and ``ctx.applied``: ``a == -b``
    and ``low <= high`` for the uniform ranges. Counts violations in a file per worker
    (``checks-PID.txt``: four numbers, rewritten in place) and logs the first few examples."""

    EXAMPLES = 5

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.counts = [0, 0, 0, 0]  # checks, torn ctx.params pairs, torn ctx.applied pairs, low > high
        self._fd = -1
        self._examples: Counter[str] = Counter()

    def before_step(self, ctx: Any) -> None:
        params, applied = ctx.params, ctx.applied
        # Each column is read once: the examples then show the values that were compared.
        a, b, applied_a, applied_b = (np.array(x) for x in (params["a"], params["b"], applied["a"], applied["b"]))
        ranges = {name: (np.array(params[name]["low"]), np.array(params[name]["high"])) for name in ("u", "v")}
        torn_params = np.flatnonzero(a != -b)
        torn_applied = np.flatnonzero(applied_a != -applied_b)
        inverted = np.flatnonzero((ranges["u"][0] > ranges["u"][1]) | (ranges["v"][0] > ranges["v"][1]))
        self.counts[0] += 1
        bad = (len(torn_params), len(torn_applied), len(inverted))
        if any(bad):
            for k, count in enumerate(bad):
                self.counts[k + 1] += count
            kinds = ("torn ctx.params", "torn ctx.applied", "low > high")
            for kind, rows in zip(kinds, (torn_params, torn_applied, inverted)):
                if not len(rows) or self._examples[kind] >= self.EXAMPLES:
                    continue
                self._examples[kind] += 1
                row = int(rows[0])
                seen = (
                    f"ctx.params a={float(a[row])} b={float(b[row])} "
                    f"u=({float(ranges['u'][0][row])}, {float(ranges['u'][1][row])}) "
                    f"v=({float(ranges['v'][0][row])}, {float(ranges['v'][1][row])}); "
                    f"ctx.applied a={float(applied_a[row])} b={float(applied_b[row])}"
                )
                now = (
                    f"a={float(params['a'][row])} b={float(params['b'][row])} u={params['u'][row]} v={params['v'][row]}"
                )
                with open(f"{self.folder}/check-examples-{os.getpid()}.txt", "a") as file:
                    file.write(
                        f"{kind} at global step {ctx.global_step}, env {ctx.env_ids[row]}: {seen}; re-read: {now}\n"
                    )
        if any(bad) or self.counts[0] % 64 == 1:
            self._publish()

    def _publish(self) -> None:
        if self._fd < 0:
            self._fd = os.open(f"{self.folder}/checks-{os.getpid()}.txt", os.O_WRONLY | os.O_CREAT, 0o600)
        os.pwrite(self._fd, " ".join(str(n) for n in self.counts).ljust(80).encode() + b"\n", 0)


class EventLog:
    """Appends every event it receives to a file per worker (``events-START-STOP-PID.txt``, the
    worker's slot in the name): ``sender thread seq step env,env,...``."""

    name = HOOK_LOG

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._file: Any = None

    def before_step(self, ctx: Any) -> None:
        if not ctx.events:
            return
        if self._file is None:
            start, stop = int(ctx.env_ids[0]), int(ctx.env_ids[-1]) + 1
            self._file = open(f"{self.folder}/events-{start}-{stop}-{os.getpid()}.txt", "a")
        for event in ctx.events:
            sender, thread, seq = (int(v) for v in event.payload)
            envs = ",".join(str(int(e)) for e in event.env_ids)
            self._file.write(f"{sender} {thread} {seq} {event.step} {envs}\n")
        self._file.flush()


def parameters() -> dict[str, shmpool.Param]:
    """``a``/``b``: a pair written together; ``u``: ranges each writer moves on its own envs;
    ``v``: a range whose low writer 0 writes and whose high writer 1 writes."""
    scalar = shmpool.Param(0.0, low=-BOUND, high=BOUND, bind=False)
    return {
        "a": scalar,
        "b": scalar,
        "u": shmpool.Param({"low": 0.0, "high": 1.0}, dist="uniform", low=-BOUND, high=BOUND, bind=False, when="reset"),
        "v": shmpool.Param(
            {"low": -0.5, "high": 0.5}, dist="uniform", low=-BOUND, high=BOUND, bind=False, when="reset"
        ),
    }


# -- hostile processes --------------------------------------------------------------------------


def _stop_on_eof(stop: threading.Event) -> None:
    """Sets ``stop`` when stdin closes: the trainer closed it, or died."""

    def watch() -> None:
        try:
            sys.stdin.buffer.read()
        finally:
            stop.set()

    threading.Thread(target=watch, daemon=True).start()


def _report_error(folder: str, who: str) -> None:
    with open(f"{folder}/errors-{who}-{os.getpid()}.txt", "a") as file:
        file.write(traceback.format_exc())


def run_writer(settings: Settings, role: Role) -> int:
    """Writes a/b pairs to random envs; moves the ``u`` ranges of its own envs (every second env);
    writes one argument of the contested ``v`` range (writer 0 ``low``, writer 1 ``high``).
    Keeps ``writes`` counters in ``writer-INDEX-PID.txt``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = threading.Event()
    _stop_on_eof(stop)
    rng = np.random.default_rng([settings.seed, role.index, os.getpid()])
    counts = Counter[str]()
    fd = os.open(f"{role.folder}/writer-{role.index}-{os.getpid()}.txt", os.O_WRONLY | os.O_CREAT, 0o600)

    def publish() -> None:
        text = " ".join(f"{key}={counts[key]}" for key in ("pairs", "u", "v", "v_refused", "u_refused"))
        os.pwrite(fd, text.ljust(120).encode() + b"\n", 0)

    try:
        with shmpool.attach(role.pool, timeout=30) as handle:
            params = handle.params
            n = handle.num_envs
            own = np.arange(role.index % 2, n, 2)
            # A locked write first: it rolls back whatever a killed predecessor left half written,
            # before this writer reads the state of its own u ranges.
            params.write([int(own[0])], a=0.0, b=-0.0)
            publish()  # tells the trainer that this writer is up (it kills only running writers)
            while not stop.is_set():
                ids = np.sort(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False))
                x = rng.uniform(-1e6, 1e6, size=len(ids))
                params.write(ids, a=x, b=-x)
                counts["pairs"] += 1
                if rng.random() < 0.3:
                    _move_u(params, rng, own, counts, role.folder)
                if rng.random() < 0.3:
                    ids = np.sort(rng.choice(n, size=int(rng.integers(1, 4)), replace=False))
                    if role.index == 0:
                        value = {"low": rng.uniform(-1.0, 0.3, len(ids))}
                    else:
                        value = {"high": rng.uniform(-0.3, 1.0, len(ids))}
                    try:
                        params.write(ids, v=value)
                        counts["v"] += 1
                    except ValueError:  # low > high after the merge: write() must refuse it
                        counts["v_refused"] += 1
                if counts["pairs"] % 32 == 0:
                    publish()
                if settings.write_pause:
                    time.sleep(settings.write_pause)
    except shmpool.PoolClosedError:
        if not stop.is_set():
            _report_error(role.folder, f"writer{role.index}")
            return 1
    except Exception:
        _report_error(role.folder, f"writer{role.index}")
        return 1
    finally:
        publish()
        os.close(fd)
    return 0


def _move_u(params: Any, rng: np.random.Generator, own: np.ndarray, counts: Counter[str], folder: str) -> None:
    """Moves the ``u`` range of some of this writer's envs past itself, one argument per write: up
    (high first, then low above the old high) or down (low first, then high below the old low).
    Each write is valid only if merged with the previous one, which must therefore have landed."""
    ids = np.sort(rng.choice(own, size=int(rng.integers(1, len(own) + 1)), replace=False))
    low, high = params["u"]["low"][ids].copy(), params["u"]["high"][ids].copy()
    span = rng.uniform(1.0, 100.0, len(ids))
    up = high.max() < U_TURN and (low.min() < -U_TURN or rng.random() < 0.5)
    steps = [{"high": high + 2 * span}, {"low": high + span}] if up else [{"low": low - 2 * span}, {"high": low - span}]
    for value in steps:
        try:
            params.write(ids, u=value)
            counts["u"] += 1
        except ValueError:
            counts["u_refused"] += 1  # a failure: the previous write did not land or was not merged
            with open(f"{folder}/u-refused-{os.getpid()}.txt", "a") as file:
                file.write(traceback.format_exc())
            return


def run_sender(settings: Settings, role: Role) -> int:
    """Sends events from ``sender_threads`` threads, each recording ``seq env,env,...`` in
    ``sent-INDEX-THREAD.txt`` once ``send()`` has returned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = threading.Event()
    _stop_on_eof(stop)
    failed = threading.Event()
    try:
        handle = shmpool.attach(role.pool, timeout=30)
    except Exception:
        _report_error(role.folder, f"sender{role.index}")
        return 1
    events, n = handle.events, handle.num_envs

    def send_loop(thread: int) -> None:
        rng = np.random.default_rng([settings.seed, 100 + role.index, thread])
        seq = 0
        with open(f"{role.folder}/sent-{role.index}-{thread}.txt", "w") as out:
            try:
                while not stop.is_set():
                    ids = np.sort(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False))
                    events.send(HOOK_LOG, ids, [role.index, thread, seq], timeout=None)
                    out.write(f"{seq} {','.join(str(e) for e in ids.tolist())}\n")
                    seq += 1
                    if settings.send_pause:
                        time.sleep(rng.uniform(0, 2 * settings.send_pause))
            except shmpool.PoolClosedError:
                if not stop.is_set():
                    _report_error(role.folder, f"sender{role.index}")
                    failed.set()
            except Exception:
                _report_error(role.folder, f"sender{role.index}")
                failed.set()

    threads = [threading.Thread(target=send_loop, args=(k,)) for k in range(settings.sender_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    handle.close()
    return 1 if failed.is_set() else 0


# -- the trainer --------------------------------------------------------------------------------


class Trainer:
    """Steps the pool, takes the SIGINTs, keeps the hostile processes running, checks and reports."""

    def __init__(self, settings: Settings, folder: str) -> None:
        self.settings = settings
        self.folder = folder
        self.counts: Counter[str] = Counter()
        self.notes: list[str] = []
        self.armed = False  # SIGINTs raise KeyboardInterrupt only while stepping
        self.stop_requested = False
        self.interrupts_sent = 0
        self.interrupts_received = 0
        self.beat = time.monotonic()
        self.pool: shmpool.Pool | None = None
        self.writers: list[subprocess.Popen[bytes]] = []
        self.senders: list[subprocess.Popen[bytes]] = []
        self.children_lock = threading.Lock()
        self.quiet = threading.Event()  # stops the SIGINT and kill threads
        self.failed_phase = ""

    # -- children

    def _spawn(self, role: str, index: int) -> subprocess.Popen[bytes]:
        s = self.settings
        command = [sys.executable, os.path.abspath(__file__), "--role", role, "--index", str(index)]
        command += ["--pool", self.pool.name, "--folder", self.folder, "--seed", str(s.seed)]  # type: ignore[union-attr]
        command += ["--write-pause", str(s.write_pause), "--send-pause", str(s.send_pause)]
        command += ["--sender-threads", str(s.sender_threads)]
        return subprocess.Popen(command, stdin=subprocess.PIPE)

    def _kill_loop(self) -> None:
        """SIGKILLs writer 0 once it runs, ``kill_every`` seconds after it started writing on average,
        and starts a new one. Every second kill waits (up to 1 s) until the victim is inside the
        writers' critical section, so that kills mid-write are certain to happen."""
        rng = random.Random(self.settings.seed)
        views = getattr(self.pool, "_views", {})  # private: only to aim kills, never to check anything
        holder = views["writers"][W_HOLDER:] if "writers" in views else None
        while not self.quiet.is_set():
            victim = self.writers[0]
            ready = Path(self.folder) / f"writer-0-{victim.pid}.txt"
            while not self.quiet.wait(0.02) and victim.poll() is None:
                if ready.exists() and ready.stat().st_size:
                    break
            if self.quiet.wait(self.settings.kill_every * rng.uniform(0.5, 1.5)):
                return
            in_lock = False
            if holder is not None and rng.random() < 0.5:
                deadline = time.monotonic() + 1.0
                while not in_lock and time.monotonic() < deadline:
                    in_lock = int(holder[0]) == victim.pid
                    if not in_lock:
                        time.sleep(0.00005)
            with self.children_lock:
                victim.kill()
                in_lock = in_lock or (holder is not None and int(holder[0]) == victim.pid)
                victim.wait()
                victim.stdin.close()  # type: ignore[union-attr]
                self.counts["writer kills"] += 1
                self.counts["writer kills inside the writers' lock"] += in_lock
                if victim.returncode != -signal.SIGKILL:  # it had exited already: an error
                    self.counts["writer exits before the kill"] += 1
                self.writers[0] = self._spawn("writer", 0)

    # -- SIGINTs

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupts_received += 1
        if self.interrupts_received > self.interrupts_sent:  # not ours: someone wants the run to stop
            self.stop_requested = True
        if self.armed:
            raise KeyboardInterrupt

    def _interrupt_loop(self) -> None:
        rng = random.Random(self.settings.seed + 1)
        s = self.settings
        while not self.quiet.wait(rng.uniform(s.interrupt_min, s.interrupt_max)):
            if self.armed:
                self.interrupts_sent += 1
                os.kill(os.getpid(), signal.SIGINT)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stop_requested = True

    # -- hangs

    def _watchdog(self) -> None:
        """Counts a hang when the loop makes no progress for ``hang_seconds``: dumps every thread's
        stack and kills the workers (the stuck call then raises WorkerDiedError); exits the process
        if even that does not free it."""
        limit = self.settings.hang_seconds
        while not self.finished.wait(1.0):
            if time.monotonic() - self.beat < limit:
                continue
            self.counts["hangs"] += 1
            print(f"\nHANG: no progress for {limit:.0f} s; stacks of the trainer:", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            pool = self.pool
            for pid in pool.worker_pids if pool is not None else []:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.beat = time.monotonic()
            if self.finished.wait(min(limit, 20.0)):
                return
            if time.monotonic() - self.beat >= min(limit, 20.0):
                print("HANG: still stuck after killing the workers; giving up", file=sys.stderr, flush=True)
                self._kill_children()
                os._exit(3)

    def _kill_children(self) -> None:
        for process in [*self.writers, *self.senders]:
            if process.poll() is None:
                process.kill()

    # -- the run

    def run(self) -> int:
        s = self.settings
        self.finished = threading.Event()
        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        name = f"soak-{os.getpid()}"
        self.pool = pool = shmpool.launch(
            make_env,
            s.num_envs,
            num_workers=s.num_workers,
            seed=s.seed,
            name=name,
            params=parameters(),
            hooks=[ParamCheck(self.folder), EventLog(self.folder)],
            timeout=max(10.0, s.hang_seconds / 2),
            info_keys=4,
        )
        started = time.monotonic()
        try:
            _, infos = pool.reset()
            base = int(infos["t"][0])
            if not (infos["t"] == base).all():
                self.counts["lockstep violations"] += 1
            self.writers = [self._spawn("writer", k) for k in range(2)]
            self.senders = [self._spawn("sender", k) for k in range(2)]
            threading.Thread(target=self._watchdog, daemon=True).start()
            chaos = []
            if s.interrupt_max > 0:
                chaos.append(threading.Thread(target=self._interrupt_loop, daemon=True))
            if s.kill_every > 0:
                chaos.append(threading.Thread(target=self._kill_loop, daemon=True))
            for thread in chaos:
                thread.start()
            self._main_loop(pool, base, started)
            self.quiet.set()
            for thread in chaos:
                thread.join()
            self._wind_down(pool, base)
        except _Stop:
            pass
        except BaseException as exc:  # noqa: BLE001 - a failed run still cleans up and reports
            label = "KeyboardInterrupts escaping the loop" if isinstance(exc, KeyboardInterrupt) else "pool errors"
            self.counts[label] += 1
            self.notes.append(f"run aborted: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        finally:
            self.armed = False
            self.quiet.set()
            elapsed = time.monotonic() - started
            self.counts["env steps"] = pool.global_step * s.num_envs
            refusals = self._close(pool)
            self.finished.set()
        self.counts["refused param values (pool.params.refusals)"] = refusals
        return self._report(name, elapsed)

    def _main_loop(self, pool: shmpool.Pool, base: int, started: float) -> None:
        """Steps until ``env_steps``, the time limit, a stop request or a pool error. Any statement
        may be cut by a KeyboardInterrupt: the nested handlers count it and go on stepping."""
        s = self.settings
        self._rng = np.random.default_rng(s.seed)
        self._actions = [self._rng.integers(0, 2, s.num_envs) for _ in range(64)]
        self._k = 0
        self._next_progress = started + s.progress_every
        deadline = started + s.seconds if s.seconds > 0 else float("inf")
        target = -(-s.env_steps // s.num_envs)
        while True:
            try:
                self.armed = True
                while True:
                    try:
                        self._steps(pool, base, target, deadline, started)
                        return
                    except KeyboardInterrupt:
                        self.counts["Ctrl-Cs taken"] += 1
                        self.beat = time.monotonic()
            except KeyboardInterrupt:  # landed in the handler above
                self.counts["Ctrl-Cs taken"] += 1
            finally:
                self.armed = False

    def _steps(self, pool: shmpool.Pool, base: int, target: int, deadline: float, started: float) -> None:
        s = self.settings
        while pool.global_step < target and not self.stop_requested:
            now = time.monotonic()
            if now >= deadline:
                break
            if now >= self._next_progress:
                self._next_progress = now + s.progress_every
                self._progress(pool, now - started)
            self._k += 1
            try:
                if s.trainer_write_every and self._k % s.trainer_write_every == 0:
                    ids = np.sort(self._rng.choice(s.num_envs, int(self._rng.integers(1, s.num_envs + 1)), False))
                    x = self._rng.uniform(-1e6, 1e6, len(ids))
                    pool.params.write(ids, a=x, b=-x)
                    self.counts["trainer pair writes"] += 1
                _, _, _, _, infos = pool.step(self._actions[self._k % 64])
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                self.counts["pool errors"] += 1
                self.notes.append(f"step {pool.global_step}: {type(exc).__name__}: {exc}")
                traceback.print_exc()
                raise _Stop() from exc
            self.beat = time.monotonic()
            self._check_step(pool, infos, base)

    def _check_step(self, pool: shmpool.Pool, infos: dict[str, Any], base: int) -> None:
        expected = base + pool.global_step
        t = infos.get("t")
        if t is None or not infos["_t"].all() or (t != expected).any():
            self.counts["lockstep violations"] += 1
            if self.counts["lockstep violations"] <= 3:
                self.notes.append(f"lockstep: after global step {pool.global_step} envs report t={t} (want {expected})")
        applied = pool.applied
        if (applied["a"] != -applied["b"]).any():
            self.counts["torn a/b in pool.applied (trainer)"] += 1

    def _progress(self, pool: shmpool.Pool, elapsed: float) -> None:
        steps = pool.global_step * self.settings.num_envs
        c = self.counts
        print(
            f"[{elapsed:6.1f} s] {steps:>12,} env steps ({steps / max(elapsed, 1e-9):>8,.0f}/s)  "
            f"Ctrl-Cs {c['Ctrl-Cs taken']:>5}  writer kills {c['writer kills']:>3}  "
            f"lockstep violations {c['lockstep violations']}  pool errors {c['pool errors']}",
            flush=True,
        )

    def _wind_down(self, pool: shmpool.Pool, base: int) -> None:
        """Stops the senders (stepping meanwhile, so that none waits on a full ring forever), then the
        writers, then steps a few more times so that every event sent is delivered."""
        self.beat = time.monotonic()
        for group, label in ((self.senders, "sender"), (self.writers, "writer")):
            with self.children_lock:
                for process in group:
                    process.stdin.close()  # type: ignore[union-attr]
            deadline = time.monotonic() + 30.0
            while any(p.poll() is None for p in group) and time.monotonic() < deadline:
                _, _, _, _, infos = pool.step(pool.action_space.sample())
                self._check_step(pool, infos, base)
                self.beat = time.monotonic()
            for process in group:
                if process.poll() is None:
                    self.counts[f"{label}s that did not stop (killed)"] += 1
                    process.kill()
                    process.wait()
                elif process.returncode != 0:
                    self.counts[f"{label} errors (exit code)"] += 1
        for _ in range(3):
            _, _, _, _, infos = pool.step(pool.action_space.sample())
            self._check_step(pool, infos, base)

    def _close(self, pool: shmpool.Pool) -> int:
        refusals = 0
        try:
            refusals = sum(pool.params.refusals.values())
        except Exception as exc:  # noqa: BLE001
            self.notes.append(f"reading refusals failed: {exc}")
        try:
            pool.close()
        except BaseException as exc:  # noqa: BLE001
            self.counts["close errors"] += 1
            self.notes.append(f"pool.close() raised {type(exc).__name__}: {exc}")
        for process in [*self.senders, *self.writers]:  # after a failed run they may still be there
            if process.poll() is None:
                if process.stdin and not process.stdin.closed:
                    process.stdin.close()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        return refusals

    # -- the report

    def _report(self, name: str, elapsed: float) -> int:
        c = self.counts
        folder = Path(self.folder)
        c["leaked /dev/shm entries"] = len(_leaked_entries(name))
        c["leaked child processes"] = len(_descendants(os.getpid()))
        checks = np.zeros(4, dtype=np.int64)
        for path in folder.glob("checks-*.txt"):
            checks += np.array([int(v) for v in path.read_text().split()], dtype=np.int64)
        c["hook checks (before_step calls)"] = int(checks[0])
        c["torn a/b in ctx.params (hooks)"] = int(checks[1])
        c["torn a/b in ctx.applied (hooks)"] = int(checks[2])
        c["low > high in ctx.params (hooks)"] = int(checks[3])
        writes: Counter[str] = Counter()
        for path in folder.glob("writer-*.txt"):
            for item in path.read_text().split():
                key, _, value = item.partition("=")
                writes[key] += int(value)
        c["writer errors (exception)"] = len(list(folder.glob("errors-writer*.txt")))
        c["sender errors (exception)"] = len(list(folder.glob("errors-sender*.txt")))
        events = _event_counts(folder, pool_failed=bool(c["pool errors"] or c["hangs"]))
        for path in sorted([*folder.glob("errors-*.txt"), *folder.glob("u-refused-*.txt")])[:3]:
            self.notes.append(f"{path.name}: {path.read_text().strip().splitlines()[-1]}")
        examples = [
            line for path in sorted(folder.glob("check-examples-*.txt")) for line in path.read_text().splitlines()
        ]
        for kind in ("torn ctx.params", "torn ctx.applied", "low > high"):
            self.notes += [f"example: {line}" for line in examples if line.startswith(kind)][:1]
        rows: list[tuple[str, int, bool]] = [
            ("env steps", c["env steps"], False),
            ("Ctrl-Cs sent", self.interrupts_sent, False),
            ("Ctrl-Cs taken", c["Ctrl-Cs taken"], False),
            ("writer kills", c["writer kills"], False),
            ("writer kills inside the writers' lock", c["writer kills inside the writers' lock"], False),
            ("a/b pair writes (writers)", writes["pairs"], False),
            ("a/b pair writes (trainer)", c["trainer pair writes"], False),
            ("u range writes", writes["u"], False),
            ("v range writes", writes["v"], False),
            ("v writes refused by write() (must be)", writes["v_refused"], False),
            ("hook checks (before_step calls)", c["hook checks (before_step calls)"], False),
            ("events sent", events["sent"], False),
            ("events delivered", events["delivered"], False),
            ("deliveries (one per worker concerned)", events["deliveries"], False),
            ("events spanning both workers", events["spanning"], False),
        ]
        failures = [
            "pool errors",
            "KeyboardInterrupts escaping the loop",
            "hangs",
            "close errors",
            "lockstep violations",
            "torn a/b in ctx.params (hooks)",
            "torn a/b in ctx.applied (hooks)",
            "torn a/b in pool.applied (trainer)",
            "low > high in ctx.params (hooks)",
            "refused param values (pool.params.refusals)",
        ]
        rows += [(label, c[label], True) for label in failures]
        rows.append(("u writes refused by write()", writes["u_refused"], True))
        rows += [(f"events {kind}", events[kind], True) for kind in ("lost", "duplicated", "never sent")]
        rows += [(f"events {kind}", events[kind], True) for kind in ("with wrong envs", "out of send order")]
        extra = ["writer errors (exception)", "sender errors (exception)", "writer errors (exit code)"]
        extra += ["sender errors (exit code)", "writer exits before the kill", "senders that did not stop (killed)"]
        extra += ["writers that did not stop (killed)", "leaked /dev/shm entries", "leaked child processes"]
        rows += [(label, c[label], True) for label in extra]
        print(
            f"\nsoak of pool {name!r}: {self.settings.num_envs} envs, "
            f"{self.settings.num_workers} workers, {elapsed:.1f} s"
        )
        print(f"{'check':<44} {'count':>12}  status")
        print("-" * 64)
        failed = False
        for label, count, is_failure in rows:
            status = ("FAIL" if count else "ok") if is_failure else "-"
            failed |= is_failure and count > 0
            print(f"{label:<44} {count:>12,}  {status}")
        for note in self.notes:
            print(f"note: {note}")
        print("FAILED" if failed else "all checks passed", flush=True)
        return 1 if failed else 0


class _Stop(Exception):
    """Ends the step loop after a pool error (already counted)."""


def _event_counts(folder: Path, pool_failed: bool) -> Counter[str]:
    """Compares the events the senders recorded with those the workers' hooks logged."""
    counts: Counter[str] = Counter()
    sent: dict[tuple[int, int, int], np.ndarray] = {}
    for path in folder.glob("sent-*.txt"):
        _, sender, thread = path.stem.split("-")
        for line in path.read_text().splitlines():
            seq, envs = line.split()
            sent[(int(sender), int(thread), int(seq))] = np.array([int(e) for e in envs.split(",")])
    counts["sent"] = len(sent)
    slots: list[tuple[int, int]] = []
    seen: Counter[tuple[tuple[int, int, int], int]] = Counter()
    delivered: set[tuple[int, int, int]] = set()
    for path in folder.glob("events-*.txt"):
        _, start_text, stop_text, _ = path.stem.split("-")
        start, stop = int(start_text), int(stop_text)
        slots.append((start, stop))
        last_seq: dict[tuple[int, int], int] = defaultdict(lambda: -1)
        for line in path.read_text().splitlines():
            sender, thread, seq, _step, envs = line.split()
            key = (int(sender), int(thread), int(seq))
            counts["deliveries"] += 1
            seen[(key, start)] += 1
            delivered.add(key)
            if key[2] <= last_seq[key[:2]]:
                counts["out of send order"] += 1
            last_seq[key[:2]] = key[2]
            ids = sent.get(key)
            if ids is None:
                counts["never sent"] += 1
                continue
            want = ids[(ids >= start) & (ids < stop)]
            if not np.array_equal(want, np.array([int(e) for e in envs.split(",")])):
                counts["with wrong envs"] += 1
    counts["delivered"] = len(delivered)
    counts["duplicated"] = sum(n - 1 for n in seen.values() if n > 1)
    for key, ids in sent.items():
        owners = [start for start, stop in slots if ((ids >= start) & (ids < stop)).any()]
        counts["spanning"] += len(owners) > 1
        if not pool_failed:  # after a pool error, events sent late could not be delivered
            counts["lost"] += sum(1 for start in owners if seen[(key, start)] == 0)
    return counts


def _leaked_entries(name: str) -> list[str]:
    """The pool's entries still in /dev/shm (its segment and its semaphores), after a short grace."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            entries = os.listdir("/dev/shm")
        except OSError:
            return []
        left = [e for e in entries if e == f"shmpool-{name}" or e.startswith(f"sem.shmpool-{name}.")]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _descendants(root: int) -> list[int]:
    """Live (not zombie) processes descended from ``root``, after a short grace."""
    deadline = time.monotonic() + 2.0
    while True:
        found = sorted(descendants(root))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    settings, role = parse_settings(argv)
    if role.role == "writer":
        return run_writer(settings, role)
    if role.role == "sender":
        return run_sender(settings, role)
    folder = settings.logs or tempfile.mkdtemp(prefix="shmpool-soak-")
    os.makedirs(folder, exist_ok=True)
    print(
        f"soak: {settings.env_steps:,} env steps"
        + (f" or {settings.seconds:.0f} s" if settings.seconds else "")
        + f", {settings.num_envs} envs, {settings.num_workers} workers, 2 writers (writer 0 killed every "
        f"~{settings.kill_every} s), 2 senders x {settings.sender_threads} threads, SIGINT every "
        f"{settings.interrupt_min * 1000:.0f}-{settings.interrupt_max * 1000:.0f} ms; logs in {folder}",
        flush=True,
    )
    try:
        return Trainer(settings, folder).run()
    finally:
        if not settings.logs:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
