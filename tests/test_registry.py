"""Finding pools in /dev/shm and removing dead ones (:mod:`shmpool.registry`), as ``launch``, ``attach``
and the ``ls``/``gc`` commands do: an owner in another pid namespace is never judged, and entries that
only look like pools (directories, links, fifos, odd files) are skipped, neither followed nor removed.

Every name carries the test's marker (the ``pool_name`` fixture); whatever a test creates in /dev/shm
it removes itself.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import struct
from collections.abc import Callable
from pathlib import Path

import helpers
import pytest

import shmpool
from shmpool.layout import H_OWNER_PIDNS, HEADER_BYTES
from shmpool.registry import sweep_stale

STRANDED_TRAINER = """
import json, sys, time, shmpool
pool = shmpool.launch("CartPole-v1", 2, num_workers=1, name=sys.argv[1])
print(json.dumps(pool.worker_pids), flush=True)
time.sleep(60)
"""


def _set_header_word(name: str, index: int, value: int) -> None:
    """Writes one header word of a segment through a mapping, as its owner would."""
    fd = os.open(os.path.join(helpers.SHM_DIR, f"shmpool-{name}"), os.O_RDWR | os.O_NOFOLLOW)
    try:
        with mmap.mmap(fd, HEADER_BYTES) as header:
            struct.pack_into("<q", header, index * 8, value)
    finally:
        os.close(fd)


def _own_pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def test_segment_of_an_owner_in_another_pid_namespace_is_left_alone(pool_name: str) -> None:
    child = helpers.start_script(STRANDED_TRAINER, pool_name, start_new_session=True)
    try:
        workers = json.loads(child.stdout.readline())
        # As seen from another container sharing /dev/shm: the owner's pid means nothing here. Written
        # while the owner lives, so that no sweep (this machine runs other tests) can take it first.
        _set_header_word(pool_name, H_OWNER_PIDNS, _own_pid_namespace() + 1)
        os.killpg(child.pid, signal.SIGKILL)  # owner and workers at once: the segment stays behind
        child.communicate(timeout=10)
        assert helpers.wait_gone(workers, 5.0) == []
        assert f"shmpool-{pool_name}" in helpers.shm_entries(pool_name)
        assert pool_name not in sweep_stale()
        gc = helpers.shmpool_cli("gc")
        assert gc.returncode == 0, gc.stderr
        assert pool_name not in gc.stdout
        assert f"shmpool-{pool_name}" in helpers.shm_entries(pool_name)
        listing = helpers.shmpool_cli("ls")
        assert listing.returncode == 0, listing.stderr
        [line] = [line for line in listing.stdout.splitlines() if line.startswith(pool_name)]
        assert "unknown" in line and "stale" not in line, line
        with pytest.raises(shmpool.PoolNotFoundError, match="another pid namespace"):
            shmpool.attach(pool_name)
        # Back in our namespace, a dead owner is a dead owner: gc removes it (or a sweep of a launch
        # elsewhere on this machine beat it to it).
        _set_header_word(pool_name, H_OWNER_PIDNS, _own_pid_namespace())
        gc = helpers.shmpool_cli("gc")
        assert gc.returncode == 0, gc.stderr
        assert helpers.shm_entries(pool_name) == []
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate(timeout=10)
        helpers.remove_shm_entries(pool_name)


def _sparse_file(size: int) -> Callable[[str], None]:
    def make(path: str) -> None:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    return make


def test_stray_directories_links_fifos_and_odd_files_are_skipped(pool_name: str, tmp_path: Path) -> None:
    base = os.path.join(helpers.SHM_DIR, f"shmpool-{pool_name}")
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
        os.mkdir(os.path.join(helpers.SHM_DIR, f"sem.shmpool-{pool_name}-semdir.t"), 0o700)  # a doorbell, no segment
        os.close(os.open(os.fsencode(base) + b"-\xff\xfe", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        before = helpers.shm_entries(pool_name)

        with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, seed=0) as pool:  # sweeps first
            pool.reset()
            pool.step(pool.action_space.sample())
            with open(f"{base}", "rb") as segment:
                target.write_bytes(segment.read())  # the link now leads to a valid-looking live segment
            listing = helpers.shmpool_cli("ls")
            assert listing.returncode == 0, listing.stderr
            listed = [line.split()[0] for line in listing.stdout.splitlines()[2:] if pool_name in line]
            assert listed == [pool_name], listing.stdout
            gc = helpers.shmpool_cli("gc")
            assert gc.returncode == 0, gc.stderr
            for suffix in strays:
                with pytest.raises(shmpool.LayoutMismatchError):
                    shmpool.attach(f"{pool_name}-{suffix}").close()
            with shmpool.attach(pool_name) as handle:
                assert handle.alive
        assert sorted(before) == helpers.shm_entries(pool_name)  # skipped, not followed nor removed
    finally:
        helpers.remove_shm_entries(pool_name)
