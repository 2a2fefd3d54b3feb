"""What shmpool knows about gymnasium's classic-control envs (see ``shmpool.env_families``).

Their parameters are plain attributes of the unwrapped env, bound by name, and every one of them is read on each step,
except that CartPole caches ``total_mass`` and ``polemass_length`` in ``__init__``: its adapter recomputes them after
its parameters change. ``hooks.Perturb`` kicks these envs by adding to the velocity entries of ``env.unwrapped.state``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from .env_families import BatchStep, EnvAdapter


class ClassicControl(EnvAdapter):
    """One classic-control env class, whose ``unwrapped.state`` holds velocities at ``velocities``."""

    name = "classic control"

    def __init__(self, cls: str, velocities: Sequence[int]) -> None:
        self.classes = (cls,)
        self.velocities = list(velocities)  # a list: fancy indexing of the state vector

    def kicker(self, env: Any) -> Callable[[np.ndarray], None]:
        """Adds ``amounts`` (one per velocity entry; extra ones ignored) to the env's velocities."""
        unwrapped, indices = env.unwrapped, self.velocities
        count = len(indices)

        def kick(amounts: np.ndarray) -> None:
            state = np.array(unwrapped.state, dtype=np.float64)
            state[indices] += amounts[:count]
            unwrapped.state = state

        return kick


class CartPole(ClassicControl):
    """CartPole, which derives ``total_mass`` and ``polemass_length`` from ``masscart``,
    ``masspole`` and ``length`` once, in ``__init__``."""

    refresh_inputs = frozenset({"masscart", "masspole", "length"})
    refresh_outputs = frozenset({"total_mass", "polemass_length"})

    def refresher(self, env: Any) -> Callable[[], None]:
        """Recomputes ``total_mass`` and ``polemass_length`` as ``__init__`` does (run after one of
        ``refresh_inputs`` changed)."""
        return self.refresher_of_many([env])

    def refresher_of_many(self, envs: list[Any]) -> Callable[[], None]:
        """``refresher`` of every env in ``envs``, in one loop."""
        unwrapped = [env.unwrapped for env in envs]

        def refresh() -> None:
            for env in unwrapped:
                env.total_mass = env.masspole + env.masscart
                env.polemass_length = env.masspole * env.length

        return refresh

    def batch_stepper(self, steppers: list[Callable[[Any], Any]]) -> BatchStep | None:
        """``CartPoleEnv.step`` of several envs at once (``_CartPoleSteps``), where each stepper is the
        ``step`` of a plain ``CartPoleEnv`` (not a subclass's: it may read its attributes otherwise).

        Why: gymnasium's step is some 30 numpy scalar calls, a third of its 5 µs in the action
        space's ``contains``; stepped together, 8 envs cost half as much, and in a training loop less
        than that (``docs/benchmarks.md``, "CartPole's envs stepped together").
        """
        from gymnasium.envs.classic_control.cartpole import CartPoleEnv

        envs = [getattr(stepper, "__self__", None) for stepper in steppers]
        if not envs or any(
            getattr(stepper, "__func__", None) is not CartPoleEnv.step or type(env) is not CartPoleEnv
            for stepper, env in zip(steppers, envs)
        ):
            return None
        return _CartPoleSteps(envs).step


#: What ``CartPoleEnv.step`` computes with, in ``_CartPoleSteps.step``'s order.
_CARTPOLE_PARAMETERS = attrgetter(
    "force_mag", "polemass_length", "total_mass", "gravity", "length", "masspole", "tau", "x_threshold",
    "theta_threshold_radians",
)  # fmt: skip
#: What decides whether ``_CartPoleSteps`` reproduces an env's step (see ``_CartPoleSteps.step``).
_CARTPOLE_MODE = attrgetter(
    "state", "kinematics_integrator", "steps_beyond_terminated", "render_mode", "action_space", "_sutton_barto_reward"
)
#: The number types whose arithmetic with a numpy float64 is that of their value as a Python float.
_PLAIN_NUMBERS = frozenset({float, int, bool, np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_})


