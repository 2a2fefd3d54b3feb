"""``engine="mujoco"`` resets its envs in the batch (``shmpool.workers.mujoco_resets``) where the
reset is gymnasium's own, with gymnasium's results (``test_mujoco_tasks.py`` compares every step
with ``SyncVectorEnv``), and through the env's ``reset`` where the user changed it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import shmpool

pytest.importorskip("mujoco.batch", reason='needs mujoco>=4.0: pip install -e ".[mujoco]"')


def count_gymnasium_resets() -> None:
    """A worker's ``worker_init``: counts the calls of gymnasium's ``MujocoEnv.reset`` (the patched
    method stays gymnasium's: its module is the original's)."""
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

    reset = MujocoEnv.reset

    def counted(self: Any, **kwargs: Any) -> Any:
        MujocoEnv.resets_counted += 1  # type: ignore[attr-defined]
        return reset(self, **kwargs)

    counted.__module__ = reset.__module__
    MujocoEnv.resets_counted = 0  # type: ignore[attr-defined]
    MujocoEnv.reset = counted  # type: ignore[method-assign]


def resets_counted(env: Any) -> int:
    return int(type(env.unwrapped).resets_counted)


def still_reset_model(env: Any) -> Any:
    """A user's ``reset_model``: the initial pose, no noise."""
    unwrapped = env.unwrapped
    unwrapped.set_state(unwrapped.init_qpos, unwrapped.init_qvel)
    return unwrapped._get_obs()


def use_still_resets(env: Any) -> None:
    env.unwrapped.reset_model = lambda: still_reset_model(env)


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
        pool.reset(seed=0)
        ended, _ = run(pool, 60)
        assert ended >= 12  # every env's time limit, three times
        counts = pool.env_apply(resets_counted, [0, 2])  # one env of each worker: the count is the worker's
        assert sum(counts) == 4, "only the pool's reset goes through gymnasium's"


def test_an_env_whose_reset_the_user_changed_resets_through_it(pool_name: str) -> None:
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
        pool.env_apply(use_still_resets, [1])
        pool.reset(seed=0)
        _, observations = run(pool, 35)
        assert {env for env, _ in observations} == {0, 1}
        for env, obs in observations:
            assert np.array_equal(obs, initial_pose) == (env == 1), f"env {env}: the user's reset only"
        changed = sum(env == 1 for env, _ in observations)
        assert pool.env_apply(resets_counted, [0]) == [2 + changed], "the pool's 2 resets, then env 1's own"
