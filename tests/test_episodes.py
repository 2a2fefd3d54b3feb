"""Finished-episode records (:mod:`shmpool.episodes`): a reader never returns a record being overwritten
and counts what it lost, and each record carries the declared metrics of its episode's last step."""

from __future__ import annotations

from functools import partial

import helpers
import numpy as np
import pytest
from helpers import Fuse, tripwire

import shmpool
from shmpool.episodes import EpisodeReader, EpisodeWriter, episode_dtype


@pytest.mark.parametrize("batch", [0, 1, 3])
def test_episode_readers_never_return_a_record_being_overwritten(batch: int) -> None:
    """Readers a ring or more behind, reading between any two stores of the writer, return only
    published records, whole: ``append`` (``batch=0``) and ``reserve``/``publish`` of ``batch``
    records at once (the numba engine's path, whose record stores the test makes in Python)."""
    capacity, fuse = 4, Fuse()
    views = {
        "episode_records": tripwire(np.zeros((1, capacity), episode_dtype(None, ())), fuse),
        "episode_heads": tripwire(np.zeros(1, np.int64), fuse),
        "episode_reserved": tripwire(np.zeros(1, np.int64), fuse),
    }
    writer = EpisodeWriter(views, 0, {})
    published = [0]  # records the writer has published so far (the test's own count)

    def write(first: int, count: int) -> None:
        if not batch:
            writer.append(first, first, first, float(first), first, False, True, None)
        else:
            head = writer.reserve(count)
            ring = writer.plain_ring
            assert ring is not None and head == first
            for seq in range(first, first + count):
                ring[seq % capacity] = (seq, seq, seq, float(seq), seq, False, True)
            writer.publish(count)
        published[0] = first + count

    def check(reader: EpisodeReader) -> None:
        records = reader.read()
        seqs = records["env_id"].tolist()
        assert seqs == list(range(published[0] - len(seqs), published[0])), (seqs, published[0])
        for name in ("episode", "step", "length"):
            assert records[name].tolist() == seqs
        assert records["return"].tolist() == [float(seq) for seq in seqs]
        assert reader.lost + len(seqs) == published[0]

    step, total = batch or 1, capacity * 3
    readers = [EpisodeReader(views, lambda: None) for _ in range(3 * total)]  # made at 0: behind later
    fuse.arm({store: [partial(check, reader)] for store, reader in enumerate(readers)})
    for first in range(0, total, step):
        write(first, step)
    fuse.disarm()
    assert total < fuse.count <= len(readers)  # a reader before every store: reserve, records, head


def test_slow_readers_count_what_they_lost(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name, episode_capacity=4, seed=0) as pool:
        pool.reset()
        for _ in range(300):
            pool.step(np.ones(4, int))  # always right: episodes of ~10 steps
        records = pool.episodes.read()
        assert len(records) == 8 and pool.episodes.lost > 50  # 2 rings of 4 kept
        assert pool.episodes.lost + len(records) == pool.episodes.total
        np.testing.assert_array_equal(records["return"], records["length"])  # CartPole: 1 per step, never garbage


def test_episode_metrics_read_the_info_keys_at_each_episodes_last_step(pool_name: str) -> None:
    metrics = {"success": "is_success", "score": "stats/score", "first": "first"}
    with shmpool.launch(helpers.MetricEnv, 3, num_workers=2, name=pool_name, episode_metrics=metrics, seed=0) as pool:
        with shmpool.attach(pool_name) as handle:  # its reader starts here
            pool.reset()  # env i gets seed i: episodes of 3, 4 and 5 steps
            for _ in range(20):
                pool.step(np.zeros(3, int))
            records = pool.episodes.read()
            seen_by_others = handle.episodes.read()
    assert records.dtype["metrics"].names == ("success", "score", "first")
    for env, length in enumerate([3, 4, 5]):
        mine = records[records["env_id"] == env]
        assert len(mine) >= 3 and (mine["length"] == length).all(), mine
        assert mine["metrics"]["success"].tolist() == [length / 10] * len(mine)  # the last step's value
        assert mine["metrics"]["score"].tolist() == [-length] * len(mine)  # a nested key, by its path
        assert np.isnan(mine["metrics"]["first"]).all()  # reported at step 1 only: absent at the last
    theirs, ours = (np.sort(r, order=["env_id", "episode"]) for r in (seen_by_others, records))
    for field in ("env_id", "episode", "length"):
        np.testing.assert_array_equal(theirs[field], ours[field])
    for name in metrics:
        np.testing.assert_array_equal(theirs["metrics"][name], ours["metrics"][name])  # NaN matches NaN
