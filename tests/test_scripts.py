"""The runnable programs in scripts/ run and print what they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_quick_prints_a_table() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/bench.py", "--quick", "--envs", "CartPole-v1", "--num-envs", "8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
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


def test_demo_quick_runs_curriculum_and_plots(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    result = subprocess.run(
        [sys.executable, "scripts/demo.py", "--quick", "--plot", str(plot)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "ADR curriculum in process" in result.stdout and "mean return" in result.stdout
    assert "env steps in" in result.stdout and f"plot saved to {plot}" in result.stdout
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_robot_dr_prints_applied_ranges() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/robot_dr.py", "--seconds", "1.5", "--num-envs", "4", "--push-every", "5"],
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
