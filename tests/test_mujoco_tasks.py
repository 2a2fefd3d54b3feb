"""``engine="mujoco"``: gymnasium's MuJoCo v5 envs on ``mujoco.batch.Batch`` give exactly what
``SyncVectorEnv`` of the gymnasium envs gives, and exactly what ``engine="python"`` gives with the
same parameters and pushes."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import shmpool
from shmpool import Param
from shmpool import mujoco as smj
from shmpool.hooks import Perturb, Resample
from shmpool.mujoco import FEW_SIMULATIONS

mujoco = pytest.importorskip("mujoco.batch", reason='needs mujoco>=4.0: pip install -e ".[mujoco]"')

IDS = [  # every id the engine runs
    "HalfCheetah-v5",
    "Hopper-v5",
    "Walker2d-v5",
    "Ant-v5",
    "Humanoid-v5",
    "Swimmer-v5",
    "InvertedPendulum-v5",
    "InvertedDoublePendulum-v5",
    "Reacher-v5",
    "Pusher-v5",
    "HumanoidStandup-v5",
]
LIMIT = 40  # short episodes: time limits, terminations and resets all happen within the run


def assert_same_step(got: tuple[Any, ...], expected: tuple[Any, ...], where: str) -> None:
    """Observations, rewards, terminations, truncations and every info key (values, dtypes, masks)."""
    for name, mine, theirs in zip(("obs", "rewards", "terminations", "truncations"), got[:-1], expected[:-1]):
        assert mine.dtype == theirs.dtype, f"{where}: {name} dtype"
        np.testing.assert_array_equal(mine, theirs, err_msg=f"{where}: {name}")
    assert_same_infos(got[-1], expected[-1], where)


def assert_same_infos(mine: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
    assert set(mine) == set(theirs), f"{where}: info keys {set(mine) ^ set(theirs)}"
    for key, value in theirs.items():
        if isinstance(value, dict):
            assert_same_infos(mine[key], value, f"{where}: {key}")
            continue
        assert mine[key].dtype == value.dtype, f"{where}: info {key!r} dtype"
        if value.dtype == object:  # final_obs: an array per env that ended, else None
            for index, (one, other) in enumerate(zip(mine[key], value)):
                assert (one is None) == (other is None), f"{where}: info {key!r} env {index}"
                if other is not None:
                    np.testing.assert_array_equal(one, other, err_msg=f"{where}: info {key!r} env {index}")
            continue
        np.testing.assert_array_equal(mine[key], value, err_msg=f"{where}: info {key!r}")


def run_against_sync(env_id: str, mode: AutoresetMode, pool_name: str, steps: int, **kwargs: Any) -> int:
    """Steps a pool and SyncVectorEnv side by side on the same out-of-bounds actions, checking every
    step; returns how many episodes ended."""
    num_envs = 3
    reference = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, max_episode_steps=LIMIT, **kwargs) for _ in range(num_envs)], autoreset_mode=mode
    )
    ended = 0
    with shmpool.launch(
        env_id,
        num_envs,
        engine="mujoco",
        autoreset_mode=mode,
        episode_statistics=False,
        env_kwargs={"max_episode_steps": LIMIT, **kwargs},
        name=pool_name,
    ) as pool:
        assert_same_step(pool.reset(seed=11), reference.reset(seed=11), "reset")
        rng = np.random.default_rng(0)
        low, high = reference.single_action_space.low, reference.single_action_space.high
        for t in range(steps):
            # Beyond the bounds as well: gymnasium's envs pass them to MuJoCo unclipped.
            actions = rng.uniform(1.5 * low, 1.5 * high, reference.action_space.shape).astype(np.float32)
            got, expected = pool.step(actions), reference.step(actions)
            assert_same_step(got, expected, f"{env_id} step {t}")
            done = expected[2] | expected[3]
            ended += int(done.sum())
            if mode == AutoresetMode.DISABLED and done.any():
                options = {"reset_mask": done}
                assert_same_step(pool.reset(options=options), reference.reset(options=options), f"reset at {t}")
    reference.close()
    return ended


@pytest.mark.parametrize("env_id", IDS)
def test_each_env_equals_sync_vector_env_bit_for_bit(env_id: str, pool_name: str) -> None:
    assert run_against_sync(env_id, AutoresetMode.NEXT_STEP, pool_name, 3 * LIMIT) > 0


def test_a_per_simulation_timestep_enters_humanoid_standups_reward(pool_name: str) -> None:
    spec = {"timestep": Param(default=1.2, low=0.5, high=2.0, bind=smj.timestep(relative=True))}
    python = randomized_run("HumanoidStandup-v5", "python", pool_name, spec, None)
    batched = randomized_run("HumanoidStandup-v5", "mujoco", pool_name, spec, None)
    for t, (expected, got) in enumerate(zip(python[1:-1], batched[1:-1])):
        for name, theirs, mine in zip(("obs", "rewards", "terminations", "truncations"), expected, got):
            np.testing.assert_array_equal(mine, theirs, err_msg=f"step {t}: {name}")


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Ant-v5", "Humanoid-v5", "InvertedDoublePendulum-v5"])
@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_other_autoreset_modes_equal_sync_vector_env(env_id: str, mode: AutoresetMode, pool_name: str) -> None:
    assert run_against_sync(env_id, mode, pool_name, 2 * LIMIT) > 0


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("HalfCheetah-v5", {"frame_skip": 3, "ctrl_cost_weight": 0.3, "reset_noise_scale": 0.5}),
        ("Hopper-v5", {"healthy_z_range": (0.9, 2.0), "exclude_current_positions_from_observation": False}),
        ("Ant-v5", {"terminate_when_unhealthy": False, "include_cfrc_ext_in_observation": False}),
    ],
)
def test_constructor_arguments_hold(env_id: str, kwargs: dict[str, Any], pool_name: str) -> None:
    run_against_sync(env_id, AutoresetMode.NEXT_STEP, pool_name, LIMIT + 5, **kwargs)


def _contact_forces(env: Any) -> np.ndarray:
    return env.unwrapped.data.cfrc_ext.copy()


def test_an_acceleration_sensor_puts_contact_forces_in_a_resets_observation(pool_name: str, tmp_path: Path) -> None:
    """With such a sensor, the env's ``mj_forward`` at reset runs ``mj_rnePostConstraint``: a lying
    humanoid's first observation (and the data a control call sees) holds its contact forces, which
    the engine had left at zero."""
    import gymnasium.envs.mujoco

    stock = Path(gymnasium.envs.mujoco.__file__).parent / "assets" / "humanoidstandup.xml"
    xml = tmp_path / "humanoidstandup_sensor.xml"
    sensor = '<sensor><framelinacc objtype="body" objname="torso"/></sensor>\n</mujoco>'
    xml.write_text(stock.read_text().replace("</mujoco>", sensor))
    run_against_sync("HumanoidStandup-v5", AutoresetMode.NEXT_STEP, pool_name, LIMIT + 3, xml_file=str(xml))
    reference = gym.make("HumanoidStandup-v5", xml_file=str(xml))
    reference.reset(seed=4)
    assert np.abs(reference.unwrapped.data.cfrc_ext).sum() > 0
    options = {"engine": "mujoco", "env_kwargs": {"xml_file": str(xml)}, "name": pool_name}
    with shmpool.launch("HumanoidStandup-v5", 2, **options) as pool:
        pool.reset(seed=[4, 4])
        for forces in pool.env_apply(_contact_forces):
            np.testing.assert_array_equal(forces, reference.unwrapped.data.cfrc_ext)


def test_an_ants_contact_forces_off_the_floor_come_from_its_equality_constraint(pool_name: str, tmp_path: Path) -> None:
    """An Ant held up by a weld to the world never touches the floor: its ``cfrc_ext`` is the
    constraint's force alone, which the engine must not skip as it skips the simulations without
    contacts, constraints or applied forces."""
    import gymnasium.envs.mujoco

    stock = Path(gymnasium.envs.mujoco.__file__).parent / "assets" / "ant.xml"
    xml = tmp_path / "ant_welded.xml"
    weld = '<equality><weld body1="torso" solref="0.2 1"/></equality>\n</mujoco>'
    xml.write_text(stock.read_text().replace("</mujoco>", weld))
    kwargs = {"xml_file": str(xml), "terminate_when_unhealthy": False}
    run_against_sync("Ant-v5", AutoresetMode.NEXT_STEP, pool_name, LIMIT + 3, **kwargs)
    reference = gym.make("Ant-v5", **kwargs)
    reference.reset(seed=11)
    reference.step(reference.action_space.sample())
    data = reference.unwrapped.data
    assert data.ne > 0 and data.ncon == 0 and np.abs(data.cfrc_ext).sum() > 0  # what the run above checked


def count_compiles() -> None:
    """A worker's ``worker_init``: counts the compiles of model files (``MjModel.from_xml_path``)."""
    import mujoco

    compile_file = mujoco.MjModel.from_xml_path

    def counted(*args: Any, **kwargs: Any) -> Any:
        counted.calls += 1  # type: ignore[attr-defined]
        return compile_file(*args, **kwargs)

    counted.calls = 0  # type: ignore[attr-defined]
    mujoco.MjModel.from_xml_path = staticmethod(counted)


