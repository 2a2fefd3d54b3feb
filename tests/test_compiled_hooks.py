"""The built-in hooks compiled (``compiled=True``, and the default with ``engine="numba"``): the same
results as their numpy versions bit for bit, on both engines, compiled when the workers build, and
the same errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import shmpool
from shmpool import hooks
from shmpool.errors import WorkerError

pytest.importorskip("numba")
from shmpool.kernels import compiled_hooks  # noqa: E402 - needs numba

ENGINES = ("python", "numba")
CHOICES = (False, True, None)


def pendulum_chain(compiled: bool | None) -> list[Any]:
    """All five on Box actions: ActionDelay over float32 actions, ActionNoise rounding to them."""
    return [
        hooks.ActionDelay(2, max_steps=3, compiled=compiled),
        hooks.ActionNoise(0.3, compiled=compiled),
        hooks.ObservationNoise(0.02, compiled=compiled),
        hooks.RewardScale(0.5, compiled=compiled),
        hooks.Perturb(0.3, every=7, compiled=compiled),
        hooks.Reset(),
    ]


def cartpole_chain(compiled: bool | None) -> list[Any]:
    """Discrete actions; Perturb on two velocities, one random sign each."""
    return [
        hooks.ActionDelay(1, max_steps=2, compiled=compiled),
        hooks.ObservationNoise(0.05, compiled=compiled),
        hooks.RewardScale(2.0, compiled=compiled),
        hooks.Perturb(0.2, every=5, compiled=compiled),
        hooks.Reset(),
    ]


def acrobot_chain(compiled: bool | None) -> list[Any]:
    """Perturb with ``dims=1``: one sign for both velocities (numpy broadcasts the one amount)."""
    return [
        hooks.Perturb(0.2, every=3, dims=1, compiled=compiled),
        hooks.ActionDelay(3, compiled=compiled),
        hooks.ObservationNoise(0.1, compiled=compiled),
        hooks.Reset(),
    ]


CHAINS = {"Pendulum-v1": pendulum_chain, "CartPole-v1": cartpole_chain, "Acrobot-v1": acrobot_chain}
#: Per-env values of the hooks' parameters (6 envs), so that rows are not interchangeable.
PARAMS = {
    "action_delay": [0, 1, 2, 1, 2, 0],
    "action_noise": [0.0, 0.1, 0.3, 0.5, 0.2, 0.4],
    "observation_noise": [0.0, 0.01, 0.05, 0.2, 0.1, 0.03],
    "reward_scale": [1.0, 0.5, -2.0, 3.0, 0.25, 1.5],
    "perturb_strength": [0.1, 0.0, 0.3, 0.5, 0.2, 0.4],
}


def run(env_id: str, engine: str, compiled: bool | None, mode: AutoresetMode, name: str) -> list[np.ndarray]:
    """Every result of 100 steps of a seeded pool of 6 envs over 2 workers, with ``env_id``'s chain
    of built-in hooks: Perturb events with and without a strength, Reset events, short episodes (a
    time limit of 25) and a ``pool.reset()`` part way."""
    results = []
    chain = CHAINS[env_id](compiled)
    with shmpool.launch(
        env_id,
        6,
        num_workers=2,
        name=name,
        engine=engine,
        hooks=chain,
        seed=7,
        autoreset_mode=mode,
        env_kwargs={"max_episode_steps": 25},
    ) as pool:
        for param, values in PARAMS.items():
            if param in pool.params.names:
                pool.params[param][:] = values
        results.append(pool.reset()[0])
        pool.action_space.seed(1)
        for t in range(100):
            if t == 10:
                pool.events.send("Perturb", [1, 4], payload=[0.7])
            if t == 12:
                pool.events.send("Perturb", [0, 4, 5])  # the parameter's strength
            if t == 20:
                pool.events.send("Reset", [2, 5])
            if t == 60:
                results.append(pool.reset()[0])
            observations, rewards, terminations, truncations, infos = pool.step(pool.action_space.sample())
            results += [observations, rewards, terminations, truncations]
            if "final_obs" in infos:
                results += [infos["_final_obs"], np.stack(list(infos["final_obs"][infos["_final_obs"]]))]
        records = pool.episodes.read()
        results.append(np.sort(records, order=["env_id", "episode"])[["env_id", "episode", "return", "length"]])
    assert records.size >= 6  # episodes ended (ActionDelay's episode change is exercised)
    return results


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("env_id", sorted(CHAINS))
def test_compiled_hooks_give_the_numpy_versions_bits(env_id: str, mode: AutoresetMode, pool_name: str) -> None:
    expected = run(env_id, "python", False, mode, pool_name + "r")
    for engine in ENGINES:
        for compiled in CHOICES:
            if (engine, compiled) == ("python", False):
                continue
            got = run(env_id, engine, compiled, mode, f"{pool_name}{engine[0]}{compiled}")
            assert len(got) == len(expected)
            for index, (a, b) in enumerate(zip(expected, got)):
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (
                    f"engine={engine} compiled={compiled}: result {index} differs: {a} != {b}"
                )


FUNCTIONS = [
    compiled_hooks.observation_noise,
    compiled_hooks.action_noise,
    compiled_hooks.action_delay,
    compiled_hooks.reward_scale,
    compiled_hooks.perturb_due,
    compiled_hooks.perturb_kick,
]


@pytest.mark.parametrize("engine", ENGINES)
def test_which_version_runs_and_that_a_step_compiles_nothing(engine: str, pool_name: str) -> None:
    """In the trainer's slot, the hooks it runs (its copies of those given to ``launch``) show what they chose."""
    chains = {compiled: pendulum_chain(compiled)[:5] for compiled in CHOICES}
    for compiled, chain in chains.items():
        with shmpool.launch(
            "Pendulum-v1",
            2,
            num_workers=1,
            trainer_slot=True,
            engine=engine,
            hooks=chain,
            seed=0,
            name=f"{pool_name}{compiled}",
        ) as pool:
            runs_compiled = [hook._compiled is not None for hook in pool._lifecycle.local.hooks]
            signatures = [len(function.signatures) for function in FUNCTIONS]  # compiled as the slot built
            pool.reset()
            for _ in range(70):  # into the second block of random numbers
                pool.step(pool.action_space.sample())
            assert [len(function.signatures) for function in FUNCTIONS] == signatures
        perturb_compiled = engine == "numba" and compiled is not False  # a Python env is kicked per env
        wanted = [compiled or (compiled is None and engine == "numba")] * 4 + [perturb_compiled]
        assert runs_compiled == wanted, f"engine={engine} compiled={compiled}"
    used = FUNCTIONS if engine == "numba" else FUNCTIONS[:4]  # Perturb's two: the numba engine's
    assert all(function.signatures for function in used)


