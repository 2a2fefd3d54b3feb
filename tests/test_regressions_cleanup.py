"""Regressions: who cleans up after a dead owner, and what ls/gc/launch/attach do with odd /dev/shm entries.

- 11: a worker notices its owner's death within ~2 s even inside a hanging env step, with every start
  method, and nothing the trainer started (forkserver, resource tracker) outlives it.
- 12a: a late worker of a dead owner removes only the objects it opened, never a new pool of the same name.
- 12b: a segment whose owner lives in another pid namespace is never judged, nor removed.
- 12c: stray directories, symlinks, fifos and odd files named ``shmpool-*`` are skipped, not fatal.
- 12d: malformed segments give ``LayoutMismatchError`` from attach and are skipped by ls and gc.

Every name carries the test's marker (the ``pool_name`` fixture); whatever a test creates in /dev/shm
it removes itself, and crash tests run the victim in a subprocess with hard timeouts.
"""

from __future__ import annotations

import gc
import json
import mmap
import os
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import helpers
import pytest

import shmpool
import shmpool.hooks
from shmpool.layout import H_OWNER_PIDNS, H_SIZE, H_TABLE_LENGTH, H_TABLE_OFFSET, HEADER_BYTES
from shmpool.registry import sweep_stale

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
SHM = "/dev/shm"


def _child(script: str, *args: str, **kwargs: object) -> subprocess.Popen:
    """Runs ``script`` in a fresh interpreter, arguments in ``sys.argv[1:]``."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        **kwargs,  # type: ignore[arg-type]
    )


def _cli(*args: str) -> subprocess.CompletedProcess:
    """Runs ``python -m shmpool ARGS`` with a hard timeout."""
    return subprocess.run(
        [sys.executable, "-m", "shmpool", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=ENV
    )


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks, None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _family(root: int) -> dict[int, int]:
    """Every live process below ``root`` (helpers such as the forkserver included): pid -> start ticks."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as file:
                    data = file.read()
            except OSError:
                continue
            parents[int(entry)] = int(data[data.rindex(b")") + 2 :].split()[1])
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            ticks = _start_ticks(pid)
            if ppid == parent and pid not in found and ticks is not None:
                found[pid] = ticks
                frontier.append(pid)
    return found


def _survivors(family: dict[int, int], seconds: float) -> dict[int, str]:
    """Waits up to ``seconds`` for every process of ``family`` to end; the survivors and their command lines."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [pid for pid, ticks in family.items() if _start_ticks(pid) == ticks]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    found = {}
    for pid in alive:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                found[pid] = file.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            found[pid] = "?"
    return found


def _kill_family(family: dict[int, int]) -> None:
    """SIGKILLs the processes of ``family`` this test started that still run (only after a failure)."""
    for pid, ticks in family.items():
        if _start_ticks(pid) == ticks:
            os.kill(pid, signal.SIGKILL)
    _survivors(family, 5.0)


def _entries(marker: str) -> list[str]:
    """/dev/shm entries whose name contains ``marker``."""
    return sorted(name for name in os.listdir(SHM) if marker in name)


def _wait_no_entries(marker: str, seconds: float) -> list[str]:
    """Waits up to ``seconds`` for /dev/shm to hold nothing named with ``marker``; returns what is left."""
    deadline = time.monotonic() + seconds
    while _entries(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    return _entries(marker)


def _remove_own(marker: str) -> None:
    """Removes /dev/shm entries named with this test's marker (only ever ones this test made)."""
    for name in os.listdir(os.fsencode(SHM)):
        if marker.encode() in name:
            path = os.path.join(os.fsencode(SHM), name)
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)


def _identities(name: str) -> dict[str, tuple[int, int]]:
    """(st_dev, st_ino) of the segment and semaphore files of the pool called ``name``."""
    files = [f for f in os.listdir(SHM) if f == f"shmpool-{name}" or f.startswith(f"sem.shmpool-{name}.")]
    return {f: (os.lstat(os.path.join(SHM, f)).st_dev, os.lstat(os.path.join(SHM, f)).st_ino) for f in files}


def _own_pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


# -- 11: the owner dies while its workers are stuck in env code ------------------------------------------------

