"""Pendulum-v1 as a numba batch kernel (see ``shmpool.kernels.builtin``)."""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from gymnasium.envs.classic_control import utils
from gymnasium.envs.classic_control.pendulum import DEFAULT_X, DEFAULT_Y, PendulumEnv

from .common import F32, make_kernel, powf32, powf64, set_float64_state

# state: th, thdot


@numba.njit(cache=True)
def pendulum_step(state, params, actions, stepping, observations, rewards, terminations):  # type: ignore[no-untyped-def]
    """PendulumEnv.step over the rows that step."""
    two, two32 = 2.0, F32(2.0)
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
        if u < F32(-max_torque):
            u = F32(-max_torque)
        if u > F32(max_torque):
            u = F32(max_torque)
        normalized = ((th + np.pi) % (2 * np.pi)) - np.pi
        costs = powf64(normalized, two) + 0.1 * powf64(thdot, two) + np.float64(F32(0.001) * powf32(u, two32))
        torque = F32(3.0 / (m * powf64(l, two))) * u  # a Python float times a float32: float32
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


PENDULUM = make_kernel(
    "Pendulum-v1",
    PendulumEnv(),
    ["max_speed", "max_torque", "dt", "g", "m", "l"],
    also=("last_u",),  # the last torque, which only rendering reads
    state_size=2,
    step=pendulum_step,
    reset=pendulum_reset,
    velocities=(1,),
    constructor=("g",),
    set_state=set_float64_state,
)
