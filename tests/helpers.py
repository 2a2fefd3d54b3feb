"""Tiny deterministic envs for tests, importable by spawned workers (the test folder is on sys.path), and
the helpers tests share: scripts run in a fresh interpreter, the ``shmpool`` command, /dev/shm entries,
``PoolConfig``'s options, arrays that run a test's hooks at their stores."""

from __future__ import annotations

import collections
import ctypes
import functools
import importlib.util
import os
import resource
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from packaging.requirements import Requirement

#: The modules of the optional extras, each with the extra that installs it: tests that need one skip
#: where it is missing (CI installs them all; the run on the oldest gymnasium installs fewer).
EXTRA_OF = {
    "numba": "numba",
    "mujoco": "mujoco",
    "ray": "ray",
    "stable_baselines3": "sb3",
    "torch": "examples",
    "matplotlib": "plot",
    "rich": "plot",
    "envpool": "bench",
    "torchrl": "torchrl",
    "rllib": "rllib",
}


#: Extras whose module is there without them (``ray`` ships ``ray.rllib``, which needs the ``rllib``
#: extra's dependencies): the distribution whose extra of that name must be installed. Read from the
#: installed metadata, not by importing RLlib: that takes seconds in every test process.
EXTRA_OF_DISTRIBUTION = {"rllib": ("ray", "rllib")}


def missing_extras(*modules: str) -> list[str]:
    """Those of ``modules`` (keys of :data:`EXTRA_OF`) that are not installed, each as its install line."""
    return [f'{module}: pip install -e ".[{EXTRA_OF[module]}]"' for module in modules if not _installed(module)]


@functools.cache
def _installed(module: str) -> bool:
    if module not in EXTRA_OF_DISTRIBUTION:
        return importlib.util.find_spec(module) is not None
    distribution, extra = EXTRA_OF_DISTRIBUTION[module]
    try:
        lines = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return False
    wanted = [
        requirement
        for requirement in map(Requirement, lines)
        if requirement.marker is not None
        and requirement.marker.evaluate({"extra": extra})
        and not requirement.marker.evaluate({"extra": ""})  # the extra's own, not the base's
    ]
    return bool(wanted) and all(_satisfied(requirement) for requirement in wanted)


def _satisfied(requirement: Requirement) -> bool:
    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        return False
    return requirement.specifier.contains(version, prereleases=True)


def needs(*modules: str) -> pytest.MarkDecorator:
    """Skips a test where one of the extras' ``modules`` is missing, saying how to install it."""
    missing = missing_extras(*modules)
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")


#: ``launch(engine=...)`` values for tests that run on both engines (numba's skipped without numba).
ENGINES = [
    "python",
    pytest.param(
        "numba",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("numba") is None, reason='needs numba: pip install ".[numba]"'
        ),
    ),
]

#: The suite runs on the oldest gymnasium the project supports as well as the newest (``.ci/run``).
#: shmpool behaves as the newest; before 1.4, gymnasium's own ``SyncVectorEnv``, which tests compare
#: against, differed in ways that are not shmpool's to copy: it refused bad input with ``assert``
#: (an ``AssertionError``, where 1.4 raises ``ValueError``/``RuntimeError``), wrote its mode into the
#: env class's shared ``metadata``, and its ``RecordEpisodeStatistics`` left the first step of each
#: episode after a same-step autoreset out of that episode's length and return.
OLD_GYMNASIUM = tuple(int(part) for part in gym.__version__.split(".")[:2]) < (1, 4)


def sync_error(error: type[BaseException]) -> type[BaseException]:
    """What ``SyncVectorEnv`` of the installed gymnasium raises for bad input that raises ``error`` on
    the pool (see :data:`OLD_GYMNASIUM`)."""
    return AssertionError if OLD_GYMNASIUM else error