HANGING_TRAINER = """
import functools, json, sys, shmpool, helpers
if __name__ == "__main__":
    hanging = functools.partial(helpers.CountingEnv, length=10**9, sleep=1000)  # importable by every start method
    pool = shmpool.launch(hanging, 2, num_workers=2, name=sys.argv[1], start_method=sys.argv[2], timeout=None)
    pool.reset()
    print(json.dumps(pool.worker_pids), flush=True)
    pool.step([0, 0])  # never returns: every env sleeps 1000 s in its step
"""


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_trainer_killed_during_a_hanging_step_leaves_no_process_and_no_memory(
    start_method: str, pool_name: str
) -> None:
    child = _child(HANGING_TRAINER, pool_name, start_method)
    family: dict[int, int] = {}
    try:
        workers = json.loads(child.stdout.readline())
        time.sleep(0.5)  # the workers are inside env.step now, sleeping
        family = _family(child.pid)
        assert set(workers) <= set(family), (workers, family)
        child.kill()
        child.wait(5)
        assert _survivors(family, 3.0) == {}
        assert _wait_no_entries(pool_name, 1.0) == []
    finally:
        child.kill()
        _kill_family(family)  # first: survivors hold the child's output pipes open
        child.communicate(timeout=10)
        _remove_own(pool_name)


# -- 12a: a late worker of a dead owner must spare a new pool of the same name ----------------------------------

IDLE_TRAINER = """
import json, sys, time, shmpool
pool = shmpool.launch("CartPole-v1", 2, num_workers=1, name=sys.argv[1], start_method="fork")
print(json.dumps(pool.worker_pids), flush=True)
time.sleep(60)
"""


def test_late_worker_of_a_dead_owner_spares_a_new_pool_of_the_same_name(pool_name: str) -> None:
    child = _child(IDLE_TRAINER, pool_name)
    family: dict[int, int] = {}
    try:
        [worker] = json.loads(child.stdout.readline())
        family = _family(child.pid)
        os.kill(worker, signal.SIGSTOP)  # a worker as slow to notice as can be: it cannot run until SIGCONT
        child.kill()
        child.wait(5)
        # The new launch sweeps the dead owner's segment and semaphores, then makes its own under the same name.
        with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, seed=0) as pool:
            pool.reset()
            mine = _identities(pool_name)
            assert f"shmpool-{pool_name}" in mine and len(mine) == 3, mine  # segment, trainer and worker doorbells
            os.kill(worker, signal.SIGCONT)
            assert _survivors(family, 5.0) == {}
            assert _identities(pool_name) == mine  # the late worker removed nothing of the new pool
            with shmpool.attach(pool_name) as handle:
                assert handle.alive
            for _ in range(50):
                pool.step(pool.action_space.sample())
        assert _wait_no_entries(pool_name, 1.0) == []
    finally:
        child.kill()
        _kill_family(family)  # first: survivors hold the child's output pipes open
        child.communicate(timeout=10)
        _remove_own(pool_name)


# -- 12b: an owner in another pid namespace cannot be judged from here -------------------------------------------

STRANDED_TRAINER = """
import json, sys, time, shmpool
pool = shmpool.launch("CartPole-v1", 2, num_workers=1, name=sys.argv[1])
print(json.dumps(pool.worker_pids), flush=True)
time.sleep(60)
"""


def _set_header_word(name: str, index: int, value: int) -> None:
    """Writes one header word of a segment through a mapping, as its owner would."""
    fd = os.open(os.path.join(SHM, f"shmpool-{name}"), os.O_RDWR | os.O_NOFOLLOW)
    try:
        with mmap.mmap(fd, HEADER_BYTES) as header:
            struct.pack_into("<q", header, index * 8, value)
    finally:
        os.close(fd)


def test_segment_of_an_owner_in_another_pid_namespace_is_left_alone(pool_name: str) -> None:
    child = _child(STRANDED_TRAINER, pool_name, start_new_session=True)
    try:
        workers = json.loads(child.stdout.readline())
        # As seen from another container sharing /dev/shm: the owner's pid means nothing here. Written
        # while the owner lives, so that no sweep (this machine runs other tests) can take it first.
        _set_header_word(pool_name, H_OWNER_PIDNS, _own_pid_namespace() + 1)
        os.killpg(child.pid, signal.SIGKILL)  # owner and workers at once: the segment stays behind
        child.communicate(timeout=10)
        assert helpers.wait_gone(workers, 5.0) == []
        assert f"shmpool-{pool_name}" in _entries(pool_name)
        assert pool_name not in sweep_stale()
        gc = _cli("gc")
        assert gc.returncode == 0, gc.stderr
        assert pool_name not in gc.stdout
        assert f"shmpool-{pool_name}" in _entries(pool_name)
        listing = _cli("ls")
        assert listing.returncode == 0, listing.stderr
        [line] = [line for line in listing.stdout.splitlines() if line.startswith(pool_name)]
        assert "unknown" in line and "stale" not in line, line
        with pytest.raises(shmpool.PoolNotFoundError, match="another pid namespace"):
            shmpool.attach(pool_name)
        # Back in our namespace, a dead owner is a dead owner: gc removes it (or a sweep of a launch
        # elsewhere on this machine beat it to it).
        _set_header_word(pool_name, H_OWNER_PIDNS, _own_pid_namespace())
        gc = _cli("gc")
        assert gc.returncode == 0, gc.stderr
        assert _entries(pool_name) == []
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate(timeout=10)
        _remove_own(pool_name)


