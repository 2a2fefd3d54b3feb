"""What shmpool asks of the operating system (:mod:`shmpool.system`): here, the doorbells that the
trainer and the workers sleep on."""

from __future__ import annotations

import numpy as np
import posix_ipc

import shmpool


def test_the_trainers_doorbell_count_stays_bounded(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 8, num_workers=4, name=pool_name, seed=0) as pool:
        pool.reset(seed=0)
        for _ in range(2000):
            pool.step(np.zeros(8, dtype=np.int64))
        doorbell = posix_ipc.Semaphore(f"/shmpool-{pool_name}.t")
        try:
            # Every worker rings for every step: a wait that took one ring and left the others would
            # let the count grow by num_workers - 1 a step; taking them all bounds it by num_workers.
            assert doorbell.value <= pool.num_workers
        finally:
            doorbell.close()
