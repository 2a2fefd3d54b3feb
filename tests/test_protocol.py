"""The shared-memory protocol of :mod:`shmpool.protocol`: its primitives, then the writers' lock and
the memory-model check as a running pool uses them.

The event rings and the seqlock run over plain numpy arrays against a small model of what must be
delivered (property tests). A writer's death is an exception raised at a chosen point of a send or a
write: inside a ring's fill, inside the ``__array__`` of the values a seqlock writes, or just before
any store into the protocol's heads, journals and counters (the arrays are a numpy subclass that
watches its stores). ``recover()`` then runs, as the next holder of the writers' lock would.
Concurrent readers are simulated by running ``consume()`` or ``seqlock_read()`` at those same points,
so they observe the half-done state. The writers' lock itself is tested with real threads, a
subprocess holding the ``flock`` and forked children; through a pool, with a holder stopped by
SIGSTOP, Ctrl-C while waiting for it and inside it, and a handle whose pool was replaced.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import helpers
import numpy as np
import pytest
from helpers import Fuse, Hook, tripwire
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import shmpool
from shmpool import Param
from shmpool.errors import WriterLockTimeoutError
from shmpool.events import event_dtype
from shmpool.protocol import (
    W_EVENTS_JOURNAL,
    W_EVENTS_PUBLISHED,
    W_HOLDER,
    W_PARAMS_GENERATION,
    W_PARAMS_JOURNAL,
    WRITERS_WORDS,
    EventRings,
    Seqlock,
    WriterLock,
    init_writer_mutex,
    seqlock_read,
    writer_lock,
)

PAIR_DTYPE = np.dtype([("a", "<f8"), ("b", "<f8")])
PAYLOAD = 2  # an event's payload here: (its id, the ring it was written for)


class Died(Exception):
    """A writer's death, simulated."""


class Values:
    """Values whose conversion by numpy (``__array__``) first runs hooks: a reader or a death
    between the stores of a seqlock write's fields."""

    def __init__(self, values: np.ndarray, hooks: Sequence[Hook]) -> None:
        self.values, self.hooks = values, list(hooks)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        hooks, self.hooks = self.hooks, []  # once, however often numpy converts
        for hook in hooks:
            hook()
        return self.values if dtype is None else self.values.astype(dtype)


def die() -> None:
    """The writer dies here."""
    raise Died


# -- event rings ----------------------------------------------------------------------------------

RING_IDS = st.integers(0, 3)  # taken modulo the number of rings
TARGETS = st.lists(RING_IDS, min_size=1, max_size=4)
#: Consumers running inside a send: ("fill", target position) or ("store", store index), ring.
INNER = st.lists(st.tuples(st.sampled_from(["fill", "store"]), st.integers(0, 8), RING_IDS), max_size=3)


class RingsWorld:
    """Event rings over plain arrays, and the model of the events each ring must still deliver."""

    def __init__(self, num_rings: int, capacity: int) -> None:
        self.num_rings, self.capacity = num_rings, capacity
        self.fuse = Fuse()
        records = np.zeros((num_rings, capacity), dtype=event_dtype(PAYLOAD, 8))
        self.heads = tripwire(np.zeros(num_rings, np.int64), self.fuse)
        self.tails = np.zeros(num_rings, np.int64)
        self.undo_heads = tripwire(np.zeros(num_rings, np.int64), self.fuse)
        self.words = tripwire(np.zeros(WRITERS_WORDS, np.int64), self.fuse)
        self.rings = EventRings(records, self.heads, self.tails, self.undo_heads, self.words)
        self.queues: list[deque[int]] = [deque() for _ in range(num_rings)]
        self.dead: set[int] = set()
        self.next_id = 1
        self.dirty = False  # a dead sender's journal waits for recover()

    def consume(self, ring: int) -> None:
        """Consumes ``ring`` and checks it delivers exactly its model queue, in order, once."""
        got = self.rings.consume(ring)
        ids = got["hook"].tolist()
        expected = list(self.queues[ring])
        assert ids == expected, f"ring {ring} delivered {ids}, the model says {expected}"
        assert not self.dead.intersection(ids), f"ring {ring} delivered events of dead sends {ids}"
        assert len(got) <= self.capacity
        assert (got["payload"][:, 0] == got["hook"]).all() and (got["payload"][:, 1] == ring).all()
        assert (np.diff(got["ticket"]) > 0).all(), f"tickets {got['ticket']} do not rise along ring {ring}"
        self.queues[ring].clear()

    def recover(self) -> None:
        """What the next holder of the writers' lock runs first; then the rings must be consistent."""
        self.rings.recover()
        self.dirty = False
        self.check(exact=True)

    def check(self, exact: bool) -> None:
        """Heads and tails bound the outstanding records; ``exact``: no dead send is pending."""
        outstanding = self.heads - self.tails
        assert ((outstanding >= 0) & (outstanding <= self.capacity)).all(), f"head - tail = {outstanding}"
        lengths = np.array([len(queue) for queue in self.queues])
        assert (outstanding >= lengths).all()
        if exact:
            assert (outstanding == lengths).all(), f"head - tail = {outstanding}, model {lengths.tolist()}"
            assert self.words[W_EVENTS_JOURNAL] == 0

    def send(
        self,
        raw_targets: Sequence[int],
        inner: Sequence[tuple[str, int, int]] = (),
        death: tuple[str, int] | None = None,
    ) -> bool:
        """One send under the lock, with consumers at ``inner`` points and a death at ``death``
        (``("fill", position)`` or ``("store", index)``). Returns whether the ring accepted it."""
        self.recover()  # the lock's acquisition (a no-op unless a dead send left its journal)
        targets = list(dict.fromkeys(ring % self.num_rings for ring in raw_targets))
        full = self.rings.full(targets)
        assert full == [ring for ring in targets if len(self.queues[ring]) == self.capacity]
        if full:
            return False
        event = self.next_id
        self.next_id += 1
        fill_hooks: dict[int, list[Hook]] = defaultdict(list)
        store_hooks: dict[int, list[Hook]] = defaultdict(list)
        for where, index, ring in inner:
            consume = partial(self.consume, ring % self.num_rings)
            (fill_hooks[index % len(targets)] if where == "fill" else store_hooks[index]).append(consume)
        if death is not None:
            where, index = death
            (fill_hooks[index % len(targets)] if where == "fill" else store_hooks[index]).append(die)
        committed: list[bool] = []

        def after(array: np.ndarray, key: Any) -> None:
            # the one store that publishes: from here the event is sent, to every target at once
            if array is self.words and isinstance(key, (int, np.integer)) and key == W_EVENTS_PUBLISHED:
                committed.append(True)
                for ring in targets:
                    self.queues[ring].append(event)

        def filler(ring: int, hooks: list[Hook]) -> Callable[[np.ndarray], None]:
            def fill(record: np.ndarray) -> None:
                for hook in hooks:
                    hook()
                record["hook"] = event
                record["payload"][0] = event
                record["payload"][1] = ring

            return fill

        parts = [(ring, filler(ring, fill_hooks[position])) for position, ring in enumerate(targets)]
        self.fuse.arm(store_hooks, after)
        try:
            self.rings.publish(parts)
            died = False
        except Died:
            died = True
        finally:
            self.fuse.disarm()
        assert committed or died, "publish() returned without publishing"
        if not committed:
            self.dead.add(event)
        self.dirty = died
        return True


