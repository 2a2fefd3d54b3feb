"""Env families (:mod:`shmpool.env_families`): an env's adapter is found by its unwrapped class, one's own
registers and reaches the workers, and the table imports MuJoCo only for MuJoCo envs."""

from __future__ import annotations

import functools
import subprocess
import sys
import types

import gymnasium as gym
import helpers
import pytest
from helpers import RenamedCartPole

import shmpool
from shmpool import Param, classic_control, env_families


def impostor() -> gym.Env:
    """An env of an unrelated class that is only named CartPoleEnv."""
    return type("CartPoleEnv", (gym.Env,), {})()


def test_adapters_are_found_by_the_unwrapped_class_not_the_name() -> None:
    cartpole = env_families.adapter_for(gym.make("CartPole-v1"))  # wrapped: looked up on env.unwrapped
    assert isinstance(cartpole, classic_control.CartPole)
    assert env_families.adapter_for(RenamedCartPole()) is cartpole
    assert env_families.adapter_for(impostor()) is env_families.GENERIC
    assert env_families.GENERIC.refresher(impostor()) is None and env_families.GENERIC.kicker(impostor()) is None
    pendulum = env_families.adapter_for(gym.make("Pendulum-v1"))
    assert isinstance(pendulum, classic_control.ClassicControl) and pendulum.refresher(gym.make("Pendulum-v1")) is None
    env = RenamedCartPole()
    env.masspole, env.length = 0.3, 0.9
    cartpole.refresher(env)()
    assert (env.total_mass, env.polemass_length) == (0.3 + env.masscart, 0.3 * 0.9)


class MirrorAdapter(env_families.EnvAdapter):
    """A family of one's own: PairEnv derives ``b`` from ``a``."""

    name = "mirror"
    classes = (env_families.class_key(helpers.PairEnv),)

    def refresher(self, env):
        unwrapped = env.unwrapped

        def refresh() -> None:
            unwrapped.b = -unwrapped.a

        return refresh


def test_a_registered_adapter_is_used_by_the_workers(pool_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env_families, "_registered", {})  # undone after the test: the registry is per process
    monkeypatch.setattr(env_families, "_table", None)
    monkeypatch.setattr(env_families, "_by_type", {})
    assert env_families.adapter_for(helpers.PairEnv()) is env_families.GENERIC
    mirror = env_families.register(MirrorAdapter())
    assert env_families.adapter_for(helpers.PairEnv()) is mirror
    with pytest.raises(ValueError, match="module:QualName"):
        env_families.register(type("Bad", (env_families.EnvAdapter,), {"classes": ("PairEnv",)})())
    # The default start method forks: the workers inherit the registration.
    with shmpool.launch(helpers.PairEnv, 2, num_workers=2, name=pool_name, params={"a": Param(0.0)}) as pool:
        pool.reset(seed=0)
        pool.params["a"][1] = 3.0
        assert pool.step([0, 0])[0].tolist() == [[0.0, -0.0], [3.0, -3.0]]


IMPORTS = """
import sys
import gymnasium as gym
import shmpool
assert "shmpool.env_families" not in sys.modules and "shmpool.classic_control" not in sys.modules
from shmpool.env_families import adapter_for
print(type(adapter_for(gym.make("CartPole-v1"))).__name__, "mujoco" in sys.modules)
"""


def test_adapters_import_mujoco_only_for_mujoco_envs() -> None:
    result = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["CartPole", "False"]


def test_a_function_is_known_as_its_modules_own_by_names_and_code_file() -> None:
    """``defined_in``: gymnasium's own ``CartPoleEnv.step`` is; one patched in with ``functools.wraps``
    (the names, other code) is not; nor one of another name; a module installed as compiled files
    only (``__file__`` a .pyc beside no .py) still knows its own."""
    from gymnasium.envs.classic_control import cartpole

    own = cartpole.CartPoleEnv.step
    assert env_families.defined_in(own, cartpole, "CartPoleEnv.step")
    assert not env_families.defined_in(
        functools.wraps(own)(lambda self, action: own(self, action)), cartpole, "CartPoleEnv.step"
    )
    assert not env_families.defined_in(cartpole.CartPoleEnv.reset, cartpole, "CartPoleEnv.step")
    compiled_only = types.ModuleType("compiled_only")
    compiled_only.__file__ = "/site/compiled_only.pyc"
    exec(compile("def step(action):\n    return action\n", "/site/compiled_only.py", "exec"), compiled_only.__dict__)
    assert env_families.defined_in(compiled_only.step, compiled_only, "step")
    compiled_only.__file__ = "/elsewhere/compiled_only.pyc"
    assert not env_families.defined_in(compiled_only.step, compiled_only, "step")