def test_a_worker_compiles_a_model_file_once_and_gives_each_env_its_own_copy(pool_name: str) -> None:
    with shmpool.launch(
        "Ant-v5", 4, num_workers=2, engine="mujoco", seed=0, worker_init=count_compiles, name=pool_name
    ) as pool:
        import mujoco

        assert pool.env_apply(lambda env: mujoco.MjModel.from_xml_path.calls) == [1] * 4
        models = pool.env_apply(lambda env: (os.getpid(), id(env.unwrapped.model)))
        assert len(set(models)) == 4  # each env its own model, in both workers
        pool.reset(seed=0)
        pool.step(np.zeros((4, 8)))


def test_episode_statistics_are_the_summed_rewards(pool_name: str) -> None:
    with shmpool.launch("Hopper-v5", 2, engine="mujoco", name=pool_name, env_kwargs={"max_episode_steps": 25}) as pool:
        pool.reset(seed=0)
        totals, lengths, seen = np.zeros(2), np.zeros(2, dtype=int), 0
        for _ in range(60):
            _, rewards, terminated, truncated, infos = pool.step(pool.action_space.sample())
            totals += rewards
            lengths += 1
            if "episode" in infos:
                for env in np.flatnonzero(infos["_episode"]):
                    assert infos["episode"]["r"][env] == pytest.approx(totals[env])
                    assert infos["episode"]["l"][env] == lengths[env]
                    seen += 1
            finished = terminated | truncated
            # next-step autoreset: the step after the end is the reset, with no reward
            totals[finished], lengths[finished] = 0.0, -1
        assert seen > 0
        records = pool.episodes.read()
        assert len(records) == seen


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_episode_records_equal_the_python_engines(mode: AutoresetMode, pool_name: str) -> None:
    """Records of episodes that end together, with the parameters drawn for them and metrics read
    from their last infos (a number, an array, a missing key and a nested one)."""
    spec = smj.scale_randomization()
    metrics = {"x": "x_position", "tendons": "tendon_length", "missing": "no_such_key", "nested": "a/b"}
    records = {}
    for engine in ("python", "mujoco"):
        with shmpool.launch(
            "Humanoid-v5",
            5,
            num_workers=2,
            engine=engine,
            params=spec,
            seed=4,
            autoreset_mode=mode,
            episode_metrics=metrics,
            env_kwargs={"max_episode_steps": 6},
            name=f"{pool_name}-{engine}",
        ) as pool:
            pool.reset(seed=0)
            rng = np.random.default_rng(0)
            for _ in range(20):
                pool.step(rng.uniform(-0.4, 0.4, pool.action_space.shape))
            records[engine] = np.sort(pool.episodes.read(), order=["env_id", "episode"])
    python, batched = records["python"], records["mujoco"]
    assert len(batched) == len(python) >= 15  # every env ended 3 time-limited episodes, or more
    for name in python.dtype.names:
        if name == "metrics":  # field by field: NaNs compare equal within a float array only
            for metric in metrics:
                np.testing.assert_array_equal(batched[name][metric], python[name][metric], err_msg=metric)
        else:
            np.testing.assert_array_equal(batched[name], python[name], err_msg=name)
    assert np.isnan(batched["metrics"]["missing"]).all() and np.isnan(batched["metrics"]["nested"]).all()
    assert np.isnan(batched["metrics"]["tendons"]).all()  # two tendons: not one number
    assert np.isfinite(batched["metrics"]["x"]).all()