class EventRingsMachine(RuleBasedStateMachine):
    """Sends (whole, killed, observed half done), consumes and recoveries of the event rings."""

    @initialize(num_rings=st.integers(1, 4), capacity=st.integers(1, 4))
    def setup(self, num_rings: int, capacity: int) -> None:
        self.world = RingsWorld(num_rings, capacity)

    @rule(to=TARGETS, inner=INNER)
    def send(self, to: list[int], inner: list[tuple[str, int, int]]) -> None:
        self.world.send(to, inner)

    @rule(to=TARGETS, inner=INNER, position=st.integers(0, 3))
    def send_dies_in_fill(self, to: list[int], inner: list[tuple[str, int, int]], position: int) -> None:
        self.world.send(to, inner, ("fill", position))

    @rule(to=TARGETS, inner=INNER, store=st.integers(0, 8))
    def send_dies_at_store(self, to: list[int], inner: list[tuple[str, int, int]], store: int) -> None:
        self.world.send(to, inner, ("store", store))

    @rule(ring=RING_IDS)
    def consume(self, ring: int) -> None:
        self.world.consume(ring % self.world.num_rings)

    @rule()
    def recover(self) -> None:
        self.world.recover()

    @invariant()
    def consistent(self) -> None:
        self.world.check(exact=not self.world.dirty)

    def teardown(self) -> None:
        world = getattr(self, "world", None)
        if world is not None:
            world.recover()
            for ring in range(world.num_rings):
                world.consume(ring)


EventRingsMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=30, deadline=None, database=None)
TestEventRings = EventRingsMachine.TestCase


@pytest.mark.parametrize("num_targets", [1, 2, 3, 4])
def test_rings_every_death_point_delivers_all_or_nothing(num_targets: int) -> None:
    """A send killed at each fill and before each store reaches all of its rings or none, whatever a
    consumer of every ring saw before the recovery, with the rings wrapped around."""
    points = [("fill", k) for k in range(num_targets)] + [("store", n) for n in range(num_targets + 5)]
    outcomes = set()
    for death in points:
        world = RingsWorld(4, 2)
        for _ in range(3):  # wrap every ring around
            assert world.send(range(4))
            for ring in range(4):
                world.consume(ring)
        assert world.send([0])
        targets = list(range(4 - num_targets, 4))[::-1]
        assert world.send(targets, death=death)
        outcomes.add(bool(world.queues[targets[0]]) and world.queues[targets[0]][-1] == world.next_id - 1)
        for ring in range(4):  # a consumer before the next lock holder recovers
            world.consume(ring)
        world.recover()
        assert world.send(range(4))
        for ring in range(4):
            world.consume(ring)
        world.check(exact=True)
    assert outcomes == {False, True}  # deaths before and after the publishing store were both covered


def test_rings_refuse_a_send_to_a_full_ring() -> None:
    """A full ring refuses the whole send: no other target ring gets the event either."""
    world = RingsWorld(2, 1)
    assert world.send([0])
    assert not world.send([1, 0])
    world.consume(1)
    world.consume(0)
    assert world.send([1, 0])
    world.consume(0)
    world.consume(1)


# -- seqlock ---------------------------------------------------------------------------------------

ROW_IDS = st.lists(st.integers(0, 5), min_size=1, max_size=6)  # taken modulo the number of rows
#: Points of a write at which a reader runs: ("values", field 0 or 1) or ("store", store index).
READS = st.lists(st.tuples(st.sampled_from(["values", "store"]), st.integers(0, 7)), max_size=3)


