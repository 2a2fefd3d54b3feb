"""The event channel: what a sender packs is what the worker's reader hands out, exactly once.

In one process: senders build each record's bytes with :mod:`struct` (no numpy for one env or a few),
and the reader decodes them the same way; these tests hold every form of ``env_ids`` and ``payload``
to the numpy reference, including slots wider than one 64-bit mask word, scheduled events, rings that
wrap, bad input, garbage records, and a send of record bytes that dies at any store.

Through a running pool: threads sending at once lose no event, an event for several workers from a
sender killed between their rings reaches none of them, and a sender waiting for room stops when the
pool closes.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helpers
import numpy as np
import pytest

import shmpool
from shmpool.errors import EventQueueFullError
from shmpool.events import Event, EventReader, EventSender, event_dtype, mask_bytes
from shmpool.protocol import (
    W_EVENTS_JOURNAL,
    W_EVENTS_PUBLISHED,
    WRITERS_WORDS,
    EventRings,
    init_writer_mutex,
    writer_lock,
)

#: A slot of 3 envs and one of 100 (two 64-bit mask words).
SLOTS = [(0, 3), (3, 103)]
NUM_ENVS = SLOTS[-1][1]
PAYLOAD = 3


class Channel:
    """The event rings of a two-worker pool over plain arrays, its sender and both workers' readers."""

    def __init__(self, capacity: int = 8) -> None:
        self.views = {
            "writers": np.zeros(WRITERS_WORDS, np.int64),
            "events": np.zeros((len(SLOTS), capacity), event_dtype(PAYLOAD, mask_bytes(SLOTS))),
            "event_heads": np.zeros(len(SLOTS), np.int64),
            "event_tails": np.zeros(len(SLOTS), np.int64),
            "event_undo_heads": np.zeros(len(SLOTS), np.int64),
        }
        init_writer_mutex(self.views["writers"])
        self.lock = writer_lock(self.views, "test rings")
        views = self.views
        self.rings = EventRings(
            views["events"], views["event_heads"], views["event_tails"], views["event_undo_heads"], views["writers"]
        )
        self.sender = EventSender(["Kick", "Reset", "Kick"], self.rings, SLOTS, self.lock, "test env", lambda: None)
        self.readers = [EventReader(self.rings, worker, slot) for worker, slot in enumerate(SLOTS)]

    def due(self, step: int) -> list[dict[int, list[Event]]]:
        """Each worker's events due at ``step``, as its HookRunner takes them."""
        return [reader.due(step) or {} for reader in self.readers]


@pytest.fixture
def channel() -> Channel:
    return Channel()


def delivered(due: list[dict[int, list[Event]]]) -> list[tuple[int, int, list[int], list[float], int]]:
    """(worker, hook, env ids, payload, step) of every event handed out, in order."""
    return [
        (worker, hook, event.env_ids.tolist(), event.payload.tolist(), event.step)
        for worker, by_hook in enumerate(due)
        for hook, events in by_hook.items()
        for event in events
    ]


def expected(
    env_ids: Any, payload: Any, hook: int = 0, step: int = 0
) -> list[tuple[int, int, list[int], list[float], int]]:
    """The reference: the numpy reading of ``env_ids`` and ``payload``."""
    if env_ids is None:
        ids = np.arange(NUM_ENVS)
    elif isinstance(env_ids, slice):
        ids = np.unique(np.arange(NUM_ENVS)[env_ids])
    else:
        ids = np.unique(np.atleast_1d(np.asarray(env_ids)))
    values = [] if payload is None else np.asarray(payload, dtype=np.float64).ravel().tolist()
    return [
        (worker, hook, [int(i) for i in ids if start <= i < stop], values, step)
        for worker, (start, stop) in enumerate(SLOTS)
        if any(start <= i < stop for i in ids)
    ]


