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
from gymnasium.spaces import Discrete

from .env_families import BatchStep, EnvAdapter, defined_in


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

    def batch_stepper(
        self, steppers: list[Callable[[Any], Any]], observations: np.ndarray, action_dtype: Any
    ) -> BatchStep | None:
        """``CartPoleEnv.step`` of several envs at once (``_CartPoleSteps``), where each stepper is
        gymnasium's own ``step`` (of a release whose step it reproduces) of a plain ``CartPoleEnv`` (not
        a subclass's: it may read its attributes otherwise), into float32 observations of 4 from int64
        actions (gymnasium's observation is float32; its action space holds int64s).

        Why: gymnasium's step is some 30 numpy scalar calls, a third of its 5 µs in the action
        space's ``contains``; stepped together, the steps of 8 envs cost about half as much
        (``docs/benchmarks.md``, "CartPole's envs stepped together").
        """
        cartpole = _gymnasium_cartpole()
        if (
            cartpole is None
            or observations.dtype != np.float32
            or observations.shape[1:] != (4,)
            or action_dtype != np.int64
        ):
            return None
        envs: list[Any] = [getattr(stepper, "__self__", None) for stepper in steppers]
        if not envs or any(
            getattr(stepper, "__func__", None) is not cartpole.step or type(env) is not cartpole
            for stepper, env in zip(steppers, envs)
        ):
            return None
        return _CartPoleSteps(envs, observations).step


#: The gymnasium releases whose ``CartPoleEnv.step`` ``_CartPoleSteps`` reproduces (the same code from
#: 1.2.2 to 1.4.0), as (major, minor).
_CARTPOLE_RELEASES = ((1, 2), (1, 4))


def _gymnasium_cartpole() -> Any:
    """gymnasium's ``CartPoleEnv``, if its ``step`` is gymnasium's own (not one patched on the class)
    of a release in ``_CARTPOLE_RELEASES``; else None."""
    import gymnasium
    from gymnasium.envs.classic_control import cartpole

    try:
        release = tuple(int(part) for part in gymnasium.__version__.split(".")[:2])
    except ValueError:
        return None
    if not (
        _CARTPOLE_RELEASES[0] <= release <= _CARTPOLE_RELEASES[1]
        and defined_in(cartpole.CartPoleEnv.step, cartpole, "CartPoleEnv.step")
    ):
        return None
    return cartpole.CartPoleEnv