def test_more_episode_ends_than_the_ring_holds_keep_the_newest_as_the_python_engine(pool_name: str) -> None:
    kept = {}
    for engine in ("python", "mujoco"):
        options = dict(engine=engine, num_workers=1, episode_capacity=2, env_kwargs={"max_episode_steps": 3})
        with shmpool.launch("Hopper-v5", 5, name=f"{pool_name}-{engine}", **options) as pool:
            pool.reset(seed=0)
            for _ in range(3):  # every env's time limit at the same step: 5 records for a ring of 2
                pool.step(np.zeros(pool.action_space.shape))
            reader = pool.episodes
            kept[engine] = (reader.read(), reader.lost)
    (python, python_lost), (batched, batched_lost) = kept["python"], kept["mujoco"]
    assert python["env_id"].tolist() == batched["env_id"].tolist() == [3, 4]
    assert batched_lost == python_lost == 3
    for name in ("episode", "step", "return", "length", "truncated"):
        np.testing.assert_array_equal(batched[name], python[name], err_msg=name)


def randomized_run(
    env_id: str,
    engine: str,
    pool_name: str,
    spec: dict[str, Param],
    push: Any,
    num_envs: int = 3,
    limit: int = LIMIT,
    num_workers: int | None = None,
) -> list[Any]:
    hooks = [] if push is None else [Perturb(40.0, every=7, dims=3, kick=push)]
    results = []
    with shmpool.launch(
        env_id,
        num_envs,
        engine=engine,
        params=spec,
        hooks=hooks,
        seed=5,
        env_kwargs={"max_episode_steps": limit},
        num_workers=num_workers,
        name=f"{pool_name}-{engine}",
    ) as pool:
        results.append(pool.reset(seed=3)[0])
        rng = np.random.default_rng(1)
        for t in range(2 * LIMIT):
            if t == 15 and "damping" in spec:
                pool.params["damping"][:2] = 2.5  # a per-step parameter written mid-episode
            if t == 25 and "gear" in spec:  # and for every env at once (one assignment for the batch)
                pool.params.write(None, gear=np.array([0.9, 1.2, 1.4]), armature=2.0)
            actions = rng.uniform(-1, 1, pool.action_space.shape).astype(np.float32)
            results.append(pool.step(actions)[:4])
        results.append({name: np.array(pool.applied[name]) for name in spec})
    return results


