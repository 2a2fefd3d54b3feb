"""Where a step's time goes, phase by phase, in the trainer and in each worker.

With ``launch(..., profile=True)`` the calls that make up a step are wrapped, once at launch, with a clock that adds
each call's ``time.perf_counter_ns`` span to a table (the workers' tables live in the segment); ``pool.phase_profile()``
reads them as microseconds per step. Without it nothing is wrapped, so the step pays nothing. The trainer's phases are
per ``step()`` (in async mode per ``send()``, its wait and results those of ``recv()``); the workers' are per step of
each worker, averaged over the workers. Nested phases (``NESTED``) overlap the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

#: The trainer's phases of a step; "own slot" (stepping the envs of its own slot, ``trainer_slot``) is
#: part of "command", "infos" and "episode stats" are parts of "results".
TRAINER_PHASES = ("action check", "command", "own slot", "wait", "results", "infos", "episode stats")
#: A worker's phases of a step; "infos" is part of "env loop" and "episode accounting".
WORKER_PHASES = (
    "events",
    "params sync",
    "draws",
    "before_step",
    "env loop",
    "after_step",
    "episode accounting",
    "infos",
    "whole step",
)
NESTED = {"own slot", "infos", "episode stats", "whole step"}


class PhaseClock:
    """Accumulates the time spent in wrapped calls, per phase, into ``totals`` of shape
    ``(len(phases), 2)``: nanoseconds and calls."""

    def __init__(self, phases: Sequence[str], totals: np.ndarray) -> None:
        self._index = {phase: index for index, phase in enumerate(phases)}
        self._totals = totals

    def instrument(self, owner: Any, attribute: str, phase: str) -> None:
        """Replaces ``owner.attribute`` (a method) by one that times its calls as ``phase``."""
        setattr(owner, attribute, self.timed(getattr(owner, attribute), phase))

    def timed(self, function: Callable[..., Any], phase: str) -> Callable[..., Any]:
        """``function``, timing each call as ``phase``."""
        row = self._totals[self._index[phase]]
        clock = time.perf_counter_ns

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return function(*args, **kwargs)
            finally:
                row[0] += clock() - start
                row[1] += 1

        return timed_call


class PhaseProfile:
    """A pool's phase times since its last reset: the trainer's, timed by wrapping the ``timed``
    calls (owner, method name, phase) of its parts (an owner of None: a part the pool lacks), and the
    workers' (their ``profile`` field)."""

    def __init__(self, worker_totals: np.ndarray, timed: Iterable[tuple[Any, str, str]]) -> None:
        self._trainer_totals = np.zeros((len(TRAINER_PHASES), 2), dtype=np.int64)
        self._worker_totals = worker_totals
        self._since = 0  # the global step of the last reset
        clock = PhaseClock(TRAINER_PHASES, self._trainer_totals)
        for owner, attribute, phase in timed:
            if owner is not None:
                clock.instrument(owner, attribute, phase)

    def restart(self, global_step: int) -> None:
        """Forgets the times so far (at a reset: the workers are idle, they only write theirs during a command)."""
        self._trainer_totals[:] = 0
        self._worker_totals[:] = 0
        self._since = global_step

    def read(self, global_step: int) -> dict[str, dict[str, float]]:
        """Microseconds per step of each phase since the last reset (see ``Pool.phase_profile``)."""
        return {
            "trainer": per_step(self._trainer_totals, TRAINER_PHASES, global_step - self._since),
            "workers": per_worker_step(self._worker_totals),
        }


def per_step(totals: np.ndarray, phases: Sequence[str], steps: int) -> dict[str, float]:
    """Microseconds per step of each phase, from totals of shape ``(len(phases), 2)``."""
    return {phase: float(totals[i, 0]) / 1000.0 / max(1, steps) for i, phase in enumerate(phases)}


def per_worker_step(totals: np.ndarray) -> dict[str, float]:
    """Microseconds per step of each worker phase, from the workers' totals of shape ``(workers,
    len(WORKER_PHASES), 2)``: each worker's time over its own steps (its calls of "whole step"),
    averaged over the workers that stepped. Not over the pool's steps: in async mode a worker steps
    only for the sends that include its slot."""
    whole = WORKER_PHASES.index("whole step")
    steps = totals[:, whole, 1]
    stepped = steps > 0
    if not stepped.any():
        return dict.fromkeys(WORKER_PHASES, 0.0)
    microseconds = (totals[stepped, :, 0] / steps[stepped, None]).mean(axis=0) / 1000.0
    return {phase: float(microseconds[i]) for i, phase in enumerate(WORKER_PHASES)}
