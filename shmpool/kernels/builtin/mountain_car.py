"""MountainCar-v0 and MountainCarContinuous-v0 as numba batch kernels, which share their reset (see
``shmpool.kernels.builtin``)."""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from gymnasium.envs.classic_control import utils
from gymnasium.envs.classic_control.continuous_mountain_car import Continuous_MountainCarEnv
from gymnasium.envs.classic_control.mountain_car import MountainCarEnv

from .common import F32, make_kernel, set_float64_state

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
    """The draws of ``count`` option-less resets of ``mountain_car_reset``."""
    return rng.uniform(low=-0.6, high=-0.4, size=(count, 1))


@numba.njit(cache=True)
def mountain_car_start(resetting, draws, params, state, observations):  # type: ignore[no-untyped-def]
    """``mountain_car_reset`` without options, from its draws, over the rows that reset."""
    for i in range(state.shape[0]):
        if resetting[i]:
            state[i, :] = 0.0
            state[i, 0] = draws[i, 0]
            observations[i, 0] = draws[i, 0]
            observations[i, 1] = 0.0


MOUNTAIN_CAR = make_kernel(
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
    set_state=set_float64_state,
)


# -- MountainCarContinuous-v0 ---------------------------------------------------------------------

# state: position, velocity, float32 (1.0 once a step has stored the state as float32, as gymnasium
# does; its arithmetic is then float32 where numpy's is).


@numba.njit(cache=True)
def _less(a, a32, b):  # type: ignore[no-untyped-def]
    """``a < b`` for ``a`` a numpy float32 (``a32``) or a float64, ``b`` a Python float."""
    return F32(a) < F32(b) if a32 else a < b


@numba.njit(cache=True)
def _greater(a, a32, b):  # type: ignore[no-untyped-def]
    """``a > b``, as ``_less``."""
    return F32(a) > F32(b) if a32 else a > b


@numba.njit(cache=True)
def _at_least(a, a32, b):  # type: ignore[no-untyped-def]
    """``a >= b``, as ``_less``."""
    return F32(a) >= F32(b) if a32 else a >= b


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
        angle = np.float64(F32(3.0) * F32(position)) if position32 else 3 * position
        gravity = 0.0025 * math.cos(angle)
        if force32:
            change = np.float64(F32(F32(F32(force) * F32(power)) - F32(gravity)))
        else:
            change = force * power - gravity
        if velocity32:
            velocity = np.float64(F32(F32(velocity) + F32(change)))
        else:
            velocity = velocity + change
        if _greater(velocity, velocity32, max_speed):
            velocity, velocity32 = max_speed, False
        if _less(velocity, velocity32, -max_speed):
            velocity, velocity32 = -max_speed, False
        if position32:
            position = np.float64(F32(F32(position) + F32(velocity)))
        else:
            position = position + velocity
        if _greater(position, position32, max_position):
            position, position32 = max_position, False
        if _less(position, position32, min_position):
            position, position32 = min_position, False
        at_min = F32(position) == F32(min_position) if position32 else position == min_position
        if at_min and velocity < 0:
            velocity, velocity32 = 0.0, False
        terminated = _at_least(position, position32, goal_position) and _at_least(velocity, velocity32, goal_velocity)
        reward = 100.0 if terminated else 0.0
        reward -= (np.float64(action) * np.float64(action)) * 0.1  # math.pow of a float32 value: exact
        state[i, 0], state[i, 1], state[i, 2] = F32(position), F32(velocity), 1.0
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


MOUNTAIN_CAR_CONTINUOUS = make_kernel(
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