ROBOT_DR = {
    "HalfCheetah-v5": ("bthigh", "bthigh"),
    "Ant-v5": ("hip_1", 0),  # its actuators have no names
    "Walker2d-v5": ("thigh_joint", 0),
}


@pytest.mark.parametrize("env_id", sorted(ROBOT_DR))
def test_same_parameters_and_pushes_give_the_python_engines_trajectories(env_id: str, pool_name: str) -> None:
    joint, actuator = ROBOT_DR[env_id]
    spec = {
        **smj.scale_randomization(mass=(0.7, 1.3)),  # torso mass and floor friction, drawn per episode
        "damping": Param(default=1.0, low=0.1, high=5.0, bind=smj.dof_damping(joint, relative=True)),
        "gravity": Param(
            dist="uniform", default={"low": -10.5, "high": -9.0}, low=-20.0, high=0.0, when="reset", bind=smj.gravity()
        ),
        "gear": Param(default=1.1, low=0.5, high=2.0, bind=smj.actuator_gear(actuator, relative=True)),
        "armature": Param(default=1.5, low=0.5, high=3.0, bind=smj.dof_armature(joint, relative=True)),
        "frictionloss": Param(default=0.2, low=0.0, high=1.0, bind=smj.dof_frictionloss(joint)),
        "solref": Param(default=0.03, low=0.005, high=0.1, when="reset", bind=smj.geom_solref("floor")),
        "timestep": Param(default=1.05, low=0.5, high=2.0, bind=smj.timestep(relative=True)),
    }
    push = smj.Push("torso", mode="force")
    python = randomized_run(env_id, "python", pool_name, spec, push)
    batched = randomized_run(env_id, "mujoco", pool_name, spec, push)
    plain = randomized_run(env_id, "mujoco", pool_name, {}, None)
    for t, (expected, got) in enumerate(zip(python[1:-1], batched[1:-1])):
        for name, theirs, mine in zip(("obs", "rewards", "terminations", "truncations"), expected, got):
            np.testing.assert_array_equal(mine, theirs, err_msg=f"{env_id} step {t}: {name}")
    for name in spec:
        np.testing.assert_array_equal(batched[-1][name], python[-1][name], err_msg=f"applied {name}")
    assert not np.array_equal(plain[5][0], batched[5][0]), "the parameters and pushes changed nothing"


def test_resets_of_few_and_of_many_simulations_give_the_python_engines_trajectories(pool_name: str) -> None:
    """The batch runs a reset's ``set_const`` and ``forward`` simulation by simulation for a few envs
    and in one call for more; Humanoid's falls end one to four episodes a step, and its observation
    holds fields that only the reset's ``forward`` computes (``cinert``, ``cvel``): both ways give
    what the Python engine's envs give."""
    spec = smj.scale_randomization(mass=(0.7, 1.3))  # torso mass (set_const) and floor friction per episode
    python = randomized_run("Humanoid-v5", "python", pool_name, spec, None, num_envs=8, limit=20)
    batched = randomized_run("Humanoid-v5", "mujoco", pool_name, spec, None, num_envs=8, limit=20, num_workers=1)
    # The envs that end on a step reset together at the next (the last step's never do).
    resets = [int(np.count_nonzero(terminated | truncated)) for _, _, terminated, truncated in python[1:-2]]
    assert max(resets) > FEW_SIMULATIONS and 0 < min(count for count in resets if count) <= FEW_SIMULATIONS
    for t, (expected, got) in enumerate(zip(python[1:-1], batched[1:-1])):
        for name, theirs, mine in zip(("obs", "rewards", "terminations", "truncations"), expected, got):
            np.testing.assert_array_equal(mine, theirs, err_msg=f"step {t}: {name}")
    for name in spec:
        np.testing.assert_array_equal(batched[-1][name], python[-1][name], err_msg=f"applied {name}")