class _CartPoleSteps:
    """Steps a slot's ``CartPoleEnv``s together, as each one's ``step`` would, bit for bit: the same
    operations in the same order on float64 values, with numpy's ``cos`` and ``sin`` (one call each for
    all the envs) and Python floats for the rest (numpy's scalar arithmetic is IEEE double arithmetic,
    as Python's is); the same rewards, terminations, ``state`` and ``steps_beyond_terminated``.

    Why Python floats and not whole-array operations: in a training loop a step follows the policy's
    forward, which leaves numpy's code out of the caches, and there some 30 array operations on 8 envs
    took as long as the envs' own steps, where the interpreter's loop stays in the caches."""

    def __init__(self, envs: list[Any]) -> None:
        self.envs = envs
        #: Each env's action space when the steppers were found: ``step`` asserts that it contains the
        #: action, which the pool checked against its own space, equal to this one when the env was made.
        self.spaces = [env.action_space for env in envs]

    def step(self, rows: list[int] | None, actions: np.ndarray, observations: np.ndarray) -> Any:
        """See ``shmpool.env_families.BatchStep``."""
        envs, spaces = (
            (self.envs, self.spaces) if rows is None else ([self.envs[r] for r in rows], [self.spaces[r] for r in rows])
        )
        states, parameters, suttons = [], [], []
        for env, space in zip(envs, spaces):
            state, integrator, beyond, render_mode, own_space, sutton = _CARTPOLE_MODE(env)
            values = _CARTPOLE_PARAMETERS(env)
            # The envs go one by one where a step would do otherwise: another integrator, a state it
            # would compute with in float32, one that is not finite (numpy would warn), a terminated
            # env's warning, rendering, an attribute that is not a plain number.
            if not (
                state.__class__ is np.ndarray
                and state.dtype == np.float64
                and state.shape == (4,)
                and integrator == "euler"
                and beyond is None
                and render_mode != "human"
                and own_space is space
                and _PLAIN_NUMBERS.issuperset(map(type, values))
            ):
                return None
            state = state.tolist()
            if not math.isfinite(sum(state)):  # any infinity or NaN among them
                return None
            states.append(state)
            parameters.append(values)
            suttons.append(sutton)
        thetas = np.array([state[2] for state in states])
        stepped, terminations = [], []
        try:
            for (x, x_dot, theta, theta_dot), values, action, costheta, sintheta in zip(
                states, parameters, actions.tolist(), np.cos(thetas).tolist(), np.sin(thetas).tolist()
            ):
                force_mag, polemass_length, total_mass, gravity, length, masspole, tau, x_threshold, theta_threshold = (
                    map(float, values)
                )
                force = force_mag if action == 1 else -force_mag
                temp = (force + polemass_length * (theta_dot * theta_dot) * sintheta) / total_mass
                thetaacc = (gravity * sintheta - costheta * temp) / (
                    length * (4.0 / 3.0 - masspole * (costheta * costheta) / total_mass)
                )
                xacc = temp - polemass_length * thetaacc * costheta / total_mass
                x = x + tau * x_dot
                x_dot = x_dot + tau * xacc
                theta = theta + tau * theta_dot
                theta_dot = theta_dot + tau * thetaacc
                if not math.isfinite(x + x_dot + theta + theta_dot):  # numpy would have warned on the way
                    return None
                stepped.append((x, x_dot, theta, theta_dot))
                terminations.append(
                    x < -x_threshold or x > x_threshold or theta < -theta_threshold or theta > theta_threshold
                )
        except (ArithmeticError, ValueError):  # a division by zero, a number too large for a float
            return None  # the envs' own steps warn or raise, naming the env
        matrix = np.array(stepped)
        for env, state in zip(envs, matrix):  # a new array each step, as gymnasium's (a row of one)
            env.state = state
        observations[slice(None) if rows is None else rows] = matrix
        rewards = []
        for env, ended, sutton in zip(envs, terminations, suttons):
            if ended:  # the pole just fell
                env.steps_beyond_terminated = 0
                rewards.append(-1.0 if sutton else 1.0)
            else:
                rewards.append(0.0 if sutton else 1.0)
        return rewards, terminations


_MODULE = "gymnasium.envs.classic_control"

ADAPTERS = [
    CartPole(f"{_MODULE}.cartpole:CartPoleEnv", velocities=[1, 3]),  # x_dot, theta_dot
    ClassicControl(f"{_MODULE}.pendulum:PendulumEnv", velocities=[1]),  # theta_dot
    ClassicControl(f"{_MODULE}.mountain_car:MountainCarEnv", velocities=[1]),  # velocity
    ClassicControl(f"{_MODULE}.continuous_mountain_car:Continuous_MountainCarEnv", velocities=[1]),
    ClassicControl(f"{_MODULE}.acrobot:AcrobotEnv", velocities=[2, 3]),  # dtheta1, dtheta2
]
