"""Env steps per second: shmpool against the raw env loop and gymnasium's vector envs, in one run.

Every row is the median of several timed windows after a warm-up window, printed with its ratio to
gymnasium's AsyncVectorEnv and SyncVectorEnv measured in the same run (per-core speed on a shared
machine drifts between minutes, so only ratios from one run mean anything).

    python scripts/bench.py                 # full table
    python scripts/bench.py --quick         # a short run, for CI
    python scripts/bench.py --envs CartPole-v1 --num-envs 32 --workers 2
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

import shmpool


@dataclass
class Settings:
    """What to measure."""

    envs: list[str] = field(default_factory=lambda: ["CartPole-v1", "Pendulum-v1"])
    """gymnasium env ids to measure."""
    num_envs: list[int] = field(default_factory=lambda: [8, 32, 128])
    """pool sizes to measure."""
    workers: int = 2
    """shmpool worker processes (gymnasium Async uses one process per env, as it must)."""
    windows: int = 5
    """timed windows per row; the row reports their median."""
    window_seconds: float = 1.0
    """the length of one timed window."""
    quick: bool = False
    """a short run for CI: one env size (32), three 0.2 s windows."""


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Builds Settings from the command line; each field is a flag, documented by --help."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Settings()
    for settings_field in dataclasses.fields(Settings):
        flag = "--" + settings_field.name.replace("_", "-")
        default = getattr(defaults, settings_field.name)
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true", help=_field_doc(settings_field.name))
        elif isinstance(default, list):  # None marks "not given", so --quick can pick its own
            parser.add_argument(flag, nargs="+", type=type(default[0]), default=None, help=_field_doc(settings_field.name))
        else:
            parser.add_argument(flag, type=type(default), default=default, help=_field_doc(settings_field.name))
    given = vars(parser.parse_args(argv))
    if given["quick"]:
        given["windows"], given["window_seconds"] = 3, 0.2
        given["num_envs"] = given["num_envs"] or [32]
    return Settings(**{key: value for key, value in given.items() if value is not None})


def _field_doc(name: str) -> str:
    """The attribute docstring written under a Settings field."""
    lines = inspect.getsource(Settings).splitlines()
    for index, line in enumerate(lines[:-1]):
        if line.strip().startswith(f"{name}:"):
            return lines[index + 1].strip().strip('"')
    return ""


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
def vector(make: Callable[[], gym.vector.VectorEnv], num_envs: int) -> Iterator[tuple[Callable[[Any], None], list[Any], int]]:
    """Any gymnasium vector env (shmpool's Pool included); counts num_envs env steps per call."""
    envs = make()
    envs.reset(seed=0)
    actions = _actions(envs.action_space, 64)
    try:
        yield envs.step, actions, num_envs
    finally:
        envs.close()


def cases(env_id: str, num_envs: int, workers: int) -> list[tuple[str, Callable[[], Any]]]:
    """The rows measured for one env and one pool size: (label, context manager factory)."""
    fns = [lambda: gym.make(env_id) for _ in range(num_envs)]
    return [
        ("raw single-env loop", lambda: raw_loop(env_id, num_envs)),
        ("gymnasium Sync", lambda: vector(lambda: gym.vector.SyncVectorEnv(fns), num_envs)),
        ("gymnasium Async", lambda: vector(lambda: gym.vector.AsyncVectorEnv(fns, shared_memory=True), num_envs)),
        (
            f"shmpool ({workers} workers)",
            lambda: vector(lambda: shmpool.launch(env_id, num_envs, num_workers=workers, seed=0), num_envs),
        ),
    ]


def measure(stepper: Any, settings: Settings) -> float:
    """The median env steps per second over the timed windows, after one warm-up window."""
    with stepper() as (step, actions, env_steps_per_call):
        rates = []
        for window in range(settings.windows + 1):
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
                rates.append(calls * env_steps_per_call / (now - start))
        return statistics.median(rates)


def main(argv: list[str] | None = None) -> None:
    """Runs every row and prints the table."""
    settings = parse_settings(argv)
    rows: list[tuple[str, int, str, float, float, float]] = []
    total = len(settings.envs) * len(settings.num_envs) * 4
    done = 0
    for env_id in settings.envs:
        for num_envs in settings.num_envs:
            measured: dict[str, float] = {}
            for label, stepper in cases(env_id, num_envs, settings.workers):
                done += 1
                print(f"[{done}/{total}] {env_id} x{num_envs}: {label}", file=sys.stderr, flush=True)
                measured[label] = measure(stepper, settings)
            sync, async_ = measured["gymnasium Sync"], measured["gymnasium Async"]
            for label, rate in measured.items():
                rows.append((env_id, num_envs, label, rate, rate / async_, rate / sync))
    print_table(rows)


def print_table(rows: list[tuple[str, int, str, float, float, float]]) -> None:
    """Prints rows as a fixed-width table."""
    header = f"{'env':<14} {'num_envs':>8}  {'runner':<24} {'steps/s':>12} {'x Async':>8} {'x Sync':>7}"
    print(header)
    print("-" * len(header))
    for env_id, num_envs, label, rate, vs_async, vs_sync in rows:
        print(f"{env_id:<14} {num_envs:>8}  {label:<24} {rate:>12,.0f} {vs_async:>8.2f} {vs_sync:>7.2f}")


if __name__ == "__main__":
    main()