def test_attach_events_and_checkpoints_act_as_on_the_python_engine(pool_name: str) -> None:
    spec = {
        "mass": smj.scale_randomization()["mass_scale"],  # torso mass x U(0.8, 1.2), drawn per episode
        "gravity": Param(low=-20.0, high=0.0, bind=smj.gravity()),
    }
    runs = {}
    for engine in ("python", "mujoco"):
        push = Perturb(0.0, dims=3, kick=smj.Push("torso", mode="velocity"), name="push")  # kicked by events only
        options = dict(engine=engine, params=spec, hooks=[push], seed=2, env_kwargs={"max_episode_steps": 30})
        seen = []
        with shmpool.launch("Hopper-v5", 2, name=f"{pool_name}-{engine}", **options) as pool:
            seen.append(pool.reset(seed=0)[0])
            actions = np.full(pool.action_space.shape, 0.4, dtype=np.float32)
            for t in range(40):
                if t == 5:
                    with shmpool.attach(pool.name) as handle:  # another writer, by name
                        handle.params.write([1], gravity=-6.0)
                if t == 9:
                    pool.events.send("push", [0], [0.5, 0.0, 0.3])  # a kick of env 0 at its next step
                seen.append(pool.step(actions)[0])
            state = pool.state_dict()
            applied = {name: np.array(pool.applied[name]) for name in spec}
        with shmpool.launch("Hopper-v5", 2, name=f"{pool_name}-{engine}-loaded", **options) as fresh:
            fresh.load_state_dict(state)
            fresh.reset(seed=0)
            for _ in range(35):  # past the next resets: the loaded draws and values hold
                seen.append(fresh.step(actions)[0])
        runs[engine] = (seen, applied)
    (python, python_applied), (batched, batched_applied) = runs["python"], runs["mujoco"]
    for t, (expected, got) in enumerate(zip(python, batched)):
        np.testing.assert_array_equal(got, expected, err_msg=f"observation {t}")
    assert batched_applied["gravity"].tolist() == [-9.81, -6.0] == python_applied["gravity"].tolist()
    np.testing.assert_array_equal(batched_applied["mass"], python_applied["mass"])


def test_velocity_push_and_a_mass_change_touch_one_simulation_only(pool_name: str) -> None:
    spec = {"mass": Param(default=1.0, low=0.5, high=3.0, bind=smj.body_mass("torso", relative=True))}
    with shmpool.launch("Hopper-v5", 2, engine="mujoco", params=spec, name=pool_name) as pool:
        pool.reset(seed=0)
        pool.params["mass"][1] = 2.0
        pool.step(np.zeros(pool.action_space.shape, dtype=np.float32))
        masses = pool.call("get_wrapper_attr", "model")
        torso = smj.object_id(masses[0], "body", "torso")
        assert masses[1].body_mass[torso] == pytest.approx(2.0 * masses[0].body_mass[torso])
        # derived constants follow, for that simulation only
        assert masses[1].body_subtreemass[0] > masses[0].body_subtreemass[0]
        with shmpool.launch("Hopper-v5", 2, engine="python", params=spec, name=f"{pool_name}-py") as python:
            python.reset(seed=0)
            python.params["mass"][1] = 2.0
            python.step(np.zeros(python.action_space.shape, dtype=np.float32))
            expected = python.call("get_wrapper_attr", "model")
        np.testing.assert_array_equal(masses[1].body_subtreemass, expected[1].body_subtreemass)
        np.testing.assert_array_equal(masses[0].body_subtreemass, expected[0].body_subtreemass)


@contextlib.contextmanager
def stepped_beside_gymnasium(
    env_id: str, num_envs: int, pool_name: str, seed: int, action: float, steps: int
) -> Iterator[tuple[shmpool.Pool, gym.vector.SyncVectorEnv, np.ndarray]]:
    """A pool on the MuJoCo engine and gymnasium's SyncVectorEnv of the same envs, both reset with
    ``seed`` and stepped ``steps`` times with ``action`` for every env: ``(pool, reference, actions)``."""
    with shmpool.launch(env_id, num_envs, engine="mujoco", name=pool_name) as pool:
        reference = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(num_envs)])
        try:
            pool.reset(seed=seed)
            reference.reset(seed=seed)
            actions = np.full(pool.action_space.shape, action, dtype=np.float32)
            for _ in range(steps):
                pool.step(actions)
                reference.step(actions)
            yield pool, reference, actions
        finally:
            reference.close()