class SeqlockWorld:
    """A seqlocked block of (a, -a) pairs over plain arrays, its model and a reader's last copy."""

    def __init__(self, num_rows: int) -> None:
        self.fuse = Fuse()
        block = np.zeros(num_rows, PAIR_DTYPE)
        block["a"] = np.arange(num_rows) + 1.0
        block["b"] = -block["a"]
        self.block = tripwire(block, self.fuse)
        self.seq = tripwire(np.zeros(num_rows, np.int64), self.fuse)
        self.undo = tripwire(np.zeros(num_rows, PAIR_DTYPE), self.fuse)
        self.words = tripwire(np.zeros(WRITERS_WORDS, np.int64), self.fuse)
        self.seqlock = Seqlock(self.block, self.seq, self.undo, self.words)
        self.num_rows = num_rows
        self.model = np.array(self.block)  # what is published
        self.previous = self.model.copy()  # the reader's last result
        self.pending = np.zeros(num_rows, np.bool_)  # rows of a dead write not recovered yet
        self.next_value = 100.0

    def read(self, old: np.ndarray, new: np.ndarray, written: np.ndarray, changing: bool) -> None:
        """A reader's ``seqlock_read``: never a torn pair; rows outside ``written`` exactly ``old``; rows
        in it ``old``, ``new`` or the reader's previous value (that one alone when ``changing``)."""
        got = seqlock_read(self.block, self.seq, self.previous, self.words)
        assert (got["a"] == -got["b"]).all(), f"torn rows: {got}"
        assert (got[~written] == old[~written]).all(), f"rows not written changed: {got} vs {old}"
        previous = self.previous
        allowed = (got == previous) | (got == old) | (got == new)
        assert allowed[written].all(), f"read {got[written]}: neither {old[written]}, {new[written]} nor {previous}"
        if changing:
            assert (got[written] == previous[written]).all(), f"rows being written read as {got[written]}"
        self.previous = got

    def read_idle(self) -> None:
        """A read outside any write: the model, but for the rows of a dead write not recovered yet."""
        self.read(self.model, self.model, self.pending, changing=False)

    def recover(self) -> None:
        """What the next holder of the writers' lock runs first: the model is published again."""
        self.seqlock.recover()
        self.pending[:] = False
        self.check()

    def check(self) -> None:
        """No write in flight: the block is the model, every counter even, the journal clear."""
        assert (np.array(self.block) == self.model).all(), f"block {np.array(self.block)} != model {self.model}"
        assert (self.seq % 2 == 0).all(), f"odd counters {self.seq}"
        assert self.words[W_PARAMS_JOURNAL] == 0
        assert self.words[W_PARAMS_GENERATION] % 2 == 0, "a write left the generation odd"

    def write(
        self,
        raw_rows: Sequence[int],
        contiguous: bool,
        reads: Sequence[tuple[str, int]] = (),
        death: tuple[str, int] | None = None,
    ) -> None:
        """One write of pairs under the lock, with readers at ``reads`` and a death at ``death``
        (``("values", field)`` or ``("store", index)``)."""
        self.recover()  # the lock's acquisition (a no-op unless a dead write left its journal)
        ids = sorted({row % self.num_rows for row in raw_rows})
        rows: slice | np.ndarray = slice(ids[0], ids[-1] + 1) if contiguous else np.array(ids)
        written = np.zeros(self.num_rows, np.bool_)
        written[rows] = True
        xs = self.next_value + np.arange(written.sum())
        self.next_value += 100.0
        old = self.model.copy()
        new = old.copy()
        new["a"][rows] = xs
        new["b"][rows] = -xs
        value_hooks: dict[int, list[Hook]] = defaultdict(list)
        store_hooks: dict[int, list[Hook]] = defaultdict(list)
        for where, index in reads:
            if where == "values":
                value_hooks[index % 2].append(partial(self.read, old, new, written, True))
            else:
                store_hooks[index].append(partial(self.read, old, new, written, False))
        at_death: list[tuple[np.ndarray, bool]] = []

        def dies() -> None:
            at_death.append((np.array(self.block), bool((self.seq % 2).any())))
            raise Died

        if death is not None:
            where, index = death
            (value_hooks[index % 2] if where == "values" else store_hooks[index]).append(dies)
        staged = [(self.block["a"], Values(xs, value_hooks[0])), (self.block["b"], Values(-xs, value_hooks[1]))]
        self.fuse.arm(store_hooks)
        try:
            self.seqlock.write(rows, staged)
        except Died:
            pass
        finally:
            self.fuse.disarm()
        if not at_death:
            self.model = new
            self.check()
            return
        state, odd = at_death[0]
        if odd:  # died with rows marked as changing: the write must be rolled back
            self.model = old
        else:  # died with no row marked: whatever is there is already published, and must be whole
            assert (state == old).all() or (state == new).all(), f"died with even counters over {state}"
            self.model = state
        self.pending = written


class SeqlockMachine(RuleBasedStateMachine):
    """Writes of pairs (whole, killed, read half done), reads and recoveries of a seqlocked block."""

    @initialize(num_rows=st.integers(1, 6))
    def setup(self, num_rows: int) -> None:
        self.world = SeqlockWorld(num_rows)

    @rule(rows=ROW_IDS, contiguous=st.booleans(), reads=READS)
    def write(self, rows: list[int], contiguous: bool, reads: list[tuple[str, int]]) -> None:
        self.world.write(rows, contiguous, reads)

    @rule(rows=ROW_IDS, contiguous=st.booleans(), reads=READS, field=st.integers(0, 1))
    def write_dies_in_values(self, rows: list[int], contiguous: bool, reads: list[tuple[str, int]], field: int) -> None:
        self.world.write(rows, contiguous, reads, ("values", field))

    @rule(rows=ROW_IDS, contiguous=st.booleans(), reads=READS, store=st.integers(0, 7))
    def write_dies_at_store(self, rows: list[int], contiguous: bool, reads: list[tuple[str, int]], store: int) -> None:
        self.world.write(rows, contiguous, reads, ("store", store))

    @rule()
    def read(self) -> None:
        self.world.read_idle()

    @rule()
    def recover(self) -> None:
        self.world.recover()

    @invariant()
    def settled(self) -> None:
        if not self.world.pending.any():
            self.world.check()


SeqlockMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=30, deadline=None, database=None)
TestSeqlock = SeqlockMachine.TestCase


def test_seqlock_dead_write_is_never_published_by_a_later_write() -> None:
    """A write killed between its two fields, then (after recovery) a write of other rows: the dead
    rows read as before the dead write, and a read during the dead state keeps the reader's values."""
    world = SeqlockWorld(4)
    before = world.model.copy()
    world.write([0, 1], contiguous=True, death=("values", 1))
    assert world.block["a"][0] != before["a"][0]  # the half write is really in the block
    world.read_idle()
    assert (world.previous == before).all()
    world.write([2, 3], contiguous=False)  # recovers first, as the lock does
    world.read_idle()
    assert (world.previous[:2] == before[:2]).all() and (world.previous["a"][2:] == -world.previous["b"][2:]).all()
    assert (world.previous[2:] != before[2:]).all()


# -- writers' lock ---------------------------------------------------------------------------------


@pytest.fixture
def lock_file() -> Iterator[tuple[str, np.ndarray]]:
    """A temporary file mapped shared as a segment's ``writers`` words, with the writers' mutex made
    in it as a pool's owner makes it: forked children and other processes share it."""
    fd, path = tempfile.mkstemp(prefix="shmpool-lock-test-")
    try:
        os.ftruncate(fd, WRITERS_WORDS * 8)
        os.close(fd)
        words = np.memmap(path, dtype=np.int64, mode="r+", shape=(WRITERS_WORDS,))
        init_writer_mutex(words)
        yield path, words
        del words
    finally:
        os.unlink(path)


def no_check() -> None:
    """A pool that is always open."""


def test_lock_threads_never_lose_an_increment(lock_file: tuple[str, np.ndarray]) -> None:
    """Two threads incrementing a counter non-atomically inside the lock lose no increment."""
    path, words = lock_file
    lock = WriterLock(words, path)
    state = {"count": 0, "inside": 0, "overlaps": 0}
    rounds = 300

    def work() -> None:
        def increment() -> None:
            state["inside"] += 1
            if state["inside"] != 1 or words[W_HOLDER] != os.getpid():
                state["overlaps"] += 1
            count = state["count"]
            time.sleep(0)
            state["count"] = count + 1
            state["inside"] -= 1

        for _ in range(rounds):
            lock.run(10.0, no_check, increment)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert state == {"count": 2 * rounds, "inside": 0, "overlaps": 0}
    assert words[W_HOLDER] == 0


def test_lock_runs_recover_on_acquire_and_after_a_failed_section(lock_file: tuple[str, np.ndarray]) -> None:
    """Recover callbacks run at every acquisition, again when the section raised, and the error
    propagates; the holder word names this process only inside."""
    path, words = lock_file
    lock = WriterLock(words, path)
    calls: list[tuple[str, int]] = []
    lock.on_acquire(lambda: calls.append(("first", int(words[W_HOLDER]))))
    lock.on_acquire(lambda: calls.append(("second", int(words[W_HOLDER]))))
    assert lock.run(1.0, no_check, lambda: int(words[W_HOLDER])) == os.getpid()
    assert calls == [("first", 0), ("second", 0)] and words[W_HOLDER] == 0
    calls.clear()

    def fails() -> None:
        raise KeyError("mid-write")

    with pytest.raises(KeyError, match="mid-write"):
        lock.run(1.0, no_check, fails)
    pid = os.getpid()
    assert calls == [("first", 0), ("second", 0), ("first", pid), ("second", pid)]
    assert words[W_HOLDER] == 0
    lock.run(1.0, no_check, no_check)  # released after the failure


def test_writer_lock_rolls_back_every_channel(lock_file: tuple[str, np.ndarray]) -> None:
    """``writer_lock`` rolls back a params write and a send interrupted inside the lock, and a half
    write left by a writer that died outside it before the next holder gets in."""
    path, words = lock_file
    block = np.zeros(3, PAIR_DTYPE)
    block["a"], block["b"] = [1.0, 2.0, 3.0], [-1.0, -2.0, -3.0]
    views = {
        "writers": words,
        "params": block,
        "params_seq": np.zeros(3, np.int64),
        "params_undo": np.zeros(3, PAIR_DTYPE),
        "events": np.zeros((2, 2), event_dtype(PAYLOAD, 8)),
        "event_heads": np.zeros(2, np.int64),
        "event_tails": np.zeros(2, np.int64),
        "event_undo_heads": np.zeros(2, np.int64),
    }
    lock = writer_lock(views, path)
    seqlock = Seqlock(views["params"], views["params_seq"], views["params_undo"], words)
    rings = EventRings(views["events"], views["event_heads"], views["event_tails"], views["event_undo_heads"], words)
    before = block.copy()
    staged = [(block["a"], np.full(2, 9.0)), (block["b"], Values(np.full(2, -9.0), [die]))]
    with pytest.raises(Died):
        lock.run(1.0, no_check, seqlock.write, np.array([0, 2]), staged)
    assert (block == before).all() and (views["params_seq"] % 2 == 0).all() and words[W_PARAMS_JOURNAL] == 0

    def fill(record: np.ndarray) -> None:
        record["hook"] = 7

    with pytest.raises(Died):
        lock.run(1.0, no_check, rings.publish, [(0, fill), (1, lambda record: die())])
    assert (views["event_heads"] == 0).all() and words[W_EVENTS_JOURNAL] == 0
    assert len(rings.consume(0)) == 0

    staged = [(block["a"], np.full(1, 5.0)), (block["b"], Values(np.full(1, -5.0), [die]))]
    with pytest.raises(Died):
        seqlock.write(np.array([1]), staged)  # a writer that dies without the lock's cleanup
    assert block["a"][1] == 5.0 and words[W_PARAMS_JOURNAL] == 1
    lock.run(1.0, no_check, no_check)
    assert (block == before).all() and (views["params_seq"] % 2 == 0).all()


