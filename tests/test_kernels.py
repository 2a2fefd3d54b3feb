"""The numba engine (``launch(engine="numba")``): compiled batch kernels give gymnasium's results bit for
bit, with the parameters, hooks, calls and errors of the Python engine. Parameter, attach and CLI
tests of both engines are in test_params.py, test_classic_control.py, test_view.py and test_cli.py
(parametrized over ``engine``)."""

from __future__ import annotations

import importlib.util
import pickle
import sys
from typing import Any

import gymnasium as gym
import helpers
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import TimeLimit
from test_e2e_equivalence import ENVS, check_matches_sync_vector_env
from test_params import run_schedule

import shmpool
from shmpool import Param, hooks, kernels

needs_numba = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason='needs numba: pip install ".[numba]"'
)
COMPILED = {**ENVS, "MountainCarContinuous-v0": {"max_episode_steps": 40}}
#: Reset options each env reads (gymnasium's bounds of the initial state).
OPTIONS = {
    "CartPole-v1": {"low": -0.2, "high": 0.2},
    "Pendulum-v1": {"x_init": 1.0, "y_init": 0.5},
    "MountainCar-v0": {"low": -1.1, "high": 0.4},
    "MountainCarContinuous-v0": {"low": -1.19, "high": 0.44},
    "Acrobot-v1": {"low": -2.0, "high": 2.0},
}
#: A parameter per env, set to a value that changes the dynamics.
CHANGED = {
    "CartPole-v1": ("length", 0.9),
    "Pendulum-v1": ("l", 0.7),
    "MountainCar-v0": ("force", 0.0017),
    "MountainCarContinuous-v0": ("power", 0.0031),
    "Acrobot-v1": ("LINK_MASS_2", 1.3),
}


@needs_numba
@pytest.mark.parametrize("env_id", sorted(COMPILED))
def test_each_kernel_is_its_gymnasium_env_bit_for_bit(env_id: str) -> None:
    """A kernel's env alone against ``gym.make``: many episodes, reset options, a changed
    parameter, and Box actions beyond their bounds (the envs clip them)."""
    ours, theirs = kernels.KernelEnv(kernels.load(kernels.find(env_id))), gym.make(env_id)
    assert ours.observation_space == theirs.observation_space and ours.action_space == theirs.action_space
    rng = np.random.default_rng(0)
    steps = 0
    for episode in range(24):
        options = OPTIONS[env_id] if episode % 3 == 1 else None
        if episode % 4 == 2:
            name, value = CHANGED[env_id]
            setattr(ours.unwrapped, name, value)  # CartPole's polemass_length stays as __init__ made it
            setattr(theirs.unwrapped, name, value)
        first, _ = ours.reset(seed=episode, options=options)
        expected, _ = theirs.reset(seed=episode, options=options)
        assert first.dtype == expected.dtype and first.tobytes() == expected.tobytes(), f"episode {episode} reset"
        theirs.action_space.seed(episode)
        for t in range(400):
            action = theirs.action_space.sample()
            if isinstance(theirs.action_space, gym.spaces.Box):
                action = (action * rng.choice([1.0, 1.0, 1.8])).astype(np.float32)
            got, wanted = ours.step(action), theirs.step(action)
            steps += 1
            assert got[0].tobytes() == wanted[0].tobytes(), f"episode {episode} step {t}: {got[0]} != {wanted[0]}"
            assert got[1:4] == tuple(wanted[1:4]), f"episode {episode} step {t}"
            if wanted[2] or wanted[3]:
                break
    assert steps > 500


@needs_numba
@pytest.mark.parametrize("num_workers", [1, 3])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("env_id", sorted(COMPILED))
def test_matches_sync_vector_env(env_id: str, mode: AutoresetMode, num_workers: int, pool_name: str) -> None:
    check_matches_sync_vector_env(env_id, COMPILED[env_id], mode, num_workers, pool_name, engine="numba")


