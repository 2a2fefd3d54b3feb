"""Every Python block of README.md runs as shown: each one alone, as a script in a fresh interpreter,
in an empty working folder, and it leaves no process, shared memory or file behind.

A block therefore has to be self-contained (its imports, its own pool) and quick (small sizes).
Examples that need a second process start it themselves (the attach example does). Blocks fenced
otherwise (```bash, ```text) are not run.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import helpers
import pytest

from shmpool.system import SEGMENT_PREFIX, stat_fields

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHM_DIR = "/dev/shm"
TIMEOUT = 90.0  # seconds per block: each takes about one on an idle machine; 2 shared cores can be slow
FENCE = re.compile(r"^```python\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks() -> list[tuple[int, str]]:
    """The ```python blocks of the README, each with the line its fence opens on."""
    text = README.read_text()
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in FENCE.finditer(text)]


BLOCKS = python_blocks()


def session_processes(session: int) -> set[int]:
    """Live processes of the session ``session``: a block's children stay in it after their parent
    is gone (they are re-parented, so a walk down from the test process would miss them)."""
    found = set()
    for entry in os.listdir("/proc"):
        fields = stat_fields(int(entry)) if entry.isdigit() else None
        if fields is not None and int(fields[3]) == session and fields[0] not in (b"Z", b"X"):
            found.add(int(entry))
    return found


def pool_entries(code: str, pid: int) -> set[str]:
    """Entries of /dev/shm (segments and semaphores) of the pools a block run by ``pid`` can make:
    those it names, and those named after its pid by default."""
    names = [SEGMENT_PREFIX + name for name in re.findall(r"""\bname=["']([^"']+)["']""", code)]
    by_default = f"{SEGMENT_PREFIX}{pid}-"
    return {
        entry
        for entry in os.listdir(SHM_DIR)
        if by_default in entry
        or any(entry in (name, f"sem.{name}") or entry.startswith((f"{name}.", f"sem.{name}.")) for name in names)
    }


def test_readme_blocks_are_all_found() -> None:
    # A fence the pattern misses (a trailing word, CRLF) would silently drop a block from the test.
    assert len(BLOCKS) == README.read_text().count("```python") >= 5


@pytest.mark.parametrize("line, code", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_block_runs(line: int, code: str, tmp_path: Path) -> None:
    missing = helpers.missing_extras(*(module for module in helpers.EXTRA_OF if re.search(rf"\b{module}\b", code)))
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    script = tmp_path / f"readme_line{line}.py"
    script.write_text(code)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    before = set(os.listdir(SHM_DIR))
    # Its own session, so that whatever the block starts can be found (and killed) after it exits.
    child = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, stderr = child.communicate()
        pytest.fail(f"README block at line {line} still ran after {TIMEOUT:.0f} s\n{stdout}\n{stderr}")
    finally:
        deadline = time.monotonic() + 5.0  # workers notice their owner's exit within ~0.2 s
        while (session_processes(child.pid) or pool_entries(code, child.pid) - before) and time.monotonic() < deadline:
            time.sleep(0.05)
        left_processes = session_processes(child.pid)
        for pid in left_processes:  # never leave them to the rest of the suite
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert child.returncode == 0, f"README block at line {line} failed:\n{stdout}\n{stderr}"
    assert not left_processes, f"README block at line {line} left processes {sorted(left_processes)} behind"
    assert not pool_entries(code, child.pid) - before, f"README block at line {line} left shared memory behind"
    assert not os.listdir(workdir), f"README block at line {line} left files behind: {os.listdir(workdir)}"