HOLDER_SCRIPT = """
import sys
import numpy as np
from shmpool.protocol import WRITERS_WORDS, WriterLock
words = np.memmap(sys.argv[1], dtype=np.int64, mode="r+", shape=(WRITERS_WORDS,))
WriterLock(words, sys.argv[1])._acquire(None, lambda: None)  # and never released
print("held", flush=True)
sys.stdin.read()
"""


def process_state(pid: int) -> str:
    """The one-letter state of a process (``T``: stopped)."""
    with open(f"/proc/{pid}/stat") as file:
        return file.read().rsplit(")", 1)[1].split()[0]


def test_lock_held_by_another_process_times_out(lock_file: tuple[str, np.ndarray]) -> None:
    """A holder in another process makes ``hold`` time out on time, naming it (and that it is
    stopped, when it is); once the holder is killed the next taker gets the lock (the kernel marks
    the robust mutex of a dead owner)."""
    path, words = lock_file
    lock = WriterLock(words, path)
    lock.run(1.0, no_check, no_check)  # this process's own description is open before the other takes it
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER_SCRIPT, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "held\n"
        start = time.monotonic()
        with pytest.raises(WriterLockTimeoutError) as info:
            lock.run(0.3, no_check, no_check)
        elapsed = time.monotonic() - start
        assert 0.3 <= elapsed < 10.0, elapsed  # its timeout, then it gives up: no hang
        assert info.value.holder_pid == process.pid and f"pid {process.pid}" in str(info.value)
        assert "stopped" not in str(info.value)
        os.kill(process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5.0
        while process_state(process.pid) not in ("T", "t"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(WriterLockTimeoutError, match="stopped"):
            lock.run(0.1, no_check, no_check)
        process.kill()
        process.wait(5.0)
        assert lock.run(2.0, no_check, lambda: int(words[W_HOLDER])) == os.getpid()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5.0)
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


def in_child(body: Callable[[], int]) -> int:
    """Runs ``body`` in a forked child and returns its exit code (2 when it raised)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 2
        try:
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_lock_excludes_forked_children(lock_file: tuple[str, np.ndarray]) -> None:
    """A child forked from a process using the lock object can't take it while the parent holds it,
    takes it once free, and excludes the parent while it holds it."""
    path, words = lock_file
    lock = WriterLock(words, path)

    def times_out() -> int:
        start = time.monotonic()
        try:
            return lock.run(0.2, no_check, lambda: 1)
        except WriterLockTimeoutError:
            return 0 if time.monotonic() - start < 10.0 else 3  # its 0.2 s timeout, not a hang

    def acquires() -> int:
        return lock.run(2.0, no_check, lambda: 0 if words[W_HOLDER] == os.getpid() else 4)

    assert lock.run(1.0, no_check, in_child, times_out) == 0
    assert in_child(acquires) == 0

    ready_read, ready_write = os.pipe()
    done_read, done_write = os.pipe()

    def holds() -> int:
        def until_done() -> None:
            os.write(ready_write, b"1")
            os.read(done_read, 1)

        lock.run(2.0, no_check, until_done)
        return 0

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 2
        try:
            code = holds()
        finally:
            os._exit(code)
    try:
        assert os.read(ready_read, 1) == b"1"
        with pytest.raises(WriterLockTimeoutError) as info:
            lock.run(0.2, no_check, no_check)
        assert info.value.holder_pid == pid
    finally:
        os.write(done_write, b"1")
        _, status = os.waitpid(pid, 0)
        for fd in (ready_read, ready_write, done_read, done_write):
            os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    lock.run(1.0, no_check, no_check)


def test_lock_freed_when_its_holder_dies_despite_forked_children(lock_file: tuple[str, np.ndarray]) -> None:
    """A holder killed inside its critical section frees the lock even if it forked a child earlier."""
    path, words = lock_file
    release_read, release_write = os.pipe()
    pid_read, pid_write = os.pipe()
    holder = os.fork()
    if holder == 0:  # pragma: no cover - the holder
        try:
            lock = WriterLock(words, path)
            lock.run(1.0, no_check, no_check)
            child = os.fork()  # a child that never touches the lock
            if child == 0:
                os.close(release_write)
                os.read(release_read, 1)  # until the test lets it go
                os._exit(0)
            os.write(pid_write, str(child).encode())
            lock.run(1.0, no_check, os._exit, 0)  # dies mid-write
        finally:
            os._exit(2)
    os.close(pid_write)
    os.close(release_read)
    grandchild = 0
    try:
        grandchild = int(os.read(pid_read, 32) or 0)
        os.waitpid(holder, 0)
        assert words[W_HOLDER] == holder  # it died holding the lock
        assert process_state(grandchild) not in ("Z", "X")  # its child, forked after it opened the lock, lives
        assert WriterLock(words, path).run(0.3, no_check, lambda: int(words[W_HOLDER])) == os.getpid()
        assert words[W_HOLDER] == 0
    finally:
        os.close(release_write)  # the grandchild exits
        os.close(pid_read)
        deadline = time.monotonic() + 5.0
        while grandchild and time.monotonic() < deadline:
            try:
                if process_state(grandchild) in ("Z", "X"):
                    break
            except OSError:
                break
            time.sleep(0.01)


# -- through a running pool -----------------------------------------------------------------------

LOCK_HOLDER = """
import signal, sys, time, shmpool
from shmpool.system import set_parent_death_signal
set_parent_death_signal(signal.SIGKILL)  # stopped or not, it never outlives whoever started it
handle = shmpool.attach(sys.argv[1], wait=10)
handle.params._lock._acquire(None, lambda: None)  # and never released
print("holding", flush=True)
time.sleep(120)
"""


def test_a_stopped_writer_holding_the_lock_makes_writes_time_out_not_hang(pool_name: str, tmp_path: Path) -> None:
    with shmpool.launch(
        "CartPole-v1",
        4,
        num_workers=2,
        name=pool_name,
        params={"length": Param()},
        hooks=[helpers.EventLog(str(tmp_path))],
        event_payload=3,
    ) as pool:
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, pool_name], stdout=subprocess.PIPE, text=True, env=helpers.ENV
        )
        outcomes: list[tuple[str, float]] = []
        try:
            assert holder.stdout.readline().strip() == "holding"
            holder.send_signal(signal.SIGSTOP)  # Ctrl-Z

            def try_both() -> None:
                for call in (
                    lambda: pool.events.send("Log", [0], [1, 2, 3], wait=0.0),
                    lambda: pool.params.write(0, length=0.7),
                ):
                    started = time.monotonic()
                    try:
                        call()
                        outcomes.append(("worked", time.monotonic() - started))
                    except shmpool.WriterLockTimeoutError as exc:
                        assert exc.holder_pid == holder.pid and "stopped" in str(exc)
                        outcomes.append(("timeout", time.monotonic() - started))

            thread = threading.Thread(target=try_both, daemon=True)
            thread.start()
            thread.join(30)
            assert not thread.is_alive(), "a write hung behind a stopped writer"
        finally:
            holder.kill()
            holder.wait(5)
        assert [what for what, _ in outcomes] == ["timeout", "timeout"], outcomes
        send_wait, write_wait = (seconds for _, seconds in outcomes)
        assert 0.25 <= send_wait < 4.0, outcomes  # a send gives up after at least 0.25 s, long before 5 s
        assert 5.0 <= write_wait < 15.0, outcomes  # a write after 5 s, never a hang
        pool.params.write(0, length=0.7)  # the kernel dropped the dead holder's lock
        assert pool.params["length"][0] == 0.7


INTERRUPT_WHILE_WAITING = """
import os, signal, subprocess, sys, threading, time
import shmpool

pool = shmpool.launch("CartPole-v1", 2, num_workers=1, name=sys.argv[1], params={"a": shmpool.Param(0.0, bind=False)})
holder = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]], stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "holding"
try:  # the stopped holder is killed however this goes: a stopped orphan would outlive the suite
    holder.send_signal(signal.SIGSTOP)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    try:
        pool.params.write(None, a=1.0)
        outcome = "written"
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    waited = time.monotonic() - started
finally:
    holder.kill()
    holder.wait()