# -- 12c: stray entries named like pools -------------------------------------------------------------------------


def test_stray_directories_links_fifos_and_odd_files_are_skipped(pool_name: str, tmp_path: Path) -> None:
    base = os.path.join(SHM, f"shmpool-{pool_name}")
    target = tmp_path / "copied-segment"
    target.touch(mode=0o600)
    strays = {
        "dir": lambda path: os.mkdir(path, 0o700),
        "fifo": lambda path: os.mkfifo(path, 0o600),
        "link": lambda path: os.symlink(target, path),  # to a copy of a live pool's segment, filled below
        "dangling": lambda path: os.symlink(tmp_path / "nothing-here", path),
        "huge": _sparse_file(1 << 62),  # a 0600 regular file far larger than any address space
    }
    try:
        for suffix, make in strays.items():
            make(f"{base}-{suffix}")
        os.mkdir(os.path.join(SHM, f"sem.shmpool-{pool_name}-semdir.t"), 0o700)  # a "doorbell" without segment
        os.close(os.open(os.fsencode(base) + b"-\xff\xfe", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        before = _entries(pool_name)

        with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, seed=0) as pool:  # sweeps first
            pool.reset()
            pool.step(pool.action_space.sample())
            with open(f"{base}", "rb") as segment:
                target.write_bytes(segment.read())  # the link now leads to a valid-looking live segment
            listing = _cli("ls")
            assert listing.returncode == 0, listing.stderr
            listed = [line.split()[0] for line in listing.stdout.splitlines()[2:] if pool_name in line]
            assert listed == [pool_name], listing.stdout
            gc = _cli("gc")
            assert gc.returncode == 0, gc.stderr
            for suffix in strays:
                with pytest.raises(shmpool.LayoutMismatchError):
                    shmpool.attach(f"{pool_name}-{suffix}").close()
            with shmpool.attach(pool_name) as handle:
                assert handle.alive
        assert sorted(before) == _entries(pool_name)  # skipped, not followed nor removed
    finally:
        _remove_own(pool_name)


def _sparse_file(size: int) -> Callable[[str], None]:
    def make(path: str) -> None:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    return make


# -- 12d: malformed segments -------------------------------------------------------------------------------------


def _crafted_segments(real: bytes) -> dict[str, bytes]:
    """Corrupted copies of a real segment's bytes, each damaged in one way."""
    (table_length,) = struct.unpack_from("<q", real, H_TABLE_LENGTH * 8)
    table = json.loads(real[HEADER_BYTES : HEADER_BYTES + table_length])
    room = min(entry["offset"] for entry in table["fields"]) - HEADER_BYTES

    def with_table(encoded: bytes) -> bytes:
        assert len(encoded) <= room
        crafted = bytearray(real)
        crafted[HEADER_BYTES : HEADER_BYTES + len(encoded)] = encoded
        struct.pack_into("<q", crafted, H_TABLE_LENGTH * 8, len(encoded))
        return bytes(crafted)

    def edited(change: Callable[[dict], object]) -> bytes:
        document = json.loads(json.dumps(table))
        change(document)
        return with_table(json.dumps(document).encode())

    def field(document: dict, name: str) -> dict:
        return next(entry for entry in document["fields"] if entry["name"] == name)

    def header_word(index: int, value: int) -> bytes:
        crafted = bytearray(real)
        struct.pack_into("<q", crafted, index * 8, value)
        return bytes(crafted)

    # A table nested far deeper than the recursion limit, after a valid header.
    deep = b'{"meta": ' + b"[" * 100_000 + b"]" * 100_000 + b', "fields": []}'
    nested = bytearray(real[:HEADER_BYTES]) + deep + bytes(64)
    struct.pack_into("<q", nested, H_TABLE_LENGTH * 8, len(deep))
    struct.pack_into("<q", nested, H_SIZE * 8, len(nested))
    plain = json.dumps(table)
    return {
        "nested": bytes(nested),
        "envs-text": edited(lambda d: d["meta"].update(num_envs="x")),
        "envs-nan": with_table(plain.replace('"num_envs": 2', '"num_envs": NaN').encode()),
        "envs-inf": with_table(plain.replace('"num_envs": 2', '"num_envs": 1e999').encode()),
        "envs-bool": edited(lambda d: d["meta"].update(num_envs=True)),
        "slots-int": edited(lambda d: d["meta"].update(slots=5)),
        "slots-short": edited(lambda d: d["meta"].update(slots=[[0]])),
        "hooks-int": edited(lambda d: d["meta"].update(hooks=5)),
        "params-int": edited(lambda d: d["meta"].update(params=5)),
        "created-text": edited(lambda d: d["meta"].update(created="x")),
        "dtype-alias": edited(lambda d: field(d, "control").update(dtype="p")),
        "dtype-bad": edited(lambda d: field(d, "control").update(dtype="<f8 ")),
        "control-float": edited(lambda d: field(d, "control").update(dtype="<f8")),
        "episodes-float": edited(lambda d: field(d, "episode_records").update(dtype="<f8")),
        "shape-huge": edited(lambda d: field(d, "rewards").update(shape=[2**32, 2**32], dtype="|u1")),
        "shape-ndim": edited(lambda d: field(d, "rewards").update(shape=[1] * 70)),
        "shape-bool": edited(lambda d: field(d, "rewards").update(shape=[True, True])),
        "duplicate": edited(lambda d: d["fields"].append(dict(field(d, "rewards")))),
        "offset-huge": edited(lambda d: field(d, "rewards").update(offset=2**70)),
        "table-past-end": header_word(H_TABLE_OFFSET, 2**63 - 1),
        "table-negative": header_word(H_TABLE_OFFSET, -(2**63)),
        "table-not-utf8": with_table(b"\xff" * 64),
        "empty": b"",
        "header-cut": real[:16],
        "size-lies": header_word(H_SIZE, len(real) * 2),
    }


def test_malformed_segments_raise_layout_mismatch_and_are_skipped(pool_name: str) -> None:
    hooks = [shmpool.hooks.Reset()]
    with shmpool.launch(
        "CartPole-v1", 2, num_workers=1, name=pool_name, params={"length": shmpool.Param()}, hooks=hooks
    ) as pool:
        with open(os.path.join(SHM, f"shmpool-{pool.name}"), "rb") as file:
            real = file.read()  # its owner is this process: every copy passes the liveness check
        crafted = _crafted_segments(real)
        assert len(crafted) >= 8
        try:
            for index, content in enumerate(crafted.values()):
                path = os.path.join(SHM, f"shmpool-{pool_name}-{index}")
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                with os.fdopen(fd, "wb") as file:
                    file.write(content)
                assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            wrong = {}
            for index, what in enumerate(crafted):
                try:
                    shmpool.attach(f"{pool_name}-{index}").close()
                except shmpool.LayoutMismatchError:
                    continue
                except BaseException as exc:  # noqa: BLE001 - collected so every case is reported at once
                    wrong[what] = f"{type(exc).__name__}: {str(exc)[:120]}"
                else:
                    wrong[what] = "attached"
            assert wrong == {}
            for command in ("ls", "gc"):
                result = _cli(command)
                assert result.returncode == 0, (command, result.stderr[-2000:])
                assert "Traceback" not in result.stderr
            assert len(_entries(f"{pool_name}-")) == len(crafted)  # owner alive (or unreadable): nothing removed
            with shmpool.attach(pool_name) as handle:
                assert handle.alive
            pool.reset()
            pool.step(pool.action_space.sample())
        finally:
            for index in range(len(crafted)):
                path = os.path.join(SHM, f"shmpool-{pool_name}-{index}")
                if os.path.lexists(path):
                    os.unlink(path)


def test_a_pool_nothing_refers_to_is_released_at_once(pool_name: str) -> None:
    """No part of a pool refers back to it: dropping the last reference releases it there and then,
    without waiting for the cyclic garbage collector (so its name is free again at once)."""
    gc.disable()  # a cycle would now keep it for good
    try:
        pool = shmpool.launch(
            "CartPole-v1",
            4,
            num_workers=2,
            name=pool_name,
            params={"length": shmpool.Param(low=0.1, high=1.0)},
            hooks=[shmpool.hooks.ObservationNoise(0.1)],
            batch_size=2,
            profile=True,
        )
        pool.reset(seed=0)
        pool.step([0, 1, 0, 1])
        params = pool.params
        del pool
        assert not os.path.exists(f"/dev/shm/shmpool-{pool_name}")
        with pytest.raises(shmpool.PoolClosedError, match="is closed"):
            params.write(None, length=0.5)
        with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name) as again:
            assert again.num_envs == 2
    finally:
        gc.enable()
