"""``engine="mujoco"`` resets its envs in the batch (``shmpool.workers.mujoco_resets``) where the
reset is gymnasium's own, with gymnasium's results (``test_mujoco_tasks.py`` compares every step
with ``SyncVectorEnv``), and through the env's ``reset`` where the user changed it."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import shmpool
from shmpool import Param, WorkerError
from shmpool import mujoco as smj

pytest.importorskip("mujoco.batch", reason='needs mujoco>=4.0: pip install -e ".[mujoco]"')


def count_gymnasium_resets() -> None:
    """A worker's ``worker_init``: counts ``mj_resetData``, which gymnasium's ``MujocoEnv.reset``
    calls on every reset (and the slot once, for its template state, while it is built)."""
    import mujoco

    reset_data = mujoco.mj_resetData

    def counted(*args: Any) -> None:
        counted.calls += 1  # type: ignore[attr-defined]
        reset_data(*args)

    counted.calls = 0  # type: ignore[attr-defined]
    mujoco.mj_resetData = counted


def resets_counted(env: Any) -> int:
    import mujoco

    return int(mujoco.mj_resetData.calls)


def still_reset_model(env: Any) -> Any:
    """A user's ``reset_model``: the initial pose, no noise."""
    unwrapped = env.unwrapped
    unwrapped.set_state(unwrapped.init_qpos, unwrapped.init_qvel)
    return unwrapped._get_obs()


def on_the_instance(env: Any) -> None:
    env.unwrapped.reset_model = lambda: still_reset_model(env)


def on_the_class_with_wraps(env: Any) -> None:
    """Patched onto gymnasium's class (every env of the worker) by a wrapper that copies gymnasium's
    names and module (``functools.wraps``)."""
    kind = type(env.unwrapped)

    @functools.wraps(kind.reset_model)
    def reset_model(self: Any) -> Any:
        return still_reset_model(self)

    kind.reset_model = reset_model


def in_a_refused_call(env: Any) -> None:
    """Changes the reset, and a constant the slot's envs must share: the call is refused."""
    on_the_instance(env)
    env.unwrapped._ctrl_cost_weight = 0.5


def run(pool: Any, steps: int) -> tuple[int, list[tuple[int, np.ndarray]]]:
    """Random steps; returns how many episodes ended, and each env's observation right after each of
    its autoresets (next-step autoreset)."""
    rng = np.random.default_rng(0)
    ended, first_observations = 0, []
    done = np.zeros(pool.num_envs, dtype=np.bool_)
    for _ in range(steps):
        obs, _, terminated, truncated, _ = pool.step(rng.uniform(-1, 1, pool.action_space.shape))
        first_observations += [(env, obs[env]) for env in np.flatnonzero(done)]
        done = terminated | truncated
        ended += int(done.sum())
    return ended, first_observations


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_autoresets_do_not_call_gymnasiums_reset(mode: AutoresetMode, pool_name: str) -> None:
    with shmpool.launch(
        "Hopper-v5",
        4,
        num_workers=2,
        engine="mujoco",
        autoreset_mode=mode,
        worker_init=count_gymnasium_resets,
        env_kwargs={"max_episode_steps": 20},
        name=pool_name,
    ) as pool:
        built = pool.env_apply(resets_counted, [0, 2])  # one env of each worker: the count is the worker's
        pool.reset(seed=0)
        ended, _ = run(pool, 60)
        assert ended >= 12  # every env's time limit, three times
        counts = pool.env_apply(resets_counted, [0, 2])
        assert sum(counts) - sum(built) == 4, "only the pool's reset goes through gymnasium's"


@pytest.mark.parametrize(
    ("patch", "changed_envs"), [(on_the_instance, {1}), (on_the_class_with_wraps, {0, 1}), (in_a_refused_call, {1})]
)
def test_an_env_whose_reset_the_user_changed_resets_through_it(
    patch: Any, changed_envs: set[int], pool_name: str
) -> None:
    with shmpool.launch(
        "Hopper-v5",
        2,
        num_workers=1,
        engine="mujoco",
        worker_init=count_gymnasium_resets,
        env_kwargs={"max_episode_steps": 10},
        name=pool_name,
    ) as pool:
        initial_pose = np.concatenate(
            pool.env_apply(lambda env: (env.unwrapped.init_qpos[1:], env.unwrapped.init_qvel))[0]
        )
        (built,) = pool.env_apply(resets_counted, [0])
        if patch is in_a_refused_call:  # the last call before the steps: no later call reads the envs anew
            with pytest.raises(ValueError, match="_ctrl_cost_weight"):
                pool.env_apply(patch, [1])
        else:
            pool.env_apply(patch, [1])
        pool.reset(seed=0)
        _, observations = run(pool, 35)
        assert {env for env, _ in observations} == {0, 1}
        for env, obs in observations:
            assert np.array_equal(obs, initial_pose) == (env in changed_envs), f"env {env}: the user's reset only"
        changed = sum(env in changed_envs for env, _ in observations)
        assert pool.env_apply(resets_counted, [0]) == [built + 2 + changed], "the pool's resets, then the user's"


class FailsAtSecondEpisode(smj.ModelBinding):
    """The torso's mass, whose write for the second simulation of a slot fails from its second
    episode on (a user's binding that raises)."""

    def resolve_in_batch(self, simulation: Any) -> Any:
        read, write = super().resolve_in_batch(simulation)
        writes = [0]

        def failing(value: Any) -> None:
            writes[0] += 1
            if simulation.index == 1 and writes[0] > 1:
                raise RuntimeError("this mass is refused on purpose")
            write(value)

        return read, failing


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_a_binding_failing_at_an_autoreset_names_its_env(mode: AutoresetMode, pool_name: str) -> None:
    mass = Param(
        dist="uniform",
        default={"low": 0.9, "high": 1.1},
        low=0.5,
        high=2.0,
        when="reset",
        bind=FailsAtSecondEpisode("body_mass", "body", "torso", None, relative=True, set_const=True),
    )
    with shmpool.launch(
        "Hopper-v5",
        4,
        num_workers=2,
        engine="mujoco",
        params={"mass": mass},
        autoreset_mode=mode,
        env_kwargs={"max_episode_steps": 3},
        name=pool_name,
    ) as pool:
        pool.reset(seed=0)
        with pytest.raises(WorkerError) as caught:
            for _ in range(5):  # every env ends its episode at the third step, and resets together
                pool.step(np.zeros(pool.action_space.shape))
    assert (caught.value.worker_id, caught.value.env_id) in {(0, 1), (1, 3)}
    assert "this mass is refused on purpose" in caught.value.__cause__.text
