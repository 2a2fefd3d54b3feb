"""gymnasium's classic-control envs as numba batch kernels, bit-identical to ``gymnasium.make`` of them.

Each ``step`` is gymnasium's arithmetic, operation for operation and in the same order, with the
same number types: numpy float32 scalars stay float32 where gymnasium's do (Pendulum's torque term,
MountainCarContinuous' state after its first step, compared in float32 as numpy compares a float32
with a Python float), and ``x ** 2`` calls libm's ``pow`` as numpy and Python do (LLVM would
otherwise turn ``pow(x, 2.0)`` into ``x * x``, which differs in the last bit for about 0.07% of
values): through its ``powf64`` / ``powf32`` names, which the compiler does not treat as ``pow``.
``sin`` and ``cos`` are libm's on both sides. Resets are gymnasium's own code paths, in numpy.

Parameters are gymnasium's attribute names; nominal values are read from a fresh env of each class,
and the time limits from gymnasium's registry. CartPole's ``total_mass`` and ``polemass_length``, which
its ``__init__`` computes once, are parameters the step reads as gymnasium's does (and ``refresh``
recomputes where the Python engine's adapter does). Every other attribute of each env (its rendering
state, CartPole's ``kinematics_integrator``, Acrobot's ``torque_noise_max``, ...) is ``unsupported``:
setting one on a compiled env is refused rather than ignored.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium
import numba
import numpy as np
from gymnasium.envs.classic_control import utils
from gymnasium.envs.classic_control.acrobot import AcrobotEnv
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.envs.classic_control.continuous_mountain_car import Continuous_MountainCarEnv
from gymnasium.envs.classic_control.mountain_car import MountainCarEnv
from gymnasium.envs.classic_control.pendulum import DEFAULT_X, DEFAULT_Y, PendulumEnv
from numba import types

from . import MODELED, BatchKernel

# libm's pow under names LLVM does not rewrite (glibc aliases of pow and powf).
_pow = types.ExternalFunction("powf64", types.float64(types.float64, types.float64))
_powf = types.ExternalFunction("powf32", types.float32(types.float32, types.float32))
_F32 = np.float32


def _nominal(env: Any, names: list[str]) -> dict[str, float]:
    return {name: float(getattr(env, name)) for name in names}


def _unsupported(env: gymnasium.Env, names: list[str], also: tuple[str, ...]) -> tuple[str, ...]:
    """The attributes of ``env`` (its own and its class's, and ``also``: ones only its ``step`` or
    ``reset`` sets) that the kernel does not model."""
    found = set(vars(env)) | set(also)
    for cls in type(env).__mro__:
        if cls.__module__.startswith("gymnasium.envs."):  # the env's classes, not gymnasium.Env's
            found.update(
                name
                for name, value in vars(cls).items()
                if not name.startswith("__") and not callable(value) and not isinstance(value, property)
            )
    return tuple(sorted(found - set(names) - set(MODELED)))


def _kernel(
    env_id: str, env: gymnasium.Env, names: list[str], also: tuple[str, ...] = (), **fields: Any
) -> BatchKernel:
    spec = gymnasium.spec(env_id)
    return BatchKernel(
        observation_space=env.observation_space,  # type: ignore[arg-type]
        action_space=env.action_space,  # type: ignore[arg-type]
        params=_nominal(env, names),
        max_episode_steps=spec.max_episode_steps,
        metadata={**env.metadata, "render_modes": []},
        unsupported=_unsupported(env, names, also),
        **fields,
    )


def _float64_state(row: np.ndarray, value: np.ndarray) -> None:
    """Stores a ``state`` of whole or float64 numbers, which gymnasium's next step computes with in
    float64 as the kernel does (a float32 state it would step in float32 arithmetic)."""
    if value.dtype.kind == "f" and value.dtype.itemsize != 8:
        raise ValueError(
            f"gymnasium's env would compute its next step in {value.dtype} arithmetic, which the kernel does "
            f"not reproduce; assign float64 values (np.asarray(state, dtype=np.float64)) or use engine='python'"
        )
    row[: len(value)] = value


# -- CartPole-v1 ----------------------------------------------------------------------------------

# state: x, x_dot, theta, theta_dot (gymnasium's state), steps_beyond_terminated (-1: None)
# params: gravity, masscart, masspole, length, force_mag, tau, theta_threshold_radians, x_threshold,
# total_mass, polemass_length (the last two as CartPoleEnv.__init__ left them: see cartpole_refresh)


@numba.njit(cache=True)
def cartpole_step(state, params, actions, stepping, observations, rewards, terminations):  # type: ignore[no-untyped-def]
    """CartPoleEnv.step (euler) over the rows that step."""
    for i in range(state.shape[0]):
        if not stepping[i]:
            continue
        gravity, masspole, length = params[i, 0], params[i, 2], params[i, 3]
        force_mag, tau, theta_threshold, x_threshold = params[i, 4], params[i, 5], params[i, 6], params[i, 7]
        total_mass, polemass_length = params[i, 8], params[i, 9]
        x, x_dot, theta, theta_dot = state[i, 0], state[i, 1], state[i, 2], state[i, 3]
        force = force_mag if actions[i] == 1 else -force_mag
        costheta = math.cos(theta)
        sintheta = math.sin(theta)
        temp = (force + polemass_length * (theta_dot * theta_dot) * sintheta) / total_mass
        thetaacc = (gravity * sintheta - costheta * temp) / (
            length * (4.0 / 3.0 - masspole * (costheta * costheta) / total_mass)
        )
        xacc = temp - polemass_length * thetaacc * costheta / total_mass
        x = x + tau * x_dot
        x_dot = x_dot + tau * xacc
        theta = theta + tau * theta_dot
        theta_dot = theta_dot + tau * thetaacc
        state[i, 0], state[i, 1], state[i, 2], state[i, 3] = x, x_dot, theta, theta_dot
        terminated = x < -x_threshold or x > x_threshold or theta < -theta_threshold or theta > theta_threshold
        if not terminated:
            reward = 1.0
        elif state[i, 4] < 0.0:
            state[i, 4] = 0.0
            reward = 1.0
        else:
            state[i, 4] += 1.0
            reward = 0.0
        observations[i, 0], observations[i, 1], observations[i, 2], observations[i, 3] = x, x_dot, theta, theta_dot
        rewards[i] = reward
        terminations[i] = terminated


def cartpole_refresh(params: np.ndarray) -> None:
    """CartPoleEnv.__init__'s ``total_mass`` and ``polemass_length``, from ``masscart``, ``masspole``
    and ``length``, in every row of ``params``."""
    params[:, 8] = params[:, 2] + params[:, 1]
    params[:, 9] = params[:, 2] * params[:, 3]


def cartpole_reset(
    rng: np.random.Generator, params: np.ndarray, options: Any, state: np.ndarray, obs: np.ndarray
) -> None:
    """CartPoleEnv.reset."""
    low, high = utils.maybe_parse_reset_bounds(options, -0.05, 0.05)
    values = rng.uniform(low=low, high=high, size=(4,))
    state[:4] = values
    state[4] = -1.0
    obs[:] = values


def cartpole_draw(rng: np.random.Generator, count: int) -> np.ndarray:
    """The draws of ``count`` option-less resets of :func:`cartpole_reset`."""
    return rng.uniform(low=-0.05, high=0.05, size=(count, 4))


@numba.njit(cache=True)
def cartpole_start(resetting, draws, params, state, observations):  # type: ignore[no-untyped-def]
    """:func:`cartpole_reset` without options, from its draws, over the rows that reset."""
    for i in range(state.shape[0]):
        if resetting[i]:
            for j in range(4):
                state[i, j] = draws[i, j]
                observations[i, j] = draws[i, j]
            state[i, 4] = -1.0


CARTPOLE = _kernel(
    "CartPole-v1",
    CartPoleEnv(),
    [
        "gravity",
        "masscart",
        "masspole",
        "length",
        "force_mag",
        "tau",
        "theta_threshold_radians",
        "x_threshold",
        "total_mass",
        "polemass_length",
    ],
    state_size=5,
    step=cartpole_step,
    reset=cartpole_reset,
    velocities=(1, 3),
    draw=cartpole_draw,
    start=cartpole_start,
    refresh=cartpole_refresh,
    refresh_inputs=("masscart", "masspole", "length"),
    state_columns=4,
    set_state=_float64_state,
)


# -- Pendulum-v1 ----------------------------------------------------------------------------------

# state: th, thdot


@numba.njit(cache=True)
def pendulum_step(state, params, actions, stepping, observations, rewards, terminations):  # type: ignore[no-untyped-def]
    """PendulumEnv.step over the rows that step."""
    two, two32 = 2.0, _F32(2.0)
    for i in range(state.shape[0]):
        if not stepping[i]:
            continue
        max_speed, max_torque, dt, g, m, l = (  # noqa: E741 - gymnasium's name
            params[i, 0],
            params[i, 1],
            params[i, 2],
            params[i, 3],
            params[i, 4],
            params[i, 5],
        )
        th, thdot = state[i, 0], state[i, 1]
        u = actions[i, 0]  # np.clip of a float32 action with Python bounds: float32 bounds
        if u < _F32(-max_torque):
            u = _F32(-max_torque)
        if u > _F32(max_torque):
            u = _F32(max_torque)
        normalized = ((th + np.pi) % (2 * np.pi)) - np.pi
        costs = _pow(normalized, two) + 0.1 * _pow(thdot, two) + np.float64(_F32(0.001) * _powf(u, two32))
        torque = _F32(3.0 / (m * _pow(l, two))) * u  # a Python float times a float32: float32
        newthdot = thdot + (3 * g / (2 * l) * math.sin(th) + np.float64(torque)) * dt
        if newthdot < -max_speed:
            newthdot = -max_speed
        if newthdot > max_speed:
            newthdot = max_speed
        newth = th + newthdot * dt
        state[i, 0], state[i, 1] = newth, newthdot
        observations[i, 0], observations[i, 1], observations[i, 2] = math.cos(newth), math.sin(newth), newthdot
        rewards[i] = -costs
        terminations[i] = False


def pendulum_reset(
    rng: np.random.Generator, params: np.ndarray, options: Any, state: np.ndarray, obs: np.ndarray
) -> None:
    """PendulumEnv.reset."""
    if options is None:
        high = np.array([DEFAULT_X, DEFAULT_Y])
    else:
        x = options.get("x_init") if "x_init" in options else DEFAULT_X
        y = options.get("y_init") if "y_init" in options else DEFAULT_Y
        high = np.array([utils.verify_number_and_cast(x), utils.verify_number_and_cast(y)])
    values = rng.uniform(low=-high, high=high)
    state[:] = values
    obs[:] = np.array([np.cos(values[0]), np.sin(values[0]), values[1]], dtype=np.float32)


PENDULUM = _kernel(
    "Pendulum-v1",
    PendulumEnv(),
    ["max_speed", "max_torque", "dt", "g", "m", "l"],
    also=("last_u",),  # the last torque, which only rendering reads
    state_size=2,
    step=pendulum_step,
    reset=pendulum_reset,
    velocities=(1,),
    constructor=("g",),
    set_state=_float64_state,
)


# -- MountainCar-v0 -------------------------------------------------------------------------------

# state: position, velocity


@numba.njit(cache=True)
def mountain_car_step(state, params, actions, stepping, observations, rewards, terminations):  # type: ignore[no-untyped-def]
    """MountainCarEnv.step over the rows that step."""
    for i in range(state.shape[0]):
        if not stepping[i]:
            continue
        force, gravity, min_position, max_position = params[i, 0], params[i, 1], params[i, 2], params[i, 3]
        max_speed, goal_position, goal_velocity = params[i, 4], params[i, 5], params[i, 6]
        position, velocity = state[i, 0], state[i, 1]
        velocity += (actions[i] - 1) * force + math.cos(3 * position) * (-gravity)
        if velocity < -max_speed:
            velocity = -max_speed
        if velocity > max_speed:
            velocity = max_speed
        position += velocity
        if position < min_position:
            position = min_position
        if position > max_position:
            position = max_position
        if position == min_position and velocity < 0:
            velocity = 0.0
        terminations[i] = position >= goal_position and velocity >= goal_velocity
        rewards[i] = -1.0
        state[i, 0], state[i, 1] = position, velocity
        observations[i, 0], observations[i, 1] = position, velocity


def mountain_car_reset(
    rng: np.random.Generator, params: np.ndarray, options: Any, state: np.ndarray, obs: np.ndarray
) -> None:
    """MountainCarEnv.reset (and MountainCarContinuous', whose state also starts as float64)."""
    low, high = utils.maybe_parse_reset_bounds(options, -0.6, -0.4)
    values = np.array([rng.uniform(low=low, high=high), 0])
    state[:2] = values
    state[2:] = 0.0  # MountainCarContinuous: not float32 yet
    obs[:] = values


def mountain_car_draw(rng: np.random.Generator, count: int) -> np.ndarray:
    """The draws of ``count`` option-less resets of :func:`mountain_car_reset`."""
    return rng.uniform(low=-0.6, high=-0.4, size=(count, 1))


@numba.njit(cache=True)
def mountain_car_start(resetting, draws, params, state, observations):  # type: ignore[no-untyped-def]
    """:func:`mountain_car_reset` without options, from its draws, over the rows that reset."""
    for i in range(state.shape[0]):
        if resetting[i]:
            state[i, :] = 0.0
            state[i, 0] = draws[i, 0]
            observations[i, 0] = draws[i, 0]
            observations[i, 1] = 0.0


MOUNTAIN_CAR = _kernel(
    "MountainCar-v0",
    MountainCarEnv(),
    ["force", "gravity", "min_position", "max_position", "max_speed", "goal_position", "goal_velocity"],
    state_size=2,
    step=mountain_car_step,
    reset=mountain_car_reset,
    velocities=(1,),
    constructor=("goal_velocity",),
    draw=mountain_car_draw,
    start=mountain_car_start,
    set_state=_float64_state,
)


# -- MountainCarContinuous-v0 ---------------------------------------------------------------------

# state: position, velocity, float32 (1.0 once a step has stored the state as float32, as gymnasium
# does; its arithmetic is then float32 where numpy's is).


@numba.njit(cache=True)
def _less(a, a32, b):  # type: ignore[no-untyped-def]
    """``a < b`` for ``a`` a numpy float32 (``a32``) or a float64, ``b`` a Python float."""
    return _F32(a) < _F32(b) if a32 else a < b


@numba.njit(cache=True)
def _greater(a, a32, b):  # type: ignore[no-untyped-def]
    """``a > b``, as :func:`_less`."""
    return _F32(a) > _F32(b) if a32 else a > b


@numba.njit(cache=True)
def _at_least(a, a32, b):  # type: ignore[no-untyped-def]
    """``a >= b``, as :func:`_less`."""
    return _F32(a) >= _F32(b) if a32 else a >= b


@numba.njit(cache=True)
def mountain_car_continuous_step(state, params, actions, stepping, observations, rewards, terminations):  # type: ignore[no-untyped-def]
    """Continuous_MountainCarEnv.step over the rows that step, with numpy's scalar types: a value
    is a float64 or a float32 (``*32``); an operation with a Python float stays float32."""
    for i in range(state.shape[0]):
        if not stepping[i]:
            continue
        power, min_action, max_action, min_position = params[i, 0], params[i, 1], params[i, 2], params[i, 3]
        max_position, max_speed, goal_position, goal_velocity = params[i, 4], params[i, 5], params[i, 6], params[i, 7]
        state32 = state[i, 2] != 0.0
        position, position32 = state[i, 0], state32
        velocity, velocity32 = state[i, 1], state32
        action = actions[i, 0]
        # force = min(max(action[0], min_action), max_action): a float32, or the Python float bound
        force, force32 = np.float64(action), True
        if _greater(min_action, True, action):
            force, force32 = min_action, False
        if _less(max_action, force32, force):
            force, force32 = max_action, False
        # velocity += force * power - 0.0025 * math.cos(3 * position)
        angle = np.float64(_F32(3.0) * _F32(position)) if position32 else 3 * position
        gravity = 0.0025 * math.cos(angle)
        if force32:
            change = np.float64(_F32(_F32(_F32(force) * _F32(power)) - _F32(gravity)))
        else:
            change = force * power - gravity
        if velocity32:
            velocity = np.float64(_F32(_F32(velocity) + _F32(change)))
        else:
            velocity = velocity + change
        if _greater(velocity, velocity32, max_speed):
            velocity, velocity32 = max_speed, False
        if _less(velocity, velocity32, -max_speed):
            velocity, velocity32 = -max_speed, False
        if position32:
            position = np.float64(_F32(_F32(position) + _F32(velocity)))
        else:
            position = position + velocity
        if _greater(position, position32, max_position):
            position, position32 = max_position, False
        if _less(position, position32, min_position):
            position, position32 = min_position, False
        at_min = _F32(position) == _F32(min_position) if position32 else position == min_position
        if at_min and velocity < 0:
            velocity, velocity32 = 0.0, False
        terminated = _at_least(position, position32, goal_position) and _at_least(velocity, velocity32, goal_velocity)
        reward = 100.0 if terminated else 0.0
        reward -= (np.float64(action) * np.float64(action)) * 0.1  # math.pow of a float32 value: exact
        state[i, 0], state[i, 1], state[i, 2] = _F32(position), _F32(velocity), 1.0
        observations[i, 0], observations[i, 1] = position, velocity
        rewards[i] = reward
        terminations[i] = terminated


def _mountain_car_continuous_set_state(row: np.ndarray, value: np.ndarray) -> None:
    """Stores a ``state``, noting whether gymnasium's env holds it as float32 (as after a step): its
    next step then computes in float32 where numpy does, as the kernel does with the flag."""
    if value.dtype.kind == "f" and value.dtype.itemsize not in (4, 8):
        raise ValueError(
            f"gymnasium's env would compute its next step in {value.dtype} arithmetic, which the kernel does "
            f"not reproduce; assign float32 or float64 values, or use engine='python'"
        )
    row[:2] = value
    row[2] = 1.0 if value.dtype == np.float32 else 0.0


def _mountain_car_continuous_kick(state: np.ndarray, amounts: np.ndarray) -> None:
    """The Python engine's kick makes the state a float64 array again."""
    state[1] += amounts[0]
    state[2] = 0.0


MOUNTAIN_CAR_CONTINUOUS = _kernel(
    "MountainCarContinuous-v0",
    Continuous_MountainCarEnv(),
    [
        "power",
        "min_action",
        "max_action",
        "min_position",
        "max_position",
        "max_speed",
        "goal_position",
        "goal_velocity",
    ],
    state_size=3,
    step=mountain_car_continuous_step,
    reset=mountain_car_reset,
    velocities=(1,),
    constructor=("goal_velocity",),
    draw=mountain_car_draw,
    start=mountain_car_start,
    kick=_mountain_car_continuous_kick,
    state_columns=2,
    set_state=_mountain_car_continuous_set_state,
)


# -- Acrobot-v1 -----------------------------------------------------------------------------------

# state: theta1, theta2, dtheta1, dtheta2 (any state gymnasium's step augments to float64 first, so a
# float32 one steps as its float64 values do: stored as float64, set_state None)


@numba.njit(cache=True)
def _acrobot_dsdt(m1, m2, l1, lc1, lc2, moi, theta1, theta2, dtheta1, dtheta2, a):  # type: ignore[no-untyped-def]
    """AcrobotEnv._dsdt ("book" dynamics)."""
    two = 2.0
    g = 9.8
    I1 = moi  # noqa: N806 - gymnasium's names
    I2 = moi  # noqa: N806
    d1 = m1 * _pow(lc1, two) + m2 * (_pow(l1, two) + _pow(lc2, two) + 2 * l1 * lc2 * math.cos(theta2)) + I1 + I2
    d2 = m2 * (_pow(lc2, two) + l1 * lc2 * math.cos(theta2)) + I2
    phi2 = m2 * lc2 * g * math.cos(theta1 + theta2 - np.pi / 2.0)
    phi1 = (
        -m2 * l1 * lc2 * _pow(dtheta2, two) * math.sin(theta2)
        - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * math.sin(theta2)
        + (m1 * lc1 + m2 * l1) * g * math.cos(theta1 - np.pi / 2)
        + phi2
    )
    ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * _pow(dtheta1, two) * math.sin(theta2) - phi2) / (
        m2 * _pow(lc2, two) + I2 - _pow(d2, two) / d1
    )
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return dtheta1, dtheta2, ddtheta1, ddtheta2


