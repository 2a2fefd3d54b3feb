"""Acrobot-v1 as a numba batch kernel (see ``shmpool.kernels.builtin``)."""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from gymnasium.envs.classic_control import utils
from gymnasium.envs.classic_control.acrobot import AcrobotEnv

from .common import make_kernel, powf64

# state: theta1, theta2, dtheta1, dtheta2 (any state gymnasium's step augments to float64 first, so a
# float32 one steps as its float64 values do: stored as float64, set_state None)


@numba.njit(cache=True)
def _acrobot_dsdt(m1, m2, l1, lc1, lc2, moi, theta1, theta2, dtheta1, dtheta2, a):  # type: ignore[no-untyped-def]
    """AcrobotEnv._dsdt ("book" dynamics)."""
    two = 2.0
    g = 9.8
    I1 = moi  # noqa: N806 - gymnasium's names
    I2 = moi  # noqa: N806
    d1 = m1 * powf64(lc1, two) + m2 * (powf64(l1, two) + powf64(lc2, two) + 2 * l1 * lc2 * math.cos(theta2)) + I1 + I2
    d2 = m2 * (powf64(lc2, two) + l1 * lc2 * math.cos(theta2)) + I2
    phi2 = m2 * lc2 * g * math.cos(theta1 + theta2 - np.pi / 2.0)
    phi1 = (
        -m2 * l1 * lc2 * powf64(dtheta2, two) * math.sin(theta2)
        - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * math.sin(theta2)
        + (m1 * lc1 + m2 * l1) * g * math.cos(theta1 - np.pi / 2)
        + phi2
    )
    ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * powf64(dtheta1, two) * math.sin(theta2) - phi2) / (
        m2 * powf64(lc2, two) + I2 - powf64(d2, two) / d1
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


ACROBOT = make_kernel(
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
