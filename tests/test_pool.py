"""gymnasium's vector API on a pool beyond step/reset: control calls (``env_apply``, ``call``,
``get_attr``, ``set_attr``, ``render``), ``env`` as a sequence of callables and ``DISABLED`` autoreset;
the failure paths of calls (env errors, unpicklable results, Ctrl-C mid-call, use after close; a worker
that dies: test_waiting.py)."""

from __future__ import annotations

import os
import signal
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import ClosedEnvironmentError
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import StructuredEnv, counting

import shmpool
from shmpool.errors import RemoteTraceback, WorkerError


def test_env_apply_runs_functions_on_the_chosen_envs_in_order(pool_name: str) -> None:
    with shmpool.launch(counting(5), 5, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=10)
        assert pool.env_apply(
            lambda env, scale, offset=0: env.unwrapped.seed_used * scale + offset,
            [4, 0, 3],
            args=(2,),
            kwargs={"offset": 1},
        ) == [29, 21, 27]
        pids = pool.env_apply(lambda env: os.getpid())
        assert pids[:3] == [pool.worker_pids[0]] * 3 and pids[3:] == [pool.worker_pids[1]] * 2
        with pytest.raises(IndexError, match="outside 0..4"):
            pool.env_apply("length", [5])


def test_call_get_attr_and_set_attr_follow_gymnasium(pool_name: str) -> None:
    with shmpool.launch(counting(7), 4, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=0)
        assert pool.get_attr("length") == (7, 7, 7, 7)
        pool.set_attr("length", [1, 2, 3, 4])
        assert pool.get_attr("length") == (1, 2, 3, 4)
        pool.set_attr("length", 2)
        assert pool.call("step", 1)[0][2] is False  # a method is called, with the arguments
        with pytest.raises(ValueError, match="Got `3` values for 4 environments"):
            pool.set_attr("length", [1, 2, 3])
        _, _, terminations, _, _ = pool.step(np.ones(4, dtype=np.int64))
        assert terminations.tolist() == [True] * 4  # each env's own step from the call counted: t == 2


def test_an_env_error_in_a_call_is_raised_with_its_type_and_the_pool_stays_usable(pool_name: str) -> None:
    with shmpool.launch(counting(5), 4, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=0)
        with pytest.raises(AttributeError, match="no_such_thing") as caught:
            pool.get_attr("no_such_thing")
        assert any("env 0 (worker 0" in note for note in caught.value.__notes__)
        with pytest.raises(ZeroDivisionError) as caught:
            pool.env_apply(lambda env: 1 / (env.unwrapped.seed_used - 3))
        assert any("env 3 (worker 1" in note for note in caught.value.__notes__)
        cause = caught.value.__cause__
        assert isinstance(cause, RemoteTraceback) and "ZeroDivisionError" in cause.text
        with pytest.raises(TypeError, match="cannot be pickled"):
            pool.env_apply(lambda env: (x for x in [env]))  # a generator never pickles
        with pytest.raises(TypeError, match="cannot be pickled"):
            pool.env_apply(lambda env, numbers: 0, args=((x for x in [1]),))
        observations, *_ = pool.step(np.ones(4, dtype=np.int64))
        assert observations[:, 0].tolist() == [1.0] * 4
        assert pool.get_attr("length") == (5, 5, 5, 5)


def test_ctrl_c_during_a_call_leaves_the_pool_in_step(pool_name: str) -> None:
    with shmpool.launch(counting(50), 4, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=0)
        main = threading.main_thread().ident
        timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            pool.env_apply(lambda env: time.sleep(1.0) or "late")
        timer.join()
        # The interrupted call's answers are still on their way: the next call must not take them.
        assert pool.env_apply(lambda env: env.unwrapped.seed_used) == [0, 1, 2, 3]
        observations, *_ = pool.step(np.ones(4, dtype=np.int64))
        assert observations[:, 0].tolist() == [1.0] * 4


def test_calls_after_close_raise_gymnasiums_closed_error(pool_name: str) -> None:
    pool = shmpool.launch(counting(5), 2, num_workers=2, name=pool_name)
    pool.close()
    for call in (lambda: pool.get_attr("length"), pool.render, lambda: pool.step(np.ones(2, dtype=np.int64))):
        with pytest.raises(ClosedEnvironmentError):
            call()


