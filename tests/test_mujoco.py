"""MuJoCo bindings change the model exactly as a hand edit would; randomization is reproducible."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import shmpool
from shmpool import Param, env_families, hooks
from shmpool import mujoco as smj

mujoco = pytest.importorskip("mujoco", reason='needs mujoco: pip install -e ".[mujoco]"')

ENV = "HalfCheetah-v5"


def hand_edited(field: str, kind: str | None, name: str | None, axis: int | None, value: float) -> gym.Env:
    """A plain HalfCheetah whose model was edited by hand, as the MuJoCo docs say to."""
    env = gym.make(ENV)
    model = env.unwrapped.model
    if field.startswith("opt."):
        owner, attribute = model.opt, field[4:]
        if axis is None:
            setattr(owner, attribute, value)
        else:
            getattr(owner, attribute)[axis] = value
        return env
    index = smj.object_id(model, kind, name)
    if field == "dof_damping":
        index = model.jnt_dofadr[index]
    array = getattr(model, field)
    array[(index,) if axis is None else (index, axis)] = value
    if field == "body_mass":
        mujoco.mj_setConst(model, mujoco.MjData(model))  # masses feed derived constants
    return env


BINDINGS = [
    ("body_mass", smj.body_mass("torso"), ("body_mass", "body", "torso", None), 9.0),
    ("geom_friction", smj.geom_friction("floor", axis=0), ("geom_friction", "geom", "floor", 0), 0.1),
    ("dof_damping", smj.dof_damping("bthigh"), ("dof_damping", "joint", "bthigh", None), 20.0),
    ("actuator_gear", smj.actuator_gear("bthigh"), ("actuator_gear", "actuator", "bthigh", 0), 40.0),
    ("gravity", smj.gravity(axis=2), ("opt.gravity", None, None, 2), -3.0),
    ("timestep", smj.timestep(), ("opt.timestep", None, None, None), 0.02),
]


@pytest.mark.parametrize("label, binding, where, value", BINDINGS, ids=[b[0] for b in BINDINGS])
def test_binding_matches_a_hand_edited_model(label, binding, where, value, pool_name: str) -> None:
    with shmpool.launch(
        ENV,
        2,
        num_workers=2,
        name=pool_name,
        params={label: Param(bind=binding, low=-1000, high=1000)},
        worker_init=smj.log_to_python,
    ) as pool:
        nominal = float(pool.params[label][0])
        pool.params[label][1] = value
        observations, _ = pool.reset(seed=3)
        references = [gym.make(ENV), hand_edited(*where, value)]
        assert nominal != value
        np.testing.assert_array_equal(
            observations, np.stack([r.reset(seed=3 + i)[0] for i, r in enumerate(references)])
        )
        pool.action_space.seed(0)
        for t in range(25):
            actions = pool.action_space.sample()
            observations, rewards = pool.step(actions)[:2]
            expected = [r.step(actions[i]) for i, r in enumerate(references)]
            np.testing.assert_array_equal(observations, np.stack([e[0] for e in expected]), err_msg=f"step {t}")
            np.testing.assert_array_equal(rewards, [e[1] for e in expected])
        assert not np.array_equal(observations[0], observations[1])


def test_unknown_names_fail_at_launch_listing_the_model_names(pool_name: str) -> None:
    with pytest.raises(ValueError, match=r"no body named 'torsoo'; its body names are \['world', 'torso', 'bthigh'"):
        shmpool.launch(
            ENV, 2, name=pool_name, params={"m": Param(bind=smj.body_mass("torsoo"))}, worker_init=smj.log_to_python
        )
    with pytest.raises(ValueError, match=r"no actuator named 'elbow'"):
        shmpool.launch(
            ENV, 2, name=pool_name, params={"g": Param(bind=smj.actuator_gear("elbow"))}, worker_init=smj.log_to_python
        )


RANDOMIZED = {
    "mass": Param(
        dist="uniform",
        default={"low": 0.8, "high": 1.2},
        low=0.5,
        high=2.0,
        when="reset",
        bind=smj.body_mass("torso", relative=True),
    ),
    "friction": Param(
        dist="uniform",
        default={"low": 0.5, "high": 1.5},
        low=0.1,
        high=3.0,
        when="reset",
        bind=smj.geom_friction("floor", axis=0, relative=True),
    ),
}


def applied_per_episode(name: str, seed: int, workers: int) -> list[np.ndarray]:
    rows = []
    with shmpool.launch(
        ENV,
        4,
        num_workers=workers,
        name=name,
        params=RANDOMIZED,
        seed=seed,
        env_kwargs={"max_episode_steps": 5},
        worker_init=smj.log_to_python,
    ) as pool:
        pool.reset()
        rows.append(pool.applied.copy())
        for _ in range(3):
            for _ in range(6):  # five steps, then the autoreset step
                pool.step(np.zeros((4, 6), np.float32))
            rows.append(pool.applied.copy())
    return rows


def test_relative_randomization_is_per_env_per_episode_and_reproducible(pool_name: str) -> None:
    first = applied_per_episode(pool_name + "a", seed=5, workers=2)
    again = applied_per_episode(pool_name + "b", seed=5, workers=1)
    other = applied_per_episode(pool_name + "c", seed=6, workers=2)
    assert [r.tobytes() for r in first] == [r.tobytes() for r in again]
    assert [r.tobytes() for r in first] != [r.tobytes() for r in other]
    masses = np.stack([r["mass"] for r in first])  # (episodes, envs)
    assert np.all((masses >= 0.8) & (masses <= 1.2))
    assert len(np.unique(masses)) == masses.size  # different per env and per episode
    frictions = np.stack([r["friction"] for r in first])
    assert np.all((frictions >= 0.5) & (frictions <= 1.5))


def test_relative_values_are_applied_exactly(pool_name: str) -> None:
    with shmpool.launch(
        ENV, 2, num_workers=2, name=pool_name, params=RANDOMIZED, seed=1, worker_init=smj.log_to_python
    ) as pool:
        observations, _ = pool.reset(seed=8)
        scales = pool.applied.copy()
        references = []
        for env in range(2):
            reference = gym.make(ENV)
            model = reference.unwrapped.model
            model.body_mass[1] = model.body_mass[1] * scales["mass"][env]
            mujoco.mj_setConst(model, mujoco.MjData(model))
            model.geom_friction[0, 0] = model.geom_friction[0, 0] * scales["friction"][env]
            references.append(reference)
        np.testing.assert_array_equal(
            observations, np.stack([r.reset(seed=8 + i)[0] for i, r in enumerate(references)])
        )
        for _ in range(20):
            actions = np.full((2, 6), 0.5, np.float32)
            np.testing.assert_array_equal(
                pool.step(actions)[0], np.stack([r.step(actions[i])[0] for i, r in enumerate(references)])
            )


@pytest.mark.parametrize("mode", ["force", "velocity"])
def test_perturb_pushes_a_mujoco_body(mode: str, pool_name: str) -> None:
    push = hooks.Perturb(0.0, kick=smj.Push("torso", mode=mode), dims=3)
    with shmpool.launch(ENV, 2, num_workers=2, name=pool_name, hooks=[push], worker_init=smj.log_to_python) as pool:
        observations, _ = pool.reset(seed=0)
        references = [gym.make(ENV) for _ in range(2)]
        for i, r in enumerate(references):
            r.reset(seed=i)
        zero = np.zeros((2, 6), np.float32)
        for t in range(12):
            if t == 3:
                pool.events.send("Perturb", [1], [200.0 if mode == "force" else 2.0])
            observations = pool.step(zero)[0]
            expected = [r.step(zero[i])[0] for i, r in enumerate(references)]
            np.testing.assert_array_equal(observations[0], expected[0])  # the other env is untouched
            if t < 3:
                np.testing.assert_array_equal(observations[1], expected[1])
        assert np.abs(observations[1] - expected[1]).max() > 1e-3


def test_perturb_needs_a_push_for_mujoco_envs(pool_name: str) -> None:
    assert isinstance(env_families.adapter_for(gym.make(ENV)), smj.MujocoAdapter)
    with pytest.raises(shmpool.WorkerError, match="failed in hook 'Perturb'.* during launch") as caught:
        shmpool.launch(ENV, 1, num_workers=1, name=pool_name, hooks=[hooks.Perturb(1.0)], worker_init=smj.log_to_python)
    assert "give it kick=shmpool.mujoco.Push(body)" in caught.value.__cause__.text


NO_LOG_FILE = """
import logging
import sys

