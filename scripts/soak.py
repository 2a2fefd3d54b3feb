"""Soak test: pools step for millions of env steps while hostile processes hammer them.

The trainer soaks one pool after another (the *phases*), each of CartPole-v1 envs (each wrapped
to count its own calls) with two hooks:

- ``workers``: every slot in a worker process, stepped with ``pool.step``;
- ``trainer-slot``: the same with ``launch(trainer_slot=True)``: the trainer steps the last slot
  in its own process (hooks included);
- ``async``: EnvPool's API, ``launch(batch_size=num_envs // num_workers)``, ``async_reset()``,
  then ``recv()`` / ``send(actions, infos["env_id"])`` one worker's batch at a time.

While each pool runs:

- two attached **writer** processes write ``params.write(env_ids, a=x, b=-x)`` (a pair that must
  land atomically; writer 1 also to every env or to one, which after a few writes take the
  compiled write) and move the arguments of two ``dist="uniform"`` parameters one argument at a
  time (``u={"low": ...}``), which is valid only if ``write()`` merges with what the block holds
  under the writers' lock; writer 0 is SIGKILLed every ``--kill-every`` seconds and replaced by a
  standby started ahead, and at each start forks a child while another of its threads makes its
  first writes (which load the compiled write): the child writes too, and must exit on its own;
  writer 1 takes its own SIGALRMs and SIGTERMs (``--handler-every``), whose handlers raise (an
  error, ``sys.exit``) wherever they land in its writes, as a preempted job's handler does;
- two attached **sender** processes, each with several threads, send events to random envs of both
  workers and record each one once ``send()`` has returned;
- the trainer itself takes a SIGINT every 20-200 ms (KeyboardInterrupt anywhere in its loop,
  ``pool.step``, ``recv``, ``send``, its control calls and its own ``params.write`` included),
  catches it and keeps going; a **storm** process also sends it bursts of SIGINTs (one every
  0-0.5 ms for 50 ms, every ``--burst-every`` seconds), which cut short even a ``send`` (too short
  for the others to hit often), and gusts (one every 20 ms for ``--gust-seconds``, every
  ``--gust-every`` seconds), under which a control call that a retry cannot finish between two
  Ctrl-Cs would never complete;
- every ``--call-every`` steps the trainer makes a control call (``get_attr``, ``call`` or
  ``env_apply``, in turn) and retries it after each Ctrl-C until it completes.

What it checks, each as a counter that must stay 0 (or, marked so, must not stay 0):

- **torn reads**: a hook checks in every ``before_step`` that each env's ``ctx.params`` and
  ``ctx.applied`` hold ``a == -b`` and ``low <= high``; the trainer checks ``pool.applied`` after
  every step;
- **merges**: no ``write()`` of writer-owned ``u`` ranges is refused (each is valid after the
  previous one) and no worker ever refuses a value (``pool.params.refusals``), so no stale merge of
  the contested ``v`` range (writer 0 writes only ``low``, writer 1 only ``high``) stored low > high;
- **lockstep** (``step``): after every step all envs report the same count of calls, the pool's
  global step;
- **async batches**: a ``recv()`` cut by Ctrl-C hands nothing out (the next one returns the batch);
  a ``send()`` that raises a plain ``KeyboardInterrupt`` sent nothing, one that raises
  ``shmpool.StepSentInterrupt`` sent the step. So each batch recv hands out reports, per env, as
  many calls as sends went out to it; none is handed out twice or sent twice (``send`` refusing it as
  still stepping or not yet returned), and none is lost: every env's results come back within
  ``--lost-seconds``, during the storm and after it;
- **control calls**: some complete during the storm, none is still retried after
  ``--livelock-seconds`` (a gust lasts longer: a livelock, each retry cut short before it finishes,
  would show there), and each returns every env's count of calls (that lockstep or the sends
  imply), with the env ids and the tag it was given;
- **events**: every sent event reaches each worker owning one of its envs exactly once, with those
  envs, in each sending thread's order; none is delivered that was not sent;
- **handlers and forks**: after a raising handler, the next write gets the lock (no writer error);
  no child forked during the first writes hangs;
- **the pool survives**: no pool error, no hang, no writer or sender error; after ``close()`` no
  ``/dev/shm`` entry of the pool and no child process is left.

It prints a progress line every few seconds, then a table (a column per phase), and exits 1 if any
check failed.

    python scripts/soak.py                      # 10 million env steps, then 2.5 million per other phase
    python scripts/soak.py --quick              # about 20 s, for CI
    python scripts/soak.py --seconds 600        # ten minutes for the workers phase, 2.5 for the others
    python scripts/soak.py --phases async       # one phase only

A Ctrl-C from the terminal (beyond the script's own) stops the run early and still prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import functools
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _settings
import gymnasium as gym
import numpy as np

import shmpool
import shmpool.system
from shmpool.protocol import W_HOLDER
from shmpool.system import descendants

HOOK_LOG = "Log"
#: The bounds of every parameter; the writer-owned ``u`` ranges turn back before reaching them.
BOUND = 1e9
U_TURN = 1e7
#: The pools soaked, in this order (see the module docstring).
PHASES = ("workers", "trainer-slot", "async")
#: The control calls the trainer makes in turn.
CALL_KINDS = ("get_attr", "call", "env_apply")
#: How long one burst of the storm process's SIGINTs lasts (seconds), and the longest pause in it.
BURST_SECONDS = 0.05
BURST_PAUSE = 0.0005
#: The storm process's counts, in its shared file ``storm-count.bin``; the last is 1 once the storm
#: process got a SIGINT: nothing of the soak sends it one, so it came from the terminal's Ctrl-C.
STORM_SENT, STORM_BURSTS, STORM_GUSTS, STORM_USER = range(4)


@dataclass
class Settings:
    """What the soak runs."""

    env_steps: int = 10_000_000
    """env steps to run in the workers phase (pool steps x num_envs)."""
    seconds: float = 0.0
    """stop the workers phase after this many seconds even if env_steps is not reached (0: no limit)."""
    phases: list[str] = field(default_factory=lambda: list(PHASES))
    """the pools to soak, one after the other: workers (worker processes only), trainer-slot
    (launch(trainer_slot=True)), async (recv/send batches of one worker each)."""
    side_share: float = 0.25
    """the trainer-slot and async phases each run this share of env_steps and of seconds."""
    num_envs: int = 16
    """envs in each pool."""
    num_workers: int = 2
    """worker processes of each pool (counting the trainer's slot in the trainer-slot phase)."""
    sender_threads: int = 3
    """threads sending events in each of the two sender processes."""
    kill_every: float = 3.0
    """mean seconds between SIGKILLs of writer 0 (restarted at once; 0: never)."""
    interrupt_min: float = 0.02
    """shortest pause between two SIGINTs to the trainer, and the pause within a gust (seconds)."""
    interrupt_max: float = 0.2
    """longest pause between two SIGINTs to the trainer (seconds; 0: none, bursts and gusts apart)."""
    write_pause: float = 0.001
    """seconds each writer sleeps between two writes."""
    handler_every: float = 0.003
    """mean seconds between writer 1's own SIGALRMs, and between its SIGTERMs (x3), whose handlers
    raise in its writes (0: none)."""
    send_pause: float = 0.002
    """mean seconds each sender thread sleeps between two sends."""
    burst_every: float = 1.0
    """mean seconds between the storm process's bursts of SIGINTs to the trainer: one every 0-0.5 ms
    for 50 ms (0: none)."""
    gust_every: float = 15.0
    """mean seconds between the storm process's gusts of SIGINTs: one every interrupt_min seconds for
    gust_seconds (0: none)."""
    gust_seconds: float = 3.0
    """how long a gust lasts."""
    trainer_write_every: int = 50
    """the trainer also writes an a/b pair every this many steps (0: never)."""
    call_every: int = 20
    """the trainer makes a control call (get_attr, call, env_apply in turn) every this many steps, and
    retries it after each Ctrl-C until it completes (0: never)."""
    livelock_seconds: float = 2.0
    """a control call still being retried after this many seconds counts as a livelock (and is given
    up); keep it below gust_seconds."""
    lost_seconds: float = 10.0
    """async: an env whose results have not come back this many seconds after its send counts as lost."""
    progress_every: float = 5.0
    """seconds between progress lines."""
    hang_seconds: float = 60.0
    """a step loop that makes no progress this long counts as a hang (the workers are then killed)."""
    seed: int = 0
    """seed of the pools, the actions and the hostile processes' choices."""
    logs: str = ""
    """folder for the event and check logs (default: a temporary one, removed at the end)."""
    quick: bool = False
    """a CI-sized run: 5 s for each phase, writer 0 killed every 0.5 s
    once it writes (its successor's first writes, fork included, take a second or more), SIGINT
    bursts every 0.5 s and gusts every 2 s: on an idle machine each phase sees a kill, a burst and a
    gust, as the tests check."""


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
        quick = {
            "seconds": 5.0,
            "side_share": 1.0,
            "kill_every": 0.5,
            "progress_every": 5.0,
            "hang_seconds": 30.0,
            "burst_every": 0.5,
            "gust_every": 2.0,
        }
        given.update({key: value for key, value in quick.items() if given[key] is None})
    settings = Settings(**{key: value for key, value in given.items() if value is not None})
    if settings.num_workers < 2 or settings.num_envs < 2 * settings.num_workers:
        parser.error("--num-workers must be >= 2 and --num-envs at least twice that (events must span workers)")
    unknown = [phase for phase in settings.phases if phase not in PHASES]
    if unknown or len(set(settings.phases)) != len(settings.phases):
        parser.error(f"--phases: each of {', '.join(PHASES)} at most once, got {' '.join(settings.phases)}")
    if "async" in settings.phases and settings.num_envs % settings.num_workers:
        parser.error(
            f"--num-envs {settings.num_envs} must be a multiple of --num-workers {settings.num_workers} for the "
            f"async phase (a batch is one worker's whole slot)"
        )
    if settings.gust_every and settings.gust_seconds <= settings.livelock_seconds:
        parser.error("--gust-seconds must exceed --livelock-seconds: a livelock shows only in a longer gust")
    if not 0 < settings.side_share <= 1:
        parser.error(f"--side-share must be in (0, 1], got {settings.side_share}")
    return settings, role


# -- what runs in the workers -------------------------------------------------------------------


class StepCounterEnv(gym.Wrapper):
    """CartPole-v1 that reports in its info ``t``: how many times it was stepped or reset. Every env
    of a pool that steps in lockstep reports the same ``t`` (the pool's steps, plus its resets),
    whether a step was an env step or a next-step autoreset. Control calls read ``calls`` and
    :meth:`peek`."""

    def __init__(self, env_id: int) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.env_id = env_id
        self.calls = 0

    def reset(self, **kwargs: Any) -> Any:
        self.calls += 1
        observation, info = self.env.reset(**kwargs)
        return observation, {**info, "t": self.calls}

    def step(self, action: Any) -> Any:
        self.calls += 1
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, reward, terminated, truncated, {**info, "t": self.calls}

    def peek(self, tag: int) -> tuple[int, int, int]:
        """``(env_id, calls, tag)``: which env answered, its count, and which call it answered."""
        return self.env_id, self.calls, tag


def make_env(env_id: int) -> gym.Env:
    return StepCounterEnv(env_id)


def peek_env(env: gym.Env, tag: int) -> tuple[int, int, int]:
    """What ``env_apply`` runs: the env's :meth:`StepCounterEnv.peek`, found through any wrapper."""
    return env.get_wrapper_attr("peek")(tag)


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
    # Started ahead as a standby, it waits for its go line, so that a killed writer's successor
    # writes at once instead of after a Python start-up under the soak's load.
    if not sys.stdin.buffer.readline():
        return 0  # a standby never needed
    stop = threading.Event()
    _stop_on_eof(stop)
    rng = np.random.default_rng([settings.seed, role.index, os.getpid()])
    counts = Counter[str]()
    fd = os.open(f"{role.folder}/writer-{role.index}-{os.getpid()}.txt", os.O_WRONLY | os.O_CREAT, 0o600)

    def publish() -> None:
        keys = ("pairs", "u", "v", "v_refused", "u_refused", "handler_raises", "forks", "forks_hung")
        text = " ".join(f"{key}={counts[key]}" for key in keys)
        os.pwrite(fd, text.ljust(120).encode() + b"\n", 0)

    try:
        with shmpool.attach(role.pool, wait=30) as handle:
            params = handle.params
            n = handle.num_envs
            own = np.arange(role.index % 2, n, 2)
            # A locked write first: it rolls back whatever a killed predecessor left half written,
            # before this writer reads the state of its own u ranges.
            params.write([int(own[0])], a=0.0, b=-0.0)
            if role.index == 0:
                counts["forks"] += 1
                counts["forks_hung"] += _fork_during_first_writes(params, n, settings.seed)
            publish()  # tells the trainer that this writer is up (it kills only running writers)
            raising = False
            while not stop.is_set():
                # After its first writes, which load the compiled write (a handler raising in the
                # load propagates, and the load is tried again at the next write).
                if not raising and role.index == 1 and settings.handler_every > 0 and counts["pairs"] >= 64:
                    raising = True
                    _raise_from_handlers(settings.handler_every, stop)
                if raising:
                    try:
                        _RAISING[0] = True
                        _write_round(params, rng, role, own, counts, n)
                        _RAISING[0] = False
                    except (_Raised, SystemExit):
                        _RAISING[0] = False
                        counts["handler_raises"] += 1
                else:
                    _write_round(params, rng, role, own, counts, n)
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
        _RAISING[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        publish()
        os.close(fd)
    return 0


def _write_round(
    params: Any, rng: np.random.Generator, role: Role, own: np.ndarray, counts: Counter[str], n: int
) -> None:
    """One round of a writer's writes: an a/b pair, sometimes a ``u`` move and a ``v`` argument."""
    # Writer 1, which is never killed, also writes what the compiled path takes, so that
    # its writes meet the locks and journals that writer 0's kills leave; writer 0 takes
    # the general path (compiled writes killed mid-way: tests/test_protocol.py).
    form = rng.random() if role.index == 1 else 1.0
    if form < 0.25:  # every env, an array each: the compiled write (after the first few)
        x = rng.uniform(-1e6, 1e6, size=n)
        params.write(None, a=x, b=-x)
    elif form < 0.5:  # one env, numbers: compiled too
        number = float(rng.uniform(-1e6, 1e6))
        params.write(int(rng.integers(n)), a=number, b=-number)
    else:  # any envs, in any order: the general path
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


class _Raised(Exception):
    """What writer 1's SIGALRM handler raises, wherever in a write it lands."""


#: Whether writer 1's handlers raise now: only inside its write rounds, whose caller catches it.
_RAISING = [False]


def _raising_handler(signum: int, frame: Any) -> None:
    if _RAISING[0]:
        raise _Raised if signum == signal.SIGALRM else SystemExit(1)  # SIGTERM: as a preempted job exits


def _raise_from_handlers(every: float, stop: threading.Event) -> None:
    """Installs the raising handlers; SIGALRM comes from an interval timer, SIGTERM from a thread."""
    signal.signal(signal.SIGALRM, _raising_handler)
    signal.signal(signal.SIGTERM, _raising_handler)
    signal.setitimer(signal.ITIMER_REAL, every, every)

    def terms() -> None:
        pace = random.Random(os.getpid())
        while not stop.wait(pace.uniform(0, 6 * every)):
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terms, daemon=True).start()


def _fork_during_first_writes(params: Any, n: int, seed: int) -> int:
    """Forks while another thread makes this process's first writes to every env (the 16th loads
    the compiled write); the child makes its own, then exits. Returns 1 if it hung (it is killed)."""

    def pairs(count: int, rng: np.random.Generator) -> None:
        for _ in range(count):
            x = rng.uniform(-1e6, 1e6, size=n)
            params.write(None, a=x, b=-x)

    thread = threading.Thread(target=pairs, args=(40, np.random.default_rng([seed, os.getpid(), 1])))
    thread.start()
    time.sleep(random.Random(os.getpid()).uniform(0.0, 0.8))  # the load takes a fraction of a second
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            shmpool.system.set_parent_death_signal(signal.SIGKILL)
            pairs(40, np.random.default_rng([seed, os.getpid(), 2]))
        finally:
            os._exit(0)
    thread.join()
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        if os.waitpid(child, os.WNOHANG)[0]:
            return 0
        time.sleep(0.01)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    return 1


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
        handle = shmpool.attach(role.pool, wait=30)
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
                    events.send(HOOK_LOG, ids, [role.index, thread, seq], wait=None)
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


def run_storm(settings: Settings, role: Role) -> int:
    """Sends its parent, the trainer, bursts and gusts of SIGINTs (see ``Settings``), counting each
    one in ``storm-count.bin`` before sending it, so that the trainer tells them from a user's Ctrl-C."""
    stop = threading.Event()
    _stop_on_eof(stop)
    trainer = os.getppid()
    counts = np.memmap(f"{role.folder}/storm-count.bin", dtype=np.int64, mode="r+", shape=(4,))
    signal.signal(signal.SIGINT, lambda signum, frame: counts.__setitem__(STORM_USER, 1))
    rng = random.Random(settings.seed + 2)

    def after(mean: float) -> float:
        return time.monotonic() + mean * rng.uniform(0.5, 1.5) if mean > 0 else float("inf")

    # The first gust at half the mean wait: a phase of 1.5 x gust_every (after this process's start)
    # sees one.
    next_burst, next_gust = after(settings.burst_every), after(settings.gust_every / 2)
    while not stop.is_set():
        now = time.monotonic()
        if now < min(next_burst, next_gust):
            stop.wait(min(next_burst, next_gust, now + 1.0) - now)
            continue
        gust = now >= next_gust
        counts[STORM_GUSTS if gust else STORM_BURSTS] += 1
        end = now + (settings.gust_seconds if gust else BURST_SECONDS)
        while time.monotonic() < end and not stop.is_set():
            if os.getppid() != trainer:  # the trainer is gone: never signal whoever adopted this process
                return 1
            counts[STORM_SENT] += 1
            os.kill(trainer, signal.SIGINT)
            time.sleep(settings.interrupt_min if gust else rng.uniform(0, BURST_PAUSE))
        if gust:
            next_gust = after(settings.gust_every)
        next_burst = max(next_burst, after(settings.burst_every))
    return 0


# -- the trainer --------------------------------------------------------------------------------

#: The rows of the table: (label, kind, phases). kind: "info" (shown), "zero" (must stay 0) or
#: "positive" (must not stay 0); phases: "all", "step" (the phases that call pool.step) or "async".
ROWS: list[tuple[str, str, str]] = [
    ("env steps", "info", "all"),
    ("Ctrl-Cs sent", "info", "all"),
    ("Ctrl-Cs taken", "info", "all"),
    ("Ctrl-Cs in recv", "info", "async"),
    ("Ctrl-Cs in send before the step went out", "info", "async"),
    ("Ctrl-Cs in send after it (StepSentInterrupt)", "info", "async"),
    ("async batches received", "info", "async"),
    ("longest wait from send to recv (ms)", "info", "async"),
    ("control calls completed (must not be 0)", "positive", "all"),
    ("control calls cut by Ctrl-C (retried)", "info", "all"),
    ("longest control call, retries included (ms)", "info", "all"),
    ("SIGINT bursts (storm process)", "info", "all"),
    ("SIGINT gusts (storm process)", "info", "all"),
    ("writer kills", "info", "all"),
    ("writer kills inside the writers' lock", "info", "all"),
    ("a/b pair writes (writers)", "info", "all"),
    ("a/b pair writes (trainer)", "info", "all"),
    ("u range writes", "info", "all"),
    ("v range writes", "info", "all"),
    ("v writes refused by write() (must be)", "info", "all"),
    ("raising handlers in writes (writer 1)", "info", "all"),
    ("forks during the first writes (writer 0)", "info", "all"),
    ("hook checks (before_step calls)", "info", "all"),
    ("events sent", "info", "all"),
    ("events delivered", "info", "all"),
    ("deliveries (one per worker concerned)", "info", "all"),
    ("events spanning both workers", "info", "all"),
    ("pool errors", "zero", "all"),
    ("KeyboardInterrupts escaping the loop", "zero", "all"),
    ("hangs", "zero", "all"),
    ("close errors", "zero", "all"),
    ("lockstep violations", "zero", "step"),
    ("step counts unequal to sends (async)", "zero", "async"),
    ("async batches handed out twice", "zero", "async"),
    ("async batches sent twice (send refused)", "zero", "async"),
    ("async envs whose results never came back", "zero", "async"),
    ("control call results wrong", "zero", "all"),
    ("control calls given up (livelock)", "zero", "all"),
    ("torn a/b in ctx.params (hooks)", "zero", "all"),
    ("torn a/b in ctx.applied (hooks)", "zero", "all"),
    ("torn a/b in pool.applied (trainer)", "zero", "all"),
    ("low > high in ctx.params (hooks)", "zero", "all"),
    ("refused param values (pool.params.refusals)", "zero", "all"),
    ("u writes refused by write()", "zero", "all"),
    ("forked children that hung", "zero", "all"),
    ("events lost", "zero", "all"),
    ("events duplicated", "zero", "all"),
    ("events never sent", "zero", "all"),
    ("events with wrong envs", "zero", "all"),
    ("events out of send order", "zero", "all"),
    ("writer errors (exception)", "zero", "all"),
    ("sender errors (exception)", "zero", "all"),
    ("writer errors (exit code)", "zero", "all"),
    ("sender errors (exit code)", "zero", "all"),
    ("writer exits before the kill", "zero", "all"),
    ("storm errors (exit code)", "zero", "all"),
    ("senders that did not stop (killed)", "zero", "all"),
    ("writers that did not stop (killed)", "zero", "all"),
    ("leaked /dev/shm entries", "zero", "all"),
    ("leaked child processes", "zero", "all"),
]
#: Where an armed pool call of the async loop was when Ctrl-C cut it, as the table counts it.
CUT_IN = {"recv": "Ctrl-Cs in recv", "send": "Ctrl-Cs in send before the step went out"}
CALLS_COMPLETED = "control calls completed (must not be 0)"


class Trainer:
    """Runs the phases: for each, launches its pool and steps it (``step``, or ``recv``/``send``)
    while taking the SIGINTs and keeping the hostile processes running; then checks and reports."""

    def __init__(self, settings: Settings, folder: str) -> None:
        self.settings = settings
        self.root = folder
        self.armed = False  # SIGINTs raise KeyboardInterrupt only while armed
        self.stop_requested = False
        self.interrupts_sent = 0  # by the thread
        self.interrupts_received = 0
        self.storm_sent = 0  # by the storm processes of the phases done
        self.storm_count = np.zeros(4, np.int64)  # by the storm process running (shared: STORM_SENT, ...)
        self.results: dict[str, Counter[str]] = {}  # each phase's counts, in the order run
        self.seconds: dict[str, float] = {}
        self.notes: list[str] = []

    def _new_phase(self, phase: str) -> None:
        """Sets up what one phase keeps: its folder of logs, counts, pool, children and threads."""
        self.phase = phase
        self.folder = os.path.join(self.root, phase)
        os.makedirs(self.folder, exist_ok=True)
        self.counts: Counter[str] = Counter()
        self.noted: Counter[str] = Counter()
        self.beat = time.monotonic()
        self.pool: shmpool.Pool | None = None
        self.writers: list[subprocess.Popen[bytes]] = []
        self.standbys: list[subprocess.Popen[bytes]] = []  # writers waiting for their go line
        self.senders: list[subprocess.Popen[bytes]] = []
        self.storm: list[subprocess.Popen[bytes]] = []
        self.children_lock = threading.Lock()
        self.quiet = threading.Event()  # stops the SIGINT and kill threads
        self.finished = threading.Event()  # stops the watchdog
        self.where = ""  # the async loop's armed pool call: where a Ctrl-C lands
        self.aborted = False  # the phase ended on a failure (events sent late then go undelivered)
        # the control call due: its kind, env ids (env_apply), since when, tag of the last attempt
        self._call_due = False
        self._call_kind = CALL_KINDS[0]
        self._call_ids = np.zeros(0, np.int64)
        self._call_since = 0.0
        self._call_tag = 0
        self._calls_scheduled = 0
        self._call_attempts = 0  # in the phase
        self._call_tries = 0  # of the call due
        # async: the batch recv handed out whose send has not gone out, and per env: the sends that
        # went out, whether one is in flight (or the reset), when it went out, how many of its
        # results came back, whether it was counted lost
        self._batch: tuple[Any, ...] | None = None
        self._sends = np.zeros(0, np.int64)
        self._out = np.zeros(0, np.bool_)
        self._sent_at = np.zeros(0)
        self._returns = np.zeros(0, np.int64)
        self._lost = np.zeros(0, np.bool_)
        self._env_steps_sent = 0
        self._base = np.zeros(0, np.int64)  # each env's calls after the first reset

    def _note(self, kind: str, text: str) -> None:
        """Keeps the first three notes of each kind."""
        self.noted[kind] += 1
        if self.noted[kind] <= 3:
            self.notes.append(f"[{self.phase}] {text}")

    # -- children

    def _spawn(self, role: str, index: int) -> subprocess.Popen[bytes]:
        s = self.settings
        command = [sys.executable, os.path.abspath(__file__), "--role", role, "--index", str(index)]
        command += ["--pool", self.pool.name, "--folder", self.folder, "--seed", str(s.seed)]  # type: ignore[union-attr]
        command += ["--write-pause", str(s.write_pause), "--send-pause", str(s.send_pause)]
        command += ["--handler-every", str(s.handler_every)]
        command += ["--sender-threads", str(s.sender_threads), "--interrupt-min", str(s.interrupt_min)]
        command += ["--burst-every", str(s.burst_every), "--gust-every", str(s.gust_every)]
        command += ["--gust-seconds", str(s.gust_seconds), "--livelock-seconds", str(s.livelock_seconds)]
        return subprocess.Popen(command, stdin=subprocess.PIPE)

    def _start_writer(self, index: int) -> subprocess.Popen[bytes]:
        """A writer process that writes once its start-up is done."""
        writer = self._spawn("writer", index)
        self._go(writer)
        return writer

    @staticmethod
    def _go(writer: subprocess.Popen[bytes]) -> None:
        """Sends a writer its go line: until then it waits, having imported what it needs."""
        try:
            writer.stdin.write(b"go\n")  # type: ignore[union-attr]
            writer.stdin.flush()  # type: ignore[union-attr]
        except BrokenPipeError:  # it died starting up: its exit code counts as a writer error
            with contextlib.suppress(BrokenPipeError):  # the line still buffered fails the close's flush
                writer.stdin.close()  # type: ignore[union-attr]

    def _kill_loop(self) -> None:
        """SIGKILLs writer 0 once it runs, ``kill_every`` seconds after it started writing on average,
        and hands over to a standby started ahead. Every second kill waits (up to 1 s) until the
        victim is inside the writers' critical section, so that kills mid-write are certain to happen."""
        rng = random.Random(self.settings.seed)
        quiet, writers, folder = self.quiet, self.writers, self.folder  # this phase's
        standbys, children_lock = self.standbys, self.children_lock
        views = getattr(self.pool, "_views", {})  # private: only to aim kills, never to check anything
        holder = views["writers"][W_HOLDER:] if "writers" in views else None
        with children_lock:
            standbys.append(self._spawn("writer", 0))  # without its go line yet
        try:
            while not quiet.is_set():
                victim = writers[0]
                ready = Path(folder) / f"writer-0-{victim.pid}.txt"
                while not quiet.wait(0.02) and victim.poll() is None:
                    if ready.exists() and ready.stat().st_size:
                        break
                if quiet.wait(self.settings.kill_every * rng.uniform(0.5, 1.5)):
                    return
                in_lock = False
                if holder is not None and rng.random() < 0.5:
                    deadline = time.monotonic() + 1.0
                    while not in_lock and time.monotonic() < deadline:
                        in_lock = int(holder[0]) == victim.pid
                        if not in_lock:
                            time.sleep(0.00005)
                with children_lock:
                    victim.kill()
                    in_lock = in_lock or (holder is not None and int(holder[0]) == victim.pid)
                    victim.wait()
                    victim.stdin.close()  # type: ignore[union-attr]
                    self.counts["writer kills"] += 1
                    self.counts["writer kills inside the writers' lock"] += in_lock
                    if victim.returncode != -signal.SIGKILL:  # it had exited already: an error
                        self.counts["writer exits before the kill"] += 1
                    writers[0] = standbys.pop()
                    self._go(writers[0])
                    standbys.append(self._spawn("writer", 0))
        finally:
            with children_lock:
                self._end_standbys(standbys)

    def _end_standbys(self, standbys: list[subprocess.Popen[bytes]]) -> None:
        """Ends standby writers (they never wrote: nothing to check but a failed start-up); the
        caller holds ``children_lock``."""
        for standby in standbys:
            if standby.poll():  # exited with an error while it waited
                self.counts["writer errors (exit code)"] += 1
            standby.kill()
            standby.wait()
            standby.stdin.close()  # type: ignore[union-attr]
        standbys.clear()

    # -- SIGINTs

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupts_received += 1
        # Not ours: someone wants the run to stop. Counting misses a Ctrl-C that came with the storm's
        # (the kernel and the pool's deferrals merge those): the storm process then tells.
        sent = self.interrupts_sent + self.storm_sent + int(self.storm_count[STORM_SENT])
        if self.interrupts_received > sent or self.storm_count[STORM_USER]:
            self.stop_requested = True
        if self.armed:
            raise KeyboardInterrupt

    def _interrupt_loop(self) -> None:
        rng = random.Random(self.settings.seed + 1)
        s, quiet = self.settings, self.quiet
        while not quiet.wait(rng.uniform(s.interrupt_min, s.interrupt_max)):
            if self.storm_count[STORM_USER]:  # the user's Ctrl-C reached the storm process: stop
                self.stop_requested = True
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
        limit, finished, pool = self.settings.hang_seconds, self.finished, self.pool
        while not finished.wait(1.0):
            if time.monotonic() - self.beat < limit:
                continue
            self.counts["hangs"] += 1
            print(f"\nHANG: no progress for {limit:.0f} s; stacks of the trainer:", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            for pid in pool.worker_pids if pool is not None else []:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.beat = time.monotonic()
            if finished.wait(min(limit, 20.0)):
                return
            if time.monotonic() - self.beat >= min(limit, 20.0):
                print("HANG: still stuck after killing the workers; giving up", file=sys.stderr, flush=True)
                self._kill_children()
                os._exit(3)

    def _kill_children(self) -> None:
        for process in [*self.writers, *self.standbys, *self.senders, *self.storm]:
            if process.poll() is None:
                process.kill()

    # -- the run

    def run(self) -> int:
        """Runs each phase in turn (a stop request skips those left); prints the table."""
        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        for phase in self.settings.phases:
            if self.stop_requested:
                self.notes.append(f"[{phase}] not run: the run was stopped")
                continue
            self._new_phase(phase)
            sent_before = self.interrupts_sent + self.storm_sent
            self._run_phase()
            self.counts["Ctrl-Cs sent"] = self.interrupts_sent + self.storm_sent - sent_before
            self.results[phase] = self.counts
        return self._report()

    def _run_phase(self) -> None:
        s, phase = self.settings, self.phase
        share = 1.0 if phase == "workers" else s.side_share
        env_steps, seconds = int(s.env_steps * share), s.seconds * share
        name = f"soak-{os.getpid()}-{phase}"
        options: dict[str, Any] = {}
        if phase == "trainer-slot":
            options["trainer_slot"] = True
        if phase == "async":
            options["batch_size"] = s.num_envs // s.num_workers  # one worker's slot per batch
        self.finished = threading.Event()
        self.pool = pool = shmpool.launch(
            [functools.partial(make_env, env_id) for env_id in range(s.num_envs)],
            num_workers=s.num_workers,
            seed=s.seed,
            name=name,
            params=parameters(),
            hooks=[ParamCheck(self.folder), EventLog(self.folder)],
            timeout=max(10.0, s.hang_seconds / 2),
            info_keys=4,
            **options,
        )
        print(
            f"phase {phase}: pool {name!r}, {env_steps:,} env steps" + (f" or {seconds:.1f} s" if seconds else ""),
            flush=True,
        )
        started = time.monotonic()
        try:
            self._start(pool)
            self.writers = [self._start_writer(k) for k in range(2)]
            self.senders = [self._spawn("sender", k) for k in range(2)]
            threading.Thread(target=self._watchdog, daemon=True).start()
            chaos = []
            if s.interrupt_max > 0:
                chaos.append(threading.Thread(target=self._interrupt_loop, daemon=True))
            if s.kill_every > 0:
                chaos.append(threading.Thread(target=self._kill_loop, daemon=True))
            for thread in chaos:
                thread.start()
            if s.burst_every > 0 or s.gust_every > 0:
                Path(self.folder, "storm-count.bin").write_bytes(bytes(8 * 4))
                self.storm_count = np.memmap(Path(self.folder, "storm-count.bin"), dtype=np.int64, mode="r+")
                self.storm = [self._spawn("storm", 0)]
            deadline = started + seconds if seconds > 0 else float("inf")
            self._main_loop(pool, env_steps, deadline, started)
            self._stop_storm()
            self.quiet.set()
            for thread in chaos:
                thread.join()
            self._wind_down(pool)
            self._final_check(pool)
        except _Stop:
            self.aborted = True
        except BaseException as exc:  # noqa: BLE001 - a failed run still cleans up and reports
            self.aborted = True
            label = "KeyboardInterrupts escaping the loop" if isinstance(exc, KeyboardInterrupt) else "pool errors"
            self.counts[label] += 1
            self._note("aborted", f"run aborted: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        finally:
            self.armed = False
            self._stop_storm()
            self.quiet.set()
            elapsed = time.monotonic() - started
            self.counts["env steps"] = self._env_steps(pool)
            refusals = self._close(pool)
            self.finished.set()
        self.counts["refused param values (pool.params.refusals)"] = refusals
        self.counts["control calls cut by Ctrl-C (retried)"] = self._call_attempts - self.counts[CALLS_COMPLETED]
        self.seconds[phase] = elapsed
        self._collect(name)

    def _stop_storm(self) -> None:
        """Stops the storm process, if any, and keeps the count of what it sent."""
        if not self.storm:
            return
        for process in self.storm:
            _stop(process)
            if process.returncode != 0:
                self.counts["storm errors (exit code)"] += 1
        self.storm = []
        self.counts["SIGINT bursts (storm process)"] = int(self.storm_count[STORM_BURSTS])
        self.counts["SIGINT gusts (storm process)"] = int(self.storm_count[STORM_GUSTS])
        self.stop_requested |= bool(self.storm_count[STORM_USER])
        self.storm_sent += int(self.storm_count[STORM_SENT])  # first: the SIGINT handler may read both meanwhile
        self.storm_count = np.zeros(4, np.int64)

    def _start(self, pool: shmpool.Pool) -> None:
        """Resets the pool (``async_reset`` in the async phase) and records each env's count of calls."""
        n = self.settings.num_envs
        if self.phase == "async":
            pool.async_reset()
            base = np.array(pool.get_attr("calls"), dtype=np.int64)  # waits for the resets: recv returns them
            self._sends = np.zeros(n, np.int64)
            self._out = np.ones(n, np.bool_)  # the reset is in flight
            self._sent_at = np.full(n, time.monotonic())
            self._returns = np.zeros(n, np.int64)
            self._lost = np.zeros(n, np.bool_)
        else:
            _, infos = pool.reset()
            base = np.asarray(infos["t"], dtype=np.int64)
        if (base != base[0]).any():
            self.counts["lockstep violations" if self.phase != "async" else "step counts unequal to sends (async)"] += 1
            self._note("base", f"after the reset the envs report calls {base.tolist()}: not all equal")
        self._base = base

    def _env_steps(self, pool: shmpool.Pool) -> int:
        return self._env_steps_sent if self.phase == "async" else pool.global_step * self.settings.num_envs

    def _expected_calls(self, pool: shmpool.Pool) -> np.ndarray:
        """How many times each env must have been reset or stepped: once per pool step, or once per
        send that went out to it (async)."""
        return self._base + (self._sends if self.phase == "async" else pool.global_step)

    def _main_loop(self, pool: shmpool.Pool, env_steps: int, deadline: float, started: float) -> None:
        """Steps (async: receives and sends) until ``env_steps``, the time limit, a stop request or a
        pool error. In the step phases any statement may be cut by a KeyboardInterrupt; the async
        loop arms its pool calls one by one. The nested handlers count it and go on."""
        s = self.settings
        self._rng = np.random.default_rng(s.seed)
        size = s.num_envs // s.num_workers if self.phase == "async" else s.num_envs
        self._actions = [self._rng.integers(0, 2, size) for _ in range(64)]
        self._k = 0
        self._next_progress = started + s.progress_every
        steps = self._async_steps if self.phase == "async" else self._steps
        while True:
            try:
                while True:
                    try:
                        self.armed = self.phase != "async"
                        steps(pool, env_steps, deadline, started)
                        return
                    except KeyboardInterrupt:
                        self.armed = False  # first: what the handler counts is then exact
                        self.counts["Ctrl-Cs taken"] += 1
                        if self.where in CUT_IN:
                            self.counts[CUT_IN[self.where]] += 1
                        self.beat = time.monotonic()
            except KeyboardInterrupt:  # on the inner loop's back edge, say
                self.armed = False
                self.counts["Ctrl-Cs taken"] += 1
            finally:
                self.armed = False

    def _steps(self, pool: shmpool.Pool, env_steps: int, deadline: float, started: float) -> None:
        s = self.settings
        target = -(-env_steps // s.num_envs)
        while pool.global_step < target and self._going_on(pool, deadline, started):
            self._k += 1
            try:
                if s.call_every and self._k % s.call_every == 0 and not self._call_due:
                    self._schedule_call()
                if self._call_due:
                    self._control_call(pool)
                if s.trainer_write_every and self._k % s.trainer_write_every == 0:
                    ids = np.sort(self._rng.choice(s.num_envs, int(self._rng.integers(1, s.num_envs + 1)), False))
                    x = self._rng.uniform(-1e6, 1e6, len(ids))
                    pool.params.write(ids, a=x, b=-x)
                    self.counts["a/b pair writes (trainer)"] += 1
                _, _, _, _, infos = pool.step(self._actions[self._k % 64])
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                self.counts["pool errors"] += 1
                self._note("pool error", f"step {pool.global_step}: {type(exc).__name__}: {exc}")
                traceback.print_exc()
                raise _Stop() from exc
            self.beat = time.monotonic()
            self._check_step(pool, infos)

    def _going_on(self, pool: shmpool.Pool, deadline: float, started: float) -> bool:
        """Whether a phase's loop goes on (no stop asked, the deadline not reached); prints progress."""
        now = time.monotonic()
        if self.stop_requested or now >= deadline:
            return False
        if now >= self._next_progress:
            self._next_progress = now + self.settings.progress_every
            self._progress(pool, now - started)
        return True

    def _check_step(self, pool: shmpool.Pool, infos: dict[str, Any]) -> None:
        expected = self._base + pool.global_step
        t = infos.get("t")
        if t is None or not infos["_t"].all() or (t != expected).any():
            self.counts["lockstep violations"] += 1
            self._note(
                "lockstep", f"lockstep: after global step {pool.global_step} envs report t={t} (want {expected})"
            )
        self._check_applied(pool)

    def _check_applied(self, pool: shmpool.Pool, ids: np.ndarray | slice = slice(None)) -> None:
        """Checks the a/b pairs of ``pool.applied`` in the rows ``ids``: those of workers not stepping
        (the view is live: a worker stepping writes its rows)."""
        applied = pool.applied
        if (applied["a"][ids] != -applied["b"][ids]).any():
            self.counts["torn a/b in pool.applied (trainer)"] += 1

    # -- async batches

    def _async_steps(self, pool: shmpool.Pool, env_steps: int, deadline: float, started: float) -> None:
        """Receives a batch and sends its actions, over and over. Only the pool calls run armed, each
        followed at once by the store that records what it did (a Ctrl-C is raised only at a call, a
        function's entry or a loop's back edge: none comes between), so the bookkeeping is exact."""
        s = self.settings
        while self._env_steps_sent < env_steps and self._going_on(pool, deadline, started):
            self._check_lost(time.monotonic())
            self._k += 1
            try:
                if s.trainer_write_every and self._k % s.trainer_write_every == 0:
                    ids = np.sort(self._rng.choice(s.num_envs, int(self._rng.integers(1, s.num_envs + 1)), False))
                    x = self._rng.uniform(-1e6, 1e6, len(ids))
                    self.where, self.armed = "write", True
                    pool.params.write(ids, a=x, b=-x)
                    self.armed = False
                    self.counts["a/b pair writes (trainer)"] += 1
                self._round(pool, arm=True)
                # After the round: a call that Ctrl-Cs keep cutting short must not keep recv and send
                # from being cut as well (a burst would otherwise land in the call's retries only).
                if s.call_every and self._k % s.call_every == 0 and not self._call_due:
                    self._schedule_call()
                if self._call_due:
                    self._control_call(pool)
            except (KeyboardInterrupt, _Stop):
                raise
            except Exception as exc:
                self.armed = False
                self.counts["pool errors"] += 1
                self._note("pool error", f"after {self._env_steps_sent:,} env steps: {type(exc).__name__}: {exc}")
                traceback.print_exc()
                raise _Stop() from exc
            self.beat = time.monotonic()

    def _round(self, pool: shmpool.Pool, *, arm: bool) -> None:
        """Receives a batch (unless one awaits its actions) and sends its actions, as the contract
        says: a ``recv`` cut by Ctrl-C handed nothing out; a ``send`` cut by a plain
        ``KeyboardInterrupt`` sent nothing (the batch is sent again), one cut by ``StepSentInterrupt``
        sent the step. With ``arm``, the SIGINTs raise in these two calls."""
        if self._batch is None:
            self.where, self.armed = "recv", arm
            try:
                self._batch = pool.recv()
                self.armed = False
            except RuntimeError as exc:
                self.armed = False
                if "recv needs" not in str(exc):
                    raise
                lost = self._out & ~self._lost  # in flight by the trainer's count, not by the pool's
                self._lost |= lost
                self.counts["async envs whose results never came back"] += int(lost.sum())
                self._note(
                    "lost", f"recv: {exc} (by the sends that went out, envs {np.flatnonzero(lost).tolist()} are)"
                )
                raise _Stop() from exc
            self._took(pool, self._batch)
        ids = self._batch[4]["env_id"]
        actions = self._actions[self._k % 64]
        self.where, self.armed = "send", arm
        try:
            pool.send(actions, ids)
            self._batch = None
            self.armed = False
        except shmpool.StepSentInterrupt:  # before KeyboardInterrupt, its base class
            self._batch = None
            self.armed = False
            self.counts["Ctrl-Cs taken"] += 1
            self.counts["Ctrl-Cs in send after it (StepSentInterrupt)"] += 1
            self.beat = time.monotonic()
        except RuntimeError as exc:
            self.armed = False
            if "still stepping" not in str(exc) and "not yet returned" not in str(exc):
                raise
            # A send that raised a plain KeyboardInterrupt had sent the step after all.
            self._batch = None
            self.counts["async batches sent twice (send refused)"] += 1
            self._note("sent twice", f"send of envs {ids.tolist()} refused: {exc}")
        self._sent(ids)

    def _took(self, pool: shmpool.Pool, batch: tuple[Any, ...]) -> None:
        """Checks and records a batch that recv handed out: each of its envs had a send (or the reset)
        in flight, and reports as many calls as there were resets and sends that went out to it."""
        infos = batch[4]
        ids = infos["env_id"]
        now = time.monotonic()
        self.counts["async batches received"] += 1
        if not self._out[ids].all():
            self.counts["async batches handed out twice"] += 1
            self._note("twice", f"recv handed out envs {ids[~self._out[ids]].tolist()} again, with no send between")
        t, want = infos.get("t"), self._base[ids] + self._sends[ids]
        if t is None or not infos["_t"].all() or (t != want).any():
            self.counts["step counts unequal to sends (async)"] += 1
            self._note("unequal", f"recv: envs {ids.tolist()} report t={t}, but the sends that went out say {want}")
        wait = int(1000 * (now - self._sent_at[ids]).max())
        label = "longest wait from send to recv (ms)"
        self.counts[label] = max(self.counts[label], wait)
        self._out[ids] = False
        self._returns[ids] += 1
        self._check_applied(pool, ids)  # their worker waits for a send: the other one may be stepping

    def _sent(self, ids: np.ndarray) -> None:
        """Records a send that went out."""
        self._sends[ids] += 1
        self._out[ids] = True
        self._sent_at[ids] = time.monotonic()
        self._env_steps_sent += len(ids)

    def _check_lost(self, now: float) -> None:
        """Counts the envs whose results have not come back ``lost_seconds`` after their send (once each)."""
        late = self._out & ~self._lost & (now - self._sent_at > self.settings.lost_seconds)
        if late.any():
            self._lost |= late
            self.counts["async envs whose results never came back"] += int(late.sum())
            self._note(
                "lost",
                f"envs {np.flatnonzero(late).tolist()}: no results {self.settings.lost_seconds} s after their send",
            )

    # -- control calls

    def _schedule_call(self) -> None:
        """Makes the next control call due: its kind (in turn) and, for env_apply, its env ids
        (random, repeats allowed, in random order)."""
        n = self.settings.num_envs
        self._call_kind = CALL_KINDS[self._calls_scheduled % len(CALL_KINDS)]
        self._call_ids = self._rng.integers(0, n, int(self._rng.integers(1, n + 1)))
        self._calls_scheduled += 1
        self._call_tries = 0
        self._call_since = time.monotonic()
        self._call_due = True

    def _control_call(self, pool: shmpool.Pool) -> None:
        """Makes the control call that is due and checks its answer: every env's count of calls (that
        lockstep or the sends imply), its env id and the attempt's tag. A Ctrl-C leaves it due, for
        the loop to retry; after ``livelock_seconds`` of that it is given up. Only the pool call runs
        armed: what is counted after it is exact."""
        armed, self.armed = self.armed, False
        s = self.settings
        if time.monotonic() - self._call_since > s.livelock_seconds:
            self._call_due = False
            self.counts["control calls given up (livelock)"] += 1
            self._note(
                "livelock",
                f"{self._call_kind}() tried {self._call_tries} times in {s.livelock_seconds:g} s, each cut short by "
                f"Ctrl-C: given up ({self.counts['control calls given up (livelock)']} so far)",
            )
            self.armed = armed
            return
        self._call_tag += 1
        self._call_attempts += 1
        self._call_tries += 1
        kind, tag, ids = self._call_kind, self._call_tag, self._call_ids
        self.where, self.armed = "call", True
        if kind == "get_attr":
            answer: Any = pool.get_attr("calls")
        elif kind == "call":
            answer = pool.call("peek", tag)
        else:
            answer = pool.env_apply(peek_env, ids.tolist(), args=(tag,))
        self.armed = False
        self._call_due = False
        self.counts[CALLS_COMPLETED] += 1
        label = "longest control call, retries included (ms)"
        self.counts[label] = max(self.counts[label], int(1000 * (time.monotonic() - self._call_since)))
        expected = self._expected_calls(pool)
        try:
            if kind == "get_attr":
                right = np.array_equal(np.asarray(answer, dtype=np.int64), expected)
            else:
                want_ids = np.arange(s.num_envs) if kind == "call" else ids
                rows = np.asarray(answer, dtype=np.int64).reshape(-1, 3)
                right = (
                    np.array_equal(rows[:, 0], want_ids)
                    and np.array_equal(rows[:, 1], expected[want_ids])
                    and bool((rows[:, 2] == tag).all())
                )
        except (TypeError, ValueError):  # not even the shape of an answer
            right = False
        if not right:
            self.counts["control call results wrong"] += 1
            self._note("call", f"{kind} (tag {tag}) returned {answer!r:.300}; each env's calls should be {expected}")
        self.armed = armed

    # -- the end of a phase

    def _progress(self, pool: shmpool.Pool, elapsed: float) -> None:
        steps = self._env_steps(pool)
        c = self.counts
        failures = sum(c[label] for label, kind, _ in ROWS if kind == "zero")
        print(
            f"[{self.phase} {elapsed:6.1f} s] {steps:>12,} env steps ({steps / max(elapsed, 1e-9):>8,.0f}/s)  "
            f"Ctrl-Cs {c['Ctrl-Cs taken']:>5}  writer kills {c['writer kills']:>3}  "
            f"control calls {c[CALLS_COMPLETED]:>4}  failures {failures}",
            flush=True,
        )

    def _tick(self, pool: shmpool.Pool) -> None:
        """One step of every env, or one batch received and sent (async), checked; not armed."""
        if self.phase == "async":
            self._round(pool, arm=False)
            self._check_lost(time.monotonic())
        else:
            _, _, _, _, infos = pool.step(pool.action_space.sample())
            self._check_step(pool, infos)
        self.beat = time.monotonic()

    def _wind_down(self, pool: shmpool.Pool) -> None:
        """Stops the senders (stepping meanwhile, so that none waits on a full ring forever), then the
        writers, then steps a few more times so that every event sent is delivered (async: until
        every env's results came back three more times, or ``lost_seconds`` passed)."""
        self.beat = time.monotonic()
        for group, label in ((self.senders, "sender"), (self.writers, "writer")):
            with self.children_lock:
                for process in group:
                    process.stdin.close()  # type: ignore[union-attr]
            deadline = time.monotonic() + 30.0
            while any(p.poll() is None for p in group) and time.monotonic() < deadline:
                self._tick(pool)
            for process in group:
                if process.poll() is None:
                    self.counts[f"{label}s that did not stop (killed)"] += 1
                    process.kill()
                    process.wait()
                elif process.returncode != 0:
                    self.counts[f"{label} errors (exit code)"] += 1
        if self.phase != "async":
            for _ in range(3):
                self._tick(pool)
            return
        returns = self._returns.copy()
        deadline = time.monotonic() + self.settings.lost_seconds
        while (self._returns - returns < 3).any() and time.monotonic() < deadline:
            self._tick(pool)
        stuck = (self._returns - returns < 3) & ~self._lost
        if stuck.any():
            self._lost |= stuck
            self.counts["async envs whose results never came back"] += int(stuck.sum())
            self._note("lost", f"after the storm, envs {np.flatnonzero(stuck).tolist()} stopped coming back")

    def _final_check(self, pool: shmpool.Pool) -> None:
        """Reads every env's count of calls once nothing is in flight: it must be what lockstep, or
        the sends that went out (async), imply."""
        calls = np.array(pool.get_attr("calls"), dtype=np.int64)
        expected = self._expected_calls(pool)
        if not np.array_equal(calls, expected):
            self.counts["lockstep violations" if self.phase != "async" else "step counts unequal to sends (async)"] += 1
            self._note("final", f"at the end the envs' counts of calls are {calls.tolist()}, not {expected.tolist()}")

    def _close(self, pool: shmpool.Pool) -> int:
        refusals = 0
        try:
            refusals = sum(pool.params.refusals.values())
        except Exception as exc:  # noqa: BLE001
            self._note("refusals", f"reading refusals failed: {exc}")
        # After a failed run the children still run: stopped first, they report no error for a pool
        # that closes under them.
        running = [p for p in [*self.senders, *self.writers] if p.poll() is None]
        for process in running:
            if process.stdin and not process.stdin.closed:
                process.stdin.close()
        deadline = time.monotonic() + 2.0
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            pool.close()
        except BaseException as exc:  # noqa: BLE001
            self.counts["close errors"] += 1
            self._note("close", f"pool.close() raised {type(exc).__name__}: {exc}")
        with self.children_lock:  # after a failed run the kill thread may not have ended them
            self._end_standbys(self.standbys)
        for process in [*self.senders, *self.writers]:  # after a failed run they may still be there
            if process.poll() is None:
                _stop(process)
        return refusals

    def _collect(self, name: str) -> None:
        """Adds to the phase's counts what its logs say, and what it left behind."""
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
        c["a/b pair writes (writers)"] = writes["pairs"]
        c["u range writes"] = writes["u"]
        c["v range writes"] = writes["v"]
        c["v writes refused by write() (must be)"] = writes["v_refused"]
        c["u writes refused by write()"] = writes["u_refused"]
        c["raising handlers in writes (writer 1)"] = writes["handler_raises"]
        c["forks during the first writes (writer 0)"] = writes["forks"]
        c["forked children that hung"] = writes["forks_hung"]
        c["writer errors (exception)"] = len(list(folder.glob("errors-writer*.txt")))
        c["sender errors (exception)"] = len(list(folder.glob("errors-sender*.txt")))
        events = _event_counts(folder, pool_failed=self.aborted or bool(c["pool errors"] or c["hangs"]))
        c["events sent"] = events["sent"]
        c["events delivered"] = events["delivered"]
        c["deliveries (one per worker concerned)"] = events["deliveries"]
        c["events spanning both workers"] = events["spanning"]
        for kind in ("lost", "duplicated", "never sent", "with wrong envs", "out of send order"):
            c[f"events {kind}"] = events[kind]
        for path in sorted([*folder.glob("errors-*.txt"), *folder.glob("u-refused-*.txt")])[:3]:
            self._note("log", f"{path.name}: {path.read_text().strip().splitlines()[-1]}")
        examples = [
            line for path in sorted(folder.glob("check-examples-*.txt")) for line in path.read_text().splitlines()
        ]
        for kind in ("torn ctx.params", "torn ctx.applied", "low > high"):
            for line in [line for line in examples if line.startswith(kind)][:1]:
                self._note("example", f"example: {line}")

    # -- the report

    def _report(self) -> int:
        """Prints the table, a column per phase run; returns the exit status (1: a check failed)."""
        s = self.settings
        phases = list(self.results)
        width = max(len(label) for label, _, _ in ROWS)
        took = ", ".join(f"{phase} {self.seconds[phase]:.1f} s" for phase in phases)
        print(f"\nsoak: {s.num_envs} envs and {s.num_workers} workers per pool; {took}")
        header = f"{'check':<{width}}" + "".join(f"  {phase:>12}" for phase in phases) + "  status"
        print(header)
        print("-" * len(header))
        failed = not phases
        for label, kind, scope in ROWS:
            if kind == "positive" and (not s.call_every or self.stop_requested):
                kind = "info"  # no calls were asked for, or a stopped run may have made none
            cells, bad = [], False
            for phase in phases:
                if scope != "all" and (scope == "async") != (phase == "async"):
                    cells.append("n/a")
                    continue
                count = self.results[phase][label]
                cells.append(f"{count:,}")
                bad |= count > 0 if kind == "zero" else count == 0 if kind == "positive" else False
            status = "-" if kind == "info" else "FAIL" if bad else "ok"
            failed |= bad
            print(f"{label:<{width}}" + "".join(f"  {cell:>12}" for cell in cells) + f"  {status}")
        for note in self.notes:
            print(f"note: {note}")
        print("FAILED" if failed else "all checks passed", flush=True)
        return 1 if failed else 0


def _stop(process: subprocess.Popen[Any]) -> None:
    """Ends a helper process: its stdin closed (its signal to stop), then killed if it is still there
    10 s later."""
    if process.stdin and not process.stdin.closed:
        process.stdin.close()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


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
    if role.role == "storm":
        return run_storm(settings, role)
    folder = settings.logs or tempfile.mkdtemp(prefix="shmpool-soak-")
    os.makedirs(folder, exist_ok=True)
    share = f", x{settings.side_share:g} for the others" if settings.phases != ["workers"] else ""
    print(
        f"soak of {', '.join(settings.phases)}: {settings.env_steps:,} env steps"
        + (f" or {settings.seconds:.0f} s" if settings.seconds else "")
        + f"{share}; {settings.num_envs} envs, {settings.num_workers} workers, 2 writers (writer 0 killed every "
        f"~{settings.kill_every} s), 2 senders x {settings.sender_threads} threads, SIGINT every "
        f"{settings.interrupt_min * 1000:.0f}-{settings.interrupt_max * 1000:.0f} ms, SIGINT bursts every "
        f"~{settings.burst_every} s and gusts every ~{settings.gust_every} s, a control call every "
        f"{settings.call_every} steps; logs in {folder}",
        flush=True,
    )
    try:
        return Trainer(settings, folder).run()
    finally:
        if not settings.logs:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
