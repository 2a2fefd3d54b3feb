"""Event rings: one ring of fixed-size records per worker, many senders, one consumer per ring, and
an event for several rings delivered to all of them or to none (``EventRings``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..errors import ShmpoolError
from .words import W_EVENTS_JOURNAL, W_EVENTS_PUBLISHED


class EventRings:
    """One ring of fixed-size records per worker; many senders, one consumer per ring.

    A send writes one record into each target ring beyond its head, advances those heads, and then publishes them all
    with one store of the global ticket. A consumer takes only records whose ticket is at most the published one, so an
    event reaches all of its rings or none. A sender that dies between the two leaves its journal set; the next holder
    of the lock moves the heads back. Why heads, tails and rings are also memoryviews: ``docs/internals.md``,
    "shmpool/protocol/rings.py".
    """

    def __init__(
        self,
        records: np.ndarray,
        heads: np.ndarray,
        tails: np.ndarray,
        undo_heads: np.ndarray,
        words: np.ndarray,
    ) -> None:
        self.records, self.heads, self.tails = records, heads, tails
        self._undo_heads, self._words = undo_heads, words
        self.capacity = records.shape[1]
        self._size = records.dtype.itemsize
        fields = records.dtype.fields
        if self._size % 8 or fields is None or "ticket" not in fields or fields["ticket"][1] != 0:
            raise ShmpoolError(f"event records must be int64 words led by their ticket, got {records.dtype}")
        self.head_words, self.tail_words = _int64_words(heads), _int64_words(tails)
        self._writer_words = _int64_words(words)
        # Per ring, its bytes and the same as int64 words; a record is a whole number of words.
        self._ring_bytes = [ring.data.cast("B") for ring in records]  # cast() refuses a strided ring
        self._ring_words = [ring.cast("q") for ring in self._ring_bytes]
        self._record_words = self._size // 8

    def full(self, ring_ids: Sequence[int]) -> list[int]:
        """The rings among ``ring_ids`` that have no room for one more record."""
        heads, tails, capacity = self.head_words, self.tail_words, self.capacity
        return [k for k in ring_ids if heads[k] - tails[k] >= capacity]

    def publish(self, parts: Sequence[tuple[int, bytes | Callable[[np.ndarray], None]]]) -> None:
        """Writes one record per ``(ring, record)`` and publishes them together. ``record``: the
        record's bytes (its ticket is stamped here), or ``fill(record)``, which writes the record's
        fields in place. Hold the lock and check ``full`` first."""
        words, heads, capacity, size = self._words, self.heads, self.capacity, self._size
        ticket = self._writer_words[W_EVENTS_PUBLISHED] + 1
        self._undo_heads[:] = heads
        words[W_EVENTS_JOURNAL] = ticket
        for ring, record in parts:
            slot = self.head_words[ring] % capacity
            if callable(record):
                fields = self.records[ring, slot]
                record(fields)
                fields["ticket"] = ticket
            else:
                # All but the ticket word, then the ticket: the slot's ticket must never read as
                # published while it is rewritten (a consumer holding a head from before a dead
                # sender's rollback may look at this slot, and skips it only by its ticket).
                self._ring_bytes[ring][slot * size + 8 : (slot + 1) * size] = memoryview(record)[8:]
                self._ring_words[ring][slot * self._record_words] = ticket
        for ring, _ in parts:
            heads[ring] += 1
        words[W_EVENTS_PUBLISHED] = ticket  # the one store that delivers to every ring at once
        words[W_EVENTS_JOURNAL] = 0

    def recover(self) -> None:
        """Moves back the heads of a send that died before publishing (one word compare otherwise)."""
        words = self._words
        ticket = int(words[W_EVENTS_JOURNAL])
        if not ticket:
            return
        if words[W_EVENTS_PUBLISHED] < ticket:  # never published: no consumer took any of it
            self.heads[:] = self._undo_heads
        words[W_EVENTS_JOURNAL] = 0

    def take(self, ring: int) -> bytearray:
        """Copies out the published records of ``ring`` not taken yet, oldest first, as raw bytes
        (whole records of ``records``' dtype), and frees them."""
        published = self._writer_words[W_EVENTS_PUBLISHED]  # first: records up to it are whole
        tail, head = self.tail_words[ring], self.head_words[ring]
        if head - tail > self.capacity:  # only a corrupt head: never read a slot twice
            head = tail + self.capacity
        ring_words, record_words, capacity = self._ring_words[ring], self._record_words, self.capacity
        ready = tail
        while ready < head and ring_words[ready % capacity * record_words] <= published:  # its ticket
            ready += 1  # tickets rise along a ring: the first unpublished record ends what is ready
        if ready == tail:
            return bytearray()
        ring_bytes, size = self._ring_bytes[ring], self._size
        start, stop = tail % capacity * size, ready % capacity * size
        if start < stop:
            taken = bytearray(ring_bytes[start:stop])
        else:  # wraps around the end of the ring
            taken = bytearray(ring_bytes[start:])
            taken += ring_bytes[:stop]
        self.tail_words[ring] = ready  # after the copy: those slots may now be reused
        return taken

    def consume(self, ring: int) -> np.ndarray:
        """``take`` as an array of records."""
        return np.frombuffer(self.take(ring), dtype=self.records.dtype)


def _int64_words(array: np.ndarray) -> memoryview:
    """A contiguous int64 array as a memoryview of Python ints (an item read is one 8-byte load)."""
    return array.data.cast("B").cast("q")
