"""The shared-memory protocol primitives that every channel of a pool uses, in one place.

Several processes (the trainer, workers, attached curricula, the CLI) and several threads of each
share one segment. Four rules make that safe, and this module is where each is implemented:

* **Ordering.** A reader must never see a flag before the data it publishes. On x86-64 the CPU
  keeps the order of stores, and of loads, so "write the data, then the flag" in separate Python
  statements is enough (each numpy call is an opaque C call the compiler cannot reorder across).
  Weaker CPUs (aarch64: Graviton, Grace, Jetson) would need real acquire/release instructions,
  which Python has no cheap way to issue: :func:`check_memory_model` refuses them at launch and
  attach with a clear error rather than let pools be silently wrong there.
* **Exclusion.** :class:`WriterLock` excludes writers across processes *and* threads *and* forked
  children: a thread lock inside each process, then a ``flock`` on a file description that each
  process (re)opens for itself (a forked child gets its own, instead of sharing its parent's). The
  kernel drops a ``flock`` when its holder dies; a stopped holder (Ctrl-Z) makes waiters time out
  with an error naming it, never hang.
* **No half write is ever published.** Every critical section that writes shared records keeps an
  undo journal in the segment. A writer that dies or is interrupted mid-write leaves its journal
  set; the next holder of the lock (or the interrupted writer itself, on the way out) rolls the
  half write back before anything else happens. Readers never wait on a writer and never see torn
  data: :func:`seqlock_read` copies the block between two reads of a generation word, and only
  while a write is in flight skips records whose per-row counter is odd or moved.
* **All or nothing across rings.** An event for envs of several workers is written into each
  worker's ring and published by one store (the global ticket), so a sender killed in between
  delivers to no worker rather than to some (:class:`EventRings`).

The ``writers`` field of the segment holds the words below (int64).
"""

from __future__ import annotations

import _signal  # the C module: signal.getsignal/signal wrap it in enums at several microseconds a call
import fcntl
import os
import platform
import signal
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import PoolClosedError, ShmpoolError, WriterLockTimeout
from .system import process_state

# Words of the ``writers`` field.
WRITERS_WORDS = 8
(
    W_HOLDER,  # pid of the process inside a writers' critical section, 0 when none
    W_PARAMS_JOURNAL,  # 1 while a params write is in flight: params_undo holds the rows before it
    W_EVENTS_JOURNAL,  # ticket of the event being sent, 0 when none: event_undo_heads hold the heads before it
    W_EVENTS_PUBLISHED,  # ticket of the newest event that reached all of its rings
    W_PARAMS_GENERATION,  # odd while a params write is in flight; +2 for each write (readers' fast path)
) = range(5)

#: CPUs whose memory model keeps the order of plain stores and of plain loads (total store order).
TSO_MACHINES = ("x86_64", "amd64", "i386", "i686")

#: Reads of a record that a writer is changing are retried this often before the reader keeps what it
#: had (a writer killed mid-write leaves its rows odd until the next writer rolls them back).
SEQLOCK_RETRIES = 8


def check_memory_model(machine: str | None = None) -> None:
    """Raises ``ShmpoolError`` on a CPU whose memory model would let readers see torn data."""
    machine = (machine or platform.machine()).lower()
    if machine not in TSO_MACHINES:
        raise ShmpoolError(
            f"shmpool needs a CPU with total store order (x86-64); this one is {machine!r}, on which "
            f"shared-memory publication without acquire/release instructions is unsafe"
        )