ENV_IDS = [
    1,
    [1],
    [70],
    np.int64(102),
    [np.int64(4)],
    np.array([64]),
    (2, 0, 2),  # duplicates, unsorted
    [0, 5, 68, 102],
    np.array([3, 100], dtype=np.uint8),
    list(range(0, 103, 1)),  # more than the few that plain ints take: numpy's path
    slice(1, 5),
    slice(None, None, 20),
    slice(-3, None),
    slice(None, None, -1),  # more than 64: numpy's path
    None,
]
PAYLOADS = [None, [], [0.5], [1, 2.5, -3], (7.0, 8.0), np.array([0.25, 0.5]), 4.0, ["1.5"], [True], np.float32(0.1)]


@pytest.mark.parametrize("env_ids", ENV_IDS, ids=repr)
@pytest.mark.parametrize("payload", PAYLOADS, ids=repr)
def test_every_form_of_env_ids_and_payload_arrives_as_sent(channel: Channel, env_ids: Any, payload: Any) -> None:
    channel.sender.send("Kick", env_ids, payload)
    assert delivered(channel.due(0)) == expected(env_ids, payload)
    assert delivered(channel.due(1)) == []  # delivered once


def test_events_arrive_in_send_order_when_due_across_a_wrapping_ring(channel: Channel) -> None:
    """Scheduled events wait in the reader; each hook's events come in send order, however the ring
    wraps around (capacity 8, 30 rounds)."""
    step, sent = 0, 0
    for _ in range(30):
        channel.sender.send("Reset", [1], [sent], at_step=step + 2)  # due two steps later
        channel.sender.send("Kick", [50, 1], [sent + 1])
        channel.sender.send("Kick", [1], [sent + 2], at_step=step)  # due now
        sent += 3
        first, second = channel.due(step)
        assert [event.payload.tolist() for event in first[0]] == [[sent - 2], [sent - 1]]
        assert [event.env_ids.tolist() for event in second[0]] == [[50]]
        if step >= 2:  # the Reset sent two rounds ago, handed out at its step
            assert [(e.payload.tolist(), e.step) for e in first[1]] == [([sent - 9], step)]
        else:
            assert 1 not in first
        step += 1
    assert delivered(channel.due(step)) + delivered(channel.due(step + 1)) == [
        (0, 1, [1], [sent - 6], step),
        (0, 1, [1], [sent - 3], step + 1),
    ]
    assert channel.readers[0].due(step + 2) is None


def test_a_reader_hands_out_nothing_until_an_event_is_due(channel: Channel) -> None:
    reader = channel.readers[0]
    assert reader.due(0) is None
    channel.sender.send("Kick", [0], at_step=5)
    assert reader.due(0) is None  # taken out of the ring, not due yet
    assert channel.views["event_tails"][0] == 1 and reader.due(4) is None
    assert delivered([reader.due(7) or {}]) == [(0, 0, [0], [], 7)]  # late: handed out at the step it is read
    assert reader.due(8) is None


def test_hooks_are_addressed_by_their_first_name(channel: Channel) -> None:
    channel.sender.send(np.str_("Kick"), [0])  # equal to "Kick", as list.index finds it
    assert [set(by_hook) for by_hook in channel.due(0)] == [{0}, set()]


