"""Finding pools by name in ``/dev/shm`` and removing the ones whose owner is dead.

Liveness is judged from the owner's pid and start time through ``/proc``, which only means something
for an owner in this process's pid namespace: containers that share ``/dev/shm`` see each other's
segments, and a pool whose owner lives in another namespace is listed with unknown liveness and never
removed from here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import LayoutMismatchError
from .layout import CONTROL_WORDS, H_GLOBAL_STEP, H_STEPS_PER_SECOND, Layout, current_rate, header_words
from .system import (
    SEGMENT_PREFIX,
    SEMAPHORE_FILE_PREFIX,
    SHM_DIR,
    FileIdentity,
    Segment,
    doorbell_file,
    file_identity,
    is_pool_name,
    pid_namespace,
    process_alive,
    segment_file,
    unlink_if_same,
)

# What reading one entry may raise for a segment that is not a readable pool of this user: skipped.
# (PoolNotFoundError and PermissionError are OSErrors.)
_UNREADABLE = (LayoutMismatchError, OSError)


@dataclass(frozen=True)
class ShmEntry:
    """One object in ``/dev/shm`` that belongs to shmpool."""

    pool_name: str
    kind: str  # "segment" or "doorbell"
    posix_name: str


def list_entries() -> Iterator[ShmEntry]:
    """The shmpool segments and semaphores present in ``/dev/shm`` (any owner).

    Only regular files with a name ``launch`` could have made: a directory, symlink, fifo or oddly named
    file that merely starts with the prefix is someone else's business, and skipping it here keeps it
    from breaking every ``launch``, ``shmpool ls`` and ``shmpool gc``.
    """
    try:
        entries = list(os.scandir(SHM_DIR))
    except OSError:
        return
    for entry in entries:
        file_name = entry.name
        if file_name.startswith(SEGMENT_PREFIX):
            kind, posix_name = "segment", "/" + file_name
            pool_name = file_name[len(SEGMENT_PREFIX) :]
        elif file_name.startswith(SEMAPHORE_FILE_PREFIX + SEGMENT_PREFIX):
            kind, posix_name = "doorbell", "/" + file_name[len(SEMAPHORE_FILE_PREFIX) :]
            pool_name = posix_name[len(SEGMENT_PREFIX) + 1 :].rsplit(".", 1)[0]
        else:
            continue
        try:
            regular = entry.is_file(follow_symlinks=False)
        except OSError:  # gone meanwhile
            continue
        if regular and is_pool_name(pool_name):
            yield ShmEntry(pool_name, kind, posix_name)


def entry_file(entry: ShmEntry) -> str:
    """The file in ``/dev/shm`` behind an entry."""
    return segment_file(entry.pool_name) if entry.kind == "segment" else doorbell_file(entry.posix_name)


def owned_by_me(entry: ShmEntry) -> bool:
    """Whether the entry's file (not what a symlink there points to) belongs to this user."""
    try:
        return os.lstat(entry_file(entry)).st_uid == os.getuid()
    except OSError:
        return False


@dataclass(frozen=True)
class PoolRecord:
    """What the header and table of one pool's segment say about it."""

    name: str
    owner_pid: int
    alive: bool | None  # None: unknown, the owner is in another pid namespace (another container)
    state: int
    meta: dict[str, Any]
    global_step: int = 0
    steps_per_second: int = 0
    identity: FileIdentity | None = None  # of the segment file that was read


def read_record(name: str) -> PoolRecord:
    """Reads one pool's header and table; raises if it is missing, foreign or not a shmpool segment."""
    segment = Segment.open(name)
    try:
        layout, header = Layout.read(segment.buffer)
        words = header_words(segment.buffer)
        control = layout.views(segment.buffer).get("control")
        global_step, rate = int(words[H_GLOBAL_STEP]), int(words[H_STEPS_PER_SECOND])
        if control is not None and control.dtype == np.int64 and control.shape[1:] == (CONTROL_WORDS,):
            rate = current_rate(rate, control)  # not in a segment malformed there: ls lists what it can
        del control
        words.release()
    finally:
        segment.close()
    alive: bool | None = None
    if header.owner_pid_namespace == pid_namespace():
        alive = process_alive(header.owner_pid, header.owner_start_ticks)
    return PoolRecord(
        name, header.owner_pid, alive, header.state, layout.meta, global_step, rate, identity=segment.identity
    )


def list_pools() -> list[PoolRecord]:
    """Every readable shmpool segment of this user, live, stale or of unknown liveness."""
    records = []
    for entry in list_entries():
        if entry.kind != "segment" or not owned_by_me(entry):
            continue
        try:
            records.append(read_record(entry.pool_name))
        except _UNREADABLE:
            continue
    return sorted(records, key=lambda record: record.name)


def remove_pool_objects(name: str, identity: FileIdentity | None) -> bool:
    """Unlinks a dead pool's doorbells, then its segment, if its segment is still the file ``identity``.

    A pool launched under the same name once the old segment is gone has new files, which stay: the
    segment is always created first, so while the old one is still there (checked first) the
    doorbells under the name are the old pool's. Returns whether the segment was removed.
    """
    path = segment_file(name)
    if identity is None or file_identity(path) != identity:
        return False  # already removed, perhaps replaced by a new pool: nothing here is ours to remove
    for entry in list_entries():
        if entry.kind == "doorbell" and entry.pool_name == name and owned_by_me(entry):
            doorbell = doorbell_file(entry.posix_name)
            unlink_if_same(doorbell, file_identity(doorbell))
    return unlink_if_same(path, identity)


def sweep_stale() -> list[str]:
    """Removes this user's segments whose owner process is dead, and doorbells left without a segment.

    A segment still being created (no magic yet), one that is not a readable shmpool segment, and one
    whose owner is in another pid namespace (its pid means nothing here) are left alone. Returns the
    names removed.
    """
    removed = []
    entries = [entry for entry in list_entries() if owned_by_me(entry)]
    segments = {entry.pool_name for entry in entries if entry.kind == "segment"}
    for name in sorted(segments):
        try:
            record = read_record(name)
        except _UNREADABLE:
            continue
        if record.alive is False and remove_pool_objects(name, record.identity):
            removed.append(name)
    for entry in entries:
        if entry.kind != "doorbell" or entry.pool_name in segments:
            continue
        # Re-check: a pool being launched right now creates its segment first, then its doorbells.
        if os.path.lexists(segment_file(entry.pool_name)):
            continue
        path = entry_file(entry)
        if unlink_if_same(path, file_identity(path)) and entry.pool_name not in removed:
            removed.append(entry.pool_name)
    return removed