def test_vector_api_sees_each_env_materialized(pool_name: str) -> None:
    with stepped_beside_gymnasium("Hopper-v5", 3, pool_name, seed=4, action=0.3, steps=5) as (pool, reference, actions):
        np.testing.assert_array_equal(np.stack(pool.call("state_vector")), np.stack(reference.call("state_vector")))
        assert pool.get_attr("_elapsed_steps") == reference.get_attr("_elapsed_steps") == (5, 5, 5)
        # set_attr of a constant the task reads holds from the next step, as on gymnasium's env
        pool.set_attr("_ctrl_cost_weight", [0.5, 0.5, 0.5])
        reference.set_attr("_ctrl_cost_weight", [0.5, 0.5, 0.5])
        # env_apply changing the state: the next step starts from it
        pool.env_apply(lambda env: env.unwrapped.set_state(env.unwrapped.init_qpos, env.unwrapped.init_qvel))
        for env in reference.envs:
            env.unwrapped.set_state(env.unwrapped.init_qpos, env.unwrapped.init_qvel)
        assert_same_step(pool.step(actions), reference.step(actions), "after the calls")
        with pytest.raises(ValueError, match="one task per slot"):
            pool.set_attr("_ctrl_cost_weight", [0.5, 0.1, 0.5])
        assert pool.get_attr("_ctrl_cost_weight") == (0.5, 0.5, 0.5)  # given back; the pool goes on
        assert_same_step(pool.step(actions), reference.step(actions), "after a refused call")


def test_a_refused_call_names_envs_by_their_pool_ids(pool_name: str) -> None:
    """The second slot's envs are 3 to 5: a differing constant in its second env is env 4's."""
    with shmpool.launch("Hopper-v5", 6, num_workers=2, engine="mujoco", name=pool_name) as pool:
        pool.reset(seed=0)
        with pytest.raises(ValueError, match=r"is 0.5 in env 3 \(the slot's first\) and 0.1 in env 4;"):
            pool.set_attr("_ctrl_cost_weight", [0.5, 0.5, 0.5, 0.5, 0.1, 0.5])
        # the first slot took its values; the refusing slot's envs were given back theirs
        assert pool.get_attr("_ctrl_cost_weight") == (0.5, 0.5, 0.5, 0.001, 0.001, 0.001)


@pytest.mark.parametrize("env_id", ["Ant-v5", "Humanoid-v5"])
def test_a_call_that_moves_the_state_and_the_materialized_data_match_gymnasium(env_id: str, pool_name: str) -> None:
    with stepped_beside_gymnasium(env_id, 2, pool_name, seed=1, action=0.2, steps=4) as (pool, reference, actions):
        # what a call sees: the env's MjData as gymnasium's holds it, contact forces included
        for name in ("cfrc_ext", "cacc", "xpos", "qacc_warmstart"):
            mine = [getattr(data, name) for data in pool.call("get_wrapper_attr", "data")]
            theirs = [getattr(env.unwrapped.data, name) for env in reference.envs]
            np.testing.assert_array_equal(np.stack(mine), np.stack(theirs), err_msg=name)
        assert np.abs(np.stack(mine)).sum() > 0

        def shift(env: Any) -> None:  # set_state runs mj_forward: the next step starts from there
            unwrapped = env.unwrapped
            position = unwrapped.data.qpos.copy()
            position[:2] += (1.0, 0.5)
            unwrapped.set_state(position, unwrapped.data.qvel.copy())

        pool.env_apply(shift)
        for env in reference.envs:
            shift(env)
        assert_same_step(pool.step(actions), reference.step(actions), "after a call that moved the state")


def _push_the_torso(env: Any) -> None:  # an applied force: part of the state, no derived field moves
    env.unwrapped.data.xfrc_applied[1, 0] = 5.0


def _speed_up(env: Any) -> None:  # a velocity edited: the body positions stay those of the last step
    env.unwrapped.data.qvel[0] += 0.5


def _recompute(env: Any) -> None:  # the state as it was, every derived field recomputed from it
    import mujoco

    mujoco.mj_forward(env.unwrapped.model, env.unwrapped.data)


def _step_inside(env: Any) -> None:  # the env's own step, inside a call
    env.step(np.full(env.action_space.shape, 0.1, dtype=np.float32))