@numba.njit(cache=True)
def acrobot_step(state, params, actions, stepping, observations, rewards, terminations):  # type: ignore[no-untyped-def]
    """AcrobotEnv.step (rk4 over one dt) over the rows that step."""
    for i in range(state.shape[0]):
        if not stepping[i]:
            continue
        dt, l1, m1, m2 = params[i, 0], params[i, 1], params[i, 3], params[i, 4]
        lc1, lc2, moi, max_vel_1, max_vel_2 = params[i, 5], params[i, 6], params[i, 7], params[i, 8], params[i, 9]
        action = actions[i]
        a = -1.0 if action == 0 else (0.0 if action == 1 else 1.0)
        y0, y1, y2, y3 = state[i, 0], state[i, 1], state[i, 2], state[i, 3]
        dt2 = dt / 2.0
        k1 = _acrobot_dsdt(m1, m2, l1, lc1, lc2, moi, y0, y1, y2, y3, a)
        k2 = _acrobot_dsdt(
            m1, m2, l1, lc1, lc2, moi, y0 + dt2 * k1[0], y1 + dt2 * k1[1], y2 + dt2 * k1[2], y3 + dt2 * k1[3], a
        )
        k3 = _acrobot_dsdt(
            m1, m2, l1, lc1, lc2, moi, y0 + dt2 * k2[0], y1 + dt2 * k2[1], y2 + dt2 * k2[2], y3 + dt2 * k2[3], a
        )
        k4 = _acrobot_dsdt(
            m1, m2, l1, lc1, lc2, moi, y0 + dt * k3[0], y1 + dt * k3[1], y2 + dt * k3[2], y3 + dt * k3[3], a
        )
        sixth = dt / 6.0
        s0 = y0 + sixth * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
        s1 = y1 + sixth * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
        s2 = y2 + sixth * (k1[2] + 2 * k2[2] + 2 * k3[2] + k4[2])
        s3 = y3 + sixth * (k1[3] + 2 * k2[3] + 2 * k3[3] + k4[3])
        diff = np.pi - (-np.pi)  # wrap(x, -pi, pi)
        while s0 > np.pi:
            s0 = s0 - diff
        while s0 < -np.pi:
            s0 = s0 + diff
        while s1 > np.pi:
            s1 = s1 - diff
        while s1 < -np.pi:
            s1 = s1 + diff
        if -max_vel_1 > s2:  # bound(x, m, M) = min(max(x, m), M)
            s2 = -max_vel_1
        if max_vel_1 < s2:
            s2 = max_vel_1
        if -max_vel_2 > s3:
            s3 = -max_vel_2
        if max_vel_2 < s3:
            s3 = max_vel_2
        state[i, 0], state[i, 1], state[i, 2], state[i, 3] = s0, s1, s2, s3
        terminated = -math.cos(s0) - math.cos(s1 + s0) > 1.0
        observations[i, 0], observations[i, 1] = math.cos(s0), math.sin(s0)
        observations[i, 2], observations[i, 3] = math.cos(s1), math.sin(s1)
        observations[i, 4], observations[i, 5] = s2, s3
        rewards[i] = 0.0 if terminated else -1.0
        terminations[i] = terminated


def acrobot_reset(
    rng: np.random.Generator, params: np.ndarray, options: Any, state: np.ndarray, obs: np.ndarray
) -> None:
    """AcrobotEnv.reset: a float32 state, whose first observation numpy computes in float32."""
    low, high = utils.maybe_parse_reset_bounds(options, -0.1, 0.1)
    s = rng.uniform(low=low, high=high, size=(4,)).astype(np.float32)
    state[:] = s
    obs[:] = np.array([np.cos(s[0]), np.sin(s[0]), np.cos(s[1]), np.sin(s[1]), s[2], s[3]], dtype=np.float32)


ACROBOT = _kernel(
    "Acrobot-v1",
    AcrobotEnv(),
    [
        "dt",
        "LINK_LENGTH_1",
        "LINK_LENGTH_2",
        "LINK_MASS_1",
        "LINK_MASS_2",
        "LINK_COM_POS_1",
        "LINK_COM_POS_2",
        "LINK_MOI",
        "MAX_VEL_1",
        "MAX_VEL_2",
    ],
    state_size=4,
    step=acrobot_step,
    reset=acrobot_reset,
    velocities=(2, 3),
)
