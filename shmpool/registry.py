"""Finding pools by name in ``/dev/shm`` and removing the ones whose owner is dead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import LayoutMismatchError, PoolNotFoundError
from .layout import H_GLOBAL_STEP, H_STEPS_PER_SECOND, Layout, header_words
from .system import Segment, list_entries, owned_by_me, process_alive, unlink_doorbell, unlink_segment


@dataclass(frozen=True)
class PoolRecord:
    """What the header and table of one pool's segment say about it."""

    name: str
    owner_pid: int
    alive: bool
    state: int
    meta: dict[str, Any]
    global_step: int = 0
    steps_per_second: int = 0


def read_record(name: str) -> PoolRecord:
    """Reads one pool's header and table; raises if it is missing, foreign or not a shmpool segment."""
    segment = Segment.open(name)
    try:
        layout, header = Layout.read(segment.buffer)
        words = header_words(segment.buffer)
        global_step, rate = int(words[H_GLOBAL_STEP]), int(words[H_STEPS_PER_SECOND])
        words.release()
    finally:
        segment.close()
    alive = process_alive(header.owner_pid, header.owner_start_ticks)
    return PoolRecord(name, header.owner_pid, alive, header.state, layout.meta, global_step, rate)


def list_pools() -> list[PoolRecord]:
    """Every readable shmpool segment of this user, live or stale."""
    records = []
    for entry in list_entries():
        if entry.kind != "segment" or not owned_by_me(entry):
            continue
        try:
            records.append(read_record(entry.pool_name))
        except (LayoutMismatchError, PoolNotFoundError, PermissionError):
            continue
    return sorted(records, key=lambda record: record.name)


def remove_pool_objects(name: str) -> None:
    """Unlinks a pool's doorbells, then its segment (the reverse of creation order)."""
    for entry in list_entries():
        if entry.kind == "doorbell" and entry.pool_name == name:
            unlink_doorbell(entry.posix_name)
    unlink_segment(name)


def sweep_stale() -> list[str]:
    """Removes this user's segments whose owner process is dead, and doorbells left without a segment.

    A segment still being created (no magic yet) is left alone. Returns the names removed.
    """
    removed = []
    entries = [entry for entry in list_entries() if owned_by_me(entry)]
    segments = {entry.pool_name for entry in entries if entry.kind == "segment"}
    for name in sorted(segments):
        try:
            record = read_record(name)
        except (LayoutMismatchError, PoolNotFoundError, PermissionError):
            continue
        if not record.alive:
            remove_pool_objects(name)
            removed.append(name)
    for entry in entries:
        if entry.kind == "doorbell" and entry.pool_name not in segments:
            unlink_doorbell(entry.posix_name)
            if entry.pool_name not in removed:
                removed.append(entry.pool_name)
    return removed