import numpy as np

import shmpool
from shmpool import Param
from shmpool import mujoco as smj

if __name__ == "__main__":  # spawned workers import this file again
    logging.basicConfig(format="%(name)s|%(message)s")
    smj.log_to_python()  # the trainer makes an env at launch, to read nominal values
    # Gravity far beyond MuJoCo's limits makes it warn ("huge value in QACC") in the worker.
    params = {"gravity": Param(bind=smj.gravity(axis=2), low=-1e15, high=0)}
    with shmpool.launch(
        "HalfCheetah-v5", 2, num_workers=1, name=sys.argv[1], params=params, start_method="spawn",
        worker_init=smj.log_to_python,
    ) as pool:
        pool.params["gravity"][1] = -1e12
        pool.reset(seed=0)
        for _ in range(3):
            pool.step(np.zeros((2, 6), np.float32))
    print("done")
"""


def test_mujoco_pools_write_no_log_file_in_the_working_directory(pool_name: str, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(NO_LOG_FILE)
    result = subprocess.run(
        [sys.executable, "train.py", pool_name], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["done"]
    assert "huge value in QACC" in result.stderr  # the worker warned...
    assert "WARNING: " not in result.stderr  # ...through logging, not MuJoCo's handler (which also writes the file)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["train.py"]
