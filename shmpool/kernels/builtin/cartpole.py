"""CartPole-v1 as a numba batch kernel (see ``shmpool.kernels.builtin``)."""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from gymnasium.envs.classic_control import utils
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from .common import make_kernel, set_float64_state

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


@numba.njit(cache=True)
def cartpole_refresh(params: np.ndarray) -> None:
    """CartPoleEnv.__init__'s ``total_mass`` and ``polemass_length``, from ``masscart``, ``masspole``
    and ``length``, in every row of ``params`` (compiled: a curriculum may run it every step)."""
    for i in range(params.shape[0]):
        params[i, 8] = params[i, 2] + params[i, 1]
        params[i, 9] = params[i, 2] * params[i, 3]


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
    """The draws of ``count`` option-less resets of ``cartpole_reset``."""
    return rng.uniform(low=-0.05, high=0.05, size=(count, 4))


@numba.njit(cache=True)
def cartpole_start(resetting, draws, params, state, observations):  # type: ignore[no-untyped-def]
    """``cartpole_reset`` without options, from its draws, over the rows that reset."""
    for i in range(state.shape[0]):
        if resetting[i]:
            for j in range(4):
                state[i, j] = draws[i, j]
                observations[i, j] = draws[i, j]
            state[i, 4] = -1.0


CARTPOLE = make_kernel(
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
    refresh_outputs=("total_mass", "polemass_length"),
    state_columns=4,
    set_state=set_float64_state,
)