pool.params.write(None, a=2.0)  # the lock was left free
print(outcome, waited < 2.0, pool.params["a"].tolist())
pool.close()
"""


def test_ctrl_c_while_waiting_for_the_writer_lock_interrupts_the_wait(pool_name: str) -> None:
    result = helpers.run_script(INTERRUPT_WHILE_WAITING, pool_name, LOCK_HOLDER)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "KeyboardInterrupt True [2.0, 2.0]"


#: The end of the storm scripts below: the lock was left free (a write well within its 5 s, a send,
#: a checkpoint, a write from another process), printed after the storm's count of interruptions.
AFTER_THE_STORM = """
started = time.monotonic()
pool.params.write(None, a=2.0)  # within the lock's 5 s only if nothing left the lock held
quick = time.monotonic() - started < 3  # the write alone: a loaded machine slows the process below
pool.events.send("Log", [0], [4, 5, 6], wait=0.0)
state = pool.state_dict()  # the checkpoint a preempted job writes on its way out
other = subprocess.run([sys.executable, "-c",
    "import shmpool, sys\\n"
    "with shmpool.attach(sys.argv[1]) as handle:\\n"
    "    handle.params.write(None, a=3.0)\\n", sys.argv[1]], timeout=30)
print(count, other.returncode, quick, pool.params["a"].tolist())
pool.close()
"""


INTERRUPTED_WRITER = (
    """
import os, signal, subprocess, sys, time
import numpy as np
import shmpool
sys.path.insert(0, "tests")
import helpers

pool = shmpool.launch("CartPole-v1", 4, num_workers=1, name=sys.argv[1], params={"a": shmpool.Param(0.0, bind=False)},
                      hooks=[helpers.EventLog(sys.argv[2])], event_payload=3, event_capacity=1 << 16)