def start_sigint_storm(
    pid: int, seconds: float, gap: float, *, random_gap: bool = True, signum: int = 2
) -> subprocess.Popen[bytes]:
    """Starts a process that sends SIGINT (or ``signum``) to ``pid`` every ``gap`` seconds (a random
    gap up to it, with ``random_gap``) for ``seconds``. Another process, not a thread: a thread would
    share the interpreter's lock with the code it interrupts. Reap it with ``os.waitpid(storm.pid, 0)``:
    the interrupted script's own ``storm.wait()`` could itself be cut short by the storm's last
    signals. ``pid`` must be the caller's own: the storm stops once its parent is gone, so that it
    never signals another process that took that pid."""
    sleep = f"random.uniform(0, {gap})" if random_gap else repr(gap)
    code = (
        "import os, random, sys, time\n"
        f"end = time.monotonic() + {seconds}\n"
        "while time.monotonic() < end and os.getppid() == int(sys.argv[1]):\n"
        f"    time.sleep({sleep})\n"
        f"    os.kill(int(sys.argv[1]), {int(signum)})\n"
    )
    return subprocess.Popen([sys.executable, "-c", code, str(pid)])


#: The repository's root, and the environment in which a fresh interpreter imports shmpool and this module.
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
SHM_DIR = "/dev/shm"


