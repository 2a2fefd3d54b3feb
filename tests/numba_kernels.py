"""A batch kernel of one's own for the numba engine's tests (the protocol of shmpool.kernels), and the
same env in plain Python to compare it with. Imported by tests only where numba is installed."""

from __future__ import annotations

import dataclasses
import math

import gymnasium as gym
import numba
import numpy as np
from gymnasium import spaces

from shmpool.kernels import BatchKernel

OBSERVATIONS = spaces.Box(-math.inf, math.inf, (2,), np.float32)
ACTIONS = spaces.Discrete(3)


@numba.njit(cache=True)
def drift_step(state, params, actions, stepping, observations, rewards, terminations):  # type: ignore[no-untyped-def]
    """A point pushed left, not at all or right by ``speed`` per step; ends beyond ``bound``."""
    for i in range(state.shape[0]):
        if not stepping[i]:
            continue
        speed, bound = params[i, 0], params[i, 1]
        state[i, 1] = speed * (actions[i] - 1)
        state[i, 0] += state[i, 1]
        observations[i, 0], observations[i, 1] = state[i, 0], state[i, 1]
        rewards[i] = -abs(state[i, 0])
        terminations[i] = abs(state[i, 0]) > bound


def drift_reset(rng, params, options, state, observation):  # type: ignore[no-untyped-def]
    """Starts at a uniform position in [-0.5, 0.5), at rest."""
    state[0], state[1] = rng.uniform(-0.5, 0.5), 0.0
    observation[:] = state


DRIFT = BatchKernel(
    observation_space=OBSERVATIONS,
    action_space=ACTIONS,
    state_size=2,
    params={"speed": 0.1, "bound": 1.0},
    step=drift_step,
    reset=drift_reset,
    max_episode_steps=30,
    velocities=(1,),
)


def drift_draw(rng, count):  # type: ignore[no-untyped-def]
    """What ``count`` resets of :func:`drift_reset` draw."""
    return rng.uniform(-0.5, 0.5, size=(count, 1))


@numba.njit(cache=True)
def drift_start(resetting, draws, params, state, observations):  # type: ignore[no-untyped-def]
    """:func:`drift_reset` from its draws, over the rows that reset."""
    for i in range(state.shape[0]):
        if resetting[i]:
            state[i, 0], state[i, 1] = draws[i, 0], 0.0
            observations[i, 0], observations[i, 1] = state[i, 0], 0.0


#: DRIFT whose autoresets run compiled, from resets drawn ahead.
DRIFT_DRAWN = dataclasses.replace(DRIFT, draw=drift_draw, start=drift_start)


class DriftEnv(gym.Env):
    """The same env in plain Python (with ``gym.wrappers.TimeLimit(env, 30)`` for the time limit)."""

    observation_space = OBSERVATIONS
    action_space = ACTIONS

    def __init__(self) -> None:
        self.speed, self.bound = 0.1, 1.0
        self.x = self.v = 0.0

    def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
        super().reset(seed=seed)
        self.x, self.v = self.np_random.uniform(-0.5, 0.5), 0.0
        return np.array([self.x, self.v], np.float32), {}

    def step(self, action):  # type: ignore[no-untyped-def]
        self.v = self.speed * (int(action) - 1)
        self.x += self.v
        return np.array([self.x, self.v], np.float32), -abs(self.x), abs(self.x) > self.bound, False, {}