@needs_numba
def test_disabled_autoreset_and_reset_masks(pool_name: str) -> None:
    fns = [lambda: gym.make("CartPole-v1") for _ in range(6)]
    reference = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED)
    with shmpool.launch(
        "CartPole-v1", 6, num_workers=2, name=pool_name, engine="numba", autoreset_mode="disabled"
    ) as pool:
        assert pool.reset(seed=5)[0].tobytes() == reference.reset(seed=5)[0].tobytes()
        ended = np.zeros(6, bool)
        for t in range(200):
            if ended.any():
                options = {"reset_mask": ended, "low": -0.1, "high": 0.1}
                ours, theirs = pool.reset(options=options)[0], reference.reset(options=options)[0]
                assert ours.tobytes() == theirs.tobytes(), f"step {t} reset"
            actions = np.array([(t * 7 + i) % 2 for i in range(6)])
            ours, theirs = pool.step(actions), reference.step(actions)
            for a, b in zip(ours[:4], theirs[:4]):
                np.testing.assert_array_equal(a, b, err_msg=f"step {t}")
            ended = ours[2] | ours[3]
    reference.close()


@needs_numba
def test_dist_draws_and_writes_give_the_same_run_on_both_engines(pool_name: str) -> None:
    python = run_schedule(2, pool_name + "p")
    numba = run_schedule(3, pool_name + "n", engine="numba")
    for a, b in zip(python[0], numba[0]):
        assert a.tobytes() == b.tobytes()
    for a, b in zip(python[1], numba[1]):
        assert a.tobytes() == b.tobytes()


def hooked_run(env_id: str, engine: str, name: str, chain: list, steps: int = 120) -> list:
    """Every result of ``steps`` steps (with Perturb and Reset events at fixed steps) of a pool."""
    results = []
    with shmpool.launch(
        env_id, 6, num_workers=2, name=name, engine=engine, hooks=chain, seed=3, env_kwargs=COMPILED[env_id]
    ) as pool:
        results.append(pool.reset()[0])
        pool.action_space.seed(1)
        for t in range(steps):
            if t == 10:
                pool.events.send("Perturb", [1, 4], payload=[0.7])
                pool.events.send("Perturb", [4, 0])  # env 4 keeps 0.7; env 0 takes its parameter's strength
            if 30 <= t < 90:  # env 3 at every step, its resets included
                pool.events.send("Perturb", [3])
            if t == 20:
                pool.events.send("Reset", [2, 5])
            observations, rewards, terminations, truncations, _ = pool.step(pool.action_space.sample())
            results += [observations, rewards, terminations, truncations]
        results.append(pool.episodes.read())
    return results


@needs_numba
@pytest.mark.parametrize(
    "env_id, chain",
    [
        (
            "CartPole-v1",
            lambda: [
                hooks.ActionDelay(2, max_steps=3),
                hooks.ObservationNoise(0.01),
                hooks.RewardScale(0.5),
                hooks.Perturb(0.3, every=7),
                hooks.Reset(),
            ],
        ),
        (
            "Pendulum-v1",
            lambda: [hooks.ActionNoise(0.3), hooks.ObservationNoise(0.02), hooks.Perturb(0.5), hooks.Reset()],
        ),
        ("MountainCarContinuous-v0", lambda: [hooks.ActionNoise(0.5), hooks.Perturb(0.01, every=5), hooks.Reset()]),
        ("Acrobot-v1", lambda: [hooks.Perturb(0.2, every=3), hooks.Reset()]),
    ],
)
def test_built_in_hooks_give_the_same_run_on_both_engines(env_id: str, chain, pool_name: str) -> None:
    python = hooked_run(env_id, "python", pool_name + "p", chain())
    numba = hooked_run(env_id, "numba", pool_name + "n", chain())
    for index, (a, b) in enumerate(zip(python[:-1], numba[:-1])):
        assert a.tobytes() == b.tobytes(), f"result {index}: {a} != {b}"
    records = [np.sort(r, order=["env_id", "episode"]) for r in (python[-1], numba[-1])]
    assert len(records[0]) >= 6
    for field in ("env_id", "episode", "step", "return", "length", "terminated", "truncated"):
        np.testing.assert_array_equal(records[0][field], records[1][field])