def test_render_returns_every_envs_frame(pool_name: str) -> None:
    kwargs = {"render_mode": "rgb_array"}
    with shmpool.launch("CartPole-v1", 3, num_workers=2, env_kwargs=kwargs, name=pool_name) as pool:
        reference = SyncVectorEnv([lambda: gym.make("CartPole-v1", **kwargs)] * 3)
        pool.reset(seed=5)
        reference.reset(seed=5)
        for got, expected in zip(pool.render(), reference.render()):
            np.testing.assert_array_equal(got, expected)
        reference.close()


def test_env_fns_may_differ_per_env(pool_name: str) -> None:
    with shmpool.launch([counting(n) for n in (1, 2, 3)], num_workers=2, name=pool_name) as pool:
        assert pool.num_envs == 3 and pool.get_attr("length") == (1, 2, 3)
        pool.reset(seed=0)
        ended = [pool.step(np.ones(3, dtype=np.int64))[2].tolist() for _ in range(3)]
        assert ended == [[True, False, False], [False, True, False], [True, False, True]]


def test_env_fns_must_agree_on_spaces_and_count(pool_name: str) -> None:
    with pytest.raises(WorkerError, match=r"env 2 has observation space .* every env of a pool must have the same"):
        shmpool.launch([counting(3), counting(3), StructuredEnv], num_workers=2, name=pool_name)
    with pytest.raises(ValueError, match="num_envs=2 but env holds 3"):
        shmpool.launch([counting(3)] * 3, 2, name=pool_name)
    with pytest.raises(TypeError, match=r"env\[1\] must be a callable"):
        shmpool.launch([counting(3), "CartPole-v1"], name=pool_name)
    with pytest.raises(TypeError, match="num_envs is required"):
        shmpool.launch("CartPole-v1", name=pool_name)


def test_disabled_autoreset_resets_only_through_reset_mask(pool_name: str) -> None:
    with shmpool.launch(
        [counting(n) for n in (2, 9, 2, 9)], num_workers=2, autoreset_mode=AutoresetMode.DISABLED, name=pool_name
    ) as pool:
        assert pool.metadata["autoreset_mode"] == AutoresetMode.DISABLED
        pool.reset(seed=0)
        for _ in range(2):
            observations, _, terminations, _, infos = pool.step(np.ones(4, dtype=np.int64))
        assert terminations.tolist() == [True, False, True, False]
        assert "final_obs" not in infos and infos["_episode"].tolist() == [True, False, True, False]
        with pytest.raises(RuntimeError, match=r"episodes of envs \[0, 2\] ended"):  # as gymnasium refuses
            pool.step(np.ones(4, dtype=np.int64))
        observations, _ = pool.reset(options={"reset_mask": terminations})
        assert observations[:, 0].tolist() == [0.0, 2.0, 0.0, 2.0]
        observations, *_ = pool.step(np.ones(4, dtype=np.int64))
        assert observations[:, 0].tolist() == [1.0, 3.0, 1.0, 3.0]


def test_step_with_a_scalar_is_a_type_error_as_in_gymnasium(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 2, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=1)
        with pytest.raises(TypeError, match="must be a batch of 2 actions"):
            pool.step(0)
        reference = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
        reference.reset(seed=1)
        assert pool.np_random_seed == reference.np_random_seed == (1, 2)
        reference.close()


class ArrivesBroken:
    """Pickles in the trainer, but fails to unpickle in the worker (as an object of a module only
    the trainer can import would)."""

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise ImportError("this object cannot be rebuilt here")


def test_a_call_whose_arguments_the_worker_cannot_unpickle_fails_alone(pool_name: str) -> None:
    with shmpool.launch(counting(5), 4, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=0)
        with pytest.raises(ImportError, match="cannot be rebuilt") as caught:
            pool.env_apply(lambda env, thing: 0, args=(ArrivesBroken(),))
        assert any("worker 0 (before any env" in note for note in caught.value.__notes__)
        assert pool.get_attr("length") == (5, 5, 5, 5)  # still usable


def test_env_apply_runs_repeated_env_ids_once_each_in_order(pool_name: str) -> None:
    with shmpool.launch(counting(9), 2, num_workers=2, name=pool_name) as pool:
        pool.reset(seed=0)
        steps = pool.env_apply(lambda env: env.step(1)[0][0], [0, 0, 1, 0])
        assert steps == [1.0, 2.0, 1.0, 3.0]