#: What ``CartPoleEnv.step`` computes with, in ``_CartPoleSteps.step``'s order.
_CARTPOLE_PARAMETERS = attrgetter(
    "force_mag", "polemass_length", "total_mass", "gravity", "length", "masspole", "tau", "x_threshold",
    "theta_threshold_radians",
)  # fmt: skip
#: What decides whether ``_CartPoleSteps`` reproduces an env's step (see ``_CartPoleSteps.step``).
_CARTPOLE_MODE = attrgetter(
    "state",
    "kinematics_integrator",
    "steps_beyond_terminated",
    "render_mode",
    "action_space",
    "action_space.n",
    "action_space.start",
    "action_space.dtype",
    "_sutton_barto_reward",
)
#: The number types whose arithmetic with a numpy float64 is that of their value as a Python float, and
#: whose negation (gymnasium negates ``force_mag`` and the thresholds alone) is exact: not numpy's
#: integers, which wrap at their minimum, nor numpy's bools, which refuse it.
_PLAIN_NUMBERS = frozenset({float, int, bool, np.float64, np.float32, np.float16})
#: numpy's float64 and int64 dtypes: an equal dtype that is not one of these (unpickled, say) only has the
#: envs stepped one by one.
_FLOAT64, _INT64 = np.dtype(np.float64), np.dtype(np.int64)
#: The largest float32: a state beyond it would overflow the observation's cast, which numpy warns of.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class _CartPoleSteps:
    """Steps a slot's ``CartPoleEnv``s together as each one's ``step`` would, bit for bit: the same
    operations in the same order on float64 values, with numpy's ``cos`` and ``sin`` (one call each for
    all the envs) and Python floats for the rest (numpy's scalar arithmetic is IEEE double arithmetic,
    as Python's is); the same rewards, terminations, observations, ``state`` and
    ``steps_beyond_terminated``.

    Python's floats neither warn nor honour ``np.seterr``: wherever numpy would warn or raise (a value
    that is not finite, a division by zero, an overflow on the way, an underflow that ``np.seterr``
    makes an error), an action the action space does not contain, or anything else unexpected, ``step``
    returns None having changed nothing, and the envs' own steps then warn or raise, naming the env.

    Why Python floats and not whole-array operations: in a training loop a step follows the policy's
    forward, which leaves numpy's code out of the caches, and there some 35 array operations on 8 envs
    took as long as the envs' own steps, where the interpreter's loop stays in the caches."""

    def __init__(self, envs: list[Any], observations: np.ndarray) -> None:
        self.envs, self.observations = envs, observations

    def step(self, rows: list[int] | None, actions: np.ndarray) -> Any:
        """See ``shmpool.env_families.BatchStep``."""
        envs = self.envs if rows is None else [self.envs[row] for row in rows]
        try:
            computed = self._compute(envs, actions)
        except Exception:  # noqa: BLE001 - the envs' own steps raise it (or not), naming the env
            return None
        if computed is None:
            return None
        stepped, terminations, suttons = computed
        matrix = np.array(stepped)
        for env, state in zip(envs, matrix):  # a new array each step, as gymnasium's (a row of one)
            env.state = state
        self.observations[slice(None) if rows is None else rows] = matrix
        rewards = []
        for env, ended, sutton in zip(envs, terminations, suttons):
            if ended:  # the pole just fell
                env.steps_beyond_terminated = 0
                rewards.append(-1.0 if sutton else 1.0)
            else:
                rewards.append(0.0 if sutton else 1.0)
        return rewards, terminations

    @staticmethod
    def _compute(envs: list[Any], actions: np.ndarray) -> Any:
        """Each env's next state and termination, and its reward flag, changing nothing; None where
        an env's step would compute otherwise or warn (see the class)."""
        if np.geterr()["under"] != "ignore":  # gymnasium's arithmetic would report underflows
            return None
        states, parameters, suttons = [], [], []
        for env in envs:
            state, integrator, beyond, render_mode, space, n, start, dtype, sutton = _CARTPOLE_MODE(env)
            values = _CARTPOLE_PARAMETERS(env)
            # Another integrator, a state it would compute with in float32, a terminated env's
            # warning, rendering, an action space that is not Discrete(2) (replaced or changed in
            # place), an attribute that is not a plain number. Each test as gymnasium's step makes it.
            if not (
                state.__class__ is np.ndarray
                and state.dtype is _FLOAT64
                and state.shape == (4,)
                and integrator == "euler"
                and beyond is None
                and not render_mode == "human"
                and space.__class__ is Discrete
                and n == 2
                and start == 0
                and dtype is _INT64
                and _PLAIN_NUMBERS.issuperset(map(type, values))
            ):
                return None
            state = state.tolist()
            if not math.isfinite(sum(state)):  # numpy would warn of an angle that is not finite
                return None
            states.append(state)
            # gymnasium negates force_mag before any float64 meets it: an int 0 has no sign, -0.0 has
            parameters.append((float(-values[0]), *map(float, values)))
            suttons.append(bool(sutton))
        thetas = np.array([state[2] for state in states])
        stepped, terminations = [], []
        for (x, x_dot, theta, theta_dot), values, action, costheta, sintheta in zip(
            states, parameters, actions.tolist(), np.cos(thetas).tolist(), np.sin(thetas).tolist()
        ):
            if action != 0 and action != 1:
                return None  # not in the action space: the env's step asserts it
            (
                negated_force,
                force_mag,
                polemass_length,
                total_mass,
                gravity,
                length,
                masspole,
                tau,
                x_threshold,
                theta_threshold,
            ) = values
            force = force_mag if action == 1 else negated_force
            temp = (force + polemass_length * (theta_dot * theta_dot) * sintheta) / total_mass
            inertia = length * (4.0 / 3.0 - masspole * (costheta * costheta) / total_mass)
            thetaacc = (gravity * sintheta - costheta * temp) / inertia
            xacc = temp - polemass_length * thetaacc * costheta / total_mass
            x = x + tau * x_dot
            x_dot = x_dot + tau * xacc
            theta = theta + tau * theta_dot
            theta_dot = theta_dot + tau * thetaacc
            # An overflow on the way leaves an infinity in one of these (or a NaN after it); a state
            # beyond float32's range would overflow the observation's cast.
            if not (
                math.isfinite(temp + inertia + thetaacc + xacc)
                and -_FLOAT32_MAX <= x <= _FLOAT32_MAX
                and -_FLOAT32_MAX <= x_dot <= _FLOAT32_MAX
                and -_FLOAT32_MAX <= theta <= _FLOAT32_MAX
                and -_FLOAT32_MAX <= theta_dot <= _FLOAT32_MAX
            ):
                return None
            stepped.append((x, x_dot, theta, theta_dot))
            terminations.append(
                x < -x_threshold or x > x_threshold or theta < -theta_threshold or theta > theta_threshold
            )
        return stepped, terminations, suttons


_MODULE = "gymnasium.envs.classic_control"

ADAPTERS = [
    CartPole(f"{_MODULE}.cartpole:CartPoleEnv", velocities=[1, 3]),  # x_dot, theta_dot
    ClassicControl(f"{_MODULE}.pendulum:PendulumEnv", velocities=[1]),  # theta_dot
    ClassicControl(f"{_MODULE}.mountain_car:MountainCarEnv", velocities=[1]),  # velocity
    ClassicControl(f"{_MODULE}.continuous_mountain_car:Continuous_MountainCarEnv", velocities=[1]),
    ClassicControl(f"{_MODULE}.acrobot:AcrobotEnv", velocities=[2, 3]),  # dtheta1, dtheta2
]