@pytest.mark.parametrize("env_id", ["Ant-v5", "Humanoid-v5"])
def test_the_step_after_a_call_reads_the_data_as_the_call_left_it(env_id: str, pool_name: str) -> None:
    """Ant's and Humanoid's rewards use a body position from before the physics, a derived field:
    after a call, gymnasium's env reads it from its MjData as the call left it, stale unless the
    call ran mj_forward; and a second call sees that MjData as the first left it."""
    with stepped_beside_gymnasium(env_id, 2, pool_name, seed=2, action=0.2, steps=3) as (pool, reference, actions):
        for call in (_push_the_torso, _speed_up, _recompute, _step_inside):
            pool.env_apply(call)
            for env in reference.envs:
                call(env)
            assert_same_step(pool.step(actions), reference.step(actions), f"after {call.__name__}")
        pool.env_apply(_speed_up)
        for env in reference.envs:
            _speed_up(env)
        for name in ("xpos", "xipos", "qvel"):
            mine = [getattr(data, name) for data in pool.call("get_wrapper_attr", "data")]
            theirs = [getattr(env.unwrapped.data, name) for env in reference.envs]
            np.testing.assert_array_equal(np.stack(mine), np.stack(theirs), err_msg=f"{name}, in a second call")
        assert_same_step(pool.step(actions), reference.step(actions), "after two calls")
        pool.env_apply(_speed_up)  # then a reset before the next step: it starts from the reset's state
        for env in reference.envs:
            _speed_up(env)
        pool.reset(seed=5)
        reference.reset(seed=5)
        assert_same_step(pool.step(actions), reference.step(actions), "after a call and a reset")


def _kick_the_data(env: Any, amounts: np.ndarray) -> None:
    env.unwrapped.data.qvel[:3] += amounts


class _ReadsTheData:
    def after_step(self, ctx: Any) -> None:
        ctx.rewards[:] = [env.unwrapped.data.qpos[0] for env in ctx.envs]


class _ReadsTheModel:
    """Would read the nominal mass, not the one written for the env (``env.dt`` reads the model too)."""

    def after_step(self, ctx: Any) -> None:
        ctx.rewards[:] = [env.unwrapped.model.body_mass[1] for env in ctx.envs]


class _ChangesTheModel:
    """Would change a model that the batch never reads again."""

    def before_step(self, ctx: Any) -> None:
        for env in ctx.envs:
            env.unwrapped.model.opt.gravity[2] = -2.0


class _DoublesTheRewards:
    def after_step(self, ctx: Any) -> None:
        ctx.rewards *= 2.0


def test_hooks_that_would_touch_an_envs_data_under_the_batch_are_refused(pool_name: str) -> None:
    """The batch holds the physics: a kick function's writes to an env's MjData would be lost, and
    a hook reading it would see its last reset; its MjModel likewise, once parameters live in the
    batch (without them every env's model is right, and hooks read it). Each raises, naming the way;
    a hook of the results runs."""
    with pytest.raises(shmpool.WorkerError, match=r"during launch.*kick with shmpool\.mujoco\.Push"):
        shmpool.launch(
            "Hopper-v5", 2, engine="mujoco", hooks=[Perturb(2.0, every=3, dims=3, kick=_kick_the_data)], name=pool_name
        )
    actions = np.full((2, 3), 0.2, dtype=np.float32)
    mass = {"mass": Param(default=1.0, low=0.5, high=2.0, bind=smj.body_mass("torso", relative=True))}
    for hook, used, params in [
        (_ReadsTheData, "data.qpos", None),
        (_ReadsTheModel, "model.body_mass", mass),
        (_ChangesTheModel, "model.opt", mass),
    ]:
        with shmpool.launch(
            "Hopper-v5", 2, engine="mujoco", hooks=[hook()], params=params, name=f"{pool_name}-r"
        ) as pool:
            pool.reset(seed=0)
            if params:
                pool.params.write([1], mass=1.5)
            with pytest.raises(shmpool.WorkerError, match=rf"'{hook.__name__}'.*env\.unwrapped\.{used} in a hook"):
                pool.step(actions)
    rewards = {}
    for engine in ("python", "mujoco"):
        with shmpool.launch(
            "Hopper-v5", 2, engine=engine, hooks=[_ReadsTheModel(), _DoublesTheRewards()], name=f"{pool_name}-{engine}"
        ) as pool:
            pool.reset(seed=0)
            rewards[engine] = [pool.step(actions)[1] for _ in range(3)]
    np.testing.assert_array_equal(rewards["mujoco"], rewards["python"])


@pytest.mark.parametrize(("env_id", "reward"), [("Hopper-v5", 2), ("InvertedDoublePendulum-v5", 5), ("Ant-v5", 3)])
def test_an_int_healthy_reward_keeps_gymnasiums_info_dtype(env_id: str, reward: int, pool_name: str) -> None:
    run_against_sync(env_id, AutoresetMode.NEXT_STEP, pool_name, 5, healthy_reward=reward)


@pytest.mark.parametrize(("env_id", "reward"), [("Walker2d-v5", True), ("Walker2d-v5", False), ("Hopper-v5", True)])
def test_a_bool_healthy_reward_keeps_gymnasiums_info_dtype(env_id: str, reward: bool, pool_name: str) -> None:
    """Walker2d's healthy flag is a numpy bool (an object array of them in SyncVectorEnv), Hopper's a
    Python bool (an int once multiplied by a bool): the same rule for both gave Walker2d int64."""
    run_against_sync(env_id, AutoresetMode.NEXT_STEP, pool_name, 5, healthy_reward=reward)


