"""The words of a segment's ``writers`` field (int64), which the writers' lock, the seqlock and the
event rings share across processes.

Each journal word is set before its critical section changes anything and cleared last, so that the
next holder of the lock knows what to roll back.
"""

from __future__ import annotations

WRITERS_WORDS = 16
(
    W_HOLDER,  # pid of the process inside a writers' critical section, 0 when none
    W_PARAMS_JOURNAL,  # 1 while a params write is in flight: params_undo holds the rows before it
    W_EVENTS_JOURNAL,  # ticket of the event being sent, 0 when none: event_undo_heads hold the heads before it
    W_EVENTS_PUBLISHED,  # ticket of the newest event that reached all of its rings
    W_PARAMS_GENERATION,  # odd while a params write is in flight; +2 per write (readers' fast path; //2: version)
) = range(5)
#: Words ``W_MUTEX`` to the end (64 bytes, 8-byte aligned) hold the writers' lock itself: a
#: process-shared robust POSIX mutex (``shmpool.protocol.lock``).
W_MUTEX = 8
MUTEX_BYTES = (WRITERS_WORDS - W_MUTEX) * 8
