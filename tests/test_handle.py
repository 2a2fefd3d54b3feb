"""Other processes find a pool by name (``shmpool.attach``), read its episodes and stats, write its
parameters. The command line over the same handles is tests/test_cli.py."""

from __future__ import annotations

import gc
import json
import mmap
import os
import signal
import struct
import time

import helpers
import numpy as np
import posix_ipc
import pytest

import shmpool
from shmpool import Param
from shmpool.layout import H_STATE, LAYOUT_VERSION, MAGIC, STATE_CLOSING, header_words

ATTACHED = """
import json, sys, shmpool
with shmpool.attach(sys.argv[1], wait=10) as handle:
    handle.params.write([2], length=0.9)
    records = handle.episodes.recent(1000)
    specs = {n: [s.when, s.dist, float(s.low), float(s.high)] for n, s in handle.param_specs.items()}
    print(json.dumps({"returns": records["return"].tolist(), "lengths": records["length"].tolist(),
                      "envs": records["env_id"].tolist(), "stats": handle.stats.episodes, "specs": specs}))
"""


def test_an_attached_process_writes_params_and_reads_episodes(pool_name: str) -> None:
    params = {"length": Param(low=0.1, high=2.0), "masscart": Param(dist="uniform", low=0.5, high=2.0, when="reset")}
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name, params=params, seed=0) as pool:
        pool.reset()
        finished = []
        for _ in range(150):
            infos = pool.step(pool.action_space.sample())[4]
            if "episode" in infos:
                done = np.flatnonzero(infos["_episode"])
                finished += [(int(e), float(infos["episode"]["r"][e]), int(infos["episode"]["l"][e])) for e in done]
        result = helpers.run_script(ATTACHED, pool.name)
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout)
        assert seen["specs"] == {"length": ["step", None, 0.1, 2.0], "masscart": ["reset", "uniform", 0.5, 2.0]}
        assert sorted(zip(seen["envs"], seen["returns"], seen["lengths"])) == sorted(finished)
        assert seen["stats"] == len(finished)
        pool.step(pool.action_space.sample())
        assert pool.applied["length"].tolist() == [0.5, 0.5, 0.9, 0.5]
        # The trainer's own reader got the same records, each once.
        records = pool.episodes.read()
        before = records[records["step"] < 150]  # the 151st step (index 150) may have finished more
        assert sorted(zip(before["env_id"].tolist(), before["return"].tolist(), before["length"].tolist())) == sorted(
            finished
        )
        assert np.all(records["params"]["masscart"] >= 0.5) and np.all(records["params"]["masscart"] <= 2.0)
        assert pool.episodes.read().size <= 4  # a second read returns only what finished since


def _fake_segment(name: str, content: bytes, uid: int | None = None, size: int = 4096) -> None:
    shm = posix_ipc.SharedMemory(f"/shmpool-{name}", posix_ipc.O_CREX, mode=0o600, size=size)
    if size:
        buffer = mmap.mmap(shm.fd, size)
        buffer[: len(content)] = content
        buffer.close()
    shm.close_fd()
    if uid is not None:
        os.chown(f"/dev/shm/shmpool-{name}", uid, -1)


def test_attach_failures_say_what_is_wrong(pool_name: str) -> None:
    with pytest.raises(shmpool.PoolNotFoundError, match=r"no pool named 'nowhere-to-be-found'; running pools"):
        shmpool.attach("nowhere-to-be-found")
    for name in (pool_name + "x" * 300, "a/b", 7):  # not "remove the segment", nor a bare TypeError
        with pytest.raises(shmpool.PoolNotFoundError, match="no pool can be named .*: pool names match"):
            shmpool.attach(name)  # type: ignore[arg-type]
    cases = [
        ("foreign", b"SOMETHING ELSE", None, shmpool.LayoutMismatchError, "not a shmpool segment"),
        ("unready", b"", None, shmpool.LayoutMismatchError, "still being created"),
        (
            "version",
            MAGIC + struct.pack("<2q", LAYOUT_VERSION + 7, 4096),
            None,
            shmpool.LayoutMismatchError,
            f"layout version {LAYOUT_VERSION + 7}",
        ),
    ]
    if os.geteuid() == 0:  # only root can make a segment that belongs to someone else
        cases.append(("theirs", MAGIC, 65534, PermissionError, "belongs to uid 65534"))
    for suffix, content, uid, error, message in cases:
        name = f"{pool_name}-{suffix}"
        _fake_segment(name, content, uid)
        try:
            with pytest.raises(error, match=message):
                shmpool.attach(name)
        finally:
            posix_ipc.unlink_shared_memory(f"/shmpool-{name}")