pool.reset(seed=0)
storm = helpers.start_sigint_storm(os.getpid(), 2.0, 0.0005)
interrupts = rounds = 0
done_at = time.monotonic() + 3.0  # by then the storm is over (time, not storm.poll(): Ctrl-C can wedge that)

def work():
    global interrupts, rounds
    while True:
        try:
            if time.monotonic() > done_at:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # one still in flight must not end the script
                return
            rounds += 1
            if rounds % 1000 == 0:  # drains the ring (a step can be interrupted too: it completes later)
                pool.step(np.zeros(4, dtype=np.int64))
            pool.params.write(None, a=1.0)
            pool.events.send("Log", [0], [1, 2, 3], wait=0.0)
        except KeyboardInterrupt:
            interrupts += 1

def until_done():  # an interrupt can also land outside work's try, as in this except clause
    global interrupts
    while True:
        try:
            work()
            return
        except KeyboardInterrupt:
            interrupts += 1

while True:  # and in that one: only one in two except clauses in a row gets past this one
    try:
        until_done()
        break
    except KeyboardInterrupt:
        interrupts += 1
os.waitpid(storm.pid, 0)
storm.returncode = 0
count = interrupts
"""
    + AFTER_THE_STORM
)


def test_ctrl_c_inside_the_writer_lock_never_leaves_it_held(pool_name: str, tmp_path: Path) -> None:
    result = helpers.run_script(INTERRUPTED_WRITER, pool_name, str(tmp_path), timeout=120)
    # What is tested is printed before the script closes the pool and exits. On a loaded machine the
    # storm's last signals can arrive during interpreter shutdown, after that line, once the default
    # handler is back: not this test's subject, so that exit is accepted, and only with the whole
    # line printed.
    printed = result.stdout.strip().split(" ", 3)
    late_sigint = result.returncode == -signal.SIGINT and len(printed) == 4 and printed[3].startswith("[")
    assert result.returncode == 0 or late_sigint, result.stderr[-2000:]
    interrupts, other, quick, values = printed
    assert int(interrupts) > 100
    assert (other, quick, values) == ("0", "True", "[3.0, 3.0, 3.0, 3.0]")


RAISING_HANDLERS = (
    """
import os, signal, subprocess, sys, time
import numpy as np
import shmpool
sys.path.insert(0, "tests")
import helpers

class Raised(Exception):
    pass

pool = shmpool.launch("CartPole-v1", 4, num_workers=1, name=sys.argv[1], params={"a": shmpool.Param(0.0, bind=False)},
                      hooks=[helpers.EventLog(sys.argv[2])], event_payload=3, event_capacity=1 << 16)
pool.reset(seed=0)
armed = False
done_at = time.monotonic() + 2.5  # the handlers raise until then

def handler(signum, frame):  # SIGALRM raises an error; SIGTERM exits, as a preempted job's handler does
    global armed
    if armed and time.monotonic() < done_at:
        armed = False  # once per arming: a signal pending on a loaded machine lands inside the try only
        raise Raised if signum == signal.SIGALRM else SystemExit(1)

signal.signal(signal.SIGALRM, handler)
signal.signal(signal.SIGTERM, handler)
if sys.argv[3] == "SIGALRM":
    signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0003)
else:
    storm = helpers.start_sigint_storm(os.getpid(), 2.0, 0.0005, signum=signal.SIGTERM)
raised = rounds = 0

while time.monotonic() < done_at:
    try:
        armed = True  # from here to the disarming below, a handler may raise anywhere
        rounds += 1
        if rounds % 1000 == 0:  # drains the ring
            pool.step(np.zeros(4, dtype=np.int64))
        pool.params.write(None, a=1.0)  # the compiled write, after the first 16
        pool.params.write([1, 2], a=1.5)  # the general path
        pool.events.send("Log", [0], [1, 2, 3], wait=0.0)
        pool.params.snapshot()
        armed = False
    except (Raised, SystemExit):
        raised += 1
armed = False
signal.setitimer(signal.ITIMER_REAL, 0)
if sys.argv[3] == "SIGTERM":
    os.waitpid(storm.pid, 0)
    storm.returncode = 0
