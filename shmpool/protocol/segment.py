"""The protocol objects of one mapped segment, built from its field views by name."""

from __future__ import annotations

import numpy as np

from .lock import WriterLock
from .rings import EventRings
from .seqlock import Seqlock


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
