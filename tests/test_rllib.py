"""shmpool.rllib: PPO trains on a pool as its env runner's vector env, parameter writes reach the
envs through ``foreach_env_runner`` and from an attached process, and the sampled episodes equal
RLlib's own ``"sync"`` vectorization given the same seed and module.

RLlib pins its own gymnasium (ray[rllib] 2.60: 1.2.2), so ``.ci/run`` runs these in its second
virtual environment, the one on the oldest gymnasium; they skip where RLlib is not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from helpers import ROOT, needs, run_script
from ray_support import no_leftovers_but_rays, ray_environment

import shmpool
from shmpool.rllib import pool_of, vector_env_creator, write_params

pytestmark = [needs("rllib"), pytest.mark.xdist_group("ray"), pytest.mark.alone]  # one Ray runtime, by itself

NUM_ENVS = 4


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """A Ray instance of this machine for the module (RLlib starts one to build an algorithm)."""
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray puts Unix sockets in it
    with pytest.MonkeyPatch.context() as patch:
        ray_environment(patch, temp)
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """conftest's check, less the processes Ray keeps for itself; replaces conftest's for this module."""
    yield from no_leftovers_but_rays(request)


def ppo(env: Any, vectorize_mode: str, seed: int = 0) -> Any:
    """A small PPO on the local env runner (no remote ones), ``NUM_ENVS`` envs."""
    from ray.rllib.algorithms.ppo import PPOConfig

    config = (
        PPOConfig()
        .environment(env)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=NUM_ENVS, gym_env_vectorize_mode=vectorize_mode)
        .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1)
        .debugging(seed=seed)
    )
    return config.build_algo()


def register(name: str, **launch_options: Any) -> str:
    from ray.tune.registry import register_env

    registered = f"shmpool-{name}"
    register_env(registered, vector_env_creator("CartPole-v1", num_workers=2, name=name, **launch_options))
    return registered


def test_ppo_trains_on_a_pool_and_writes_reach_its_envs(ray_local: None, pool_name: str) -> None:
    spec = {"length": shmpool.Param(0.5, low=0.1, high=2.0)}
    algorithm = ppo(register(pool_name, params=spec), "vector_entry_point")
    try:
        result = algorithm.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 128
        pool = pool_of(algorithm.env_runner)
        assert algorithm.env_runner.env.unwrapped is pool and pool.name == f"{pool_name}-0"
        assert pool.num_envs == NUM_ENVS
        versions = write_params(algorithm, None, length=0.9)
        assert len(versions) == 1 and versions[0] >= 1  # one env runner (the local one): one write
        # An external curriculum attaches to the runner's pool by name, as scripts/curriculum.py does.
        attached = run_script(
            "import sys, shmpool\n"
            "with shmpool.attach(sys.argv[1]) as handle:\n"
            "    handle.params.write([1], length=1.3)\n",
            pool.name,
        )
        assert attached.returncode == 0, attached.stderr
        algorithm.train()
        np.testing.assert_array_equal(pool.applied["length"], [0.9, 1.3, 0.9, 0.9])
        assert pool.call("length") == (0.9, 1.3, 0.9, 0.9)
    finally:
        algorithm.stop()
    assert pool.closed


def test_an_attached_adr_process_widens_a_runners_ranges_while_ppo_trains(ray_local: None, pool_name: str) -> None:
    """``scripts/curriculum.py --algo adr``, a separate process, attaches to the env runner's pool by
    its name and widens the pole length's range from the episodes PPO samples (every episode tests
    a boundary, and every boundary tested widens: the thresholds are 0 and 1)."""
    spec = {"length": shmpool.Param(dist="uniform", default={"low": 0.5, "high": 0.5}, low=0.2, high=2.0)}
    algorithm = ppo(register(pool_name, params=spec), "vector_entry_point")
    curriculum = None
    try:
        pool = pool_of(algorithm.env_runner)
        adr = ["--algo", "adr", "--buffer", "2", "--p-boundary", "1", "--low-threshold", "0", "--high-threshold", "1"]
        curriculum = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "curriculum.py"), "--pool", pool.name, *adr],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # It widens only after it has attached (a fresh process: seconds on a loaded machine).
        deadline = time.monotonic() + 60
        while True:
            algorithm.train()
            low, high = float(pool.params["length"]["low"].min()), float(pool.params["length"]["high"].max())
            if low < high or time.monotonic() > deadline:
                break
        assert low < high and low <= 0.5 <= high, (low, high)  # widened from the episodes RLlib sampled
    finally:
        algorithm.stop()
        if curriculum is not None:
            output = curriculum.communicate(timeout=30)[0]  # it stops by itself once the pool is gone
            assert curriculum.returncode == 0, output


def test_sampled_episodes_equal_rllibs_sync_vectorization(ray_local: None, pool_name: str) -> None:
    on_pool = ppo(register(pool_name), "vector_entry_point", seed=3)
    on_sync = ppo("CartPole-v1", "sync", seed=3)
    try:
        # One module for both: the same weights, and actions without exploration.
        on_sync.env_runner.module.load_state_dict(on_pool.env_runner.module.state_dict())
        ours = on_pool.env_runner.sample(num_timesteps=300, explore=False)
        theirs = on_sync.env_runner.sample(num_timesteps=300, explore=False)
    finally:
        on_pool.stop()
        on_sync.stop()
    assert len(ours) == len(theirs) > NUM_ENVS  # episodes ended and the envs went on (NEXT_STEP)
    for mine, reference in zip(ours, theirs):
        np.testing.assert_array_equal(mine.get_observations(), reference.get_observations())
        np.testing.assert_array_equal(mine.get_actions(), reference.get_actions())
        np.testing.assert_array_equal(mine.get_rewards(), reference.get_rewards())
        assert (mine.is_terminated, mine.is_truncated) == (reference.is_terminated, reference.is_truncated)


def test_misuse_is_named() -> None:
    with pytest.raises(ValueError, match="RLlib sets num_envs"):
        vector_env_creator("CartPole-v1", num_envs=4)
    with pytest.raises(ValueError, match="num_envs_per_env_runner"):
        vector_env_creator("CartPole-v1")({})
    with pytest.raises(TypeError, match="is not a shmpool pool"):
        pool_of(os)