def launch_error(env_id: str, engine: str, chain: list[Any], name: str) -> str:
    """The message of the WorkerError that ``launch`` raises, without the traceback."""
    with pytest.raises(WorkerError) as caught:
        shmpool.launch(env_id, 2, num_workers=1, engine=engine, hooks=chain, name=name)
    return str(caught.value).splitlines()[0]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_space_a_hook_cannot_take_fails_the_launch_alike(engine: str, pool_name: str) -> None:
    messages = {  # one pool name after another: the messages name it
        compiled: launch_error("CartPole-v1", engine, [hooks.ActionNoise(0.1, compiled=compiled)], pool_name)
        for compiled in CHOICES
    }
    assert "ActionNoise needs a float Box action space, got Discrete(2)" in messages[False]
    assert messages[True] == messages[False] == messages[None]


def test_compiled_true_where_it_cannot_run_compiled_fails_the_launch(pool_name: str) -> None:
    def kick(env: Any, amounts: np.ndarray) -> None:
        env.unwrapped.state[1] += amounts[0]

    message = launch_error("Pendulum-v1", "numba", [hooks.Perturb(0.1, kick=kick, compiled=True)], pool_name)
    assert "Perturb(compiled=True) cannot run compiled: it kicks with a kick function" in message
    message = launch_error("CartPole-v1", "numba", [hooks.Perturb(0.1, dims=0, compiled=True)], pool_name + "2")
    assert "dims=0 gives fewer amounts than the kernel's 2 velocities" in message
    chain = [hooks.Perturb(0.1, every=1, kick=kick)]  # compiled=None: the kick function runs per env
    with shmpool.launch("Pendulum-v1", 2, engine="numba", hooks=chain, name=pool_name + "3") as pool:
        pool.reset(seed=0)
        pool.step(np.zeros((2, 1), np.float32))
        assert pool.step(np.zeros((2, 1), np.float32))[0].shape == (2, 3)


def test_compiled_true_needs_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks.compiled, "_numba_installed", lambda: False)  # checked where the hooks are made
    for hook in (hooks.ObservationNoise, hooks.ActionNoise, hooks.ActionDelay, hooks.RewardScale, hooks.Perturb):
        with pytest.raises(ImportError, match=rf'{hook.__name__}\(compiled=True\) needs numba.*"shmpool\[numba\]"'):
            hook(compiled=True)
        hook(compiled=None)  # numpy's version needs nothing
        hook(compiled=False)
    with pytest.raises(TypeError, match=r"compiled=\.\.\.\) must be True, False or None, got 'yes'"):
        hooks.RewardScale(compiled="yes")  # type: ignore[arg-type]