def test_a_handle_dropped_without_close_lets_go_of_its_file_descriptors(pool_name: str) -> None:
    """A curriculum process that attaches for each write and never closes must not run out of them."""
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params={"length": Param()}):
        shmpool.attach(pool_name).params.write(None, length=0.6)
        gc.collect()
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(50):
            shmpool.attach(pool_name).params.write(None, length=0.6)
        gc.collect()
        assert len(os.listdir("/proc/self/fd")) == before


def test_attach_takes_a_closing_pool_for_gone_and_waits_for_its_successor(pool_name: str) -> None:
    """A process that re-attaches after a trainer restart must not get the pool on its way out (a
    handle dead on arrival). The pool's closing state is set here as ``close`` sets it first, and
    held there, so that the window is not a race."""
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name) as pool:
        header = header_words(shmpool.system.Segment.open(pool_name).buffer)
        running = header[H_STATE]
        header[H_STATE] = STATE_CLOSING
        try:
            with pytest.raises(shmpool.PoolNotFoundError, match="is closing"):
                shmpool.attach(pool_name)
            started = time.monotonic()
            with pytest.raises(shmpool.PoolNotFoundError, match="is closing"):
                shmpool.attach(pool_name, wait=0.3)
            assert time.monotonic() - started >= 0.3
        finally:
            header[H_STATE] = running
        with shmpool.attach(pool_name, wait=0.3) as handle:
            assert handle.alive and pool.alive


OUT_OF_FILE_DESCRIPTORS = """
import os, resource, sys
import shmpool
from shmpool.system import process_alive, process_start_ticks
with shmpool.launch("CartPole-v1", 2, num_workers=1, name=sys.argv[1]):
    ticks = process_start_ticks(os.getpid())
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8,) * 2)
    filler = []
    try:
        while True:
            filler.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    outcomes = []
    for attempt in (lambda: process_alive(os.getpid(), ticks), lambda: shmpool.attach(sys.argv[1])):
        try:
            outcomes.append(repr(attempt()))
        except Exception as error:
            outcomes.append(f"{type(error).__name__} {getattr(error, 'errno', None)}")
    for descriptor in filler:
        os.close(descriptor)
print(outcomes)
"""


def test_running_out_of_file_descriptors_reads_as_that_not_as_a_dead_owner_or_a_foreign_segment(
    pool_name: str,
) -> None:
    result = helpers.run_script(OUT_OF_FILE_DESCRIPTORS, pool_name)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str(["OSError 24", "OSError 24"])  # EMFILE: not False, not LayoutMismatchError


OWNER = """
import json, sys, time, shmpool
pool = shmpool.launch("CartPole-v1", 2, num_workers=1, name=sys.argv[1], params={"length": shmpool.Param()})
print(json.dumps(pool.worker_pids), flush=True)
time.sleep(60)
"""


def test_owner_death_and_close_make_handles_dead_not_crash(pool_name: str) -> None:
    owner = helpers.start_script(OWNER, pool_name, start_new_session=True)
    try:
        pids = json.loads(owner.stdout.readline())
        with shmpool.attach(pool_name) as handle:
            assert handle.alive
            lengths = handle.params["length"]
            lengths[0] = 0.7
            owner.send_signal(signal.SIGKILL)
            owner.wait(5)
            assert helpers.wait_gone(pids, 5.0) == []  # the workers leave and remove the segment...
            assert not handle.alive
            with pytest.raises(shmpool.PoolClosedError):
                handle.params.write(0, length=0.6)
            with pytest.raises(shmpool.PoolClosedError):
                handle.applied  # noqa: B018
            assert lengths[0] == 0.7  # ...but a view kept from before stays valid: no SIGBUS
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name + "b", params={"length": Param()}) as pool:
        handle = shmpool.attach(pool.name)
    assert not handle.alive
    with pytest.raises(shmpool.PoolClosedError):
        handle.params.write(0, length=0.6)
    handle.close()
    handle.close()


