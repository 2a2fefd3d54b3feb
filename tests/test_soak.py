"""scripts/soak.py --quick: a pool under hostile writers, senders, SIGKILLs and Ctrl-Cs passes every check."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _table(stdout: str) -> dict[str, tuple[int, str]]:
    """The soak's table as {label: (count, status)}."""
    rows = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"(.+?)\s+([\d,]+)  (ok|FAIL|-)", line)
        if match:
            rows[match.group(1)] = (int(match.group(2).replace(",", "")), match.group(3))
    return rows


@pytest.mark.timeout(180)
def test_soak_quick_passes_and_exercises_everything() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/soak.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    rows = _table(result.stdout)
    assert "all checks passed" in result.stdout
    assert not [label for label, (_, status) in rows.items() if status == "FAIL"]
    # Not vacuous: every hostile thing really happened.
    for label in ("env steps", "events delivered", "Ctrl-Cs taken", "writer kills", "a/b pair writes (writers)"):
        assert rows[label][0] > 0, label
    assert rows["u range writes"][0] > 0 and rows["hook checks (before_step calls)"][0] > 0
    assert rows["events delivered"][0] == rows["events sent"][0]
    assert rows["events spanning both workers"][0] > 0
    assert rows["events lost"] == (0, "ok") and rows["lockstep violations"] == (0, "ok")