def _run_python(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs ``python ARGS`` in the repository root with a hard timeout; returns its exit status and output."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV)


def run_script(code: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter, arguments in ``sys.argv[1:]``; returns its exit status and output."""
    return _run_python("-c", code, *args, timeout=timeout)


def outcome_in_thread(call: Callable[[], Any], done: str = "returned") -> tuple[threading.Thread, list[str]]:
    """Starts ``call`` in a thread; the list gets ``done`` when it returns, else the name of the
    exception it raised (what the scripts that close a pool under another thread's call print)."""
    outcome: list[str] = []

    def run() -> None:
        try:
            call()
            outcome.append(done)
        except BaseException as exc:  # noqa: BLE001 - which one is the outcome
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def shmpool_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Runs the ``shmpool`` command (``python -m shmpool ARGS``) with a hard timeout."""
    return _run_python("-m", "shmpool", *args)


def start_script(code: str, *args: str, **popen: Any) -> subprocess.Popen[str]:
    """Starts ``code`` (dedented) in a fresh interpreter, arguments in ``sys.argv[1:]``, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        **popen,
    )


def shm_entries(marker: str) -> list[str]:
    """Entries of /dev/shm whose name contains ``marker``."""
    return sorted(name for name in os.listdir(SHM_DIR) if marker in name)


def remove_shm_entries(marker: str) -> None:
    """Removes the /dev/shm entries named with ``marker`` (a test's own marker: only ever ones it made),
    whatever they are: segments, directories, links, fifos, names that are not UTF-8."""
    folder = os.fsencode(SHM_DIR)
    for name in os.listdir(folder):
        if marker.encode() in name:
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)


class CountingEnv(gym.Env):
    """Observation = [steps so far, last action]; ends after ``length`` steps; reward = action.

    Faults for tests: ``raise_at`` raises in step once that many steps were taken, in the env last
    reset with seed ``raise_seed`` (all envs when it is None); ``raise_in_reset`` and
    ``raise_in_init`` raise there; ``sleep`` slows every step.
    """

    def __init__(
        self,
        length: int = 5,
        raise_at: int | None = None,
        raise_seed: int | None = None,
        raise_in_reset: bool = False,
        sleep: float = 0.0,
        raise_in_init: bool = False,
    ) -> None:
        if raise_in_init:
            raise RuntimeError("CountingEnv refused to be built")
        self.raise_seed, self.seed_used = raise_seed, None
        self.observation_space = spaces.Box(-1e6, 1e6, (2,), np.float64)
        self.action_space = spaces.Discrete(3)
        self.length, self.raise_at, self.raise_in_reset, self.sleep = length, raise_at, raise_in_reset, sleep
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.seed_used = seed
        if self.raise_in_reset:
            raise ValueError("reset exploded on purpose")
        self.t = 0
        offset = float(options.get("offset", 0)) if options else 0.0
        return np.array([offset, -1.0]), {}

    def step(self, action):
        if self.sleep:
            time.sleep(self.sleep)
        self.t += 1
        if self.raise_at is not None and self.t >= self.raise_at and self.raise_seed in (None, self.seed_used):
            explode_here(self.t)
        return np.array([float(self.t), float(action)]), float(action), self.t >= self.length, False, {}


def explode_here(t: int) -> None:
    """Raises with a recognisable name in the traceback."""
    raise ZeroDivisionError(f"boom at step {t}")


def counting(length: int) -> Callable[[], CountingEnv]:
    """A factory of :class:`CountingEnv` whose episodes last ``length`` steps."""
    return lambda: CountingEnv(length=length)


class CrashesNatively(CountingEnv):
    """A CountingEnv that kills its process from native code at its third step (``how``: "segfault"
    or "abort"), in the env last reset with seed ``crash_seed``."""

    def __init__(self, how: str = "segfault", crash_seed: int | None = None) -> None:
        super().__init__(length=100)
        self.how, self.crash_seed = how, crash_seed

    def step(self, action):
        if self.t == 2 and self.crash_seed in (None, self.seed_used):
            crash_natively_here(self.how)
        return super().step(action)


def crash_natively_here(how: str) -> None:
    """Ends this process by SIGSEGV (reading address 0) or SIGABRT, leaving no core file."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    if how == "abort":
        os.abort()
    ctypes.string_at(0)


class InfoEnv(gym.Env):
    """Reports numeric infos (nested too, and an empty dict) on some steps, and a string that
    shmpool must leave out."""

    def __init__(self, with_text: bool = False) -> None:
        self.observation_space = spaces.Box(-1, 1, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.with_text = with_text
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {"start": int(self.np_random.integers(0, 100))}

    def step(self, action):
        self.t += 1
        info: dict[str, Any] = {}
        if (self.t + int(action)) % 2:
            info["count"] = self.t
            info["ratio"] = self.t / 3.0
            info["odd"] = True
            info["vec"] = np.arange(3, dtype=np.float32) * self.t
            info["nested"] = {"depth": np.int32(self.t)}
            info[("pair", 1)] = self.t  # keys that are not strings, as gymnasium allows
            info[7] = {"seven": 0.5}
            info["reached"] = np.bool_(self.t > 2)  # gymnasium batches numpy bools into object arrays
            info["empty"] = {}  # an empty nested info is kept, as an empty dict
        if self.with_text:
            info["label"] = "text"
        return np.full(1, self.t / 10, np.float32), 1.0, self.t >= 4, False, info


class StructuredEnv(gym.Env):
    """Dict/Tuple observation and action spaces with every leaf type; the observation echoes the action."""

    def __init__(self) -> None:
        leaf_spaces = {
            "box": spaces.Box(-2.0, 2.0, (2, 3), np.float32),
            "int_box": spaces.Box(0, 255, (4,), np.uint8),
            "discrete": spaces.Discrete(5, start=-2),
            "multi": spaces.MultiDiscrete([3, 4]),
            "binary": spaces.MultiBinary(3),
        }
        self.action_space = spaces.Dict(
            {
                "a": spaces.Tuple((leaf_spaces["box"], leaf_spaces["discrete"])),
                "b": spaces.Dict({"m": leaf_spaces["multi"], "bin": leaf_spaces["binary"]}),
            }
        )
        self.observation_space = spaces.Dict(
            {
                "echo": self.action_space,
                "pixels": leaf_spaces["int_box"],
                "t": spaces.Discrete(100),
            }
        )
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.action_space.seed(int(self.np_random.integers(1 << 30)))
        return self._obs(self.action_space.sample()), {}

    def _obs(self, action):
        return {"echo": action, "pixels": self.np_random.integers(0, 255, 4, dtype=np.uint8), "t": self.t}

    def step(self, action):
        self.t += 1
        return self._obs(action), float(self.t), self.t >= 3, False, {}


class TextSpaceEnv(gym.Env):
    """An env with a Text observation space, which shmpool cannot store."""

    observation_space = spaces.Text(8)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return "hello", {}

    def step(self, action):
        return "hello", 0.0, False, False, {}


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live, non-zombie process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    """Waits until none of ``pids`` is alive; returns the ones still alive after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [pid for pid in pids if pid_alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


class PairEnv(gym.Env):
    """Observation = its attributes [a, b] as they are when it steps: shows which values it applied."""

    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.a, self.b = 0.0, 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([self.a, self.b]), {}

    def step(self, action):
        return np.array([self.a, self.b]), 0.0, False, False, {}


class EventLog:
    """A hook that appends every event it receives to a file per worker: (payload..., global step)."""

    name = "Log"

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._file = None

    def before_step(self, ctx) -> None:
        if not ctx.events:
            return
        if self._file is None:
            import os

            self._file = open(f"{self.folder}/events-{os.getpid()}.txt", "a")
        for event in ctx.events:
            self._file.write(" ".join(str(int(v)) for v in event.payload) + f" {event.step} {list(event.env_ids)}\n")
        self._file.flush()


class SeesParams:
    """Reports, as rewards, the value of parameter ``a`` that before_step saw."""

    def __init__(self) -> None:
        self.seen = None

    def before_step(self, ctx) -> None:
        self.seen = ctx.applied["a"].copy()

    def after_step(self, ctx) -> None:
        ctx.rewards[:] = self.seen


class SetsStates:
    """A hook that sets the unwrapped envs' ``state`` before global step ``t`` to ``states[t]`` (one
    array per env id): from inside the worker, as a user's hook may, with no control call."""

    def __init__(self, states: dict[int, list[np.ndarray]]) -> None:
        self.states = states

    def before_step(self, ctx) -> None:
        states = self.states.get(ctx.global_step)
        if states is not None:
            for env, env_id in zip(ctx.envs, ctx.env_ids):
                env.unwrapped.state = states[env_id].copy()


class ChangesEnv:
    """A hook that calls ``change(ctx, row)`` before global step ``at`` for the row of env ``env_id``
    (where the worker has it): a change made inside the worker, with no control call."""

    def __init__(self, at: int, env_id: int, change: Callable[[Any, int], None]) -> None:
        self.at, self.env_id, self.change = at, env_id, change

    def before_step(self, ctx) -> None:
        if ctx.global_step == self.at:
            for row in np.flatnonzero(np.asarray(ctx.env_ids) == self.env_id).tolist():
                self.change(ctx, row)


def write_action_five(ctx, row: int) -> None:
    """An action outside CartPole's ``Discrete(2)``, written by a hook after the pool checked the batch."""
    ctx.actions[row] = 5


def delete_tau(ctx, row: int) -> None:
    del ctx.envs[row].unwrapped.tau


def shrink_action_space(ctx, row: int) -> None:
    """``Discrete(1)``: CartPole's step then refuses action 1."""
    ctx.envs[row].unwrapped.action_space = spaces.Discrete(1)


def shrink_action_space_in_place(ctx, row: int) -> None:
    """The same ``Discrete`` object, holding ``0`` only from now on."""
    ctx.envs[row].unwrapped.action_space.n = np.int64(1)


def narrow_action_space_in_place(ctx, row: int) -> None:
    """The same ``Discrete`` object, of int32 from now on: an int64 action no longer casts to it."""
    ctx.envs[row].unwrapped.action_space.dtype = np.dtype(np.int32)


def remove_time_limit_count(ctx, row: int) -> None:
    """A ``TimeLimit`` whose limit is None: its step's comparison raises ``TypeError``."""
    ctx.envs[row]._max_episode_steps = None


def fallen_and_stepped_again(env: gym.Env) -> None:
    """CartPole with its pole down and one step taken since it fell: its next step warns, rewards 0."""
    env.unwrapped.state = np.array([0.0, 0.0, 0.25, 0.0])
    env.unwrapped.steps_beyond_terminated = 0


def make_fallen_and_stepped_again(ctx, row: int) -> None:
    fallen_and_stepped_again(ctx.envs[row])


def doubled_rewards(step: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``step`` with its reward doubled."""

    def doubled(action: Any) -> Any:
        observation, reward, terminated, truncated, info = step(action)
        return observation, 2.0 * reward, terminated, truncated, info

    return doubled


def double_rewards_inside(envs: list[gym.Env], row: int) -> None:
    """Patches the innermost env's ``step``, on the instance."""
    envs[row].unwrapped.step = doubled_rewards(envs[row].unwrapped.step)


def double_rewards_outside(envs: list[gym.Env], row: int) -> None:
    """Patches the outermost wrapper's ``step``, on the instance."""
    envs[row].step = doubled_rewards(envs[row].step)


def double_rewards_by_a_wrapper(envs: list[gym.Env], row: int) -> None:
    """Puts the env in a wrapper of its own, in its place in ``envs``."""
    envs[row] = gym.wrappers.TransformReward(envs[row], lambda reward: 2.0 * reward)


def doubled_rewards_method(step: Callable[..., Any]) -> Callable[..., Any]:
    """The method ``step`` with its reward doubled, to patch on a class."""

    def doubled(self: Any, action: Any) -> Any:
        observation, reward, terminated, truncated, info = step(self, action)
        return observation, 2.0 * reward, terminated, truncated, info

    return doubled


#: The classes a test patches ``step`` on: gymnasium's three wrappers that ``make`` puts on every env, the
#: ``Wrapper`` whose step ``OrderEnforcing``'s calls (``super().step``), and CartPole.
STEPPING_CLASSES = {
    kind.__name__: kind
    for kind in (gym.wrappers.TimeLimit, gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker, gym.Wrapper)
} | {"CartPoleEnv": CartPoleEnv}


class DoublesRewardsOfClass:
    """A ``ChangesEnv`` change that patches ``step`` on the class named ``name`` (in the worker's process)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, ctx, row: int) -> None:
        kind = STEPPING_CLASSES[self.name]
        kind.step = doubled_rewards_method(kind.step)


def put_a_non_env(envs: list[gym.Env], row: int) -> None:
    """Puts something without a ``step`` in the env's place."""
    envs[row] = object()


class ChangesHeldEnvs:
    """A hook that holds the slot's envs from ``on_launch`` and calls ``change(envs, row)`` on them before
    global step ``at``, without reading ``ctx.envs`` again."""

    def __init__(self, at: int, row: int, change: Callable[[list[gym.Env], int], None]) -> None:
        self.at, self.row, self.change = at, row, change

    def on_launch(self, ctx) -> None:
        self.envs = ctx.envs

    def before_step(self, ctx) -> None:
        if ctx.global_step == self.at:
            self.change(self.envs, self.row)


class OnEnvs:
    """A ``ChangesEnv`` change that calls ``change(ctx.envs, row)``: what a test also does to Sync's envs."""

    def __init__(self, change: Callable[[list[gym.Env], int], None]) -> None:
        self.change = change

    def __call__(self, ctx, row: int) -> None:
        self.change(ctx.envs, row)


def cartpole_with_float64_observations() -> gym.Env:
    """CartPole whose observation space is float64: gymnasium's float32 observations cast up into it."""
    env = gym.make("CartPole-v1")
    box = env.unwrapped.observation_space
    env.unwrapped.observation_space = spaces.Box(
        box.low.astype(np.float64), box.high.astype(np.float64), dtype=np.float64
    )
    return env


class Explodes:
    """A hook that raises in after_step from the given global step on."""

    def __init__(self, at: int) -> None:
        self.at = at

    def after_step(self, ctx) -> None:
        if ctx.global_step >= self.at:
            raise KeyError("hook went wrong on purpose")


class ShiftingInfoEnv(gym.Env):
    """Infos whose types change between reset and steps: ``dist`` is an int at reset and a float in
    steps, ``vec`` has 2 entries at reset and 2 or 3 in steps, ``level`` is float32 at reset and int16
    in steps. Envs reset with an odd seed report ``odd_dist`` as a float where the others report an
    int, and (``with_vec_mix``) ``mixed_vec`` with 3 entries where the others report 2."""

    def __init__(self, length: int = 4, with_vec_mix: bool = False) -> None:
        self.observation_space = spaces.Box(-1e6, 1e6, (1,), np.float64)
        self.action_space = spaces.Discrete(2)
        self.length, self.with_vec_mix = length, with_vec_mix
        self.t, self.odd = 0, False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.odd = bool(seed % 2)
        self.t = 0
        return np.zeros(1), {"dist": 0, "vec": np.zeros(2), "level": np.float32(0.5)}

    def step(self, action):
        self.t += 1
        info: dict[str, Any] = {
            "dist": 0.75 * self.t,
            "vec": np.arange(2 + self.t % 2, dtype=np.float64) * self.t,
            "level": np.int16(self.t),
            "odd_dist": 0.75 * self.t if self.odd else self.t,
        }
        if self.with_vec_mix:
            info["mixed_vec"] = np.full(3 if self.odd else 2, float(self.t))
        return np.array([float(self.t)]), 0.0, self.t >= self.length, False, info


class BadObservationEnv(gym.Env):
    """Returns an observation that does not fit its space (``bad``: "shape1", "scalar", "none",
    "complex"), at reset (``when="reset"``) or at its second step, if it was first reset with seed
    ``bad_seed``; ``nested`` puts the Box in a Dict."""

    def __init__(self, bad: str = "shape1", when: str = "step", nested: bool = False, bad_seed: int = 0) -> None:
        box = spaces.Box(-10.0, 10.0, (4,), np.float32)
        self.observation_space = spaces.Dict({"pos": box, "t": spaces.Discrete(10)}) if nested else box
        self.action_space = spaces.Discrete(2)
        self.bad, self.when, self.nested, self.bad_seed = bad, when, nested, bad_seed
        self.t, self.broken = 0, False

    def _obs(self, broken: bool) -> Any:
        if not (broken and self.broken):
            pos: Any = np.full(4, float(self.t), np.float32)
        else:
            pos = {
                "shape1": np.ones(1, np.float32),
                "scalar": 1.0,
                "none": None,
                "complex": np.full(4, 1 + 2j),
            }[self.bad]
        return {"pos": pos, "t": self.t} if self.nested else pos

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.broken = seed == self.bad_seed
        self.t = 0
        return self._obs(self.when == "reset"), {}

    def step(self, action):
        self.t += 1
        return self._obs(self.when == "step" and self.t == 2), 0.0, False, False, {}


class SingleLeafEnv(gym.Env):
    """Dict or Tuple spaces of a single leaf: the observation echoes the action (``kind``: "dict" for
    Dict observations and actions, "tuple" for a Tuple observation and a Dict action)."""

    def __init__(self, kind: str = "dict") -> None:
        box = spaces.Box(-5.0, 5.0, (3,), np.float32)
        self.observation_space = spaces.Dict({"x": box}) if kind == "dict" else spaces.Tuple((box,))
        self.action_space = spaces.Dict({"a": spaces.Box(-1.0, 1.0, (3,), np.float32)})
        self.kind = kind
        self.t = 0

    def _obs(self, values: np.ndarray) -> Any:
        return {"x": values} if self.kind == "dict" else (values,)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(self.np_random.uniform(-1, 1, 3).astype(np.float32)), {}

    def step(self, action):
        self.t += 1
        return self._obs(np.asarray(action["a"], np.float32) + self.t), 1.0, self.t >= 3, False, {}


class EchoActionEnv(gym.Env):
    """Observation = [steps in this episode, the action it received]; the action is a float Box."""

    observation_space = spaces.Box(-1e9, 1e9, (2,), np.float64)
    action_space = spaces.Box(-1e9, 1e9, (1,), np.float64)

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, -1.0]), {}

    def step(self, action):
        self.t += 1
        return np.array([float(self.t), float(action[0])]), 0.0, False, False, {}


class ResetWhereNotResetting:
    """A reset hook that reads ``ctx.resetting`` first (to skip envs already resetting), then asks to
    reset the rows of env ``env_id`` at global step ``at``."""

    name = "ResetAt"

    def __init__(self, env_id: int, at: int) -> None:
        self.env_id, self.at = env_id, at

    def before_step(self, ctx) -> None:
        rows = ctx.rows(np.intersect1d(ctx.env_ids, [self.env_id]))
        rows = rows[~ctx.resetting[rows]]
        if ctx.global_step == self.at and rows.size:
            ctx.request_reset(rows)


class ResetRowsAt:
    """Asks, at global step ``at``, to reset the rows ``rows`` exactly as given (a mask, ids, anything)."""

    def __init__(self, rows: Any, at: int) -> None:
        self.rows_given, self.at, self.name = rows, at, f"ResetRowsAt{at}"

    def before_step(self, ctx) -> None:
        if ctx.global_step == self.at:
            ctx.request_reset(self.rows_given)


class SeesResetting:
    """Reports, as rewards, the ``ctx.resetting`` flags that its before_step saw."""

    def __init__(self) -> None:
        self.seen = None

    def before_step(self, ctx) -> None:
        self.seen = ctx.resetting.astype(np.float64)

    def after_step(self, ctx) -> None:
        ctx.rewards[:] = self.seen


class StepMarkerEnv(gym.Env):
    """Creates the file ``folder/stepping-PID`` as each step begins, then sleeps ``sleep`` seconds: a
    test can wait for the file to act while the worker is inside ``env.step``."""

    observation_space = spaces.Box(-1e6, 1e6, (1,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, folder: str, sleep: float = 30.0) -> None:
        self.folder, self.sleep = folder, sleep

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1), {}

    def step(self, action):
        import os

        with open(f"{self.folder}/stepping-{os.getpid()}", "w"):
            pass
        time.sleep(self.sleep)
        return np.zeros(1), 0.0, False, False, {}


class OneInfoEnv(gym.Env):
    """Reports ``value`` under ``v`` and the step count under ``count`` on every step."""

    observation_space = spaces.Box(-1e6, 1e6, (1,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, value: Any) -> None:
        self.value, self.t = value, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1), {}

    def step(self, action):
        self.t += 1
        return np.array([float(self.t)]), 1.0, False, False, {"v": self.value, "count": self.t}


class BigInfoEnv(OneInfoEnv):
    """Reports ``big`` (9 float64: 72 bytes), ``fits`` (8 float64: 64 bytes) and ``count``, all equal
    to the step count, on every step."""

    def __init__(self) -> None:
        super().__init__(None)

    def step(self, action):
        self.t += 1
        info = {"big": np.full(9, float(self.t)), "fits": np.full(8, float(self.t)), "count": self.t}
        return np.array([float(self.t)]), 1.0, False, False, info


class MetricEnv(gym.Env):
    """Episodes of ``3 + seed % 3`` steps (the seed of its last seeded reset); reward 1 per step. Its
    info at step ``t`` holds ``is_success`` = t / 10 and ``stats/score`` = -t, and ``first`` only at
    step 1: the values at an episode's last step are known from its length."""

    observation_space = spaces.Box(-1e6, 1e6, (1,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.t, self.length = 0, 3

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.length = 3 + seed % 3
        self.t = 0
        return np.zeros(1), {}

    def step(self, action):
        self.t += 1
        info: dict[str, Any] = {"is_success": self.t / 10, "stats": {"score": -self.t}}
        if self.t == 1:
            info["first"] = 1.0
        return np.array([float(self.t)]), 1.0, self.t >= self.length, False, info


class TerminateAfter:
    """A hook that ends, in ``after_step``, the episode of every env whose observation[0] (its step
    count, for ``CountingEnv``) reached ``steps``."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def after_step(self, ctx) -> None:
        ctx.terminations[ctx.stepped & (ctx.observations[:, 0] >= self.steps)] = True


class HalfTimeLimit(gym.wrappers.TimeLimit):
    """A TimeLimit subclass that truncates at half its limit: a pool must step it, not pass over it
    as it passes over gymnasium's own TimeLimit."""

    def step(self, action):  # type: ignore[no-untyped-def]
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated, truncated or 2 * self._elapsed_steps >= self._max_episode_steps, info


def pendulum_with_half_limit() -> gym.Env:
    """Pendulum-v1 with gymnasium's own wrappers, under a :class:`HalfTimeLimit` of 20 steps."""
    return HalfTimeLimit(gym.make("Pendulum-v1", max_episode_steps=40), 20)


def count_kick(env: gym.Env, amounts: np.ndarray) -> None:
    """A Perturb kick that only counts its calls, on the env (read back with ``get_attr("kicks")``)."""
    env.unwrapped.kicks = getattr(env.unwrapped, "kicks", 0) + 1


class FailsItsAutoreset(CountingEnv):
    """A CountingEnv of 3 steps whose second reset (its first autoreset, inside a step) raises, in
    the env first reset with seed 3."""

    def __init__(self) -> None:
        super().__init__(length=3)
        self.resets = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
        self.resets += 1
        if self.resets == 2 and self.seed_used == 3:
            raise ValueError("the autoreset exploded on purpose")
        return super().reset(seed=seed, options=options)


def scale_reward_under_time_limit(env: gym.Env) -> None:
    """Puts a wrapper multiplying rewards by 10 right under the env's outermost wrapper (its TimeLimit)."""
    env.env = gym.wrappers.TransformReward(env.env, lambda reward: 10.0 * reward)


def double_reward_step(env: gym.Env) -> None:
    """Patches the env's own ``step`` (as instrumentation does) to double its reward."""
    step = env.step

    def doubled(action):  # type: ignore[no-untyped-def]
        observation, reward, terminated, truncated, info = step(action)
        return observation, 2.0 * reward, terminated, truncated, info

    env.step = doubled


class MixedInfoEnv(gym.Env):
    """Infos whose kinds differ between envs (``index``): ``"bool_then_array"``, a numpy bool in env 0
    and an int array in env 1 under one key (gymnasium then holds the array in an object array);
    ``"empty_ordered_dict"``, an empty ``OrderedDict`` (gymnasium keeps it as an empty dict)."""

    def __init__(self, scenario: str, index: int) -> None:
        self.observation_space = spaces.Box(-1, 1, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.scenario, self.index, self.t = scenario, index, 0

    def _info(self) -> dict[str, Any]:
        if self.scenario == "bool_then_array":
            return {"k": np.bool_(self.t % 2 == 0)} if self.index == 0 else {"k": np.array([self.t, self.t])}
        return {"d": collections.OrderedDict(), "n": self.t}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
        super().reset(seed=seed)
        return np.zeros(1, np.float32), self._info()

    def step(self, action):  # type: ignore[no-untyped-def]
        self.t += 1
        return np.zeros(1, np.float32), 1.0, False, False, self._info()


class RenamedCartPole(CartPoleEnv):
    """CartPole under another class name: its adapter is found through its class hierarchy."""


def pool_config_options() -> list[tuple[str, object, object]]:
    """``PoolConfig``'s options after ``env`` and ``num_envs``: (name, default, annotation) in order."""
    from dataclasses import MISSING, fields

    from shmpool.config import PoolConfig

    return [
        (option.name, None if option.default is MISSING else option.default, option.type)
        for option in fields(PoolConfig)
        if option.init and option.name not in ("env", "num_envs")
    ]


#: What a test runs at a chosen point of a write (see :class:`Fuse`): a reader, or the writer's death.
Hook = Callable[[], None]


class Fuse:
    """Watches the stores into a protocol object's arrays: runs hooks just before the n-th store."""

    def __init__(self) -> None:
        self.bases: list[np.ndarray] = []
        self.hooks: dict[int, list[Hook]] = {}
        self.after: Callable[[np.ndarray, Any], None] | None = None
        self.armed = False
        self.count = 0

    def arm(self, hooks: dict[int, list[Hook]], after: Callable[[np.ndarray, Any], None] | None = None) -> None:
        """Counts stores from 0, running ``hooks[n]`` before store n and ``after`` after each."""
        self.hooks, self.after, self.armed, self.count = hooks, after, True, 0

    def disarm(self) -> None:
        """Stops watching."""
        self.hooks, self.after, self.armed = {}, None, False

    def watches(self, array: np.ndarray) -> bool:
        """Whether ``array`` is (a view of) one of the watched arrays, rather than a copy of one."""
        return any(np.may_share_memory(array, base) for base in self.bases)


class Tripwire(np.ndarray):
    """An array whose item stores go through its :class:`Fuse` (views inherit the fuse)."""

    fuse: Fuse | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self.fuse = getattr(obj, "fuse", None)

    def __setitem__(self, key: Any, value: Any) -> None:
        fuse = self.fuse
        if fuse is None or not fuse.armed or not fuse.watches(self):
            super().__setitem__(key, value)
            return
        index = fuse.count
        fuse.count += 1
        for hook in fuse.hooks.get(index, ()):
            hook()
        super().__setitem__(key, value)
        if fuse.after is not None:
            fuse.after(self, key)


def tripwire(array: np.ndarray, fuse: Fuse) -> Tripwire:
    """``array`` as a watched :class:`Tripwire` (same memory)."""
    watched = array.view(Tripwire)
    watched.fuse = fuse
    fuse.bases.append(watched)
    return watched