count = raised
"""
    + AFTER_THE_STORM
)


@pytest.mark.parametrize("signum", ["SIGALRM", "SIGTERM"])
def test_a_signal_handler_that_raises_during_writes_never_leaves_the_lock_held(
    pool_name: str, tmp_path: Path, signum: str
) -> None:
    """Handlers of signals other than SIGINT that raise (an error, or ``sys.exit`` as a preempted
    job's SIGTERM handler does) land anywhere in writes, sends and snapshots; the lock is free after."""
    result = helpers.run_script(RAISING_HANDLERS, pool_name, str(tmp_path), signum, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    raised, other, quick, values = result.stdout.strip().split(" ", 3)
    assert int(raised) > 100  # the handlers really raised, all through the writes
    assert (other, quick, values) == ("0", "True", "[3.0, 3.0, 3.0, 3.0]")


def test_a_write_from_a_signal_handler_while_its_thread_writes_fails_at_once(pool_name: str) -> None:
    """A handler that writes while its thread holds the lock gets ``WriterLockReentryError`` at once,
    not a 5 s wait on itself blamed on "another writer"; the lock is free afterwards."""
    params = {"a": Param(0.0, bind=False)}
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        lock = pool.params._lock
        writes: list[BaseException] = []

        def write_from_the_handler(signum: int, frame: Any) -> None:
            try:
                pool.params.write(None, a=1.0)
            except shmpool.WriterLockReentryError as error:
                writes.append(error)
                raise

        previous = signal.signal(signal.SIGALRM, write_from_the_handler)
        try:
            started = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            with pytest.raises(shmpool.WriterLockReentryError, match="signal handler wrote while this thread held"):
                lock.run(5.0, no_check, time.sleep, 3.0)  # the handler runs in this sleep, inside the lock
            assert time.monotonic() - started < 1.5 and len(writes) == 1
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert pool.params.write(None, a=2.0) == 1 and pool.params["a"].tolist() == [2.0, 2.0]


def test_a_handle_of_a_closed_pool_never_locks_a_new_pool_of_the_same_name(pool_name: str) -> None:
    """The lock lives in the segment a handle mapped: a new pool of the same name has its own."""
    params = {"a": Param(0.0, bind=False)}
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        handle = shmpool.attach(pool.name)
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as new_pool:
        # the old pool's lock, held: the new pool's writers are not blocked
        handle._channels.lock.run(1.0, lambda: None, lambda: new_pool.params.write(None, a=1.0))
        assert new_pool.params["a"].tolist() == [1.0, 1.0]
        with pytest.raises(shmpool.PoolClosedError):
            handle.params.write(None, a=2.0)  # and the handle knows its pool is gone
        handle.close()


def test_cpus_without_total_store_order_are_refused_with_a_clear_error() -> None:
    from shmpool.protocol import check_memory_model

    with pytest.raises(shmpool.ShmpoolError, match="aarch64.*unsafe"):
        check_memory_model("aarch64")
    check_memory_model("x86_64")


# -- the compiled write --------------------------------------------------------------------------

KILL_ROWS = 200_000  # a write of this many rows spends nearly all its time inside the mutex


def test_a_compiled_write_killed_anywhere_is_rolled_back_by_the_next_holder(tmp_path: Path) -> None:
    """Forked children loop compiled writes of ``a = x, b = -x`` over many rows (so that a SIGKILL
    lands inside the critical section, between the two columns, nearly every time) and are killed at
    random moments: the next holder of the lock finds the rows whole, each one as some write left it,
    and the generation even; a reader in between never copies a half-written row."""
    pytest.importorskip("numba", reason='needs numba: pip install -e ".[numba]"')
    from shmpool.compiled_writes import CompiledWrites
    from shmpool.params import compile_specs
    from shmpool.protocol import compiled

    specs = compile_specs({"a": Param(0.0, low=-10, high=10), "b": Param(0.0, low=-10, high=10)})
    path = tmp_path / "segment"
    record = np.dtype([("a", "<f8"), ("b", "<f8")])
    size = WRITERS_WORDS * 8 + 2 * KILL_ROWS * record.itemsize + KILL_ROWS * 8
    path.write_bytes(bytes(size))
    memory = np.memmap(path, dtype=np.uint8, mode="r+", shape=(size,))
    words = memory[: WRITERS_WORDS * 8].view(np.int64)
    block = memory[WRITERS_WORDS * 8 :][: KILL_ROWS * record.itemsize].view(record)
    undo = memory[WRITERS_WORDS * 8 + KILL_ROWS * record.itemsize :][: KILL_ROWS * record.itemsize].view(record)
    seq = memory[size - KILL_ROWS * 8 :].view(np.int64)
    init_writer_mutex(words)
    lock = WriterLock(words, str(path))
    seqlock = Seqlock(block, seq, undo, words)
    lock.on_acquire(seqlock.recover)
    writes = CompiledWrites({spec.name: spec for spec in specs}, seqlock, lock, compiled)
    assert writes.write(None, {"a": np.zeros(KILL_ROWS), "b": np.zeros(KILL_ROWS)}) == 1  # loaded before the forks
    rng = np.random.default_rng(0)
    inside = mid_write = 0  # kills that landed holding the mutex, and between the rows made odd and even
    for attempt in range(16):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child: writes until killed
            try:
                x = np.random.default_rng(attempt).uniform(-5, 5, KILL_ROWS)
                values = [{"a": x, "b": -x}, {"a": -x, "b": x}]
                for turn in itertools.count():
                    if writes.write(None, values[turn % 2]) < 0:
                        os._exit(3)  # the compiled write gave up: it must not here
            finally:
                os._exit(2)
        time.sleep(0.05 + rng.uniform(0.0, 0.05))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL, "the writer stopped by itself"
        inside += bool(words[W_HOLDER])  # killed holding the mutex (W_HOLDER is cleared just before it is dropped)
        if words[W_PARAMS_GENERATION] % 2:  # killed between the rows made odd and made even
            mid_write += 1
            copy = seqlock_read(block, seq, np.zeros_like(block), words)
            whole = copy["a"] != 0
            np.testing.assert_array_equal(copy["a"][whole], -copy["b"][whole])  # a reader keeps old values
            if attempt % 2:  # a compiled write next: it leaves the rollback to the general path
                assert writes.write(None, {"a": np.ones(KILL_ROWS), "b": -np.ones(KILL_ROWS)}) < 0
        lock.run(1.0, no_check, no_check)  # rolls back what the killed writer left
        np.testing.assert_array_equal(block["a"], -block["b"])
        assert words[W_PARAMS_JOURNAL] == 0 and words[W_PARAMS_GENERATION] % 2 == 0 and (seq % 2 == 0).all()
    assert inside >= 3, f"only {inside} of 16 kills landed inside the writers' mutex"
    del writes, memory, words, block, undo, seq