class WriterLock:
    """Excludes the writers of one pool's shared records: threads, processes and forked children.

    Acquire with :meth:`hold`. Channels register a ``recover`` callable with :meth:`on_acquire`; it
    runs inside every acquisition and must be a no-op (one word compare) unless an earlier holder
    left a journal behind.
    """

    def __init__(self, path: str, words: np.ndarray, identity: tuple[int, int] | None = None) -> None:
        self._path = path
        self._identity = identity  # (st_dev, st_ino) of the segment this lock guards, when known
        self._words = words
        self._recoveries: list[Callable[[], None]] = []
        self._pid = -1
        self._thread_lock = threading.Lock()
        self._fd = _Descriptor()
        self._closed = False
        _LOCKS.add(self)

    def on_acquire(self, recover: Callable[[], None]) -> None:
        """Runs ``recover`` (roll back what a dead or interrupted holder left half done) on every
        acquisition and after a critical section that raised."""
        self._recoveries.append(recover)

    def _own_fd(self, pid: int) -> int:
        """This process's (``pid``'s) file description of the lock file, opened on first use in each
        process."""
        if self._pid != pid:
            with _OPENING:  # two threads' first uses must not both open (one would never unlock)
                if self._pid != pid:
                    try:
                        fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
                    except FileNotFoundError as exc:
                        raise PoolClosedError(f"the pool's segment {self._path} is gone: the pool was closed") from exc
                    info = os.fstat(fd)
                    if self._identity is not None and (info.st_dev, info.st_ino) != self._identity:
                        os.close(fd)  # a new pool took the name: locking its file would not exclude ours
                        raise PoolClosedError(
                            f"the pool's segment {self._path} was replaced by another pool of the same name: "
                            f"this one was closed"
                        )
                    self._fd.value = fd
                    self._pid = pid
        return self._fd.value

    def _forget_after_fork(self) -> None:
        """In a forked child: drops the inherited description. Sharing it with the parent would share
        the parent's lock instead of being excluded by it, and would keep the lock held after the
        parent dies holding it (the kernel releases a ``flock`` when its last descriptor closes)."""
        self._fd.close()
        self._pid = -1
        self._thread_lock = threading.Lock()  # the fork copied it, maybe held by a thread not copied

    def hold(self, timeout: float | None, check_open: Callable[[], None]) -> _Held:
        """A context manager holding the lock; waits up to ``timeout`` seconds (None: as long as the
        pool is open), then raises :class:`WriterLockTimeout` naming the holder."""
        return _Held(self, timeout, check_open)

    def _acquire(self, timeout: float | None, check_open: Callable[[], None]) -> None:
        if self._closed:
            raise PoolClosedError(f"the writer lock of {self._path} is closed")
        pid = os.getpid()
        fd = self._own_fd(pid)
        deadline = None if timeout is None else time.monotonic() + timeout
        thread_lock = self._thread_lock
        if not thread_lock.acquire(False):  # a free lock (the common case) without the timed wait's cost
            while not thread_lock.acquire(timeout=0.05):
                self._check_deadline(deadline, check_open)
        try:
            delay = 0.0001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    self._check_deadline(deadline, check_open)
                    time.sleep(delay)
                    delay = min(delay * 2, 0.005)
            try:
                for recover in self._recoveries:
                    recover()
                self._words[W_HOLDER] = pid
            except BaseException:
                fcntl.flock(fd, fcntl.LOCK_UN)
                raise
        except BaseException:
            thread_lock.release()
            raise

    def _release(self, failed: bool) -> None:
        try:
            if failed:  # interrupted mid-write (Ctrl-C, an error): never leave a half write behind
                self._recover()
            self._words[W_HOLDER] = 0
        finally:
            fcntl.flock(self._fd.value, fcntl.LOCK_UN)
            self._thread_lock.release()

    def _recover(self) -> None:
        for recover in self._recoveries:
            recover()

    def _check_deadline(self, deadline: float | None, check_open: Callable[[], None]) -> None:
        check_open()
        if deadline is not None and time.monotonic() >= deadline:
            holder = int(self._words[W_HOLDER])
            state = process_state(holder) if holder else "?"
            what = f"pid {holder}" + (" (stopped: Ctrl-Z or SIGSTOP)" if state in ("T", "t") else "")
            raise WriterLockTimeout(
                f"another writer ({what if holder else 'unknown'}) has held the writer lock of "
                f"{self._path} for too long; resume or stop that process, or retry",
                holder_pid=holder or None,
            )

    def close(self) -> None:
        """Refuses later acquisitions; the file description closes when the lock is collected (a
        thread still inside a critical section keeps it until then)."""
        self._closed = True


