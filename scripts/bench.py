"""Env steps per second: shmpool against the raw env loop and gymnasium's vector envs, in one run.

Every row is the median of several timed windows after a warm-up window, printed with its ratio to
gymnasium's AsyncVectorEnv and SyncVectorEnv measured in the same run (per-core speed on a shared
machine drifts between minutes, so only ratios from one run mean anything).

    python scripts/bench.py                 # full table
    python scripts/bench.py --quick         # a short run, for CI
    python scripts/bench.py --envs CartPole-v1 --num-envs 32 --workers 2
    python scripts/bench.py --loop          # the whole loop: a policy between steps, sync and async
    python scripts/bench.py --ppo           # CleanRL's PPO (torch, default threads): rollouts and updates
    python scripts/bench.py --ray           # shmpool.ray's ClusterPool against a local pool (needs Ray)
"""

from __future__ import annotations

import os

# One BLAS thread everywhere (trainer and forked workers alike): the policy of --loop must not
# take the cores the envs need, and every runner gets the same policy cost.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import functools
import importlib.util
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from typing import Any

import _settings
import gymnasium as gym
import numpy as np

import shmpool
import shmpool.hooks
from shmpool.params import compile_specs
from shmpool.profiling import NESTED


@dataclass
class Settings:
    """What to measure."""

    envs: list[str] = field(default_factory=lambda: ["CartPole-v1", "Pendulum-v1", "HalfCheetah-v5"])
    """gymnasium env ids to measure (MuJoCo ones only up to 32 envs, and only with mujoco installed)."""
    num_envs: list[int] = field(default_factory=lambda: [8, 32, 128])
    """pool sizes to measure."""
    workers: int = 2
    """shmpool worker processes (gymnasium Async uses one process per env, as it must)."""
    windows: int = 5
    """timed windows per row; the row reports their median."""
    window_seconds: float = 1.0
    """the length of one timed window."""
    quick: bool = False
    """a short run for CI: one env size (32), three 0.2 s windows (unless the options say otherwise)."""
    loop: bool = False
    """instead of the table: whole-loop steps/s with a fixed-cost policy (an MLP forward of each
    batch) between steps, for gymnasium Sync and Async and shmpool sync and async (batch_size =
    num_envs / 2); --envs and --num-envs default to CartPole-v1 x32 and HalfCheetah-v5 x16."""
    hidden: int = 256
    """the width of the --loop policy's two hidden layers."""
    ppo: bool = False
    """instead of the table: CleanRL's PPO iteration (scripts/ppo.py's agent and update, torch with
    its default threads) on gymnasium Sync (of CleanRL's envs: each in RecordEpisodeStatistics), a
    default launch and engine="numba" (for a MuJoCo env: engine="mujoco" and EnvPool), timed in
    turns, an iteration (a rollout of 128 steps per env, then 4 epochs of 4 minibatches) each; with
    the env steps' share of Sync's iteration, and so the best ratio any vector env could reach;
    --envs and --num-envs default to CartPole-v1 at 8 and 32."""
    torch_threads: int = 0
    """--ppo: torch's threads (0: as many as cores, torch's default, which users get)."""
    profile: bool = False
    """instead of the table: where a step's time goes, phase by phase (us per step, trainer and
    workers), for the first of --envs at the first of --num-envs: plain, and for CartPole also with 3
    built-in hooks and with 3 params written every step."""
    ray: bool = False
    """instead of the table: the per-step cost of shmpool.ray's ClusterPool against a local pool of the
    same total size (the first of --envs and of --num-envs, 32 by default), on the Ray cluster at
    RAY_ADDRESS, or else on a simulated one of --ray-nodes nodes on this machine (loopback only)."""
    ray_nodes: int = 2
    """nodes of the simulated cluster of --ray."""
    engine: str = "python"
    """the shmpool engine that --profile measures: python, numba (compiled kernels) or mujoco."""
    writes: bool = False
    """instead of the table: what ``params.write`` costs the trainer, for one and for three CartPole
    parameters, as numbers (one value for every env) and as per-env arrays, against the same values
    stored with plain numpy, at each of --num-envs (default 32 and 128)."""
    scaling: list[int] = field(default_factory=list)
    """instead of the table: shmpool with each of these worker counts (both engines, numba where
    installed) against gymnasium Sync, for the first of --envs at each of --num-envs (for a machine
    with many cores: --scaling 2 4 8 16 --num-envs 128 256)."""


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Builds Settings from the command line; each field is an option, documented by --help."""
    given = _settings.parse_given(Settings, argv, description=__doc__)
    if given["ppo"]:
        given.setdefault("envs", ["CartPole-v1"])
        given.setdefault("num_envs", [8, 32])
    if given["loop"] and "envs" not in given and "num_envs" not in given:
        given.update(envs=["CartPole-v1", "HalfCheetah-v5"], num_envs=[32, 16])
    if given["quick"]:  # what the command line gives wins
        given.setdefault("windows", 3)
        given.setdefault("window_seconds", 0.2)
        given.setdefault("num_envs", [32])
    if given["ray"]:
        given.setdefault("num_envs", [32])
    if given["writes"]:
        given.setdefault("num_envs", [32, 128])
    return Settings(**given)


# -- steppers: each yields a function that performs one batch step ------------------------------


def _actions(space: gym.Space, count: int, seed: int = 0) -> list[Any]:
    space.seed(seed)
    return [space.sample() for _ in range(count)]


@contextmanager
def raw_loop(env_id: str, num_envs: int) -> Iterator[tuple[Callable[[Any], None], list[Any], int]]:
    """One plain env stepped in a Python loop (autoreset by hand); counts one env step per call."""
    env = gym.make(env_id)
    env.reset(seed=0)
    actions = _actions(env.action_space, 256)

    def step(action: Any) -> None:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()

    try:
        yield step, actions, 1
    finally:
        env.close()


@contextmanager
def vector(
    make: Callable[[], gym.vector.VectorEnv], num_envs: int
) -> Iterator[tuple[Callable[[Any], None], list[Any], int]]:
    """Any gymnasium vector env (shmpool's Pool included); counts num_envs env steps per call."""
    envs = make()
    envs.reset(seed=0)
    actions = _actions(envs.action_space, 64)
    try:
        yield envs.step, actions, num_envs
    finally:
        envs.close()


#: A row of the table: its label and what makes its stepper; or several labels, for a stepper of
#: several steps that ``measure`` times in turns (``idle_and_written``, ``in_turns``).
Row = tuple[str | tuple[str, ...], Callable[[], Any]]
#: The parameters rewritten every step in the "param writes" rows (CartPole-v1 only).
UPDATED = {"length": (0.4, 0.6), "masspole": (0.08, 0.12), "force_mag": (8.0, 12.0)}
#: Seconds each call of shmpool's params.write() took, over the whole run (for the note).
WRITE_TIMES: list[float] = []


@contextmanager
def with_updates(
    make: Callable[[], gym.vector.VectorEnv],
    num_envs: int,
    how: str,
    updated: dict[str, tuple[float, float]] = UPDATED,
) -> Iterator[tuple[Callable[[Any], None], list[Any], int]]:
    """A vector env whose parameters ``updated`` (three of CartPole's by default) get new values,
    uniform in their range, for every env before every step: through shmpool's ``params.write``
    (``how="write"``), or gymnasium's ``set_attr``."""
    with vector(make, num_envs) as (step, actions, env_steps):
        yield _updating(step, num_envs, how, updated), actions, env_steps


@contextmanager
def idle_and_written(
    make: Callable[[], gym.vector.VectorEnv], num_envs: int, updated: dict[str, tuple[float, float]] = UPDATED
) -> Iterator[tuple[tuple[Callable[[Any], None], Callable[[Any], None]], list[Any], int]]:
    """One pool's two steps: plain, and with ``updated`` written for every env before every step
    (``with_updates``), for ``measure`` to time in turns: the keep ratio is of the same pool, and
    the machine's drift hits both alike."""
    with vector(make, num_envs) as (step, actions, env_steps):
        yield (step, _updating(step, num_envs, "write", updated)), actions, env_steps


def _updating(
    step: Callable[[Any], Any], num_envs: int, how: str, updated: dict[str, tuple[float, float]]
) -> Callable[[Any], None]:
    """``step`` of a vector env, after new values of ``updated`` for every env (see ``with_updates``)."""
    rng = np.random.default_rng(0)
    updates = [{name: rng.uniform(low, high, num_envs) for name, (low, high) in updated.items()} for _ in range(32)]
    envs = step.__self__  # type: ignore[attr-defined]
    counter = [0]

    def step_with_updates(action: Any) -> None:
        update = updates[counter[0] % len(updates)]
        counter[0] += 1
        if how == "write":
            start = time.perf_counter()
            envs.params.write(None, **update)
            WRITE_TIMES.append(time.perf_counter() - start)
        else:
            for name, values in update.items():
                envs.set_attr(name, list(values))
        step(action)

    return step_with_updates


EVENT_SENDER = """
import sys, time, shmpool
# argv: pool name, events per second, "send" or "idle", seconds to send for (0: until killed)
with shmpool.attach(sys.argv[1], wait=30) as handle:
    print("attached", flush=True)
    start, sent, send, spent, cpu = time.perf_counter(), 0, sys.argv[3] == "send", 0, 0
    seconds = float(sys.argv[4])
    while not seconds or time.perf_counter() < start + seconds:
        sent += 1
        if send:
            began, began_cpu = time.perf_counter_ns(), time.thread_time_ns()
            handle.events.send("Perturb", [sent % handle.num_envs], [0.0], wait=None)
            spent, cpu = spent + time.perf_counter_ns() - began, cpu + time.thread_time_ns() - began_cpu
        time.sleep(max(0.0, start + sent / float(sys.argv[2]) - time.perf_counter()))
    print(sent if send else 0, spent, cpu, flush=True)  # events sent, nanoseconds in send(): wall, CPU
"""


def start_event_sender(pool_name: str, rate: int, send: bool = True, seconds: float = 0.0) -> subprocess.Popen[str]:
    """A process that attaches to the pool and sends ``rate`` Perturb events per second for
    ``seconds`` (0: until killed; ``send=False``: it wakes as often but sends nothing), then prints
    how many it sent and the nanoseconds its ``send()`` calls took (wall clock, then its CPU time: on
    2 cores the sender is a third process, preempted mid-send). Returns once it has attached."""
    sender = subprocess.Popen(
        [sys.executable, "-c", EVENT_SENDER, pool_name, str(rate), "send" if send else "idle", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    sender.stdout.readline()  # type: ignore[union-attr]
    return sender


@contextmanager
def with_event_sender(
    make: Callable[[], gym.vector.VectorEnv], num_envs: int, rate: int, send: bool = True
) -> Iterator[tuple[Callable[[Any], None], list[Any], int]]:
    """A pool that receives ``rate`` events per second from another process while it steps (with
    ``send=False`` the process wakes as often but sends nothing: what the wake-ups alone cost)."""
    with vector(make, num_envs) as (step, actions, env_steps):
        sender = start_event_sender(step.__self__.name, rate, send)
        try:
            yield step, actions, env_steps
        finally:
            sender.kill()
            sender.wait()


@contextmanager
def envpool_steps(env_id: str, num_envs: int, threads: int) -> Iterator[tuple[Callable[[Any], None], list[Any], int]]:
    """EnvPool's C++ envs (synchronous API, ``threads`` threads); counts num_envs env steps per call."""
    import envpool

    envs = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, num_threads=threads, seed=0)
    envs.reset()
    actions = _actions(gym.vector.utils.batch_space(envs.action_space, num_envs), 64)
    try:
        yield envs.step, actions, num_envs
    finally:
        envs.close()


def envpool_installed() -> bool:
    """Whether EnvPool imports (the ``bench`` extra; it has wheels for x86-64 Linux up to Python 3.12)."""
    try:
        import envpool  # noqa: F401
    except ImportError:
        return False
    return True


#: The row of a process that wakes 1,000 times a second beside the pool but sends nothing.
WAKE_UPS = "shmpool, 1,000 wake-ups/s, no event"
#: The Python engine's row with the hooks compiled (numba installed).
COMPILED_HOOKS = "shmpool, 3 hooks compiled=True"
#: The "numba engine" rows' labels, for the notes.
NUMBA, NUMBA_LOADED, ENVPOOL = "shmpool numba", "numba, 3 params/step + 3 hooks", "EnvPool"
#: Rows with three parameters declared, and with them written for every env before every step.
PARAMS_IDLE, PARAMS_WRITTEN = "3 params, no writes", "3 params written/step"


def compiled_cases(env_id: str, num_envs: int, workers: int) -> list[Row]:
    """The numba engine's rows and EnvPool's, for the envs that have a compiled kernel."""
    from shmpool import kernels

    if env_id not in kernels.compiled_ids() or importlib.util.find_spec("numba") is None:
        return []
    numba = lambda **options: shmpool.launch(env_id, num_envs, num_workers=workers, seed=0, engine="numba", **options)  # noqa: E731
    rows: list[Row] = [(NUMBA, lambda: vector(numba, num_envs))]
    if env_id.startswith("CartPole"):
        params = {name: shmpool.Param(low=0.01, high=100.0) for name in UPDATED}
        loaded = lambda: numba(params=params, hooks=three_hooks())  # noqa: E731
        rows += [
            (
                (f"numba, {PARAMS_IDLE}", f"numba, {PARAMS_WRITTEN}"),
                lambda: idle_and_written(lambda: numba(params=params), num_envs),
            ),
            (NUMBA_LOADED, lambda: with_updates(loaded, num_envs, "write")),
        ]
    if envpool_installed():
        rows.append((f"{ENVPOOL} ({workers} threads)", lambda: envpool_steps(env_id, num_envs, workers)))
    return rows


#: The MuJoCo engine's rows' labels, for the notes.
BATCH_FLOOR, MUJOCO, MUJOCO_DR, PYTHON_DR = (
    "mujoco.batch floor",
    "shmpool mujoco",
    "shmpool mujoco, 4 params/episode + Push",
    "shmpool python, 4 params/episode + Push",
)
#: A joint each robot's domain randomization damps (the third of the four parameters).
DAMPED_JOINT = {"HalfCheetah": "bthigh", "Ant": "hip_1", "Hopper": "thigh_joint", "Walker2d": "thigh_joint"}


@contextmanager
def batch_floor(env_id: str, num_envs: int, threads: int) -> Iterator[tuple[Callable[[Any], None], list[Any], int]]:
    """The bare physics: ``mujoco.batch.Batch`` of the env's model stepping ``frame_skip`` substeps
    with the actions as controls, then copying qpos and qvel out (what any observation needs)."""
    import mujoco.batch

    env = gym.make(env_id)
    env.reset(seed=0)
    unwrapped = env.unwrapped
    batch = mujoco.batch.Batch(unwrapped.model, num_envs, nthread=threads, persistent=True)
    batch.reset()
    ctrl, qpos, qvel = batch.bind("ctrl"), batch.bind("qpos"), batch.bind("qvel")
    frame_skip = unwrapped.frame_skip

    def step(action: Any) -> None:
        ctrl[:] = action
        batch.step(nstep=frame_skip)
        np.concatenate((qpos, qvel), axis=1)

    try:
        yield step, _actions(gym.vector.utils.batch_space(env.action_space, num_envs), 64), num_envs
    finally:
        env.close()


def robot_randomization(env_id: str) -> tuple[dict[str, shmpool.Param], list[Any]]:
    """The issue's domain randomization: torso mass, floor friction, a joint's damping and gravity
    drawn per episode, and a ``Push`` of the torso every 100 steps."""
    from shmpool import mujoco as smj

    def drawn(low: float, high: float, bind: Any) -> shmpool.Param:
        return shmpool.Param(
            dist="uniform",
            default={"low": low, "high": high},
            low=0.0,  # scales: any positive value is allowed, the draws stay in [low, high]
            high=2 * high,
            when="reset",
            bind=bind,
        )

    params = {
        "mass": drawn(0.8, 1.2, smj.body_mass("torso", relative=True)),
        "friction": drawn(0.5, 1.5, smj.geom_friction("floor", axis=0, relative=True)),
        "damping": drawn(0.5, 2.0, smj.dof_damping(DAMPED_JOINT[env_id.split("-")[0]], relative=True)),
        "gravity": drawn(0.9, 1.1, smj.gravity(relative=True)),
    }
    return params, [shmpool.hooks.Perturb(50.0, every=100, dims=3, kick=smj.Push("torso"))]


def mujoco_cases(env_id: str, num_envs: int, workers: int) -> list[Row]:
    """The MuJoCo engine's rows (its default placement), the bare physics and EnvPool's, for the MuJoCo
    envs the engine runs; with the issue's randomization on both engines where it applies."""
    from shmpool.mujoco_tasks import TASKS

    if env_id not in TASKS or importlib.util.find_spec("mujoco.batch") is None:
        return []
    engine = lambda name, **options: shmpool.launch(env_id, num_envs, seed=0, engine=name, **options)  # noqa: E731
    # The runners that the engine's bars compare, timed in turns (one row): on this drifting VM,
    # rows timed minutes apart gave the same code ratios 20% apart.
    compared: list[tuple[str, Callable[[], Any]]] = [
        (f"{BATCH_FLOOR} ({workers} threads)", lambda: batch_floor(env_id, num_envs, workers)),
        (MUJOCO, lambda: vector(lambda: engine("mujoco"), num_envs)),
    ]
    if env_id.split("-")[0] in DAMPED_JOINT:
        params, hooks = robot_randomization(env_id)
        compared += [
            (MUJOCO_DR, lambda: vector(lambda: engine("mujoco", params=params, hooks=hooks), num_envs)),
            (
                PYTHON_DR,
                lambda: vector(lambda: engine("python", num_workers=workers, params=params, hooks=hooks), num_envs),
            ),
        ]
    if envpool_installed():
        compared.append((f"{ENVPOOL} ({workers} threads)", lambda: envpool_steps(env_id, num_envs, workers)))
    labels, makers = zip(*compared)
    rows: list[Row] = [(labels, lambda: in_turns(*makers))]
    if env_id.startswith("HalfCheetah"):
        written = per_step_randomization()
        rows.append(
            (
                (f"shmpool mujoco, {PARAMS_IDLE}", f"shmpool mujoco, {PARAMS_WRITTEN}"),
                lambda: idle_and_written(lambda: engine("mujoco", params=written), num_envs, PER_STEP_RANGES),
            )
        )
    return rows


#: The per-step randomization of HalfCheetah's rows: floor friction, a joint's damping and an
#: actuator's gear, each scaled by U(0.8, 1.2) for every env before every step.
PER_STEP_RANGES = {"friction": (0.8, 1.2), "damping": (0.8, 1.2), "gear": (0.8, 1.2)}


def per_step_randomization() -> dict[str, shmpool.Param]:
    """HalfCheetah's three per-step parameters (:data:`PER_STEP_RANGES`), as relative model fields."""
    from shmpool import mujoco as smj

    binds = {
        "friction": smj.geom_friction("floor", relative=True),
        "damping": smj.dof_damping("bthigh", relative=True),
        "gear": smj.actuator_gear("bthigh", relative=True),
    }
    return {name: shmpool.Param(1.0, low=0.1, high=10.0, bind=bind) for name, bind in binds.items()}


def mujoco_notes(measured: dict[tuple[str, int], dict[str, float]], workers: int) -> list[str]:
    """The MuJoCo engine against EnvPool, the bare physics and the Python engine, per env and size."""
    notes = []
    for (env_id, num_envs), results in measured.items():
        if MUJOCO not in results:
            continue
        mujoco, floor = results[MUJOCO], results[f"{BATCH_FLOOR} ({workers} threads)"]
        line = f"{env_id} x{num_envs}: mujoco engine {mujoco / floor:.2f}x the bare physics"
        envpool = results.get(f"{ENVPOOL} ({workers} threads)")
        if envpool:
            line += f", {mujoco / envpool:.2f}x EnvPool"
        if MUJOCO_DR in results:
            randomized = results[MUJOCO_DR]
            line += (
                f"; randomized {randomized / floor:.2f}x the bare physics, {randomized / results[PYTHON_DR]:.2f}x the "
                f"Python engine randomized" + (f", {randomized / envpool:.2f}x EnvPool" if envpool else "")
            )
        notes.append(line)
    return notes


def cases(env_id: str, num_envs: int, workers: int) -> list[Row]:
    """The rows measured for one env and one pool size: (label, context manager factory)."""
    fns = [lambda: gym.make(env_id) for _ in range(num_envs)]
    rows: list[Row] = [
        ("raw single-env loop", lambda: raw_loop(env_id, num_envs)),
        (
            ("gymnasium Sync", "shmpool (defaults)"),  # in turns: the defaults' bar is their ratio
            lambda: in_turns(
                lambda: vector(lambda: gym.vector.SyncVectorEnv(fns), num_envs),
                lambda: vector(lambda: shmpool.launch(env_id, num_envs, seed=0), num_envs),
            ),
        ),
        ("gymnasium Async", lambda: vector(lambda: gym.vector.AsyncVectorEnv(fns, shared_memory=True), num_envs)),
        (
            f"shmpool ({workers} workers)",
            lambda: vector(
                lambda: shmpool.launch(env_id, num_envs, num_workers=workers, seed=0, trainer_slot=False), num_envs
            ),
        ),
        (
            "shmpool (trainer slot)",
            lambda: vector(
                lambda: shmpool.launch(env_id, num_envs, num_workers=workers, seed=0, trainer_slot=True), num_envs
            ),
        ),
    ]
    if env_id.startswith("HalfCheetah"):
        from shmpool import mujoco as smj

        randomized = smj.scale_randomization()  # torso mass x U(0.8, 1.2), floor friction x U(0.5, 1.5)
        rows.append(
            (
                "shmpool, randomized",
                lambda: vector(
                    lambda: shmpool.launch(env_id, num_envs, num_workers=workers, seed=0, params=randomized), num_envs
                ),
            )
        )
    if env_id.startswith("CartPole"):
        params = {name: shmpool.Param(low=0.01, high=100.0) for name in UPDATED}
        pool = lambda: shmpool.launch(env_id, num_envs, num_workers=workers, seed=0, params=params)  # noqa: E731
        hooked = lambda: shmpool.launch(env_id, num_envs, num_workers=workers, seed=0, hooks=three_hooks())  # noqa: E731
        kicked = lambda: shmpool.launch(env_id, num_envs, num_workers=workers, seed=0, hooks=[shmpool.hooks.Perturb()])  # noqa: E731
        rows.append(("shmpool, 3 built-in hooks", lambda: vector(hooked, num_envs)))
        if importlib.util.find_spec("numba") is not None:
            compiled = lambda: shmpool.launch(  # noqa: E731
                env_id, num_envs, num_workers=workers, seed=0, hooks=three_hooks(compiled=True)
            )
            rows.append((COMPILED_HOOKS, lambda: vector(compiled, num_envs)))
        rows += [
            ("shmpool, 1,000 events/s sent", lambda: with_event_sender(kicked, num_envs, 1000)),
            (WAKE_UPS, lambda: with_event_sender(kicked, num_envs, 1000, send=False)),
            ((f"shmpool, {PARAMS_IDLE}", f"shmpool, {PARAMS_WRITTEN}"), lambda: idle_and_written(pool, num_envs)),
            (
                "Async, set_attr x3 per step",
                lambda: with_updates(lambda: gym.vector.AsyncVectorEnv(fns, shared_memory=True), num_envs, "set_attr"),
            ),
        ]
    return rows + compiled_cases(env_id, num_envs, workers) + mujoco_cases(env_id, num_envs, workers)


def measurable(env_id: str, num_envs: int) -> bool:
    """MuJoCo envs need mujoco installed, and are measured up to 32 envs (Async would start 128
    MuJoCo processes)."""
    if "Cheetah" in env_id or env_id.split("-")[0] in {"Hopper", "Ant", "Humanoid", "Walker2d", "Swimmer"}:
        try:
            import mujoco  # noqa: F401
        except ImportError:
            print(f"skipping {env_id}: mujoco is not installed (pip install -e '.[mujoco]')", file=sys.stderr)
            return False
        return num_envs <= 32
    return True


def measure(stepper: Any, settings: Settings) -> Any:
    """The median env steps per second over the timed windows, after one warm-up window; for a
    stepper that yields a tuple of steps (``idle_and_written``), the tuple of their medians, timed
    in turns, a window each."""
    with stepper() as (steps, actions, env_steps_per_call):
        several = isinstance(steps, tuple)
        rates: list[list[float]] = [[] for _ in steps] if several else [[]]
        for window in range(settings.windows + 1):
            for step, step_rates in zip(steps if several else (steps,), rates):
                calls, index = 0, 0
                start = time.perf_counter()
                deadline = start + settings.window_seconds
                while True:
                    for _ in range(16):
                        step(actions[index])
                        index = (index + 1) % len(actions)
                    calls += 16
                    now = time.perf_counter()
                    if now >= deadline:
                        break
                if window:  # the first window warms caches, JITs and the scheduler
                    step_rates.append(calls * env_steps_per_call / (now - start))
        medians = tuple(statistics.median(step_rates) for step_rates in rates)
        return medians if several else medians[0]


def three_hooks(compiled: bool | None = None) -> list[Any]:
    """The built-in hooks of the "3 built-in hooks" rows (``compiled``: see ``shmpool.hooks``)."""
    hooks = shmpool.hooks
    return [
        hooks.ObservationNoise(0.01, compiled=compiled),
        hooks.RewardScale(1.0, compiled=compiled),
        hooks.ActionDelay(1, compiled=compiled),
    ]


#: The profile's variants with a Perturb hook and another process waking 1,000 times a second:
#: sending nothing (what its wake-ups cost on 2 cores), and sending an event each time.
KICKED, EVENTS = "Perturb, 1,000 wake-ups/s", "Perturb, 1,000 events/s"


def phase_profile(settings: Settings) -> None:
    """Prints microseconds per step of every phase, for each variant of one configuration, and
    (CartPole-v1) what one event costs the workers and the sender."""
    env_id, num_envs = settings.envs[0], settings.num_envs[0]
    variants: dict[str, dict[str, Any]] = {"plain": {}}
    if env_id.startswith("CartPole"):
        variants["3 built-in hooks"] = {"hooks": three_hooks()}
        variants["3 params written/step"] = {"params": {name: shmpool.Param(low=0.01, high=100.0) for name in UPDATED}}
        variants[KICKED] = variants[EVENTS] = {"hooks": [shmpool.hooks.Perturb()]}
    rng = np.random.default_rng(0)
    updates = [{name: rng.uniform(low, high, num_envs) for name, (low, high) in UPDATED.items()} for _ in range(32)]
    seconds = settings.windows * settings.window_seconds
    columns: dict[str, dict[str, dict[str, float]]] = {}
    steps_of: dict[str, int] = {}
    sent = spent = cpu = 0
    for label, options in variants.items():
        print(f"profiling {env_id} x{num_envs}: {label}", file=sys.stderr, flush=True)
        with shmpool.launch(
            env_id, num_envs, num_workers=settings.workers, seed=0, profile=True, engine=settings.engine, **options
        ) as pool:
            pool.reset(seed=0)
            actions = _actions(pool.action_space, 64)
            sender = (
                start_event_sender(pool.name, 1000, label == EVENTS, seconds) if label in (KICKED, EVENTS) else None
            )
            deadline, steps, last = time.perf_counter() + seconds, 0, -1
            while steps != last:
                if "params" in options:
                    pool.params.write(None, **updates[steps % len(updates)])
                pool.step(actions[steps % len(actions)])
                steps += 1
                if last < 0 and ((time.perf_counter() >= deadline) if sender is None else sender.poll() is not None):
                    last = steps if sender is None else steps + 8  # 8 more steps deliver the last events sent
            if sender is not None:
                report = sender.communicate()[0].split()  # the idle one's says it sent nothing
                if label == EVENTS:
                    sent, spent, cpu = map(int, report)
            columns[label], steps_of[label] = pool.phase_profile(), steps
    labels = list(columns)
    print(
        f"{env_id} x{num_envs}, {settings.workers} workers, {settings.engine} engine: us per step "
        "(nested phases in parentheses)"
    )
    print(f"{'phase':<28}" + "".join(f"{label:>27}" for label in labels))
    for side in ("trainer", "workers"):
        for phase in columns[labels[0]][side]:
            name = f"({phase})" if phase in NESTED else phase
            print(
                f"{side[:-1] if side == 'workers' else side:<8}{name:<20}"
                + "".join(f"{columns[label][side][phase]:>27.1f}" for label in labels)
            )
    if sent:
        without, events = columns[KICKED]["workers"], columns[EVENTS]["workers"]
        print(event_costs(without, events, steps_of[EVENTS], settings.workers, sent, spent, cpu))


def event_costs(
    without: dict[str, float], events: dict[str, float], steps: int, workers: int, sent: int, wall_ns: int, cpu_ns: int
) -> str:
    """The line on what one event cost: the workers' extra time in each phase over a run of ``steps``
    (per worker step, ``events`` against ``without``: the same wake-ups without events) shared among
    the ``sent`` events, and the sender's mean ``send()`` (wall clock and CPU time)."""

    def per_event(*phases: str) -> float:
        extra = sum(events[phase] - without[phase] for phase in phases)  # us per step of one worker
        return extra * workers * steps / sent

    return (
        f"events: {sent} sent; per event {per_event('events'):.1f} us of worker time to deliver (events phase), "
        f"{per_event('before_step', 'after_step'):.1f} us in the hook (the kick), "
        f"{per_event('whole step'):.1f} us of worker step in all; "
        f"send() takes the sender {wall_ns / sent / 1000:.1f} us ({cpu_ns / sent / 1000:.1f} us of CPU time)"
    )


class Policy:
    """A fixed-cost policy: a tanh MLP forward of the batch of observations (float32), then argmax
    (discrete actions) or the tanh outputs scaled to the bounds (Box actions)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden: int) -> None:
        rng = np.random.default_rng(0)
        inputs = int(np.prod(observation_space.shape))
        self._discrete = isinstance(action_space, gym.spaces.Discrete)
        outputs = int(action_space.n) if self._discrete else int(np.prod(action_space.shape))
        sizes = [inputs, hidden, hidden, outputs]
        self._layers = [
            (rng.normal(0, 1 / np.sqrt(a), (a, b)).astype(np.float32), np.zeros(b, np.float32))
            for a, b in zip(sizes, sizes[1:])
        ]
        if not self._discrete:
            self._low, self._high = action_space.low, action_space.high

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        x = observations.reshape(len(observations), -1).astype(np.float32)
        for weights, bias in self._layers[:-1]:
            x = np.tanh(x @ weights + bias)
        weights, bias = self._layers[-1]
        x = x @ weights + bias
        if self._discrete:
            return x.argmax(axis=1)
        return self._low + (np.tanh(x) + 1) / 2 * (self._high - self._low)


@contextmanager
def sync_loop(make: Callable[[], Any], hidden: int) -> Iterator[Callable[[], int]]:
    """One whole-loop iteration of a synchronous vector env: policy, then step; returns env steps."""
    envs = make()
    policy = Policy(envs.single_observation_space, envs.single_action_space, hidden)
    state = {"observations": envs.reset(seed=0)[0]}

    def iteration() -> int:
        state["observations"] = envs.step(policy(state["observations"]))[0]
        return envs.num_envs

    try:
        yield iteration
    finally:
        envs.close()


@contextmanager
def async_loop(make: Callable[[], Any], hidden: int) -> Iterator[Callable[[], int]]:
    """One whole-loop iteration of shmpool's async API: recv a batch, policy, send; returns env steps."""
    pool = make()
    policy = Policy(pool.single_observation_space, pool.single_action_space, hidden)
    pool.async_reset(seed=0)

    def iteration() -> int:
        observations, _, _, _, infos = pool.recv()
        pool.send(policy(observations), infos["env_id"])
        return len(observations)

    try:
        yield iteration
    finally:
        pool.close()


class EnvPoolVector:
    """EnvPool's envs with what :func:`sync_loop` and ``PpoIteration`` use of a vector env. EnvPool
    resets a finished env at its next step (gymnasium's next-step autoreset), not within the step:
    a PPO rollout's bookkeeping is then off by a step at episode ends, which does not change its cost."""

    def __init__(self, env_id: str, num_envs: int, threads: int) -> None:
        import envpool

        self._envs = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, num_threads=threads, seed=0)
        self.num_envs = num_envs
        self.single_observation_space = self._envs.observation_space
        self.single_action_space = self._envs.action_space

    def reset(self, seed: int | None = None) -> Any:
        return self._envs.reset()  # seeded at make

    def step(self, actions: Any) -> Any:
        return self._envs.step(actions)

    def close(self) -> None:
        self._envs.close()


def loop_cases(env_id: str, num_envs: int, workers: int, hidden: int) -> list[Row]:
    """The whole-loop rows for one env and size: (label, context manager factory)."""
    from shmpool.mujoco_tasks import TASKS

    fns = [lambda: gym.make(env_id) for _ in range(num_envs)]
    half = num_envs // 2
    extra: list[Row] = []
    if env_id in TASKS and importlib.util.find_spec("mujoco.batch") is not None:
        extra.append(
            (
                "shmpool sync, mujoco engine",
                lambda: sync_loop(lambda: shmpool.launch(env_id, num_envs, seed=0, engine="mujoco"), hidden),
            )
        )
        if envpool_installed():
            extra.append(
                (
                    f"{ENVPOOL} ({workers} threads)",
                    lambda: sync_loop(lambda: EnvPoolVector(env_id, num_envs, workers), hidden),
                )
            )
    return extra + [
        (
            ("gymnasium Sync", "shmpool sync (defaults)"),  # in turns: the defaults' bar is their ratio
            lambda: in_turns(
                lambda: sync_loop(lambda: gym.vector.SyncVectorEnv(fns), hidden),
                lambda: sync_loop(lambda: shmpool.launch(env_id, num_envs, seed=0), hidden),
            ),
        ),
        ("gymnasium Async", lambda: sync_loop(lambda: gym.vector.AsyncVectorEnv(fns, shared_memory=True), hidden)),
        (
            f"shmpool sync ({workers} workers)",
            lambda: sync_loop(
                lambda: shmpool.launch(env_id, num_envs, num_workers=workers, seed=0, trainer_slot=False), hidden
            ),
        ),
        (
            f"shmpool async (B={half}, {workers} workers)",
            lambda: async_loop(
                lambda: shmpool.launch(
                    env_id, num_envs, num_workers=workers, seed=0, batch_size=half, trainer_slot=False
                ),
                hidden,
            ),
        ),
        (
            "shmpool sync (trainer slot)",
            lambda: sync_loop(
                lambda: shmpool.launch(env_id, num_envs, num_workers=workers, seed=0, trainer_slot=True), hidden
            ),
        ),
        (
            f"shmpool async (B={half}, trainer slot)",
            lambda: async_loop(
                lambda: shmpool.launch(env_id, num_envs, num_workers=2, seed=0, batch_size=half, trainer_slot=True),
                hidden,
            ),
        ),
    ]


def measure_loop(looper: Any, settings: Settings) -> Any:
    """The median env steps per second of whole-loop iterations over the timed windows, after a
    warm-up window; for a looper that yields a tuple of iterations (``in_turns``), the tuple of
    their medians, timed in turns, a window each."""
    with looper() as iterations:
        several = isinstance(iterations, tuple)
        rates: list[list[float]] = [[] for _ in iterations] if several else [[]]
        for window in range(settings.windows + 1):
            for iteration, loop_rates in zip(iterations if several else (iterations,), rates):
                env_steps = 0
                start = time.perf_counter()
                deadline = start + settings.window_seconds
                while True:
                    for _ in range(8):
                        env_steps += iteration()
                    now = time.perf_counter()
                    if now >= deadline:
                        break
                if window:
                    loop_rates.append(env_steps / (now - start))
        medians = tuple(statistics.median(loop_rates) for loop_rates in rates)
        return medians if several else medians[0]


@contextmanager
def in_turns(*makers: Callable[[], Any]) -> Iterator[Any]:
    """Several runners of one env and size, open at once, for ``measure`` or ``measure_loop`` to
    time in turns, a window each: on a shared machine whose speed drifts by tens of percent between
    minutes, their ratio then compares like with like. Yields the tuple of their steps (with the
    first one's actions and env steps per call) or of their loop iterations."""
    with ExitStack() as stack:
        opened = [stack.enter_context(make()) for make in makers]
        if isinstance(opened[0], tuple):  # steppers: (step, actions, env steps per call)
            yield tuple(step for step, _, _ in opened), opened[0][1], opened[0][2]
        else:
            yield tuple(opened)


def whole_loop(settings: Settings) -> None:
    """Prints whole-loop steps/s (policy + env steps) of every runner, with ratios to gymnasium Sync
    and to shmpool sync from the same run."""
    plan = [
        (env_id, n, case)
        for env_id, n in zip(settings.envs, settings.num_envs)
        if measurable(env_id, n)
        for case in loop_cases(env_id, n, settings.workers, settings.hidden)
    ]
    measured: dict[tuple[str, int], dict[str, float]] = {}
    for done, (env_id, num_envs, (label, looper)) in enumerate(plan, 1):
        print(f"[{done}/{len(plan)}] whole loop {env_id} x{num_envs}: {label}", file=sys.stderr, flush=True)
        rates = measure_loop(looper, settings)
        for one, rate in zip(label, rates) if isinstance(label, tuple) else [(label, rates)]:
            measured.setdefault((env_id, num_envs), {})[one] = rate
    print(f"whole loop: policy = MLP {settings.hidden}x{settings.hidden} forward of each batch, then the step")
    header = f"{'env':<16} {'num_envs':>8}  {'runner':<34} {'steps/s':>10} {'x Sync':>7} {'x shmpool sync':>15}"
    print(header)
    print("-" * len(header))
    for (env_id, num_envs), results in measured.items():
        sync = results["gymnasium Sync"]
        ours = results[f"shmpool sync ({settings.workers} workers)"]
        for label, rate in results.items():
            print(f"{env_id:<16} {num_envs:>8}  {label:<34} {rate:>10,.0f} {rate / sync:>7.2f} {rate / ours:>15.2f}")
    for env_id, num_envs in measured:
        print(best_cases(env_id, num_envs, settings.workers, settings.hidden))


# -- --ppo: CleanRL's PPO iteration, as users run it -------------------------------------------


def ppo_runners(env_id: str, num_envs: int) -> dict[str, Callable[[], Any]]:
    """The vector envs that --ppo compares, same-step autoreset each: gymnasium Sync of CleanRL's
    envs, a default launch, the numba engine where the env has a kernel; for the MuJoCo envs the
    mujoco engine has a task for, that engine and EnvPool (as many threads as cores), where installed."""
    from shmpool import kernels
    from shmpool.mujoco_tasks import TASKS
    from shmpool.system import usable_cores

    same_step = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    # CleanRL's make_env wraps each env in RecordEpisodeStatistics, for the episode returns it logs;
    # a pool reports those itself (infos["episode"]). Its continuous script's normalizing wrappers
    # are left out, as scripts/ppo.py leaves them out.
    fns = [lambda: gym.wrappers.RecordEpisodeStatistics(gym.make(env_id)) for _ in range(num_envs)]
    runners = {
        "gymnasium Sync": lambda: gym.vector.SyncVectorEnv(fns, **same_step),
        "shmpool (defaults)": lambda: shmpool.launch(env_id, num_envs, seed=0, **same_step),
    }
    if env_id in kernels.compiled_ids() and importlib.util.find_spec("numba") is not None:
        runners["shmpool numba"] = lambda: shmpool.launch(env_id, num_envs, seed=0, engine="numba", **same_step)
    if env_id in TASKS and importlib.util.find_spec("mujoco.batch") is not None:
        runners["shmpool mujoco"] = lambda: shmpool.launch(env_id, num_envs, seed=0, engine="mujoco", **same_step)
        if envpool_installed():
            runners[f"{ENVPOOL} ({usable_cores()} threads)"] = lambda: EnvPoolVector(env_id, num_envs, usable_cores())
    return runners


def ppo_loops(settings: Settings) -> None:
    """Prints CleanRL's PPO loop's env steps/s on each of ``ppo_runners`` (timed in turns, an
    iteration each), as ratios to Sync, with the env steps' share of each loop."""
    try:
        import ppo
    except SystemExit as exc:  # ppo.py names the missing extra
        raise SystemExit(f"--ppo: {exc}") from None
    from shmpool.system import usable_cores

    # torch's default (as many threads as cores), which OMP_NUM_THREADS=1 above hid
    ppo.torch.set_num_threads(settings.torch_threads or usable_cores())
    header = f"{'env':<12} {'num_envs':>8}  {'runner':<22} {'steps/s':>8} {'x Sync':>7} {'in step':>8} {'us/step':>8}"
    lines = [f"CleanRL's PPO iteration, torch with {ppo.torch.get_num_threads()} threads", header, "-" * len(header)]
    for env_id in settings.envs:
        for num_envs in settings.num_envs:
            runners = ppo_runners(env_id, num_envs)
            print(f"PPO {env_id} x{num_envs}: {', '.join(runners)}, in turns", file=sys.stderr, flush=True)
            with ExitStack() as stack:
                opened = {label: stack.enter_context(closing(make())) for label, make in runners.items()}
                loops = {label: ppo.PpoIteration(envs) for label, envs in opened.items()}
                timings: dict[str, list[tuple[float, float]]] = {label: [] for label in loops}
                for window in range(settings.windows + 1):
                    for label, iteration in loops.items():
                        start = time.perf_counter()
                        env_steps, stepping = iteration()
                        seconds = time.perf_counter() - start
                        if window:  # the first warms caches, JITs and torch
                            steps = env_steps / num_envs
                            timings[label].append((env_steps / seconds, stepping / seconds, stepping / steps))
            rates = {label: statistics.median(run[0] for run in runs) for label, runs in timings.items()}
            shares = {label: statistics.median(run[1] for run in runs) for label, runs in timings.items()}
            # A step's time in the loop, where the policy's forward runs between steps: more than the
            # same step in a loop of its own, whose code and data stay in the caches.
            step_times = {label: statistics.median(run[2] for run in runs) for label, runs in timings.items()}
            sync = rates["gymnasium Sync"]
            for label, rate in rates.items():
                lines.append(
                    f"{env_id:<12} {num_envs:>8}  {label:<22} {rate:>8,.0f} {rate / sync:>7.2f} {shares[label]:>8.0%} "
                    f"{step_times[label] * 1e6:>8,.0f}"
                )
            lines.append(
                f"{'':<12} {'':>8}  env steps take {shares['gymnasium Sync']:.0%} of Sync's iteration: a vector env "
                f"whose steps took no time would reach {1 / (1 - shares['gymnasium Sync']):.2f}x Sync"
            )
            envpool = next((rate for label, rate in rates.items() if label.startswith(ENVPOOL)), None)
            if envpool and "shmpool mujoco" in rates:
                lines.append(
                    f"{'':<12} {'':>8}  shmpool mujoco runs at {rates['shmpool mujoco'] / envpool:.2f}x EnvPool"
                )
    print("\n".join(lines))


def _microseconds_per_call(function: Callable[[], Any], seconds: float = 0.3, windows: int = 5) -> float:
    """The time of a call of ``function``: the median over ``windows`` windows of ``seconds`` in all
    of each window's mean, after a warm-up (a window the machine's noise slowed does not count)."""
    for _ in range(50):
        function()
    means = []
    for _ in range(windows):
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / windows:
            function()
            calls += 1
        means.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(means)


def best_cases(env_id: str, num_envs: int, workers: int, hidden: int) -> str:
    """The arithmetic behind the --loop rows: the best whole-loop time per ``num_envs`` env steps of
    shmpool sync and async (batches of half) on this machine's cores, with no wake-up and no idle
    core, from the parts measured one by one (the policy alone; a worker's step and the trainer's
    own share from ``launch(profile=True)``). What the measured rows lose against it is the cost of
    handing work between processes."""
    half, cores = num_envs // 2, len(os.sched_getaffinity(0))
    env = gym.make(env_id)
    policy = Policy(env.observation_space, env.action_space, hidden)
    space = gym.vector.utils.batch_space(env.observation_space, num_envs)
    space.seed(0)
    observations = space.sample()
    policy_half = _microseconds_per_call(lambda: policy(observations[:half]))
    policy_all = _microseconds_per_call(lambda: policy(observations))
    with shmpool.launch(env_id, num_envs, num_workers=workers, seed=0, profile=True) as pool:
        pool.reset(seed=0)
        actions = _actions(pool.action_space, 64)
        for step in range(300):
            pool.step(actions[step % len(actions)])
        profile = pool.phase_profile()
    worker_step = profile["workers"]["whole step"]
    trainer = profile["trainer"]  # its own slot's steps are in the workers' step too
    trainer_sync = trainer["action check"] + trainer["command"] - trainer["own slot"] + trainer["results"]
    with shmpool.launch(env_id, num_envs, num_workers=workers, seed=0, batch_size=half, profile=True) as pool:
        pool.async_reset(seed=0)
        batch_actions = _actions(gym.vector.utils.batch_space(env.action_space, half), 64)
        start = time.perf_counter()
        for batch in range(300):
            _, _, _, _, infos = pool.recv()
            pool.send(batch_actions[batch % len(batch_actions)], infos["env_id"])
        spent = (time.perf_counter() - start) * 1e6 / 300
        trainer_async = spent - pool.phase_profile()["trainer"]["wait"]  # per send: recv and send, without the wait
    env.close()
    sync_best = policy_all + trainer_sync + worker_step
    batches = num_envs // half
    trainer_round = batches * (policy_half + trainer_async)
    async_best = max(
        trainer_round,  # the trainer handles every batch
        worker_step + policy_half + trainer_async,  # a worker's batch goes through the trainer before it steps again
        (trainer_round + workers * worker_step) / cores,  # all the work, spread over every core
    )
    return (
        f"{env_id} x{num_envs}, {workers} workers, {cores} cores: best cases (no wake-up, no idle core) "
        f"{sync_best:.0f} us sync, {async_best:.0f} us async per {num_envs} env steps, so async at most "
        f"{sync_best / async_best:.2f}x sync; from the policy ({policy_half:.0f} us for {half} envs, "
        f"{policy_all:.0f} us for {num_envs}), a worker's step ({worker_step:.0f} us) and the trainer's own "
        f"share ({trainer_sync:.0f} us per step, {trainer_async:.0f} us per batch)"
    )


def write_costs(settings: Settings) -> None:
    """Prints the trainer's cost of ``params.write`` against plain numpy stores of the same values
    (which skip validation, the writers' lock and the per-env atomicity ``write`` gives)."""
    params = {name: shmpool.Param(low=0.01, high=100.0) for name in UPDATED}
    header = f"{'num_envs':>8}  {'what':<28} {'raw numpy us':>13} {'write() us':>11} {'x raw':>6}"
    print(header)
    print("-" * len(header))
    rounds = 3 if settings.quick else 15  # --quick checks what is printed, not the costs
    for num_envs in settings.num_envs:
        with shmpool.launch("CartPole-v1", num_envs, num_workers=1, params=params, seed=0) as pool:
            rng = np.random.default_rng(0)
            for count in (1, 3):
                for kind in ("numbers", "per-env arrays"):
                    values = {
                        name: float(np.mean(bounds)) if kind == "numbers" else rng.uniform(*bounds, num_envs)
                        for name, bounds in list(UPDATED.items())[:count]
                    }
                    raw, written = _write_and_raw_costs(pool.params, values, rounds)
                    what = f"{count} param{'s' if count > 1 else ''}, {kind}"
                    print(f"{num_envs:>8}  {what:<28} {raw:>13.1f} {written:>11.1f} {written / raw:>6.1f}")
            for kind in ("numbers", "arrays"):
                values = {
                    name: float(np.mean(bounds)) if kind == "numbers" else rng.uniform(*bounds, num_envs)
                    for name, bounds in UPDATED.items()
                }
                for what, cost, raw in _write_floors(pool.params, values, kind, rounds):
                    print(f"{num_envs:>8}  {what:<28} {raw:>13.1f} {cost:>11.1f} {cost / raw:>6.1f}")
    for num_envs in settings.num_envs:
        print(_worker_apply_costs(num_envs, rounds))


def _worker_apply_costs(num_envs: int, rounds: int) -> str:
    """What a worker pays to set every env's parameters when a write changed all of them (a
    curriculum's every step): with the store loop ``EnvTargets`` compiles for the parameters' names,
    and with one ``setattr`` per value, spec by spec (what it falls back to)."""
    from shmpool.workers.targets import EnvTargets, Targets

    specs = compile_specs({name: shmpool.Param(low=0.01, high=100.0) for name in UPDATED})
    targets = EnvTargets(specs, num_envs, "CartPole-v1")
    envs = [gym.make("CartPole-v1") for _ in range(num_envs)]
    for local, env in enumerate(envs):
        targets.attach(local, env)
    values = np.random.default_rng(0).uniform(0.5, 1.0, (num_envs, len(specs)))
    compiled, each = _interleaved_costs(
        [lambda: targets.write_every_row(specs, values), lambda: Targets.write_every_row(targets, specs, values)],
        rounds,
    )
    for env in envs:
        env.close()
    return (
        f"workers: {len(specs)} params set on {num_envs} envs per sync: {compiled:.1f} us with the compiled store "
        f"loop, {each:.1f} us with setattr per value ({each / compiled:.1f}x)"
    )


def _write_floors(block: Any, values: dict[str, Any], kind: str, rounds: int) -> list[tuple[str, float, float]]:
    """What any write of ``values`` (numbers, or per-env arrays: ``kind``) for every env costs at
    least, as (what, us, raw numpy us): a Python method that takes them and does nothing, and one
    that also passes them to one compiled call (numba, called as ``params.write`` calls its own:
    through the entry point of its signature) that does nothing with them: no checks, lock,
    journal or stores."""

    class NoOp:
        def write(self, env_ids: Any, **values: Any) -> int:
            return 0

    floors: list[tuple[str, Callable[..., int]]] = [(f"floor, no-op ({kind})", NoOp().write)]
    if importlib.util.find_spec("numba") is not None:
        import numba
        from numba import types

        from shmpool.protocol.compiled import entry_point

        @numba.njit
        def take(values: Any) -> int:
            return 0

        value_type = types.float64 if kind == "numbers" else types.Array(types.float64, 1, "A")
        taken = entry_point(take, (types.UniTuple(value_type, len(values)),))

        def compiled(env_ids: Any, **given: Any) -> int:
            return taken(tuple(given.values()))  # type: ignore[no-any-return]

        floors.append((f"floor, +compiled ({kind})", compiled))
    writes = [lambda w=write: w(None, **values) for _, write in floors]
    raw, *costs = _interleaved_costs([_raw_stores(block, values), *writes], rounds)
    return [(what, cost, raw) for (what, _), cost in zip(floors, costs)]


def _raw_stores(block: Any, values: dict[str, Any]) -> Callable[[], None]:
    """Plain numpy stores of ``values`` into every env's row of ``block``."""
    columns = [(block[name], value) for name, value in values.items()]

    def raw() -> None:
        for column, value in columns:
            column[:] = value

    return raw


def _write_and_raw_costs(block: Any, values: dict[str, Any], rounds: int) -> tuple[float, float]:
    """Microseconds per plain numpy store of ``values`` into every env's row, and per ``write``."""
    raw, written = _interleaved_costs([_raw_stores(block, values), lambda: block.write(None, **values)], rounds)
    return raw, written


def _interleaved_costs(functions: list[Callable[[], Any]], rounds: int, seconds: float = 0.02) -> list[float]:
    """Microseconds per call of each of ``functions``: the median over ``rounds`` rounds, each of which
    times every function for ``seconds`` in turn, so that the machine's drifts (several tens of
    percent within a second on a shared VM) slow all of them alike rather than one."""
    for function in functions:
        for _ in range(50):  # warm-up: caches, and the first writes (which load the compiled ones)
            function()
    means: list[list[float]] = [[] for _ in functions]
    for _ in range(rounds):
        for function, mean in zip(functions, means):
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                function()
                calls += 1
            mean.append((time.perf_counter() - start) / calls * 1e6)
    return [statistics.median(mean) for mean in means]


@contextmanager
def ray_cluster(simulated_nodes: int) -> Iterator[int]:
    """Connects to the Ray cluster at RAY_ADDRESS, or starts a simulated one of ``simulated_nodes``
    nodes on this machine (``ray.cluster_utils.Cluster``, loopback only, its files in a temporary
    folder); yields the number of alive nodes and shuts down what it started."""
    import shutil
    import tempfile

    if os.environ.get("RAY_ADDRESS"):
        import ray

        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        try:
            yield sum(1 for node in ray.nodes() if node["Alive"])
        finally:
            ray.shutdown()
        return
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray puts Unix sockets in it
    # Set before Ray is imported, which reads them: loopback addresses, no usage report, our folder,
    # and the workers at the local pool's priority (Ray's default, nice 15, would skew the ratio).
    os.environ.update(
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=temp, RAY_worker_niceness="0"
    )
    import ray
    from ray.cluster_utils import Cluster

    node_args = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    try:
        for _ in range(simulated_nodes - 1):
            cluster.add_node(**node_args)
        ray.init(address=cluster.address, log_to_driver=False)
        yield simulated_nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def ray_overhead(settings: Settings) -> None:
    """Prints steps/s of shmpool.ray's ClusterPool (over every node, and over one) and of a local pool
    of the same total size, with the Ray path's cost per step, from the same run."""
    import shmpool.ray

    env_id, num_envs, workers = settings.envs[0], settings.num_envs[0], settings.workers
    with ray_cluster(settings.ray_nodes) as nodes:
        per_node = max(1, num_envs // nodes)
        total, node_workers = per_node * nodes, max(1, workers // nodes)
        rows = [
            (
                f"local pool ({workers} workers)",
                lambda: vector(lambda: shmpool.launch(env_id, total, num_workers=workers, seed=0), total),
            ),
            (
                f"ClusterPool, 1 node ({workers} workers)",
                lambda: vector(lambda: shmpool.ray.launch(env_id, total, nodes=1, num_workers=workers, seed=0), total),
            ),
            (
                f"ClusterPool, {nodes} nodes ({node_workers} each)",
                lambda: vector(lambda: shmpool.ray.launch(env_id, total, num_workers=node_workers, seed=0), total),
            ),
        ]
        rates = {}
        for done, (label, stepper) in enumerate(rows, 1):
            print(f"[{done}/{len(rows)}] {env_id} x{total}: {label}", file=sys.stderr, flush=True)
            rates[label] = measure(stepper, settings)
    local = rates[rows[0][0]]
    print(f"{env_id} x{total}: shmpool.ray against a local pool of the same size (one run; ratios only)")
    header = f"{'runner':<34} {'steps/s':>10} {'us/step':>9} {'x local':>8} {'Ray cost us/step':>17}"
    print(header)
    print("-" * len(header))
    for label, rate in rates.items():
        step_us, local_us = total / rate * 1e6, total / local * 1e6
        print(f"{label:<34} {rate:>10,.0f} {step_us:>9.0f} {rate / local:>8.2f} {step_us - local_us:>17.0f}")


def scaling(settings: Settings) -> None:
    """Prints steps/s of shmpool at each worker count of --scaling against gymnasium Sync."""
    env_id = settings.envs[0]
    engines = ["python"] + (["numba"] if importlib.util.find_spec("numba") is not None else [])
    rows: list[tuple[str, int, str, float, float, float]] = []
    for num_envs in settings.num_envs:
        fns = [lambda: gym.make(env_id) for _ in range(num_envs)]
        sync = measure(functools.partial(vector, functools.partial(gym.vector.SyncVectorEnv, fns), num_envs), settings)
        rows.append((env_id, num_envs, "gymnasium Sync", sync, math.nan, 1.0))
        for engine in engines:
            for workers in settings.scaling:
                make = functools.partial(shmpool.launch, env_id, num_envs, num_workers=workers, seed=0, engine=engine)
                rate = measure(functools.partial(vector, make, num_envs), settings)
                rows.append((env_id, num_envs, f"shmpool {engine}, {workers} workers", rate, math.nan, rate / sync))
                print(f"{env_id} x{num_envs}: {engine}, {workers} workers", file=sys.stderr, flush=True)
    print(f"{os.cpu_count()} cores ('x Async' not measured)")
    print_table(rows)


def main(argv: list[str] | None = None) -> None:
    """Runs every row and prints the table."""
    settings = parse_settings(argv)
    # MuJoCo's warnings to logging, not to MUJOCO_LOG.TXT here; forked workers (Async's, shmpool's)
    # inherit it.
    from shmpool import mujoco as smj

    smj.log_to_python()
    if settings.profile:
        phase_profile(settings)
        return
    if settings.loop:
        whole_loop(settings)
        return
    if settings.ppo:
        ppo_loops(settings)
        return
    if settings.ray:
        ray_overhead(settings)
        return
    if settings.scaling:
        scaling(settings)
        return
    if settings.writes:
        write_costs(settings)
        return
    rows: list[tuple[str, int, str, float, float, float]] = []
    plan = [
        (env_id, n, case)
        for env_id in settings.envs
        for n in settings.num_envs
        if measurable(env_id, n)
        for case in cases(env_id, n, settings.workers)
    ]
    measured: dict[tuple[str, int], dict[str, float]] = {}
    for done, (env_id, num_envs, (label, stepper)) in enumerate(plan, 1):
        print(f"[{done}/{len(plan)}] {env_id} x{num_envs}: {label}", file=sys.stderr, flush=True)
        rates = measure(stepper, settings)
        for one, rate in zip(label, rates) if isinstance(label, tuple) else [(label, rates)]:
            measured.setdefault((env_id, num_envs), {})[one] = rate
    for (env_id, num_envs), results in measured.items():
        sync, async_ = results["gymnasium Sync"], results["gymnasium Async"]
        for label, rate in results.items():
            rows.append((env_id, num_envs, label, rate, rate / async_, rate / sync))
    print_table(rows)
    notes = []
    for (env_id, num_envs), results in measured.items():
        plain = results.get(f"shmpool ({settings.workers} workers)")
        if plain and "shmpool, 3 built-in hooks" in results:
            notes.append(
                f"{env_id} x{num_envs}: 3 built-in hooks cost {1 - results['shmpool, 3 built-in hooks'] / plain:.0%} "
                f"of throughput; 1,000 events/s cost {1 - results['shmpool, 1,000 events/s sent'] / plain:.0%} "
                f"(a process waking as often and sending nothing: {1 - results[WAKE_UPS] / plain:.0%})"
            )
            if COMPILED_HOOKS in results:
                notes[-1] += f"; compiled (compiled=True), the hooks cost {1 - results[COMPILED_HOOKS] / plain:.0%}"
        if plain and "shmpool, randomized" in results:
            notes.append(
                f"{env_id} x{num_envs}: per-reset mass and friction randomization costs "
                f"{1 - results['shmpool, randomized'] / plain:.0%}; randomized shmpool is "
                f"{results['shmpool, randomized'] / results['gymnasium Sync']:.2f}x Sync"
            )
        if f"shmpool, {PARAMS_WRITTEN}" in results:
            written = results[f"shmpool, {PARAMS_WRITTEN}"]
            notes.append(
                f"{env_id} x{num_envs}: param writes keep {written / results[f'shmpool, {PARAMS_IDLE}']:.2f} "
                f"of no-write throughput; {written / results['Async, set_attr x3 per step']:.1f}x Async with set_attr"
            )
        for engine in ("numba", "shmpool mujoco"):
            if f"{engine}, {PARAMS_WRITTEN}" in results:
                kept = results[f"{engine}, {PARAMS_WRITTEN}"] / results[f"{engine}, {PARAMS_IDLE}"]
                notes.append(
                    f"{env_id} x{num_envs}: {engine} engine, param writes keep {kept:.2f} of no-write throughput"
                )
    notes += compiled_notes(measured, settings.workers) + mujoco_notes(measured, settings.workers)
    if WRITE_TIMES:
        notes.append(
            f"params.write(None, 3 params) costs the trainer {statistics.median(WRITE_TIMES) * 1e6:.1f} us per update "
            f"(median over all sizes; mean {statistics.fmean(WRITE_TIMES) * 1e6:.1f} us, with the first writes, "
            f"which load the compiled writes)"
        )
    print("\n".join(notes))


def compiled_notes(measured: dict[tuple[str, int], dict[str, float]], workers: int) -> list[str]:
    """The numba engine against the Python engine and EnvPool, per env and size."""
    notes = []
    for (env_id, num_envs), results in measured.items():
        numba, python = results.get(NUMBA), results.get(f"shmpool ({workers} workers)")
        if numba is None or python is None:
            continue
        line = f"{env_id} x{num_envs}: numba engine {numba / python:.2f}x the Python engine"
        envpool = results.get(f"{ENVPOOL} ({workers} threads)")
        if envpool:
            line += f", {numba / envpool:.2f}x EnvPool"
            if NUMBA_LOADED in results:
                line += f"; with 3 params written/step and 3 hooks {results[NUMBA_LOADED] / envpool:.2f}x EnvPool"
        notes.append(line)
    if notes and not envpool_installed():
        notes.append("EnvPool rows skipped: envpool is not installed (pip install -e '.[bench]')")
    return notes


def print_table(rows: list[tuple[str, int, str, float, float, float]]) -> None:
    """Prints rows as a fixed-width table."""
    header = f"{'env':<14} {'num_envs':>8}  {'runner':<36} {'steps/s':>12} {'x Async':>8} {'x Sync':>7}"
    print(header)
    print("-" * len(header))
    for env_id, num_envs, label, rate, vs_async, vs_sync in rows:
        print(f"{env_id:<14} {num_envs:>8}  {label:<36} {rate:>12,.0f} {vs_async:>8.2f} {vs_sync:>7.2f}")


if __name__ == "__main__":
    main()
