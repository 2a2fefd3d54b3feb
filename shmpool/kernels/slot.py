"""The numba engine's per-step bookkeeping around a kernel, compiled: the time limit, the episode
sums, and accepting rewritten scalar parameters. Each replaces a handful of numpy calls whose fixed
cost (about a microsecond each) would otherwise outweigh the kernel itself. Imported by the workers of
the numba engine only (it imports numba)."""

from __future__ import annotations

import numba
import numpy as np

from ..protocol.compiled import compiler_fence
from ..protocol.words import W_PARAMS_GENERATION


@numba.njit(cache=True)
def time_limit(elapsed, stepping, limits, truncations, stepped):  # type: ignore[no-untyped-def]
    """gymnasium's ``TimeLimit`` over the slot: counts the steps of the rows that stepped and sets
    their truncations once the count reaches the row's limit (``limits[i]``, one per env as each
    ``TimeLimit`` has its own ``_max_episode_steps``; ``shmpool.kernels.NO_LIMIT``: none); records
    which rows stepped."""
    for i in range(elapsed.shape[0]):
        stepped[i] = stepping[i]
        if stepping[i]:
            elapsed[i] += 1
            truncations[i] = elapsed[i] >= limits[i]
        else:
            truncations[i] = False


@numba.njit(cache=True)
def add_step(stepped, rewards, terminations, truncations, returns, lengths, ended):  # type: ignore[no-untyped-def]
    """Adds the step to each stepped env's episode (return and length) and marks in ``ended`` the
    episodes that ended; returns how many ended."""
    count = 0
    for i in range(stepped.shape[0]):
        ended[i] = False
        if stepped[i]:
            returns[i] += rewards[i]
            lengths[i] += 1
            if terminations[i] or truncations[i]:
                ended[i] = True
                count += 1
    return count


@numba.njit(cache=True)
def accept_scalars(  # type: ignore[no-untyped-def]
    new, seen, good, words, low, high, step, targets, applied_words, matrix, applied, refreshes, touched
):
    """The Python engine's rule for plain float64 parameters, over records seen as ``(envs, words)`` float64 matrices
    (every field 8 bytes): a value that changed (bitwise) since ``seen`` and is finite and within ``[low, high]``
    becomes the env's ``good`` value and, for a ``step`` parameter, is applied: to its column ``targets[p]`` of the
    kernel's ``matrix`` (-1: none, a value only hooks read) and to its word ``applied_words[p]`` of ``applied``;
    ``touched[i]`` says whether env ``i`` had one applied for which ``refreshes[p]`` (the kernel's ``refresh`` must
    follow). ``words[w]`` is the parameter ``p`` at record word ``w``, -1 for words of other parameters. Returns False,
    having changed nothing, if a value is refused or another parameter changed (the caller's general path handles
    those)."""
    new_bits, seen_bits = new.view(np.int64), seen.view(np.int64)
    rows, width = new.shape
    touched[:] = False
    for i in range(rows):
        for w in range(width):
            if new_bits[i, w] != seen_bits[i, w]:
                p = words[w]
                if p < 0:
                    return False
                value = new[i, w]
                if not (np.isfinite(value) and low[p] <= value <= high[p]):
                    return False
    for i in range(rows):
        for w in range(width):
            if new_bits[i, w] != seen_bits[i, w]:
                p = words[w]
                value = new[i, w]
                good[i, w] = value
                if step[p]:
                    if targets[p] >= 0:
                        matrix[i, targets[p]] = value
                    applied[i, applied_words[p]] = value
                    if refreshes[p]:
                        touched[i] = True
    return True


#: ``sync_scalars``' results besides 0 (nothing changed) and 1 + the rows touched: a value the general
#: path must handle (refused, or of another parameter); a write in flight (the general path's
#: seqlock read keeps what it had for the rows being written).
REFUSED, TORN = -1, -2