class _Descriptor:
    """A file descriptor closed exactly once: at collection, or when a forked child drops it."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = -1

    # ``os.close`` bound now: a pool collected while the interpreter exits runs this after the
    # module's globals are gone.
    def close(self, _close: Callable[[int], None] = os.close) -> None:
        if self.value >= 0:
            fd, self.value = self.value, -1
            _close(fd)

    def __del__(self) -> None:
        self.close()


#: Every writer lock of this process, so that a forked child can drop their inherited descriptors.
_LOCKS: weakref.WeakSet[WriterLock] = weakref.WeakSet()
_OPENING = threading.Lock()


def _after_fork_in_child() -> None:
    global _OPENING
    _OPENING = threading.Lock()
    for lock in list(_LOCKS):
        lock._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Held:
    """The context manager of :meth:`WriterLock.hold`.

    Ctrl-C is held back from acquisition to release: a ``KeyboardInterrupt`` raised between a lock
    call returning and the bookkeeping after it would leave the thread lock or the ``flock`` held
    for good. It is raised once the lock is free again (the write itself completes or rolls back),
    or, while still waiting for the lock, at the next check of the wait (nothing is held then).
    """

    __slots__ = ("_lock", "_timeout", "_check_open", "_deferral")

    def __init__(self, lock: WriterLock, timeout: float | None, check_open: Callable[[], None]) -> None:
        self._lock, self._timeout, self._check_open = lock, timeout, check_open
        self._deferral: _DeferredInterrupt | None = None

    def __enter__(self) -> None:
        self._deferral = _DeferredInterrupt.begin()
        try:
            self._lock._acquire(self._timeout, self._check_while_waiting)
        except BaseException:
            self._end_deferral()
            raise

    def _check_while_waiting(self) -> None:
        deferral = self._deferral
        if deferral is not None and deferral.received:
            deferral.received = False  # raised here, so not again when the deferral ends
            raise KeyboardInterrupt
        self._check_open()

    def __exit__(self, exc_type: Any, *exc_info: Any) -> None:
        try:
            self._lock._release(exc_type is not None)
        finally:
            self._end_deferral()

    def _end_deferral(self) -> None:
        deferral, self._deferral = self._deferral, None
        if deferral is not None:
            deferral.end()


class interrupts_deferred:  # noqa: N801 - used as a function: ``with interrupts_deferred():``
    """Holds back Ctrl-C (in the main thread) for the block, and raises it after: for work that must
    not stop halfway, such as releasing a pool. A class rather than a generator-based context
    manager: async ``send``/``recv`` enter it on every call, and this costs a third as much."""

    __slots__ = ("_deferral",)

    def __init__(self) -> None:
        self._deferral: _DeferredInterrupt | None = None

    def __enter__(self) -> None:
        self._deferral = _DeferredInterrupt.begin()

    def __exit__(self, *exc_info: object) -> None:
        deferral, self._deferral = self._deferral, None
        if deferral is not None:
            deferral.end()

    #: For a hold that outlives a ``with`` block (a lock's release included): ``hold()`` ... ``release()``.
    #: ``release`` is idempotent and raises the held-back ``KeyboardInterrupt``, if any.
    hold = __enter__

    def release(self) -> None:
        """Ends the hold; raises ``KeyboardInterrupt`` if Ctrl-C came during it."""
        self.__exit__()


class _DeferredInterrupt:
    """Holds back SIGINT's Python handler in the main thread (the only thread a ``KeyboardInterrupt``
    is raised in) and runs it at :meth:`end`. Blocking the signal would not do: another thread can
    take it, and the main thread still runs the handler at its next bytecode."""

    __slots__ = ("_previous", "received")

    def __init__(self, previous: Any) -> None:
        self._previous = previous
        self.received = False

    @classmethod
    def begin(cls) -> _DeferredInterrupt | None:
        """Starts holding back Ctrl-C, or returns None off the main thread or without a Python handler."""
        if threading.get_ident() != threading.main_thread().ident:
            return None
        previous = _signal.getsignal(signal.SIGINT)
        if not callable(previous):  # SIG_IGN, or SIG_DFL (the kernel ends the process: nothing leaks)
            return None
        deferral = cls(previous)
        _signal.signal(signal.SIGINT, deferral._note)
        return deferral

    def _note(self, signum: int, frame: Any) -> None:
        self.received = True

    def end(self) -> None:
        """Puts the handler back and runs it if Ctrl-C came meanwhile (raising ``KeyboardInterrupt``)."""
        _signal.signal(signal.SIGINT, self._previous)
        if self.received:
            self._previous(signal.SIGINT, None)


# -- seqlock --------------------------------------------------------------------------------------


class Seqlock:
    """Per-row sequence counters over a block of records, a generation counter over all of them, and
    the writer's undo journal.

    Writer side (under the :class:`WriterLock`): :meth:`write` saves the rows to the journal, makes
    the generation and the rows' counters odd, writes, makes them even. Reader side:
    :func:`seqlock_read`, which needs the per-row counters only while a write is in flight (the
    generation is odd or moved): otherwise one copy between two reads of one word. After a writer
    dies or is interrupted, :meth:`recover` (run by the next acquisition) restores the odd rows from
    the journal, so the half write is never published, not even by a later write of other fields.
    """

    def __init__(self, block: np.ndarray, seq: np.ndarray, undo: np.ndarray, words: np.ndarray) -> None:
        self.block, self.seq, self._undo, self._words = block, seq, undo, words
        # The journal copy as raw bytes: a third of the cost of copying records field by field.
        plain = all(a.ndim == 1 and a.strides == (a.itemsize,) for a in (block, undo))
        self._block_bytes, self._undo_bytes = (_as_bytes(block), _as_bytes(undo)) if plain else (block, undo)

    def write(self, rows: slice | np.ndarray, staged: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Writes each ``(target column view, values)`` at ``rows``, atomically per row. Hold the lock."""
        seq, words = self.seq, self._words
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

    def recover(self) -> None:
        """Rolls back the rows a dead or interrupted writer left odd (one word compare otherwise)."""
        words = self._words
        if not words[W_PARAMS_JOURNAL]:
            return
        odd = np.flatnonzero(self.seq & 1)
        self.block[odd] = self._undo[odd]
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


