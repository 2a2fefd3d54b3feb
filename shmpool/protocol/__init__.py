"""The shared-memory protocol primitives that every channel of a pool uses, in one package.

Several processes (the trainer, workers, attached curricula, the CLI) and several threads of each
share one segment. Four rules make that safe, each implemented in one module here:

* **Ordering** (``.memory_model``). A reader must never see a flag before the data it publishes.
  On x86-64 the CPU keeps the order of stores, and of loads, so "write the data, then the flag" in
  separate Python statements is enough (each numpy call is an opaque C call the compiler cannot
  reorder across). Weaker CPUs (aarch64: Graviton, Grace, Jetson) would need real acquire/release
  instructions, which Python has no cheap way to issue: ``check_memory_model`` refuses them at
  launch and attach with a clear error rather than let pools be silently wrong there.
* **Exclusion** (``.lock``). ``WriterLock`` excludes writers across processes *and* threads
  *and* forked children: a process-shared robust POSIX mutex in the segment, taken without a system
  call when free (compiled code takes it too: ``.compiled``). The kernel marks it when its holder
  dies, and the next taker rolls back what it left; a stopped holder (Ctrl-Z) makes waiters time
  out with an error naming it, never hang.
* **No half write is ever published** (``.seqlock``). Every critical section that writes shared
  records keeps an undo journal in the segment. A writer that dies or is interrupted mid-write
  leaves its journal set; the next holder of the lock (or the interrupted writer itself, on the way
  out) rolls the half write back before anything else happens. Readers never wait on a writer and
  never see torn data: ``seqlock_read`` copies the block between two reads of a generation
  word, and only while a write is in flight skips records whose per-row counter is odd or moved.
* **All or nothing across rings** (``.rings``). An event for envs of several workers is written
  into each worker's ring and published by one store (the global ticket), so a sender killed in
  between delivers to no worker rather than to some (``EventRings``).

The words these share live in the segment's ``writers`` field (``.words``); ``.segment``
builds the lock, the seqlock and the rings of a mapped segment from its fields. Holding back Ctrl-C
is about signals, not shared memory: it is ``shmpool.interrupts``.
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
