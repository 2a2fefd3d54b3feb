"""What the tests that start Ray share (``test_ray``, ``test_rllib``): a Ray kept on this machine and
in a folder of its own, and conftest's leak check less the processes Ray keeps for itself."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import leak_check

from shmpool.system import stat_fields

ROOT = Path(__file__).resolve().parents[1]


def ray_environment(patch: pytest.MonkeyPatch, temp: str) -> None:
    """Sets the environment of a Ray started by this process: loopback only, no usage statistics,
    its sessions and sockets in ``temp``, and the tests' modules importable by its workers."""
    # Loopback only: without it a local Cluster binds the machine's network address.
    patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    patch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine
    # Ray starts its workers (each node's host actor, so its pool's workers too) at nice 15: beside the
    # suite's other tests they would get a few percent of a core, and a launch took over a minute.
    patch.setenv("RAY_worker_niceness", "0")
    # Sessions, sockets and the "current cluster" file in a folder of our own, not /tmp/ray,
    # where another user's ray.init() would find this cluster.
    patch.setenv("RAY_TMPDIR", temp)
    # The workers Ray starts import the tests' env classes (helpers) by name.
    patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])))


def cmdline(pid: int) -> str:
    """The command line of ``pid`` ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    fields = stat_fields(pid)
    return 0 if fields is None else int(fields[1])


def rays_own(pid: int) -> bool:
    """A worker process that a raylet started and keeps for Ray (an idle worker, or the process of an
    actor that is being torn down): a child of a raylet. The pools' workers are children of a host
    actor's process, never of a raylet, so they are still checked."""
    return "/raylet/raylet" in cmdline(_parent(pid))


def wait_for(check: Any, seconds: float) -> Any:
    """Polls ``check`` until it returns something empty, or ``seconds`` pass; returns its last value."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if not value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def kill_and_wait(actor: Any, seconds: float = 30.0) -> None:
    """``ray.kill(actor)``, then waits until the actor no longer answers: the kill is asynchronous,
    and a call made right after it may still run."""
    import ray

    ray.kill(actor)

    def answers() -> bool:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5.0)
        except ray.exceptions.RayActorError:
            return False
        return True

    assert not wait_for(answers, seconds), "ray.kill did not end the actor"


def no_leftovers_but_rays(request: pytest.FixtureRequest) -> Iterator[None]:
    """conftest's check (no segment and no child process left behind), less the worker processes
    that Ray starts and keeps for itself (children of a raylet): the body of an autouse fixture that
    replaces conftest's in a module that starts Ray. A host actor's pool closes within its close(),
    but Ray's own exit lags: 10 seconds."""
    yield from leak_check(request, ignored=rays_own, seconds=10.0)