# -- event rings ----------------------------------------------------------------------------------


class EventRings:
    """One ring of fixed-size records per worker; many senders, one consumer per ring.

    A send writes one record into each target ring beyond its head, advances those heads, and then
    publishes them all with one store of the global ticket. A consumer takes only records whose ticket
    is at most the published one, so an event reaches all of its rings or none. A sender that dies
    between the two leaves its journal set; the next holder of the lock moves the heads back.

    Heads and tails are also memoryviews (``head_words``, ``tail_words``) and each ring raw bytes: an
    item read from a memoryview is one 8-byte load at half the cost of a numpy scalar, which matters to
    a worker that checks its ring at every step, and a record is written or copied out as one slice.
    The commit's stores (journal, heads, published ticket) go through the numpy arrays, where tests can
    watch each one.
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
        fields in place. Hold the lock and check :meth:`full` first."""
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
        (whole records of :attr:`records`' dtype), and frees them."""
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
        """:meth:`take` as an array of records."""
        return np.frombuffer(self.take(ring), dtype=self.records.dtype)


def _int64_words(array: np.ndarray) -> memoryview:
    """A contiguous int64 array as a memoryview of Python ints (an item read is one 8-byte load)."""
    return array.data.cast("B").cast("q")


# -- the channels of a segment --------------------------------------------------------------------


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


def writer_lock(path: str, views: dict[str, np.ndarray], identity: tuple[int, int] | None = None) -> WriterLock:
    """The writers' lock of a mapped segment (``path``: the segment's file; ``identity``: its st_dev and
    st_ino), recovering every channel."""
    lock = WriterLock(path, views["writers"], identity)
    for channel in (params_seqlock(views), event_rings(views)):
        if channel is not None:
            lock.on_acquire(channel.recover)
    return lock
