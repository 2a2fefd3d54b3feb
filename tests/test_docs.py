"""The documentation: the site builds with ``mkdocs build --strict`` (a broken link or reference fails
it), and every Python block of README.md and docs/ runs as shown: each one alone, as a script in a
fresh interpreter, in an empty working folder, and it leaves no process, shared memory or file behind.

A block therefore has to be self-contained (its imports, its own pool) and quick (small sizes).
Examples that need a second process start it themselves (the attach example does). Blocks fenced
otherwise (```bash, ```text) are not run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
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
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
SHM_DIR = "/dev/shm"
TIMEOUT = 90.0  # seconds per block: each takes about one on an idle machine; 2 shared cores can be slow
FENCE = re.compile(r"^```python\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


#: When a block needs an extra's module: it names the module (``engine="mujoco"`` needs mujoco), except
#: envpool, which only a block importing it needs (``shmpool.envpool`` replaces it, needing nothing).
NEEDS = {module: rf"\b{module}\b" for module in helpers.EXTRA_OF} | {"envpool": r"^\s*(?:import|from)\s+envpool\b"}


def python_blocks() -> list[tuple[str, str]]:
    """The ```python blocks of the README and the docs, each with its page and the line its fence opens on."""
    blocks = []
    for page in PAGES:
        text = page.read_text()
        where = page.relative_to(ROOT).as_posix()
        blocks += [(f"{where}:{text.count(chr(10), 0, m.start()) + 1}", m.group(1)) for m in FENCE.finditer(text)]
    return blocks


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


def test_python_blocks_are_all_found() -> None:
    # A fence the pattern misses (a trailing word, CRLF) would silently drop a block from the test.
    assert len(BLOCKS) == sum(page.read_text().count("```python") for page in PAGES) >= 15
    assert README.read_text().count("\n") <= 200  # the manual is the site; the README its first page


DOCS_MODULES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


@pytest.mark.skipif(
    not all(importlib.util.find_spec(module.split(".")[0]) for module in DOCS_MODULES),
    reason='needs the docs extra: pip install -e ".[docs]"',
)
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """Every page in the nav, every link and anchor resolving, every reference rendering from its
    docstring without a warning, and no docstring markup left unrendered."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    built = {path.relative_to(tmp_path / "site").as_posix() for path in (tmp_path / "site").rglob("index.html")}
    pages = {page.relative_to(ROOT / "docs").with_suffix("").as_posix() for page in PAGES[1:]}
    assert {f"{page}/index.html" for page in pages - {"index"}} | {"index.html"} <= built
    reference = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "recv_order" in reference
    # Docstring examples render as code blocks, not as ">>>" read as nested quotes; signatures wrap.
    assert "<blockquote>" not in reference
    examples = re.findall(r"<pre[^>]*><span></span><code>(?:(?!</code>).)*&gt;&gt;&gt;", reference, re.S)
    assert len(examples) >= 6, len(examples)
    assert "Formatting signatures requires" not in result.stderr
    from shmpool.config import PoolConfig  # launch's options table, written from its fields at build time

    for field in dataclasses.fields(PoolConfig):
        assert (f"<td><code>{field.name}</code></td>" in reference) == field.init, field.name
    assert not re.findall(r":(?:func|class|mod|meth|attr|data|exc):", reference)  # Sphinx roles: not rendered


def test_pages_are_organized_as_their_nav_says_and_code_fits_88_columns() -> None:
    """Nav labels are the pages' titles, every guide and tutorial has sections, and no code line is
    wider than 88 columns (the README's two setup commands, one line each by design, aside)."""
    nav = re.findall(r"^ +- (.+): (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    for label, page in nav:
        title = (ROOT / "docs" / page).read_text().splitlines()[0]
        assert label == "Home" or title == f"# {label}", (page, title, label)
    for page in sorted((ROOT / "docs").glob("guides/*.md")) + sorted((ROOT / "docs").glob("tutorials/*.md")):
        assert re.search(r"^## ", page.read_text(), re.M), f"{page.name} has no subheadings"
    for page in PAGES:
        for language, code in re.findall(r"```(\w*)\n(.*?)```", page.read_text(), re.S):
            if page == README and language != "python":
                continue
            wide = [line for line in code.splitlines() if len(line) > 88]
            assert not wide, f"{page.name}: {wide}"


def test_ci_runs_the_readmes_test_command() -> None:
    command = next(line for line in README.read_text().splitlines() if "pytest" in line and "pip install" in line)
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


# One after another, on one test worker: examples name their pools as users would ("cl").
@pytest.mark.xdist_group("docs examples")
@pytest.mark.parametrize("where, code", BLOCKS, ids=[where for where, _ in BLOCKS])
def test_python_block_runs(where: str, code: str, tmp_path: Path) -> None:
    missing = helpers.missing_extras(*(module for module in helpers.EXTRA_OF if re.search(NEEDS[module], code, re.M)))
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    script = tmp_path / f"block_{re.sub(r'[^A-Za-z0-9]+', '_', where)}.py"
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
        pytest.fail(f"{where} still ran after {TIMEOUT:.0f} s\n{stdout}\n{stderr}")
    finally:
        deadline = time.monotonic() + 5.0  # workers notice their owner's exit within ~0.2 s
        while (session_processes(child.pid) or pool_entries(code, child.pid) - before) and time.monotonic() < deadline:
            time.sleep(0.05)
        left_processes = session_processes(child.pid)
        for pid in left_processes:  # never leave them to the rest of the suite
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert child.returncode == 0, f"{where} failed:\n{stdout}\n{stderr}"
    assert not left_processes, f"{where} left processes {sorted(left_processes)} behind"
    assert not pool_entries(code, child.pid) - before, f"{where} left shared memory behind"
    assert not os.listdir(workdir), f"{where} left files behind: {os.listdir(workdir)}"
