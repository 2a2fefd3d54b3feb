"""The runnable programs in scripts/ run and print what they promise."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import helpers
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import _settings  # noqa: E402  (scripts/ is not a package: the scripts import it as their neighbour)


@dataclass
class Example:
    """Settings of every kind the helper handles."""

    pool: str
    """the pool to attach to."""
    num_envs: int = 64
    """envs in
    the pool (a 100% sure thing)."""
    envs: list[str] = field(default_factory=lambda: ["CartPole-v1", "Pendulum-v1"])
    """env ids."""
    algo: Literal["adr", "threshold"] = "adr"
    """which curriculum."""
    state: str | None = None
    """a JSON file."""
    rate: float = 0.5
    quick: bool = False
    """a short run."""
    color: bool = True
    """colored output."""


def test_settings_helper_reads_attribute_docstrings() -> None:
    assert _settings.field_docs(Example) == {
        "pool": "the pool to attach to.",
        "num_envs": "envs in the pool (a 100% sure thing).",
        "envs": "env ids.",
        "algo": "which curriculum.",
        "state": "a JSON file.",
        "quick": "a short run.",
        "color": "colored output.",
    }
    text = _settings.build_parser(Example, description="the example", groups={"extra": ["rate"]}).format_help()
    assert "the example" in text and "envs in the pool (a 100% sure thing) (default: 64)" in " ".join(text.split())
    assert "--envs ENVS [ENVS ...]" in text and "(default: CartPole-v1 Pendulum-v1)" in text
    assert "{adr,threshold}" in text and "--color, --no-color" in text and "\nextra:\n  --rate RATE" in text


def test_settings_helper_types_defaults_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    settings = _settings.parse(Example, ["--pool", "p"])
    assert settings == Example("p")
    settings = _settings.parse(
        Example,
        "--pool p --num-envs 8 --envs A B --envs C --algo threshold --state s.json --rate 2 --quick --no-color".split(),
    )
    assert dataclasses.astuple(settings) == ("p", 8, ["A", "B", "C"], "threshold", "s.json", 2.0, True, False)
    assert type(settings.rate) is float
    assert _settings.parse_given(Example, ["--pool", "p", "--rate", "1"]) == {"pool": "p", "rate": 1.0, "quick": False}
    assert Example("p").envs == ["CartPole-v1", "Pendulum-v1"]  # the default list is never extended in place
    for argv, message in [
        ([], "the following arguments are required: --pool"),
        (["--pool", "p", "--algo", "x"], "invalid choice: 'x'"),
        (["--pool", "p", "--num-envs", "1.5"], "invalid int value: '1.5'"),
    ]:
        with pytest.raises(SystemExit):
            _settings.parse(Example, argv)
        assert message in capsys.readouterr().err


SCRIPTS = (
    "bench",
    "demo",
    "curriculum",
    "robot_dr",
    "soak",
    "ppo",
    "envpool_loop",
    "rllib_ppo",
    "torchrl_ppo",
    "tianshou_collector",
    "dr_study",
)

#: The extras' modules each script imports (see helpers.EXTRA_OF).
SCRIPT_NEEDS = {
    "demo": ("rich", "matplotlib"),
    "ppo": ("torch", "matplotlib"),
    "robot_dr": ("mujoco",),
    "dr_study": ("torch", "matplotlib", "mujoco"),
}


@pytest.mark.parametrize(
    "script",
    [pytest.param(script, marks=helpers.needs(*SCRIPT_NEEDS.get(script, ()))) for script in SCRIPTS],
)
def test_scripts_document_their_options(script: str) -> None:
    result = subprocess.run(
        [sys.executable, f"scripts/{script}.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    options = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  --")]
    assert len(options) >= 5 and "--quick" in options or script == "curriculum"
    assert "(default: " in result.stdout


#: Windows as short as still time a step: these tests check what bench.py prints, not the speeds.
SHORT_WINDOWS = ("--windows", "1", "--window-seconds", "0.05")
#: torch's threads spin between parallel regions, burning cores that the suite's other tests need.
ONE_TORCH_THREAD = ("--torch-threads", "1")


def bench_lines(*options: str, env: str = "CartPole-v1", num_envs: int = 8) -> list[str]:
    """What ``scripts/bench.py --quick --envs ENV --num-envs NUM_ENVS`` with one short window and
    ``OPTIONS`` prints, line by line."""
    command = ["scripts/bench.py", "--quick", "--envs", env, "--num-envs", str(num_envs), *SHORT_WINDOWS, *options]
    result = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()


def test_bench_writes_prints_write_costs_against_raw_numpy() -> None:
    lines = bench_lines("--writes")
    assert "raw numpy us" in lines[0] and "write() us" in lines[0]
    table, workers = lines[2:-1], lines[-1]
    rows = [line.split(maxsplit=1) for line in table]
    whats = [what.rsplit(maxsplit=3)[0] for _, what in rows]
    compiled = importlib.util.find_spec("numba") is not None
    floors = [
        what
        for kind in ("numbers", "arrays")
        for what in [f"floor, no-op ({kind})"] + ([f"floor, +compiled ({kind})"] if compiled else [])
    ]
    assert whats == [
        "1 param, numbers",
        "1 param, per-env arrays",
        "3 params, numbers",
        "3 params, per-env arrays",
        *floors,
    ]
    for _, what in rows:
        raw, written, ratio = (float(number) for number in what.split()[-3:])
        assert raw > 0 and written > 0 and ratio > 0
    # What a worker pays to apply them, with the store loop it compiles and without.
    compiled_loop = r"workers: 3 params set on 8 envs per sync: [\d.]+ us with the compiled store loop, .*x\)"
    assert re.fullmatch(compiled_loop, workers)


@helpers.needs("torch")
def test_bench_ppo_times_cleanrls_loop_on_sync_and_the_pool() -> None:
    lines = bench_lines("--ppo", *ONE_TORCH_THREAD)
    assert lines[0] == "CleanRL's PPO iteration, torch with 1 threads"
    row = re.compile(r"CartPole-v1 +8 +(.+?) +([\d,]+) +(\d+\.\d\d) +(\d+)% +([\d,]+)")
    rows = {m[1]: (float(m[3]), int(m[4]), int(m[5].replace(",", ""))) for m in map(row.fullmatch, lines[3:]) if m}
    numba = ["shmpool numba"] if importlib.util.find_spec("numba") else []
    assert list(rows) == ["gymnasium Sync", "shmpool (defaults)", *numba]
    assert rows["gymnasium Sync"][0] == 1.0 and all(0 < share < 100 for _, share, _ in rows.values())
    assert all(step_us > 0 for *_, step_us in rows.values())
    assert re.search(r"env steps take \d+% of Sync's iteration: .* would reach \d+\.\d\dx Sync", lines[-1])


@helpers.needs("torch", "mujoco")
def test_bench_ppo_on_a_robot_adds_the_mujoco_engine_and_envpool() -> None:
    lines = bench_lines("--ppo", *ONE_TORCH_THREAD, env="Hopper-v5", num_envs=2)
    row = re.compile(r"Hopper-v5 +2 +(.+?) +([\d,]+) +(\d+\.\d\d) +(\d+)% +([\d,]+)")
    rows = [m[1] for m in map(row.fullmatch, lines) if m]
    envpool = importlib.util.find_spec("envpool") is not None
    assert rows[:3] == ["gymnasium Sync", "shmpool (defaults)", "shmpool mujoco"]
    assert len(rows) == 3 + envpool
    if envpool:
        assert re.fullmatch(r"EnvPool \(\d+ threads\)", rows[3])
        assert re.fullmatch(r" +shmpool mujoco runs at \d+\.\d\dx EnvPool", lines[-1])


def test_bench_quick_prints_a_table() -> None:
    lines = bench_lines()
    assert "x Async" in lines[0] and "x Sync" in lines[0]
    runners = [line for line in lines[2:] if line.startswith("CartPole-v1") and line.split()[1].isdigit()]
    labels = [
        "raw single-env loop",
        "gymnasium Sync",
        "gymnasium Async",
        "shmpool (2 workers)",
        "shmpool, 3 built-in hooks",
        "shmpool, 1,000 events/s sent",
        "shmpool, 3 params, no writes",
        "shmpool, 3 params written/step",
        "Async, set_attr x3 per step",
    ]
    assert [label for label in labels if any(label in line for line in runners)] == labels
    sync_row = next(line for line in runners if "gymnasium Sync" in line)
    assert sync_row.split()[-1] == "1.00"
    assert any("of no-write throughput" in line and "x Async with set_attr" in line for line in lines)
    assert any("us per update" in line for line in lines)
    assert any("3 built-in hooks cost" in line and "1,000 events/s cost" in line for line in lines)


@helpers.needs("mujoco")
def test_bench_times_the_mujoco_engine_in_turns_with_what_its_bars_compare() -> None:
    lines = bench_lines("--envs", "HalfCheetah-v5")
    rows = (re.fullmatch(r"HalfCheetah-v5 +8 +(.+?) +[\d,]+ +[\d.]+ +[\d.]+", line) for line in lines)
    runners = [row[1] for row in rows if row]
    compared = [
        "mujoco.batch floor (2 threads)",
        "shmpool mujoco",
        "shmpool mujoco, 4 params/episode + Push",
        "shmpool python, 4 params/episode + Push",
    ]
    envpool = importlib.util.find_spec("envpool") is not None
    compared += ["EnvPool (2 threads)"] if envpool else []
    start = runners.index(compared[0])
    assert runners[start : start + len(compared)] == compared  # one row of the table, timed in turns
    note = next(line for line in lines if "x the bare physics" in line)
    assert "randomized" in note and "the Python engine randomized" in note and ("x EnvPool" in note) == envpool


def test_bench_loop_prints_every_runner_and_the_best_cases() -> None:
    lines = bench_lines("--loop")
    rows = [line for line in lines if line.startswith("CartPole-v1 ") and line.split()[1] == "8"]
    assert [row[26:60].strip() for row in rows if "shmpool" in row] == [
        "shmpool sync (defaults)",  # measured in turns with gymnasium Sync, so printed after it
        "shmpool sync (2 workers)",
        "shmpool async (B=4, 2 workers)",
        "shmpool sync (trainer slot)",
        "shmpool async (B=4, trainer slot)",
    ]
    best = next(line for line in lines if "best cases" in line)
    sync_us, async_us = (float(best.split(" us " + kind)[0].split()[-1]) for kind in ("sync", "async"))
    ratio = float(best.split("async at most ")[1].split("x")[0])
    assert sync_us > 0 and async_us > 0 and ratio == pytest.approx(sync_us / async_us, abs=0.02)


@helpers.needs(*SCRIPT_NEEDS["demo"])
def test_demo_quick_runs_curriculum_and_plots(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    result = subprocess.run(
        [sys.executable, "scripts/demo.py", "--quick", "--plot", str(plot), "--workdir", str(tmp_path / "work")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "ADR curriculum in process" in result.stdout and "mean return" in result.stdout
    assert "env steps in" in result.stdout and f"plot saved to {plot}" in result.stdout
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Not on a terminal: the progress bar is drawn once, as one plain line (no \r, no escape codes).
    assert "\r" not in result.stdout + result.stderr and "\x1b" not in result.stdout + result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("generation 4/4")], result.stderr
    table = [line.split()[0] for line in result.stdout.splitlines() if line[:10].strip().isdigit()]
    assert table == ["1", "2", "3", "4"]  # one row per generation here, the last one only once


@helpers.needs(*SCRIPT_NEEDS["demo"])
def test_demo_widens_the_ranges_once_the_policies_reach_the_threshold() -> None:
    """A short demo (20 generations of 200 steps): the curriculum, a separate process, widens at
    least one range away from its nominal value once the candidates' returns pass 30% of the longest."""
    options = ["--num-envs", "32", "--population", "8", "--elites", "2", "--generations", "20", "--max-steps", "200"]
    result = subprocess.run(
        [sys.executable, "scripts/demo.py", *options, "--plot", ""],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    last = [line for line in result.stdout.splitlines() if line[:10].strip() == "20"][-1]
    widths = [float(high) - float(low) for low, high in re.findall(r"\[([\d.]+), ([\d.]+)\]", last)]
    assert len(widths) == 3 and max(widths) > 0, last


def run_ppo(plot: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``scripts/ppo.py --quick --plot PLOT OPTIONS``, checked to succeed."""
    result = subprocess.run(
        [sys.executable, "scripts/ppo.py", "--quick", "--plot", str(plot), *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize("mode", [[], ["--async"]], ids=["step", "send-recv"])
@helpers.needs(*SCRIPT_NEEDS["ppo"])
def test_ppo_quick_prints_returns_and_plots(mode: list[str], tmp_path: Path) -> None:
    plot = tmp_path / "ppo.png"
    result = run_ppo(plot, *mode)
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.split()[:2] == ["iteration", "env"])
    assert header.split()[-2:] == ["return", "pole"]
    rows = [line.split() for line in lines if line[:9].strip().isdigit()]
    assert [row[0] for row in rows] == [str(i) for i in range(2, 17, 2)]  # 16 iterations, a row every 2
    assert rows[-1][1] == "8,192"
    returns = [float(row[4]) for row in rows if row[4] != "-"]
    assert returns and all(0 < value <= 500 for value in returns)
    assert all(0.5 <= float(row[5]) <= 2.0 for row in rows)  # the pole length, from its nominal 0.5 up
    assert "8,192 env steps in" in result.stdout and "mean return of the last" in result.stdout
    assert f"plot saved to {plot}" in result.stdout


@helpers.needs(*SCRIPT_NEEDS["ppo"], "mujoco")
def test_ppo_quick_trains_a_randomized_robot_on_the_mujoco_engine(tmp_path: Path) -> None:
    plot = tmp_path / "ppo.png"
    result = run_ppo(plot, "--env", "Hopper-v5", "--engine", "mujoco")
    lines = result.stdout.splitlines()
    assert "engine mujoco" in lines[0]
    rows = [line.split() for line in lines if line[:9].strip().isdigit()]
    assert rows[-1][1] == "8,192"
    assert all(0.8 <= float(row[5]) <= 1.2 for row in rows)  # the mean torso-mass scale drawn, U(0.8, 1.2)
    assert "randomized per episode" in result.stdout and plot.stat().st_size > 10_000
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def run_quick(script: str, timeout: float = 180.0) -> list[str]:
    """What ``scripts/SCRIPT.py --quick`` prints, line by line (it must succeed)."""
    result = subprocess.run(
        [sys.executable, f"scripts/{script}.py", "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()


@helpers.needs(*SCRIPT_NEEDS["dr_study"])
def test_dr_study_quick_trains_twice_and_compares_both_on_one_grid(tmp_path: Path) -> None:
    plot = tmp_path / "study.png"
    result = subprocess.run(
        [sys.executable, "scripts/dr_study.py", "--quick", "--plot", str(plot)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("trained")] == ["nominal", "randomized"]
    tables = [i for i, line in enumerate(lines) if "mean return per cell" in line]
    assert len(tables) == 2
    for start in tables:
        assert lines[start + 1].split() == ["mass", "x0.25", "x2"]
        for row in lines[start + 2 : start + 4]:
            assert len(row.split()) == 3 and all(np.isfinite(float(value)) for value in row.split()[1:])
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_envpool_loop_quick_lengthens_the_poles_it_receives() -> None:
    lines = run_quick("envpool_loop")
    assert lines[0].split() == ["env", "pole", "length", "episodes"]
    lengths = [float(line.split()[1]) for line in lines[1:17]]
    assert min(lengths) == max(lengths) == 0.8  # 0.5, lengthened by 0.05 at six curriculum steps
    assert "env steps in" in lines[-1]


def quick_rows(lines: list[str], header: list[str]) -> list[list[float]]:
    """The numbers of the table under ``header`` (its first words) in a script's output."""
    start = next(index for index, line in enumerate(lines) if line.split()[: len(header)] == header)
    return [[float(word) for word in line.split()] for line in lines[start + 1 :] if line[:9].strip().isdigit()]


@helpers.needs("torchrl")
def test_torchrl_ppo_quick_trains_and_lengthens_the_poles() -> None:
    rows = quick_rows(run_quick("torchrl_ppo"), ["batch", "episodes", "mean", "return"])
    assert [row[0] for row in rows] == [1, 2, 3]
    assert all(row[1] > 0 and 0 < row[2] <= 500 for row in rows)
    assert rows[0][3] == 0.5 and rows[-1][3] > 0.5  # returns above the quick target: the poles grew


@helpers.needs("rllib")
def test_rllib_ppo_quick_trains_and_lengthens_the_poles() -> None:
    lines = run_quick("rllib_ppo", timeout=300)
    header = ["iteration", "mean", "return", "pole", "length", "pole", "masses", "seconds"]
    start = next(index for index, line in enumerate(lines) if line.split() == header)
    rows = [line.split() for line in lines[start + 1 :]]
    assert [row[0] for row in rows] == ["1", "2"]
    assert (rows[0][2], rows[1][2]) == ("0.50", "0.60")  # the first iteration's return reached the target
    for row in rows:
        low, high = (float(mass) for mass in row[3].split("-"))
        assert 0.05 <= low < high <= 0.2  # drawn per episode by on_episode_end


@helpers.needs(*SCRIPT_NEEDS["robot_dr"])
def test_robot_dr_prints_applied_ranges() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/robot_dr.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows = {
        line.split()[0]: line.split()
        for line in result.stdout.splitlines()
        if line.startswith(("mass_scale", "friction_scale"))
    }
    assert 0.8 <= float(rows["mass_scale"][3]) <= float(rows["mass_scale"][4]) <= 1.2
    assert 0.5 <= float(rows["friction_scale"][3]) <= float(rows["friction_scale"][4]) <= 1.5
    assert "steps/s" in result.stdout
