"""Atomic multi-field writes of a block of records that readers copy without waiting: ``Seqlock``
(the writer's side) and ``seqlock_read`` (the readers').
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .words import W_PARAMS_GENERATION, W_PARAMS_JOURNAL

#: Reads of a record that a writer is changing are retried this often before the reader keeps what it
#: had (a writer killed mid-write leaves its rows odd until the next writer rolls them back).
SEQLOCK_RETRIES = 8


class Seqlock:
    """Per-row sequence counters over a block of records, a generation counter over all of them, and the writer's
    undo journal.

    ``write`` (under the ``WriterLock``) journals the rows, makes the generation and the rows' counters odd, writes,
    makes them even; ``recover`` rolls a half write back from the journal. Half the generation, rounded down, is how
    many writes were published (``version``). Why and how: ``docs/internals.md``, "shmpool/protocol/seqlock.py".
    """

    def __init__(self, block: np.ndarray, seq: np.ndarray, undo: np.ndarray, words: np.ndarray) -> None:
        self.block, self.seq, self.undo, self.words = block, seq, undo, words
        # The journal copy as raw bytes: a third of the cost of copying records field by field.
        plain = all(a.ndim == 1 and a.strides == (a.itemsize,) for a in (block, undo))
        self._block_bytes, self._undo_bytes = (_as_bytes(block), _as_bytes(undo)) if plain else (block, undo)

    @property
    def version(self) -> int:
        """How many writes of the block have been published (one in flight is not yet counted)."""
        return int(self.words[W_PARAMS_GENERATION]) // 2

    def write(self, rows: slice | np.ndarray, staged: Sequence[tuple[np.ndarray, np.ndarray | float]]) -> int:
        """Writes each ``(target column view, values)`` at ``rows`` (values: one per row, or one for
        all), atomically per row; returns the ``version`` once it is published. Hold the lock."""
        seq, words = self.seq, self.words
        generation = int(words[W_PARAMS_GENERATION])
        self._undo_bytes[rows] = self._block_bytes[rows]
        words[W_PARAMS_JOURNAL] = 1  # after the journal is whole: a rollback restores from it
        words[W_PARAMS_GENERATION] = generation + 1  # odd: readers take the per-row path
        seq[rows] += 1  # odd: readers skip these rows from here on
        for target, values in staged:
            target[rows] = values
        seq[rows] += 1  # even: the rows are whole again
        words[W_PARAMS_GENERATION] = generation + 2
        words[W_PARAMS_JOURNAL] = 0
        return (generation + 2) // 2

    def recover(self) -> None:
        """Rolls back the rows a dead or interrupted writer left odd (one word compare otherwise)."""
        words = self.words
        if not words[W_PARAMS_JOURNAL]:
            return
        odd = np.flatnonzero(self.seq & 1)
        self.block[odd] = self.undo[odd]
        self.seq[odd] += 1
        if words[W_PARAMS_GENERATION] & 1:
            words[W_PARAMS_GENERATION] += 1
        words[W_PARAMS_JOURNAL] = 0


def _as_bytes(records: np.ndarray) -> np.ndarray:
    """Contiguous ``records`` as an ``(rows, itemsize)`` uint8 view."""
    return records.view(np.uint8).reshape(len(records), records.itemsize)


def seqlock_read(block: np.ndarray, seq: np.ndarray, previous: np.ndarray, words: np.ndarray) -> np.ndarray:
    """A copy of ``block`` in which no row is half written: rows that a writer is changing (odd or
    moving counter) for ``SEQLOCK_RETRIES`` tries keep their value from ``previous``. Never waits."""
    generation = words[W_PARAMS_GENERATION]
    copy = block.copy()
    if generation == words[W_PARAMS_GENERATION] and not generation & 1:  # no write meanwhile: the common case
        return copy
    snapshot = previous.copy()
    pending = np.ones(len(block), dtype=np.bool_)
    for _ in range(SEQLOCK_RETRIES):
        before = seq.copy()
        copy = block.copy()
        after = seq.copy()
        whole = (before == after) & (before & 1 == 0) & pending
        snapshot[whole] = copy[whole]
        pending &= ~whole
        if not pending.any():
            break
    return snapshot
