"""The shmpool demo: a policy learns CartPole while an external ADR curriculum widens the physics.

1. Launches a pool of CartPole envs whose pole length, pole mass and gravity are randomized per
   episode (``dist="uniform"`` parameters, starting at their nominal values).
2. Starts ``scripts/curriculum.py --algo adr`` as a separate process that attaches to the pool by
   name: it reads finished episodes and widens each parameter's range while the policy copes.
3. Improves a linear controller with the cross-entropy method against those widening ranges.
4. Prints a summary table and saves a plot of the ranges and the returns (``--plot``).

    python scripts/demo.py            # about 25 s on 2 cores
    python scripts/demo.py --quick    # a few seconds, for CI
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import _settings
import numpy as np

import shmpool

try:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Column
except ImportError as exc:
    raise SystemExit(f'the demo draws its progress with rich: pip install -e ".[plot]" ({exc})') from exc

HERE = Path(__file__).resolve().parent

#: The randomized parameters: (nominal value, hard low, hard high).
PHYSICS = {"length": (0.5, 0.2, 2.0), "masspole": (0.1, 0.02, 1.0), "gravity": (9.8, 4.0, 20.0)}


@dataclass
class Settings:
    """What the demo runs."""

    num_envs: int = 64
    """envs in the pool."""
    num_workers: int = 2
    """worker processes."""
    generations: int = 60
    """cross-entropy generations."""
    population: int = 16
    """candidate policies per generation."""
    elites: int = 4
    """candidates kept per generation."""
    max_steps: int = 500
    """steps per evaluation episode."""
    seed: int = 0
    """seed of the pool and the optimizer."""
    plot: str = "demo.png"
    """where to save the PNG plot ('' for none)."""
    workdir: str = ""
    """folder for the curriculum's state file and log ('': a new temporary folder, kept and printed)."""
    quick: bool = False
    """a short run for CI: 16 envs, 4 generations, 200 steps."""


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Reads Settings from the command line."""
    settings = _settings.parse(Settings, argv, description=__doc__)
    if settings.quick:
        settings.num_envs, settings.generations, settings.population, settings.elites, settings.max_steps = (
            16,
            4,
            8,
            2,
            200,
        )
    if settings.num_envs % settings.population:
        raise SystemExit("--num-envs must be a multiple of --population")
    return settings


def evaluate(pool: shmpool.Pool, weights: np.ndarray, max_steps: int) -> np.ndarray:
    """The return of each env's first episode under its candidate's linear policy (one row of
    ``weights`` per env: action 1 when w . [obs, 1] > 0)."""
    observations, _ = pool.reset()
    returns = np.zeros(pool.num_envs)
    finished = np.zeros(pool.num_envs, dtype=bool)
    for _ in range(max_steps):
        features = np.concatenate([observations, np.ones((pool.num_envs, 1))], axis=1)
        actions = (np.einsum("ij,ij->i", features, weights) > 0).astype(np.int64)
        observations, rewards, terminations, truncations, _ = pool.step(actions)
        returns += np.where(finished, 0.0, rewards)
        finished |= terminations | truncations
        if finished.all():
            break
    return returns


def wait_attached(curriculum: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    """Waits until the curriculum process says it has attached to the pool, so that it sees the
    episodes from the first generation on (a --quick run can end before a late one attaches)."""
    deadline = time.monotonic() + timeout
    while "attached to" not in log.read_text():
        if curriculum.poll() is not None or time.monotonic() > deadline:
            curriculum.kill()
            curriculum.wait()
            raise SystemExit(f"the curriculum did not attach to the pool; its log: {log}")
        time.sleep(0.01)


def progress_bar() -> Progress:
    """A progress bar on stderr: live on a terminal; in a pipe, a log or CI, rich draws it once, as
    plain text, when it stops."""
    return Progress(
        TextColumn("generation"),
        MofNCompleteColumn(),
        BarColumn(bar_width=20),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}", table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis")),
        console=Console(stderr=True),
        expand=True,  # the status takes the width left and is cut short, so the bar always shows
    )


def save_plot(path: str, history: list[dict], thresholds: tuple[float, float]) -> str:
    """Plots the ADR ranges and the returns per generation; returns what happened."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 'matplotlib is not installed (pip install -e ".[plot]"): no plot'
    generations = [row["generation"] for row in history]
    # Returns above, each range below on the same generation axis: a widening range shows as the
    # band growing, and a dip in the returns above it as the policy meets the harder physics.
    names = list(PHYSICS)
    figure, axes = plt.subplot_mosaic([["returns"] * len(names), names], sharex=True, figsize=(12, 6.4))
    axes["returns"].plot(generations, [row["mean"] for row in history], label="mean return (all candidates)")
    axes["returns"].plot(generations, [row["best"] for row in history], label="best candidate", alpha=0.6)
    axes["returns"].set_title("returns of the policies, as the ADR curriculum (a separate process) widens the physics")
    axes["returns"].axhline(thresholds[1], color="green", linestyle="--", linewidth=0.8, label="ADR widens above")
    axes["returns"].axhline(thresholds[0], color="red", linestyle="--", linewidth=0.8, label="ADR narrows below")
    axes["returns"].legend(loc="lower right", ncol=2)
    for name, (nominal, low, high) in PHYSICS.items():
        axis = axes[name]
        lows = [row["ranges"].get(name, [nominal, nominal])[0] for row in history]
        highs = [row["ranges"].get(name, [nominal, nominal])[1] for row in history]
        axis.fill_between(generations, lows, highs, alpha=0.4, step="post", label="ADR range")
        axis.axhline(nominal, color="black", linewidth=0.8, label="nominal")
        axis.set_ylim(low, high)
        axis.set_title(f"{name}: drawn per episode from")
        axis.set_xlabel("generation")
    axes[names[0]].legend(loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    return f"plot saved to {path}"


def main(argv: list[str] | None = None) -> int:
    """Runs the demo."""
    settings = parse_settings(argv)
    params = {
        name: shmpool.Param(dist="uniform", default={"low": nominal, "high": nominal}, low=low, high=high, when="reset")
        for name, (nominal, low, high) in PHYSICS.items()
    }
    workdir = Path(settings.workdir) if settings.workdir else Path(tempfile.mkdtemp(prefix="shmpool-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    state_file = workdir / "adr.json"
    rng = np.random.default_rng(settings.seed)
    mean, std = np.zeros(5), np.ones(5)
    per_candidate = settings.num_envs // settings.population
    history: list[dict] = []
    # A boundary's episodes (run by every candidate policy, good or bad) widen it at 30% of the
    # longest return, narrow it at 10%: the population's mean passes 30% within about ten generations.
    thresholds = (0.1 * settings.max_steps, 0.3 * settings.max_steps)
    started = time.perf_counter()
    with shmpool.launch(
        "CartPole-v1", settings.num_envs, num_workers=settings.num_workers, params=params, seed=settings.seed
    ) as pool:
        curriculum = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "curriculum.py"),
                "--pool",
                pool.name,
                "--algo",
                "adr",
                "--state",
                str(state_file),
                "--low-threshold",
                str(thresholds[0]),
                "--high-threshold",
                str(thresholds[1]),
                "--buffer",
                "4",
                "--delta",
                "0.05",
                "--p-boundary",
                "0.5",
                "--log-every",
                "3600",
            ],
            stdout=open(workdir / "curriculum.log", "w"),
            stderr=subprocess.STDOUT,
        )
        print(
            f"pool {pool.name}: {settings.num_envs} CartPole envs on {settings.num_workers} workers; "
            f"ADR curriculum in process {curriculum.pid} (log: {workdir / 'curriculum.log'})"
        )
        wait_attached(curriculum, workdir / "curriculum.log")
        steps_before = 0
        with progress_bar() as bar:
            task = bar.add_task("generations", total=settings.generations, status="")
            for generation in range(1, settings.generations + 1):
                candidates = mean + std * rng.standard_normal((settings.population, 5))
                returns = evaluate(pool, np.repeat(candidates, per_candidate, axis=0), settings.max_steps)
                scores = returns.reshape(settings.population, per_candidate).mean(axis=1)
                elite = candidates[np.argsort(scores)[-settings.elites :]]
                mean, std = elite.mean(axis=0), elite.std(axis=0) + 0.02
                ranges = json.loads(state_file.read_text())["ranges"] if state_file.exists() else {}
                history.append(
                    {
                        "generation": generation,
                        "mean": float(returns.mean()),
                        "best": float(scores.max()),
                        "ranges": ranges,
                    }
                )
                shown = " ".join(f"{n}=[{lo:.3g},{hi:.3g}]" for n, (lo, hi) in ranges.items())
                bar.update(task, advance=1, status=f"return {returns.mean():5.1f}  {shown}")
        steps = pool.global_step * pool.num_envs - steps_before
    elapsed = time.perf_counter() - started
    try:
        curriculum.wait(timeout=10)  # it stops by itself once the pool has gone away
    except subprocess.TimeoutExpired:
        curriculum.kill()
        curriculum.wait()

    print(f"\n{'generation':>10} {'mean return':>12} {'best':>8}  ADR ranges")
    rows = history[:: max(1, len(history) // 10)]
    if history and rows[-1] is not history[-1]:
        rows.append(history[-1])
    for row in rows:
        shown = "  ".join(f"{n} [{lo:.3g}, {hi:.3g}]" for n, (lo, hi) in row["ranges"].items()) or "(not yet)"
        print(f"{row['generation']:>10} {row['mean']:>12.1f} {row['best']:>8.1f}  {shown}")
    print(f"\n{steps:,} env steps in {elapsed:.1f} s ({steps / elapsed:,.0f} steps/s, policy and curriculum included)")
    if settings.plot:
        print(save_plot(settings.plot, history, thresholds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