BAD_SENDS: list[tuple[Callable[[EventSender], None], type[Exception], str]] = [
    (lambda s: s.send("Kik", [0]), KeyError, r"no hook named 'Kik'; the pool's hooks are \['Kick', 'Reset', 'Kick'\]"),
    (lambda s: s.send(["Kick"], [0]), KeyError, r"no hook named \['Kick'\]"),  # unhashable
    (lambda s: s.send("Kick", [True]), ValueError, r"env_ids must be one or more env ids .* got \[True\]"),
    (lambda s: s.send("Kick", True), ValueError, r"env_ids must be one or more env ids .* got True"),
    (lambda s: s.send("Kick", [1.0]), ValueError, r"env_ids must be one or more env ids"),
    (lambda s: s.send("Kick", []), ValueError, r"env_ids must be one or more env ids .* got \[\]"),
    (lambda s: s.send("Kick", slice(200, None)), ValueError, r"env ids .* got slice\(200, None, None\)"),
    (lambda s: s.send("Kick", [[1]]), ValueError, r"env_ids must be one or more env ids .* got \[\[1\]\]"),
    (lambda s: s.send("Kick", 103), ValueError, r"env_ids \[103\] out of range for num_envs=103"),
    (lambda s: s.send("Kick", [5, -1, 5]), ValueError, r"env_ids \[-1, 5\] out of range for num_envs=103"),
    (lambda s: s.send("Kick", [0], [1, 2, 3, 4]), ValueError, r"payload has 4 numbers; .* allows 3"),
    (lambda s: s.send("Kick", [0], np.zeros((2, 2))), ValueError, r"payload has 4 numbers; .* allows 3"),
    (lambda s: s.send("Kick", [0], ["x"]), ValueError, r"could not convert string to float"),
    (lambda s: s.send("Kick", [0], "1.5"), TypeError, r"payload of an event for 'Kick' must be numbers, got '1.5'"),
    (lambda s: s.send("Kick", [0], {"a": 1}), TypeError, r"for 'Kick' must be numbers, got \{'a': 1\}"),
    (lambda s: s.send("Kick", [0], wait=math.nan), ValueError, r"wait must be a number of seconds or None, got nan"),
    (
        lambda s: s.send("Kick", [0], [1.0, math.nan]),
        ValueError,
        r"'Kick' \(envs \[0\]\) must be finite, got \[1.0, nan\]",
    ),
    (lambda s: s.send("Kick", [0], np.array([np.inf])), ValueError, r"must be finite, got \[inf\]"),
    (lambda s: s.send("Kick", [0], at_step=True), ValueError, r"at_step must be a non-negative int, got True"),
    (lambda s: s.send("Kick", [0], at_step=-1), ValueError, r"at_step must be a non-negative int, got -1"),
    (lambda s: s.send("Kick", [0], at_step=1.0), ValueError, r"at_step must be a non-negative int, got 1.0"),
    (lambda s: s.send("Kick", [0], at_step=1 << 63), ValueError, r"at_step must be a non-negative int"),
]