@needs_numba
@pytest.mark.parametrize(
    "how, start_method", [("import string", "spawn"), ("object", "fork"), ("drawn resets", "forkserver")]
)
def test_a_kernel_of_ones_own(how: str, start_method: str, pool_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import numba_kernels

    monkeypatch.setattr(kernels, "_registered", {})  # the registry is per process: undone after the test
    kernel = {"import string": "numba_kernels:DRIFT", "object": numba_kernels.DRIFT}.get(
        how, "numba_kernels:DRIFT_DRAWN"
    )
    kernels.register("Drift-v0", kernel)
    assert "Drift-v0" in kernels.compiled_ids()
    speeds = [0.05, 0.1, 0.2, 0.3]

    def make(speed: float):
        def env() -> gym.Env:
            drift = numba_kernels.DriftEnv()
            drift.speed = speed
            return TimeLimit(drift, 30)

        return env

    reference = SyncVectorEnv([make(s) for s in speeds])
    params = {"speed": Param(low=0.0, high=1.0)}
    with shmpool.launch(
        "Drift-v0", 4, num_workers=2, engine="numba", params=params, name=pool_name, start_method=start_method
    ) as pool:
        assert pool.params["speed"].tolist() == [0.1] * 4  # nominal, from the kernel
        pool.params["speed"][:] = speeds
        assert pool.reset(seed=9)[0].tobytes() == reference.reset(seed=9)[0].tobytes()
        ended = 0
        for t in range(80):
            actions = np.array([(t + i) % 3 for i in range(4)])
            ours, theirs = pool.step(actions), reference.step(actions)
            for a, b in zip(ours[:4], theirs[:4]):
                np.testing.assert_array_equal(a, b, err_msg=f"step {t}")
            ended += int((theirs[2] | theirs[3]).sum())
        assert ended >= 4 and pool.get_attr("speed") == tuple(speeds)
    reference.close()


@needs_numba
def test_calls_reach_the_compiled_envs(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name, engine="numba", seed=0) as pool:
        pool.reset()
        assert pool.get_attr("gravity") == (9.8,) * 4
        assert pool.np_random_seed == (0, 1, 2, 3)
        pool.set_attr("length", [0.5, 0.6, 0.7, 0.8])  # as on a gymnasium env: unchecked, not in applied
        assert pool.get_attr("length") == (0.5, 0.6, 0.7, 0.8)
        states = pool.env_apply(lambda env: env.unwrapped.state.copy())
        observations = pool.step(np.zeros(4, int))[0]
        assert all(len(state) == 4 for state in states) and observations.shape == (4, 4)  # gymnasium's shape
        with pytest.raises(NotImplementedError, match="do not render"):
            pool.call("render")


@needs_numba
def test_profile_times_the_kernel_loop(pool_name: str) -> None:
    chain = [hooks.ObservationNoise(0.01)]
    with shmpool.launch(
        "CartPole-v1", 8, num_workers=2, name=pool_name, engine="numba", profile=True, hooks=chain, seed=0
    ) as pool:
        pool.reset()
        for _ in range(50):
            pool.step(pool.action_space.sample())
        workers = pool.phase_profile()["workers"]
    assert workers["env loop"] > 0 and workers["after_step"] > 0 and workers["episode accounting"] > 0
    assert workers["whole step"] >= workers["env loop"]


@needs_numba
def test_launch_refuses_what_the_kernel_cannot_do(pool_name: str) -> None:
    with pytest.raises(ValueError, match=r"no compiled kernel for 'HalfCheetah-v5'; compiled ids: Acrobot-v1, Cart"):
        shmpool.launch("HalfCheetah-v5", 2, engine="numba", name=pool_name)
    with pytest.raises(ValueError, match=r"no compiled kernel for a function"):
        shmpool.launch(lambda: gym.make("CartPole-v1"), 2, engine="numba", name=pool_name)
    with pytest.raises(ValueError, match=r"params\['mass'\] binds 'mass', which the CartPole-v1 kernel does not read"):
        shmpool.launch("CartPole-v1", 2, engine="numba", name=pool_name, params={"mass": Param(1.0)})
    with pytest.raises(ValueError, match=r"binds through a function"):
        shmpool.launch("CartPole-v1", 2, engine="numba", name=pool_name, params={"x": Param(1.0, bind=print)})
    with pytest.raises(ValueError, match=r"env_kwargs\['sutton_barto_reward'\]"):
        shmpool.launch("CartPole-v1", 2, engine="numba", name=pool_name, env_kwargs={"sutton_barto_reward": True})
    with pytest.raises(ValueError, match=r"when='rebuild', but 'length' is not a constructor keyword"):
        shmpool.launch("CartPole-v1", 2, engine="numba", name=pool_name, params={"length": Param(when="rebuild")})
    with pytest.raises(ValueError, match=r"engine must be one of \['python', 'numba', 'mujoco'\]"):
        shmpool.launch("CartPole-v1", 2, engine="cuda", name=pool_name)
    # A parameter only hooks read (bind=False) and the env's constructor keywords are fine.
    with shmpool.launch(
        "Pendulum-v1",
        2,
        engine="numba",
        name=pool_name,
        env_kwargs={"g": 9.81, "max_episode_steps": 3},
        params={"tag": Param(1.0, bind=False)},
    ) as pool:
        pool.reset(seed=0)
        assert pool.get_attr("g") == (9.81, 9.81)
        truncations = [pool.step(np.zeros((2, 1), np.float32))[3].all() for _ in range(3)]
        assert truncations == [False, False, True]


def test_asking_for_numba_without_it_names_the_extra(monkeypatch: pytest.MonkeyPatch, pool_name: str) -> None:
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba now raises ImportError
    with pytest.raises(ImportError, match=r"engine='numba' needs numba.*pip install \"shmpool\[numba\]\""):
        shmpool.launch("CartPole-v1", 2, engine="numba", name=pool_name)


def test_kernels_import_nothing_heavy() -> None:
    import subprocess

    code = (
        "import sys, shmpool, shmpool.kernels; print('numba' in sys.modules, 'shmpool.kernels.builtin' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False"]


def test_engines_list_matches_helpers() -> None:
    assert [getattr(engine, "values", [engine])[0] for engine in helpers.ENGINES] == ["python", "numba"]


@needs_numba
@pytest.mark.parametrize("env_id", ["CartPole-v1", "MountainCar-v0"])
def test_autoresets_drawn_ahead_keep_gymnasiums_streams(env_id: str, pool_name: str) -> None:
    """Kernels with ``draw`` and ``start`` autoreset compiled, from resets drawn ahead: episodes of 3
    steps cross several refills, a reset with options (drawn in Python) comes between refills, and
    every env's ``np_random`` is where gymnasium's is whenever it is asked for."""
    from shmpool.workers.kernels import RESETS_DRAWN_AHEAD

    num_envs, length = 4, 3
    reference = SyncVectorEnv([lambda: gym.make(env_id, max_episode_steps=length) for _ in range(num_envs)])
    with shmpool.launch(
        env_id, num_envs, num_workers=2, engine="numba", env_kwargs={"max_episode_steps": length}, name=pool_name
    ) as pool:
        assert kernels.load(kernels.find(env_id)).start is not None
        results = [pool.reset(seed=5)[0]], [reference.reset(seed=5)[0]]
        rng = np.random.default_rng(0)
        steps = (length + 1) * (RESETS_DRAWN_AHEAD * 2 + 5)  # an episode and its reset step
        for t in range(steps):
            actions = rng.integers(0, pool.single_action_space.n, num_envs)
            for got, wanted in zip(pool.step(actions)[:4], reference.step(actions)[:4]):
                assert got.tobytes() == wanted.tobytes(), f"step {t}"
            if t in (length * 7 + 2, steps // 2):  # between refills, mid-episode: rewound, then drawn again
                options = OPTIONS[env_id]
                results[0].append(pool.reset(options=options)[0])
                results[1].append(reference.reset(options=options)[0])
            if t % 10 == 0:
                ours, theirs = pool.np_random, reference.np_random
                assert [g.bit_generator.state for g in ours] == [g.bit_generator.state for g in theirs], f"step {t}"
        for got, wanted in zip(*results):
            assert got.tobytes() == wanted.tobytes()
        records = pool.episodes.read()
        assert len(records) >= num_envs * RESETS_DRAWN_AHEAD * 2
        assert sorted(set(records["length"].tolist())) == [length] and records["truncated"].all()
        assert records["return"].tolist() == [length * (1.0 if env_id == "CartPole-v1" else -1.0)] * len(records)
        for env in range(num_envs):  # every episode once, in order, but those a reset cut short
            own = records[records["env_id"] == env]
            assert (np.diff(own["episode"]) > 0).all() and (np.diff(own["step"]) > 0).all()
            assert len(own) <= own["episode"][-1] + 1 <= len(own) + 2
        assert len(set(np.bincount(records["env_id"]).tolist())) == 1
    reference.close()


class _KeptGenerators:
    """A hook that keeps its envs' generators (taken once) and draws from them at every step."""

    def after_step(self, ctx: hooks.HookContext) -> None:
        if not hasattr(self, "generators"):
            self.generators = [env.np_random for env in ctx.envs]
        for row, generator in enumerate(self.generators):
            ctx.rewards[row] += generator.random()


@needs_numba
@pytest.mark.parametrize("held_by", ["a hook", "two envs", "legacy RandomState"])
def test_generators_held_elsewhere_give_the_python_engines_run(held_by: str, pool_name: str) -> None:
    """Resets drawn ahead would take numbers that another holder of the generator draws in between:
    the engines must still agree when a hook keeps the generators, or when envs share one."""

    def run(engine: str) -> tuple[list[bytes], list[Any]]:
        chain = [_KeptGenerators()] if held_by == "a hook" else []
        with shmpool.launch(
            "CartPole-v1",
            4,
            num_workers=2,
            engine=engine,
            hooks=chain,
            env_kwargs={"max_episode_steps": 3},
            name=f"{pool_name}{engine[0]}",
        ) as pool:
            pool.reset(seed=0)
            if held_by == "two envs":
                pool.set_attr("np_random", np.random.default_rng(123))  # one generator per worker's two envs
            elif held_by == "legacy RandomState":  # no bit generator state to save: resets run in Python
                pool.set_attr("np_random", [np.random.RandomState(seed) for seed in range(4)])
            results = [b"".join(a.tobytes() for a in pool.step(np.zeros(4, np.int64))[:4]) for _ in range(40)]
            return results, [pickle.dumps(generator) for generator in pool.np_random]

    python, numba = run("python"), run("numba")
    assert numba[0] == python[0]
    assert numba[1] == python[1]


@needs_numba
def test_a_value_written_back_after_a_compiled_sync_is_applied(pool_name: str) -> None:
    """The workers' compiled sync rewrites their last snapshot in place; the general path after it
    (a distribution changed too) compares with that snapshot, not with a copy taken before it. With a
    distribution between two plain parameters their columns are not adjacent, which is where a copy
    was kept: a value written back to what it was two writes ago was never applied."""
    params = {
        "length": Param(0.5, low=0.1, high=2.0),
        "noise": Param(dist="uniform", low=0.0, high=0.1, bind=False),
        "masspole": Param(0.1, low=0.01, high=1.0),
    }
    with shmpool.launch("CartPole-v1", 4, num_workers=1, params=params, engine="numba", name=pool_name) as pool:
        pool.reset(seed=0)
        actions = np.zeros(4, dtype=np.int64)
        for length, noise_high in ((0.6, 0.05), (0.7, None), (0.6, 0.08)):  # general, compiled, general
            if noise_high is not None:
                pool.params["noise"]["high"][:] = noise_high
            pool.params["length"][:] = length
            pool.step(actions)
            assert pool.applied["length"].tolist() == [length] * 4
            assert pool.get_attr("length") == (length,) * 4


@needs_numba
def test_max_episode_steps_is_taken_as_gymnasium_make_takes_it(pool_name: str) -> None:
    """-1 means no time limit (Pendulum's episodes run past its registered 200 steps, as gymnasium's
    do, and are not cut at every step); 0 and 2.5 are refused at launch, as ``TimeLimit`` refuses them,
    and True too (which ``TimeLimit``, testing for an int, takes for 1)."""
    reference = SyncVectorEnv([lambda: gym.make("Pendulum-v1", max_episode_steps=-1) for _ in range(2)])
    with shmpool.launch(
        "Pendulum-v1", 2, num_workers=1, engine="numba", env_kwargs={"max_episode_steps": -1}, name=pool_name
    ) as pool:
        pool.reset(seed=3), reference.reset(seed=3)
        for t in range(250):  # past Pendulum's registered 200
            torques = np.full((2, 1), np.sin(t), dtype=np.float32)
            for got, wanted in zip(pool.step(torques)[:4], reference.step(torques)[:4]):
                assert got.tobytes() == wanted.tobytes(), f"step {t}"
        assert pool.get_attr("_max_episode_steps") == (None, None)
    for bad, error in ((0, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match=rf"engine='numba': CartPole-v1: env_kwargs: max_episode_steps .*{bad}"):
            shmpool.launch("CartPole-v1", 2, engine="numba", env_kwargs={"max_episode_steps": bad}, name=pool_name)
    with pytest.raises(ValueError, match=r"compiled CartPole-v1 does not render: .*'render_mode'.* got 'rgb_array'"):
        shmpool.launch("CartPole-v1", 2, engine="numba", env_kwargs={"render_mode": "rgb_array"}, name=pool_name)
