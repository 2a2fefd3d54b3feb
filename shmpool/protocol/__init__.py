"""The shared-memory protocol primitives that every channel of a pool uses, in one package.

Why and how: ``docs/internals.md``, "shmpool/protocol/__init__.py".
"""

from __future__ import annotations

from .lock import WriterLock, init_writer_mutex
from .memory_model import TSO_MACHINES, check_memory_model
from .rings import EventRings
from .segment import event_rings, params_seqlock, writer_lock
from .seqlock import SEQLOCK_RETRIES, Seqlock, seqlock_read
from .words import (
    W_EVENTS_JOURNAL,
    W_EVENTS_PUBLISHED,
    W_HOLDER,
    W_PARAMS_GENERATION,
    W_PARAMS_JOURNAL,
    WRITERS_WORDS,
)

__all__ = [
    "SEQLOCK_RETRIES",
    "TSO_MACHINES",
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