@numba.njit(cache=True)
def sync_scalars(  # type: ignore[no-untyped-def]
    block,
    fresh,
    seen,
    writers,
    good,
    words,
    low,
    high,
    step,
    targets,
    applied_words,
    matrix,
    applied,
    refreshes,
    touched,
):
    """``shmpool.workers.param_applier.ParamApplier.sync`` for a slot of plain float64 parameters in
    one call: copies the slot's shared ``block`` into ``fresh`` between two reads of the writers'
    generation word (the seqlock's fast path), then, if some value changed since ``seen``, accepts
    them as ``accept_scalars`` does and makes ``seen`` the fresh copy. Returns 0 when nothing
    changed, 1 + the number of rows ``touched``, or REFUSED or TORN having changed nothing."""
    generation = writers[W_PARAMS_GENERATION]
    if generation & 1:
        return TORN
    compiler_fence()
    rows, width = block.shape
    for i in range(rows):
        for w in range(width):
            fresh[i, w] = block[i, w]
    compiler_fence()
    if writers[W_PARAMS_GENERATION] != generation:
        return TORN
    fresh_bits, seen_bits = fresh.view(np.int64), seen.view(np.int64)
    changed = False
    for i in range(rows):
        for w in range(width):
            if fresh_bits[i, w] != seen_bits[i, w]:
                changed = True
                break
        if changed:
            break
    if not changed:
        return 0
    if not accept_scalars(
        fresh, seen, good, words, low, high, step, targets, applied_words, matrix, applied, refreshes, touched
    ):
        return REFUSED
    count = 0
    for i in range(rows):
        for w in range(width):
            seen[i, w] = fresh[i, w]
        if touched[i]:
            count += 1
    return 1 + count


@numba.njit(cache=True)
def end_episodes(ended, returns, lengths, starts, now, episode_return, episode_length, episode_time, needs_reset):  # type: ignore[no-untyped-def]
    """Publishes the return, length and time (seconds since ``starts``, to the microsecond) of the
    episodes that ``ended``, and marks those envs for a reset at their next step."""
    for i in range(ended.shape[0]):
        if ended[i]:
            episode_return[i] = returns[i]
            episode_length[i] = lengths[i]
            episode_time[i] = np.round(now - starts[i], 6)
            needs_reset[i] = True


@numba.njit(cache=True)
def restart(  # type: ignore[no-untyped-def]
    needs_reset,
    restarting,
    cursor,
    draws,
    current,
    now,
    returns,
    lengths,
    starts,
    episode_index,
    elapsed,
    rewards,
    terminations,
    truncations,
):
    """Starts the next episode of every env due for a reset that has a drawn reset left: moves its
    next draw (``draws[i, cursor[i]]``) to ``current[i]`` for the kernel's ``start``, marks it in
    ``restarting``, and clears its episode sums, time limit and step results, as a reset in Python
    does. Returns how many envs due for a reset had no draw left (still marked in ``needs_reset``)
    and how many used their last draw."""
    left = exhausted = 0
    size = draws.shape[1]
    for i in range(needs_reset.shape[0]):
        restarting[i] = False
        if not needs_reset[i]:
            continue
        if cursor[i] >= size:
            left += 1
            continue
        current[i, :] = draws[i, cursor[i]]
        cursor[i] += 1
        if cursor[i] >= size:
            exhausted += 1
        needs_reset[i] = False
        restarting[i] = True
        returns[i] = 0.0
        lengths[i] = 0
        starts[i] = now
        episode_index[i] += 1
        elapsed[i] = 0
        rewards[i] = 0.0
        terminations[i] = False
        truncations[i] = False
    return left, exhausted


@numba.njit(cache=True)
def record_episodes(ended, first_env, episode_index, step, returns, lengths, terminations, truncations, ring, head):  # type: ignore[no-untyped-def]
    """Writes the record of each episode that ``ended`` (``shmpool.episodes.episode_dtype`` without
    parameters or metrics) into ``ring`` from position ``head`` on; returns how many (the caller
    publishes them after)."""
    capacity, count = ring.shape[0], 0
    for i in range(ended.shape[0]):
        if ended[i]:
            at = (head + count) % capacity
            ring[at]["env_id"] = first_env + i
            ring[at]["episode"] = episode_index[i]
            ring[at]["step"] = step
            ring[at]["return"] = returns[i]
            ring[at]["length"] = lengths[i]
            ring[at]["terminated"] = terminations[i]
            ring[at]["truncated"] = truncations[i]
            count += 1
    return count