@pytest.mark.alone  # another test's launch would remove the stale pool
def test_stale_pool_is_reported_as_stale(pool_name: str) -> None:
    child = helpers.start_script(OWNER, pool_name, start_new_session=True)
    pids = json.loads(child.stdout.readline())
    os.killpg(child.pid, signal.SIGKILL)  # owner and workers at once: the segment stays behind
    child.wait(5)
    assert helpers.wait_gone(pids, 5.0) == []
    try:
        with pytest.raises(shmpool.PoolNotFoundError, match="stale: its owner .* is dead"):
            shmpool.attach(pool_name)
        listing = helpers.shmpool_cli("ls")
        assert pool_name in listing.stdout and "stale" in listing.stdout
    finally:
        assert pool_name in helpers.shmpool_cli("gc").stdout


WAITING_ATTACHER = """
import sys, time, shmpool
print("attaching", flush=True)
with shmpool.attach(sys.argv[1], wait=60) as handle:
    print("attached", handle.num_envs, handle.alive, flush=True)
"""


def test_attach_with_a_timeout_waits_for_the_pool_to_appear(pool_name: str) -> None:
    started = time.monotonic()
    with pytest.raises(shmpool.PoolNotFoundError, match="no pool named"):
        shmpool.attach(pool_name, wait=0.5)  # nothing appears: it gives up after its timeout
    assert 0.5 <= time.monotonic() - started < 10.0
    with pytest.raises(ValueError, match="wait must be a number of seconds or None, got nan"):
        shmpool.attach(pool_name, wait=float("nan"))  # no deadline would ever pass
    _fake_segment(pool_name, b"SOMETHING ELSE")
    try:
        started = time.monotonic()
        with pytest.raises(shmpool.LayoutMismatchError, match="bad magic"):
            shmpool.attach(pool_name, wait=30)  # not a pool being created: no waiting for it
        assert time.monotonic() - started < 5.0
    finally:
        posix_ipc.unlink_shared_memory(f"/shmpool-{pool_name}")
    attacher = helpers.start_script(WAITING_ATTACHER, pool_name)
    try:
        assert attacher.stdout.readline().strip() == "attaching"
        time.sleep(0.5)
        assert attacher.poll() is None  # still waiting: no pool of that name yet
        # A pool being created: first an empty segment, then one whose header is not written yet.
        for size in (0, 4096):
            _fake_segment(pool_name, b"", size=size)
            try:
                time.sleep(0.3)
                assert attacher.poll() is None  # waits on: the pool is still being launched
            finally:
                posix_ipc.unlink_shared_memory(f"/shmpool-{pool_name}")
        with shmpool.launch("CartPole-v1", 3, num_workers=1, name=pool_name) as pool:
            output, _ = attacher.communicate(timeout=60)
            assert pool.num_envs == 3
        assert attacher.returncode == 0 and output.strip() == "attached 3 True"
    finally:
        if attacher.poll() is None:
            attacher.kill()
            attacher.communicate()


def test_an_idle_pool_reports_no_steps_per_second(pool_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rate is published while the pool steps; a pool idle for a while (a long update) showed its
    last rate for ever, in stats and in ``shmpool ls``."""
    import shmpool.layout
    import shmpool.registry

    monkeypatch.setattr(shmpool.layout, "IDLE_AFTER", 0.3)
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name) as pool, shmpool.attach(pool_name) as handle:
        pool.reset(seed=0)
        started = time.monotonic()
        while time.monotonic() - started < 1.2:  # the rate is published every 64 steps, once a second has passed
            pool.step(np.zeros(2, np.int64))
        assert handle.stats.steps_per_second > 0
        time.sleep(0.5)
        assert handle.stats.steps_per_second == 0 and pool.stats.steps_per_second == 0
        assert shmpool.registry.read_record(pool_name).steps_per_second == 0  # what `shmpool ls` shows
