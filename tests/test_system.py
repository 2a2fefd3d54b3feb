"""What shmpool asks of the operating system (:mod:`shmpool.system`): here, the doorbells that the
trainer and the workers sleep on, and the signal handlers a worker must not inherit."""

from __future__ import annotations

import helpers
import numpy as np
import posix_ipc

import shmpool

#: A trainer that registers a faulthandler dump and a Python handler on SIGTERM (absl registers the
#: dump), then leaves its pools to be stopped at exit: each worker gets SIGTERM there.
INHERITS_SIGTERM_HANDLERS = """
import faulthandler, os, signal, sys
import numpy as np
import shmpool

faulthandler.register(signal.SIGTERM, chain=True)
signal.signal(signal.SIGTERM, lambda *_: print("the trainer's handler ran in", os.getpid()))

def handlers(env):
    return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, faulthandler.unregister(signal.SIGTERM)

options = {"num_workers": 2, "trainer_slot": False}
pools = [shmpool.launch("CartPole-v1", 2, **options, name=f"{sys.argv[1]}-{i}") for i in range(2)]
for pool in pools:
    pool.reset(seed=0)
    print(pool.env_apply(handlers))
"""


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


def test_workers_drop_the_signal_handlers_they_inherit_and_exit_quietly(pool_name: str) -> None:
    result = helpers.run_script(INHERITS_SIGTERM_HANDLERS, pool_name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[(True, False), (True, False)]"] * 2
    assert "most recent call first" not in result.stderr and "handler ran" not in result.stdout