@pytest.mark.parametrize(("send", "error", "message"), BAD_SENDS)
def test_bad_input_is_refused_with_what_was_wrong_and_queues_nothing(
    channel: Channel, send: Callable[[EventSender], None], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        send(channel.sender)
    assert channel.views["event_heads"].tolist() == [0, 0] and channel.views["writers"][W_EVENTS_JOURNAL] == 0


def test_a_full_ring_refuses_the_whole_event(channel: Channel) -> None:
    for _ in range(8):
        channel.sender.send("Kick", [70])
    with pytest.raises(EventQueueFullError, match="test env: the event ring of worker 1 is full .8 events"):
        channel.sender.send("Kick", [0, 70])
    assert channel.views["event_heads"].tolist() == [0, 8]  # not even the room in worker 0's ring was used


def test_a_garbage_record_never_reads_beyond_its_payload_or_slot(channel: Channel) -> None:
    """A record from a broken writer: a payload size out of range and mask bits beyond the slot."""

    def garbage(payload_size: int, mask: list[int]) -> Callable[[np.ndarray], None]:
        def fill(record: np.ndarray) -> None:
            record["hook"], record["at_step"], record["payload_size"] = 0, -1, payload_size
            record["payload"] = [1.0, 2.0, 3.0]
            record["mask"] = mask + [0] * (len(record["mask"]) - len(mask))

        return fill

    channel.rings.publish([(0, garbage(-5, [0b1000]))])  # env 3 of a 3-env slot: none of its envs
    channel.rings.publish([(0, garbage(99, [0b1010]))])  # env 1 and env 3 (beyond the slot)
    assert delivered(channel.due(0)) == [(0, 0, [], [], 0), (0, 0, [1], [1.0, 2.0, 3.0], 0)]


def test_payloads_are_independent_writable_arrays(channel: Channel) -> None:
    channel.sender.send("Kick", [0], [1.0])
    channel.sender.send("Kick", [0], [2.0])
    first, second = channel.due(0)[0][0]
    first.payload[0] = 9.0  # a hook may scribble on its copy
    assert second.payload.tolist() == [2.0] and first.payload.tolist() == [9.0]
    assert first.env_ids.dtype == np.int64 and first.payload.dtype == np.float64


class Watched(np.ndarray):
    """An array that calls ``before_store(self, key)`` before each item store (views share it)."""

    before_store: Callable[[np.ndarray, Any], None] | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self.before_store = getattr(obj, "before_store", None)

    def __setitem__(self, key: Any, value: Any) -> None:
        if self.before_store is not None:
            self.before_store(self, key)
        super().__setitem__(key, value)


class Died(Exception):
    """A sender's death, simulated."""


@pytest.mark.parametrize("fatal", range(8))
def test_a_send_of_record_bytes_that_dies_at_any_store_reaches_both_rings_or_neither(
    channel: Channel, fatal: int
) -> None:
    """Dies before the ``fatal``-th store of a two-ring send (journal, heads, published ticket; a send
    has fewer than 8). Readers looking before each store see none of it until the published ticket
    is stored; after the next holder's recovery the event is in both rings or in neither."""
    views = channel.views
    stores: list[tuple[np.ndarray, Any]] = []

    def before_store(array: np.ndarray, key: Any) -> None:
        if not any(a is views["writers"] and k == W_EVENTS_PUBLISHED for a, k in stores):
            assert delivered(channel.due(0)) == [], stores  # not published yet: nothing to see
        stores.append((array, key))
        if len(stores) - 1 == fatal:
            raise Died

    for name in WATCHED:
        views[name] = views[name].view(Watched)
        views[name].before_store = before_store
    rings = EventRings(
        views["events"], views["event_heads"], views["event_tails"], views["event_undo_heads"], views["writers"]
    )
    channel.readers = [EventReader(rings, worker, slot) for worker, slot in enumerate(SLOTS)]
    ids = np.array([2, 70])
    parts = [(worker, channel.sender._filler(worker, 1, ids[worker : worker + 1], [5.0], None)) for worker in (0, 1)]
    try:
        rings.publish(parts)
        died = False
    except Died:
        died = True
    for name in WATCHED:
        views[name].before_store = None
    assert died == (fatal < len(stores))
    published = any(a is views["writers"] and k == W_EVENTS_PUBLISHED for a, k in stores[: fatal if died else None])
    rings.recover()  # what the next holder of the lock runs first
    assert views["writers"][W_EVENTS_JOURNAL] == 0
    arrived = delivered(channel.due(0))
    assert arrived == ([(0, 1, [2], [5.0], 0), (1, 1, [70], [5.0], 0)] if published else []), (fatal, arrived)
    channel.sender.send("Kick", [2, 70])  # the rings work on, for both workers
    assert [len(by_hook.get(0, [])) for by_hook in channel.due(1)] == [1, 1]


WATCHED = ("writers", "event_heads", "event_undo_heads")


def test_a_consumer_with_a_head_from_before_a_rollback_never_takes_a_record_being_rewritten(
    channel: Channel,
) -> None:
    """A sender dies after advancing ring 0's head, before publishing; a worker has read that head
    (and is paused); the next lock holder rolls the head back and a new sender starts rewriting the
    same slot. The slot's ticket never reads as published meanwhile, so the worker, resuming with its
    stale head, takes nothing: not the half-written record (ticket 0), and its head does not pass it."""
    rings, views = channel.rings, channel.views
    dead = channel.sender._filler(0, 0, np.array([0]), [1.0], None)
    with pytest.raises(Died):
        views["writers"] = views["writers"].view(Watched)
        views["writers"].before_store = lambda array, key: _die_at(key, W_EVENTS_PUBLISHED)
        dead_rings = EventRings(
            views["events"], views["event_heads"], views["event_tails"], views["event_undo_heads"], views["writers"]
        )
        dead_rings.publish([(0, dead)])
    views["writers"].before_store = None
    stale_head = int(views["event_heads"][0])
    assert stale_head == 1
    rings.recover()  # the next holder of the lock: the head goes back to 0
    assert views["event_heads"][0] == 0
    new = channel.sender._filler(0, 1, np.array([1]), [2.0], None)
    size = views["events"].dtype.itemsize
    rings._ring_bytes[0][8:size] = memoryview(new)[8:]  # publish's first store into the slot: all but the ticket
    heads = rings.head_words
    rings.head_words = [stale_head, heads[1]]  # the paused worker resumes with the head it read before
    try:
        taken = rings.consume(0)
    finally:
        rings.head_words = heads
    assert len(taken) == 0 and views["event_tails"][0] == 0, taken


def _die_at(key: Any, word: int) -> None:
    if key == word:
        raise Died


# -- through a running pool -----------------------------------------------------------------------


def test_threads_sending_events_lose_none(pool_name: str, tmp_path: Path) -> None:
    per_thread = 400
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, inside critical sections too
    try:
        with shmpool.launch(
            "CartPole-v1",
            4,
            num_workers=2,
            name=pool_name,
            hooks=[helpers.EventLog(str(tmp_path))],
            event_payload=3,
            event_capacity=64,
        ) as pool:
            pool.reset(seed=0)

            def sender(thread_id: int) -> None:
                for seq in range(per_thread):
                    pool.events.send("Log", None, [thread_id, seq, 0], wait=None)  # to both workers

            threads = [threading.Thread(target=sender, args=(k,)) for k in range(4)]
            for thread in threads:
                thread.start()
            while any(thread.is_alive() for thread in threads):
                pool.step(np.zeros(4, dtype=np.int64))
            for _ in range(3):
                pool.step(np.zeros(4, dtype=np.int64))
    finally:
        sys.setswitchinterval(previous)
    delivered = [
        tuple(int(v) for v in line.split()[:2])
        for file in tmp_path.glob("events-*")
        for line in file.read_text().splitlines()
    ]
    assert sorted(delivered) == sorted((k, seq) for k in range(4) for seq in range(per_thread) for _ in range(2))


HALF_SENDER = """
import os, signal, sys
import numpy as np
import shmpool

handle = shmpool.attach(sys.argv[1], wait=10)
sender = handle.events
def die(record):
    print("dying", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
ids = np.array([0, 3])  # one env of each worker
parts = [(0, sender._filler(0, 0, ids[:1], np.array([9.0, 9.0, 9.0]), None)), (1, die)]
sender._lock.run(None, lambda: None, sender._rings.publish, parts)
"""


def test_an_event_to_several_workers_from_a_killed_sender_reaches_none(pool_name: str, tmp_path: Path) -> None:
    with shmpool.launch(
        "CartPole-v1", 4, num_workers=2, name=pool_name, hooks=[helpers.EventLog(str(tmp_path))], event_payload=3
    ) as pool:
        pool.reset(seed=0)
        result = helpers.run_script(HALF_SENDER, pool_name)
        assert result.returncode == -signal.SIGKILL and "dying" in result.stdout, result.stderr[-2000:]
        pool.step(np.zeros(4, dtype=np.int64))
        pool.events.send("Log", [1, 2], [1, 1, 1])  # the next sender recovers the rings, then sends
        for _ in range(2):
            pool.step(np.zeros(4, dtype=np.int64))
    delivered = sorted(line.split()[0] for file in tmp_path.glob("events-*") for line in file.read_text().splitlines())
    assert delivered == ["1", "1"]  # the new event in both workers; the dead sender's in neither


SENDER_DURING_CLOSE = """
import sys, time
import shmpool
sys.path.insert(0, "tests")
import helpers

pool = shmpool.launch("CartPole-v1", 4, num_workers=2, name=sys.argv[1], hooks=[helpers.EventLog(sys.argv[2])],
                      event_capacity=2, event_payload=3)
pool.reset(seed=0)

def send_all():
    for seq in range(10):  # the ring holds 2 and nobody steps: the third send waits for room
        pool.events.send("Log", None, [0, 0, seq], wait=None)

thread, outcome = helpers.outcome_in_thread(send_all, "sent all")
time.sleep(0.5)
started = time.monotonic()
pool.close()
thread.join(5)
print(outcome, thread.is_alive(), time.monotonic() - started < 10)
"""


def test_a_sender_waiting_for_room_stops_when_the_pool_closes(pool_name: str, tmp_path: Path) -> None:
    result = helpers.run_script(SENDER_DURING_CLOSE, pool_name, str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[0] == "['PoolClosedError'] False True"
