"""The segment: mode 0600, a validated header, and a field table that is plain data; a malformed one
is refused with ``LayoutMismatchError`` and skipped by ``ls`` and ``gc``."""

from __future__ import annotations

import json
import mmap
import os
import stat
import struct
from collections.abc import Callable

import helpers
import numpy as np
import posix_ipc
import pytest

import shmpool
import shmpool.hooks
from shmpool.errors import LayoutMismatchError, PoolNotFoundError
from shmpool.layout import H_SIZE, H_TABLE_LENGTH, H_TABLE_OFFSET, HEADER_BYTES, LAYOUT_VERSION, MAGIC, Layout
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
        with open(os.path.join(helpers.SHM_DIR, f"shmpool-{pool.name}"), "rb") as file:
            real = file.read()  # its owner is this process: every copy passes the liveness check
        crafted = _crafted_segments(real)
        assert len(crafted) >= 8
        try:
            for index, content in enumerate(crafted.values()):
                path = os.path.join(helpers.SHM_DIR, f"shmpool-{pool_name}-{index}")
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
                result = helpers.shmpool_cli(command)
                assert result.returncode == 0, (command, result.stderr[-2000:])
                assert "Traceback" not in result.stderr
            # Their owner is alive (or unreadable): nothing was removed.
            assert len(helpers.shm_entries(f"{pool_name}-")) == len(crafted)
            with shmpool.attach(pool_name) as handle:
                assert handle.alive
            pool.reset()
            pool.step(pool.action_space.sample())
        finally:
            for index in range(len(crafted)):
                path = os.path.join(helpers.SHM_DIR, f"shmpool-{pool_name}-{index}")
                if os.path.lexists(path):
                    os.unlink(path)
