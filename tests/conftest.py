"""Fixtures every test gets: a unique pool-name prefix, and a check that nothing is left behind."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata

import pytest
from helpers import shm_entries

from shmpool.system import descendants as all_descendants

# Many processes share 2 cores while the suite runs: a numerical library's own thread pool (torch's, in
# the trainer scripts and the docs' examples) would spin against them, not speed anything up.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Long-lived helpers that multiprocess starts once per test session and keeps: not leaks.
_HELPERS = ("forkserver import main", "resource_tracker import main")


def descendants(root: int) -> set[int]:
    """Live (non-zombie) processes below ``root`` in the process tree, multiprocess helpers excluded."""
    return {pid for pid in all_descendants(root) if not _is_helper(pid)}


def _is_helper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            command_line = file.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return any(helper in command_line for helper in _HELPERS)


#: The modules whose tests take longest (scripts, the soak, other projects' suites),
#: in the order pytest-xdist's workers start them: first, so that none is what the session ends
#: waiting for. Tests marked ``alone`` go last in each worker's queue, when little is left to wait
#: for (see ``alone_when_marked``); a group that xdist sends out whole (``xdist_group``: the Ray
#: tests') keeps the place xdist gives it. Run in one process (``-n 0``), the suite keeps the order
#: it was given.
LONG_FIRST = ("test_e2e_soak.py", "test_scripts.py", "test_sb3.py", "test_docs.py", "test_interrupts.py")


#: The (major, minor) ranges of pytest and pytest-xdist on which ``--dist loadgroup`` silently
#: ignores ``xdist_group`` (each test's id became structured; xdist still rewrites the old one).
XDIST_1386 = {"pytest": ((9, 2), (99, 0)), "pytest-xdist": ((0, 0), (3, 8))}


def _warm_numba_cache() -> None:
    """Compiles the built-in kernels once, into numba's on-disk cache, before pytest-xdist's workers
    start: in a fresh clone each worker (and the pools it launches first) would compile them at once.
    One process per core, each a share of the kernels: the workers wait for this."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("numba") is None:
        return
    from shmpool import kernels
    from shmpool.system import usable_cores

    cores = usable_cores()
    code = "import sys; from shmpool import kernels\nfor i in sys.argv[1:]: kernels.load(kernels.find(i)).warm_up()"
    processes = [
        subprocess.Popen([sys.executable, "-c", code, *sorted(kernels.BUILTIN)[core::cores]], stderr=subprocess.PIPE)
        for core in range(min(cores, len(kernels.BUILTIN)))
    ]
    errors = [process.communicate(timeout=600)[1] for process in processes]
    for process, error in zip(processes, errors):
        if process.returncode:
            raise RuntimeError(error.decode()[-2000:])


def pytest_configure(config: pytest.Config) -> None:
    versions = {name: tuple(map(int, re.findall(r"\d+", metadata.version(name))[:2])) for name in XDIST_1386}
    if config.getoption("dist", None) == "loadgroup" and all(
        low <= versions[name] <= high for name, (low, high) in XDIST_1386.items()
    ):
        raise pytest.UsageError(
            "pytest-xdist's --dist loadgroup ignores xdist_group marks on this pytest (pytest-dev/pytest-xdist#1386):"
            " install the test tools with -c constraints.txt, as the README's test command does"
        )
    starts_workers = config.getoption("numprocesses", None) and not config.getoption("collectonly", False)
    if starts_workers and not hasattr(config, "workerinput"):
        try:  # in the controlling process, before it starts the workers
            _warm_numba_cache()
        except Exception as error:  # noqa: BLE001 - the numba tests report it; the others run
            warnings.warn(f"numba's cache was not warmed: {type(error).__name__}: {error}", stacklevel=1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (not a pytest that a test runs)
        rank = {name: place for place, name in enumerate(LONG_FIRST)}
        items.sort(
            key=lambda item: (item.get_closest_marker("alone") is not None, rank.get(item.path.name, len(LONG_FIRST)))
        )


@pytest.fixture(autouse=True, scope="session")
def mujoco_warnings_to_logging() -> None:
    """MuJoCo appends its warnings to MUJOCO_LOG.TXT in the working directory on every model compile
    (the trainer compiles one at each launch): send this process's to logging instead. Workers get
    the same with ``launch(..., worker_init=shmpool.mujoco.log_to_python)``."""
    from shmpool.mujoco import log_to_python

    log_to_python()


@pytest.fixture(autouse=True)
def ctrl_c_as_in_a_terminal() -> Iterator[None]:
    """Gives each test Python's own Ctrl-C handler, and puts back whatever a test installed.

    A shell starts a background job (``pytest &``) with SIGINT ignored; Python then installs no
    handler, and its children inherit the ignored signal. The Ctrl-C tests (and their scripts, whose
    helper processes they kill only once interrupted) would then depend on how the suite was started
    and on whether an earlier test had installed a handler and left it there."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def session_locks(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[int, int]]:
    """Two lock files every process of the session (pytest-xdist's workers too) opens: a turnstile
    and the run lock (see ``alone_when_marked``)."""
    shared = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        shared = shared.parent  # the session's folder, above each worker's own
    descriptors = tuple(os.open(shared / f"{name}.lock", os.O_RDWR | os.O_CREAT) for name in ("turnstile", "run"))
    yield descriptors  # type: ignore[misc]
    for descriptor in descriptors:
        os.close(descriptor)


@pytest.fixture(autouse=True)
def alone_when_marked(request: pytest.FixtureRequest, session_locks: tuple[int, int]) -> Iterator[None]:
    """Runs a test marked ``alone`` while no other test of the session runs (the suite runs on
    pytest-xdist's workers): one that makes stale pools on purpose (every launch removes them), or
    whose processes must not wait for the cores (the soak). Other tests share the run
    lock; the turnstile keeps new ones from starving an ``alone`` one."""
    turnstile, run = session_locks
    alone = request.node.get_closest_marker("alone") is not None
    try:  # a timeout or Ctrl-C while waiting must not leave the turnstile held
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(run, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
    finally:
        fcntl.flock(run, fcntl.LOCK_UN)
        fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.fixture
def pool_name(request: pytest.FixtureRequest) -> str:
    """A pool name unique to this test; the leak check looks for it."""
    return request.node.leak_marker + "-p"


@pytest.fixture(autouse=True)
def no_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails the test if it leaves a shared-memory object or a child process of its own behind."""
    yield from leak_check(request)


def leak_check(
    request: pytest.FixtureRequest, ignored: Callable[[int], bool] = lambda pid: False, seconds: float = 5.0
) -> Iterator[None]:
    """The body of ``no_leftovers``: gives the test its marker, and after it fails the test if a
    segment of its own or a new child process (not ``ignored``) is still there after ``seconds``."""
    short = re.sub(r"[^A-Za-z0-9]+", "_", request.node.name)[-40:]
    marker = f"t{uuid.uuid4().hex[:6]}-{short}"
    request.node.leak_marker = marker
    default_marker = f"shmpool-{os.getpid()}-"  # pools launched with a generated name
    before_processes = descendants(os.getpid())
    before_default = set(shm_entries(default_marker))
    yield
    deadline = time.monotonic() + seconds
    while True:
        new_processes = {pid for pid in descendants(os.getpid()) - before_processes if not ignored(pid)}
        leaked = shm_entries(marker) + sorted(set(shm_entries(default_marker)) - before_default)
        if not new_processes and not leaked:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    pytest.fail(f"test left behind processes {sorted(new_processes)} and shared memory {leaked}")
