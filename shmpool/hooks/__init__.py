"""Hooks: code that runs inside the workers at fixed points of every step, over a worker's whole slot.

A hook is any picklable object with any of these methods, each taking a ``HookContext``:

- ``before_step(ctx)``: before the slot's envs step; ``ctx.actions`` is writable.
- ``after_step(ctx)``: after they stepped; ``ctx.observations``, ``ctx.rewards``,
  ``ctx.terminations`` and ``ctx.truncations`` are writable (a termination set here ends the
  episode as if the env had ended it).
- ``on_reset(ctx)``: after envs reset outside a step's view: ``pool.reset()`` and same-step
  autoresets; ``ctx.reset_rows`` says which. An env that resets *in place of* a step (next-step
  autoreset, a ``Reset`` event) is in ``ctx.resetting`` during ``before_step`` and its first
  observation is in the rows ``after_step`` sees (with ``ctx.stepped`` False).

and optionally ``params()`` returning ``{name: shmpool.Param}`` declarations that the hook reads
(merged into the pool's parameters unless the user declared the same names), and ``on_launch(ctx)``,
run once per worker when it builds, before any reset or step (to check spaces and make arrays once;
an error there fails the launch). Hooks run once per step per worker, vectorized over the slot, in
the order given to ``launch``; they are shipped to each worker once, at launch (closures work), and
each worker keeps its own copy and its state. A hook's name (its ``name`` attribute, else its class
name) addresses events to it (``pool.events.send``); events due at a step are in ``ctx.events``
during every phase of that step. Every public name is importable from ``shmpool.hooks`` itself.
"""

from __future__ import annotations

from .context import PHASES, HookContext, hook_name
from .delay import ActionDelay
from .noise import ActionNoise, ObservationNoise
from .perturb import Perturb, default_kick
from .resets import Resample, Reset
from .rewards import RewardScale
from .streams import EnvStreams

__all__ = [
    "PHASES",
    "ActionDelay",
    "ActionNoise",
    "EnvStreams",
    "HookContext",
    "ObservationNoise",
    "Perturb",
    "Resample",
    "Reset",
    "RewardScale",
    "default_kick",
    "hook_name",
]
