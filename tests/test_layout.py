"""The segment: mode 0600, a validated header, and a field table that is plain data."""

from __future__ import annotations

import json
import mmap
import os
import stat
import struct

import numpy as np
import posix_ipc
import pytest

import shmpool
from shmpool.errors import LayoutMismatchError, PoolNotFoundError
from shmpool.layout import H_TABLE_LENGTH, LAYOUT_VERSION, MAGIC, Layout
from shmpool.registry import list_pools, read_record


def test_segment_mode_header_and_listing(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name) as pool:
        info = os.stat(f"/dev/shm/shmpool-{pool.name}")
        assert stat.S_IMODE(info.st_mode) == 0o600
        record = read_record(pool.name)
        assert record.alive and record.owner_pid == os.getpid()
        assert record.meta["num_envs"] == 4 and record.meta["slots"] == [[0, 2], [2, 4]]
        assert pool.name in [r.name for r in list_pools()]
        with open(f"/dev/shm/shmpool-{pool.name}", "rb") as file:
            head = file.read(64)
        assert head[:8] == MAGIC
        version, size = struct.unpack_from("<2q", head, 8)
        assert version == LAYOUT_VERSION and size == info.st_size


def _fake_segment(name: str, content: bytes) -> None:
    shm = posix_ipc.SharedMemory(f"/shmpool-{name}", posix_ipc.O_CREX, mode=0o600, size=4096)
    buffer = mmap.mmap(shm.fd, 4096)
    shm.close_fd()
    buffer[: len(content)] = content
    buffer.close()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"NOTPOOL\x00", "not a shmpool segment"),
        (MAGIC + struct.pack("<q", LAYOUT_VERSION + 1), f"layout version {LAYOUT_VERSION + 1}"),
        (MAGIC + struct.pack("<2q", LAYOUT_VERSION, 8192), "says 8192 bytes but the object has 4096"),
        (MAGIC + struct.pack("<8q", LAYOUT_VERSION, 4096, 1, 1, 1, 1, 128, 10**7), "outside the segment"),
    ],
)
def test_foreign_or_damaged_segments_are_refused(content: bytes, message: str, pool_name: str) -> None:
    _fake_segment(pool_name, content)
    try:
        with pytest.raises(LayoutMismatchError, match=message):
            read_record(pool_name)
    finally:
        posix_ipc.unlink_shared_memory(f"/shmpool-{pool_name}")


def test_field_table_rejects_objects_and_out_of_bounds_fields() -> None:
    layout = Layout.plan([("a", np.float64, (4,)), ("b", [("x", "<f8"), ("y", "<i8", (2,))], (3,))], {"k": 1})
    buffer = bytearray(layout.size)
    layout.write_header(buffer, owner_pid=1, owner_start_ticks=1)
    decoded, _ = Layout.read(buffer)
    assert decoded.fields["b"].dtype == np.dtype([("x", "<f8"), ("y", "<i8", (2,))])
    views = decoded.views(buffer)
    views["b"]["y"][1] = [5, 6]
    assert Layout.read(buffer)[0].views(buffer)["b"]["y"][1].tolist() == [5, 6]

    table = json.loads(bytes(buffer[128 : 128 + struct.unpack_from("<q", buffer, H_TABLE_LENGTH * 8)[0]]))
    edits = [
        ("an object dtype", lambda t: t["fields"][0].update(dtype="|O")),
        ("a field past the end", lambda t: t["fields"][0].update(offset=layout.size - 64)),
        ("a misaligned field", lambda t: t["fields"][0].update(offset=t["fields"][0]["offset"] + 8)),
        ("overlapping fields", lambda t: t["fields"][1].update(offset=t["fields"][0]["offset"])),
        ("a negative shape", lambda t: t["fields"][0].update(shape=[-4])),
    ]
    for what, edit in edits:
        edited = json.loads(json.dumps(table))
        edit(edited)
        encoded = json.dumps(edited).encode()
        broken = bytearray(buffer)
        broken[128 : 128 + len(encoded)] = encoded
        struct.pack_into("<q", broken, H_TABLE_LENGTH * 8, len(encoded))
        with pytest.raises(LayoutMismatchError):
            Layout.read(broken)
            pytest.fail(f"accepted {what}")


def test_missing_pool() -> None:
    with pytest.raises(PoolNotFoundError):
        read_record("no-such-pool-anywhere")
