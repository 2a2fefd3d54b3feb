"""The built-in hooks' per-step work (``shmpool.hooks``), compiled: each function does one hook's work over a
worker's whole slot in one call, with the numpy version's arithmetic in the same number types and order, so that
both give the same bits.

Random numbers come from the hook's ``EnvStreams`` as numpy makes them: ``noise`` is the stream's whole block,
``(envs, BLOCK, width)``, and ``index`` the step's position in it (no view per step). Arrays with more than one number
per env come as ``(envs, width)`` views. Imported only by hooks that run compiled (it imports numba).
"""

from __future__ import annotations

import numba


@numba.njit(cache=True)
def observation_noise(observations, noise, index, std, rows):  # type: ignore[no-untyped-def]
    """``ObservationNoise``: adds ``noise[row, index] * std[row]`` to the observations at ``rows``.

    The product is float64 and the sum is rounded once, when stored in the observation's type, as
    numpy's ``observations += noise * std`` does (float32 observations are not added in float32)."""
    for row in rows:
        scale = std[row]
        for j in range(observations.shape[1]):
            observations[row, j] += noise[row, index, j] * scale


@numba.njit(cache=True)
def action_noise(actions, noise, index, std, cast):  # type: ignore[no-untyped-def]
    """``ActionNoise``: adds ``noise[i, index] * std[i]`` to the actions of every env ``i``.

    The noise is rounded to the actions' type before the addition, as numpy's ``actions +=
    noise.astype(actions.dtype)`` does: ``cast`` is a one-element array of that type to store it in."""
    for i in range(actions.shape[0]):
        scale = std[i]
        for j in range(actions.shape[1]):
            cast[0] = noise[i, index, j] * scale
            actions[i, j] += cast[0]


@numba.njit(cache=True)
def action_delay(actions, history, count, last_episodes, episodes, delay, max_steps):  # type: ignore[no-untyped-def]
    """``ActionDelay``: records each env's action in its shift register and replaces it with the one
    of ``delay`` steps ago (the episode's first action until the episode has had that many).

    ``history[i, j]`` is env ``i``'s action of ``j`` steps ago and ``history[i, count[i]]`` its
    episode's first action; an env whose episode index differs from ``last_episodes`` starts afresh."""
    lags, width = history.shape[1], actions.shape[1]
    for i in range(actions.shape[0]):
        if episodes[i] != last_episodes[i]:
            count[i] = 0
            last_episodes[i] = episodes[i]
        for lag in range(lags - 1, 0, -1):
            for j in range(width):
                history[i, lag, j] = history[i, lag - 1, j]
        for j in range(width):
            history[i, 0, j] = actions[i, j]
        lag = min(delay[i], count[i])
        for j in range(width):
            actions[i, j] = history[i, lag, j]
        count[i] = min(count[i] + 1, max_steps)


@numba.njit(cache=True)
def reward_scale(rewards, scale):  # type: ignore[no-untyped-def]
    """``RewardScale``: multiplies each env's reward by its scale."""
    for i in range(rewards.shape[0]):
        rewards[i] *= scale[i]


@numba.njit(cache=True)
def perturb_due(  # type: ignore[no-untyped-def]
    due, strengths, strength, step_counts, every, resetting, sent, sent_strength, sent_has_strength
):
    """``Perturb``: marks in ``due`` the envs to kick this step and puts their strength in
    ``strengths``; returns how many are due.

    An env is due every ``every`` steps of its episode (``every`` 0: never) or when an event
    addressed it (``sent``), unless it resets this step. Its strength is the event's
    (``sent_strength`` where ``sent_has_strength``) or else ``strength``."""
    count = 0
    for i in range(due.shape[0]):
        hit = sent[i] or (every > 0 and step_counts[i] > 0 and step_counts[i] % every == 0)
        hit = hit and not resetting[i]
        due[i] = hit
        strengths[i] = sent_strength[i] if sent_has_strength[i] else strength[i]
        if hit:
            count += 1
    return count


@numba.njit(cache=True)
def perturb_kick(state, velocities, noise, index, due, strengths, dims):  # type: ignore[no-untyped-def]
    """``Perturb``'s kick on a kernel's state: adds ``strengths[i]`` times a random sign to each
    velocity column of every due env ``i``, as ``KernelEnv.kick`` adds its ``amounts``.

    Signs come from ``noise`` (uniform numbers: ``< 0.5`` is minus); with ``dims`` 1 every velocity
    gets the first one (numpy broadcasts the one amount), else velocity ``j`` gets number ``j``."""
    for i in range(state.shape[0]):
        if due[i]:
            for j in range(velocities.shape[0]):
                draw = noise[i, index, j if dims > 1 else 0]
                sign = -1.0 if draw < 0.5 else 1.0
                state[i, velocities[j]] += strengths[i] * sign