def test_closing_releases_the_batch_before_another_pool_forks(pool_name: str) -> None:
    spec = {"mass": Param(default=1.1, low=0.5, high=2.0, bind=smj.body_mass("torso", relative=True))}
    push = Perturb(10.0, every=3, dims=3, kick=smj.Push("torso"))

    def batches() -> int:
        return sum(type(thing).__name__ == "Batch" for thing in gc.get_objects())

    gc.collect()
    before = batches()
    gc.disable()  # what must release the batch is close(), not a collection that may or may not come
    try:
        for attempt in range(2):
            with shmpool.launch(
                "Hopper-v5",
                2,
                engine="mujoco",
                params=spec,
                hooks=[push],
                trainer_slot=True,
                name=f"{pool_name}-{attempt}",
            ) as pool:
                pool.reset(seed=0)
                pool.step(np.zeros(pool.action_space.shape, dtype=np.float32))
            assert batches() == before, "a closed pool still holds its batch"
        # a later pool's forked workers would otherwise inherit it and abort destroying it
        with shmpool.launch("Hopper-v5", 2, engine="mujoco", num_workers=2, name=f"{pool_name}-after") as pool:
            pool.reset(seed=0)
            pool.step(np.zeros(pool.action_space.shape, dtype=np.float32))
    finally:
        gc.enable()


def test_render_gives_the_frames_of_gymnasiums_env(pool_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOCO_GL", os.environ.get("MUJOCO_GL", "egl"))  # headless, in the workers
    frames = {}
    for engine in ("python", "mujoco"):
        with shmpool.launch(
            "Hopper-v5",
            2,
            engine=engine,
            env_kwargs={"render_mode": "rgb_array"},
            name=f"{pool_name}-{engine}",
            timeout=20,
        ) as pool:
            pool.reset(seed=4)
            for _ in range(3):
                pool.step(np.full(pool.action_space.shape, 0.3, dtype=np.float32))
            try:
                frames[engine] = np.stack(pool.render())
            except Exception as exc:  # noqa: BLE001 - no OpenGL on this machine: nothing to compare
                pytest.skip(f"MuJoCo cannot render here ({type(exc).__name__}: {str(exc)[:100]})")
    np.testing.assert_array_equal(frames["mujoco"], frames["python"])
    assert frames["mujoco"].std() > 0


def test_unsupported_ids_and_parameters_the_engine_cannot_apply_are_refused(pool_name: str) -> None:
    for bind in (None, "model.opt.gravity[2]"):
        with pytest.raises(ValueError, match=r"\['_ctrl_cost_weight'\] bind to env attributes or paths"):
            shmpool.launch(
                "Hopper-v5",
                2,
                engine="mujoco",
                params={"_ctrl_cost_weight": Param(default=0.001, low=0.0, high=1.0, bind=bind)},
                name=pool_name,
            )
    with pytest.raises(ValueError, match="HalfCheetah-v5") as caught:
        shmpool.launch("CartPole-v1", 2, engine="mujoco", name=pool_name)
    assert "engine='python'" in str(caught.value)
    with pytest.raises(ValueError, match="when='rebuild'"):
        shmpool.launch(
            "Hopper-v5",
            2,
            engine="mujoco",
            params={"ctrl_cost_weight": Param(default=0.001, low=0.0, high=1.0, when="rebuild")},
            name=pool_name,
        )


def test_redraws_mid_episode_write_the_batch_as_the_python_engine_writes_envs(pool_name: str) -> None:
    """``Resample`` redraws a mass (``set_const``) and a friction for the envs due, several at once,
    and checks its names at launch with a redraw of no env: the batch takes both as env by env."""
    spec = smj.scale_randomization(mass=(0.6, 1.4))
    runs = {}
    for engine in ("python", "mujoco"):
        with shmpool.launch(
            "HalfCheetah-v5",
            4,
            engine=engine,
            params=spec,
            hooks=[Resample(["mass_scale", "friction_scale"], every=3)],
            seed=2,
            name=f"{pool_name}-{engine}",
        ) as pool:
            steps = [pool.reset(seed=1)[0]]
            actions = np.full(pool.action_space.shape, 0.4, dtype=np.float32)
            for _ in range(10):
                steps.append(pool.step(actions)[0])
            runs[engine] = (steps, np.array(pool.applied))
    for t, (expected, got) in enumerate(zip(runs["python"][0], runs["mujoco"][0])):
        np.testing.assert_array_equal(got, expected, err_msg=f"step {t}")
    assert runs["python"][1].tobytes() == runs["mujoco"][1].tobytes()
    assert len(set(runs["mujoco"][1]["mass_scale"].tolist())) == 4  # each env its own draw
