"""The shared-memory protocol primitives that every channel of a pool uses, in one package, and the
objects of one mapped segment built from its field views by name.

Why and how: ``docs/internals.md``, "shmpool/protocol/__init__.py".
"""

from __future__ import annotations

import platform

import numpy as np

from ..errors import ShmpoolError
from .lock import WriterLock, init_writer_mutex
from .rings import EventRings
from .seqlock import Seqlock, seqlock_read
from .words import (
    W_EVENTS_JOURNAL,
    W_EVENTS_PUBLISHED,
    W_HOLDER,
    W_PARAMS_GENERATION,
    W_PARAMS_JOURNAL,
    WRITERS_WORDS,
)

__all__ = [
    "WRITERS_WORDS",
    "W_EVENTS_JOURNAL",
    "W_EVENTS_PUBLISHED",
    "W_HOLDER",
    "W_PARAMS_GENERATION",
    "W_PARAMS_JOURNAL",
    "EventRings",
    "Seqlock",
    "WriterLock",
    "check_memory_model",
    "event_rings",
    "init_writer_mutex",
    "params_seqlock",
    "seqlock_read",
    "writer_lock",
]

#: CPUs whose memory model keeps the order of plain stores and of plain loads (total store order).
TSO_MACHINES = ("x86_64", "amd64", "i386", "i686")


def check_memory_model(machine: str | None = None) -> None:
    """Raises ``ShmpoolError`` on a CPU whose memory model would let readers see torn data (the
    publication order is only safe on total-store-order CPUs: see docs/internals.md)."""
    machine = (machine or platform.machine()).lower()
    if machine not in TSO_MACHINES:
        raise ShmpoolError(
            f"shmpool needs a CPU with total store order (x86-64); this one is {machine!r}, on which "
            f"shared-memory publication without acquire/release instructions is unsafe"
        )


def event_rings(views: dict[str, np.ndarray]) -> EventRings | None:
    """The event rings of a mapped segment, or None for a pool without hooks."""
    if "events" not in views:
        return None
    return EventRings(
        views["events"], views["event_heads"], views["event_tails"], views["event_undo_heads"], views["writers"]
    )


def params_seqlock(views: dict[str, np.ndarray]) -> Seqlock | None:
    """The seqlocked params block of a mapped segment, or None for a pool without params."""
    if "params" not in views:
        return None
    return Seqlock(views["params"], views["params_seq"], views["params_undo"], views["writers"])


def writer_lock(views: dict[str, np.ndarray], label: str) -> WriterLock:
    """The writers' lock of a mapped segment (``label``: its name in errors), recovering every channel."""
    lock = WriterLock(views["writers"], label)
    for channel in (params_seqlock(views), event_rings(views)):
        if channel is not None:
            lock.on_acquire(channel.recover)
    return lock
