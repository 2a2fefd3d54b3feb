"""scripts/soak.py --quick: pools under hostile writers, senders, SIGKILLs and Ctrl-C storms pass every
check, in each phase: worker processes, the trainer's own slot, and async recv/send batches."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PHASES = ["workers", "trainer-slot", "async"]


def _table(stdout: str) -> tuple[list[str], dict[str, tuple[dict[str, int | None], str]]]:
    """The soak's phases and table: {label: ({phase: count, or None where the row does not apply}, status)}."""
    lines = stdout.splitlines()
    header = next(line for line in lines if line.startswith("check  "))
    phases = header.split()[1:-1]
    rows = {}
    for line in lines[lines.index(header) + 2 :]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(phases) + 2 or cells[-1] not in ("ok", "FAIL", "-"):
            break
        counts = {
            phase: None if cell == "n/a" else int(cell.replace(",", "")) for phase, cell in zip(phases, cells[1:])
        }
        rows[cells[0]] = (counts, cells[-1])
    return phases, rows


# Alone: the soak keeps both cores busy by itself (beside other tests the suite would not end
# sooner), and beside three busy test workers a phase once saw no writer kill.
@pytest.mark.alone
@pytest.mark.timeout(180)
def test_soak_quick_passes_and_exercises_everything() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/soak.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
    phases, rows = _table(result.stdout)
    assert phases == PHASES
    assert "all checks passed" in result.stdout
    assert not [label for label, (_, status) in rows.items() if status == "FAIL"]
    # Not vacuous: every hostile thing really happened, in every phase.
    for label in (
        "env steps",
        "events delivered",
        "Ctrl-Cs taken",
        "writer kills",
        "a/b pair writes (writers)",
        "u range writes",
        "hook checks (before_step calls)",
        "events spanning both workers",
        "control calls completed (must not be 0)",
        "SIGINT bursts (storm process)",
        "SIGINT gusts (storm process)",
        "raising handlers in writes (writer 1)",
        "forks during the first writes (writer 0)",
    ):
        counts, _ = rows[label]
        assert all(counts[phase] for phase in PHASES), (label, counts)
    for phase in PHASES:
        assert rows["events delivered"][0][phase] == rows["events sent"][0][phase], phase
    assert rows["events lost"] == ({phase: 0 for phase in PHASES}, "ok")
    assert rows["lockstep violations"] == ({"workers": 0, "trainer-slot": 0, "async": None}, "ok")
    assert rows["control calls given up (livelock)"][1] == "ok"
    # The async phase: batches flowed, Ctrl-Cs cut recv and send, and every check of them held.
    async_counts = {label: counts["async"] or 0 for label, (counts, _) in rows.items()}
    assert async_counts["async batches received"] > 0 and async_counts["Ctrl-Cs in recv"] > 0
    cut_sends = async_counts["Ctrl-Cs in send before the step went out"]
    assert cut_sends + async_counts["Ctrl-Cs in send after it (StepSentInterrupt)"] > 0
    for label in (
        "step counts unequal to sends (async)",
        "async batches handed out twice",
        "async batches sent twice (send refused)",
        "async envs whose results never came back",
    ):
        assert async_counts[label] == 0, label
