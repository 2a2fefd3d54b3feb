"""Pushes: kicks to the envs' velocities, every few steps and on events (``Perturb``), and the
kick each env family's adapter knows (``default_kick``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..env_families import adapter_for
from ..params import Param
from .compiled import _compiled_functions
from .context import HookContext
from .param_hook import ParamHook


def default_kick(env: Any) -> Callable[[np.ndarray], None]:
    """``env``'s own kick, from its family's adapter (``shmpool.env_families``): a function adding
    ``amounts`` to its velocities; ``TypeError`` if its adapter knows none."""
    adapter = adapter_for(env)
    kick = adapter.kicker(env)
    if kick is None:
        raise TypeError(
            f"Perturb has no default kick for {type(env.unwrapped).__name__} (no adapter in shmpool.env_families "
            f"knows its velocities); give it a kick function kick(env, amounts)"
        )
    return kick


class Perturb(ParamHook):
    """Kicks envs: every ``every`` steps of each episode and/or when it receives an event.

    The kick adds ``strength`` (the parameter ``param``, per env; an event's payload[0] overrides it) times a random
    sign, per dimension (``dims``), to each velocity of the env (its adapter's default kick: classic control adds to
    the velocity entries of its state) or calls ``kick(env, amounts)``: for MuJoCo envs ``shmpool.mujoco.Push("torso")``
    applies a force for one step (``dims=3``) or changes the body's velocity. A kick with a ``clear(env)`` method is
    cleared after the step. An env whose step is a reset (next-step autoreset) is not kicked: it takes no physics step
    to push, and a push carried into its new episode would land where nobody sent it.

    ``compiled`` applies to ``engine="numba"`` only: the default kick of a kernel that declares its ``velocities`` runs
    compiled over the slot's state array (None or True; True fails the launch for a ``kick`` function, a kernel's own
    ``kick`` or no velocities); False kicks env by env, as ``engine="python"`` always does. Both give the same bits.
    """

    def __init__(
        self,
        strength: float = 0.0,
        *,
        every: int | None = None,
        param: str = "perturb_strength",
        kick: Callable[[Any, np.ndarray], None] | None = None,
        dims: int = 2,
        name: str | None = None,
        compiled: bool | None = None,
    ) -> None:
        if every is not None and every < 1:
            raise ValueError(f"Perturb(every=...) must be >= 1, got {every}")
        super().__init__("Perturb", param=param, name=name, compiled=compiled)
        self.strength, self.every = strength, every
        self.kick = kick  # None: each env's default kick
        self.dims = dims
        self._kicked: list[int] = []  # the rows last kicked: a kick with ``clear`` is cleared after its step
        self._defaults: dict[int, tuple[Any, Callable[[np.ndarray], None]]] = {}  # row -> (env, its kick)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_defaults"] = {}  # per-env closures: found again where the hook runs
        return state

    def _default_kick(self, row: int, env: Any) -> Callable[[np.ndarray], None]:
        """The default kick of the env at ``row``, found once per env (again if it was re-made)."""
        found = self._defaults.get(row)
        if found is None or found[0] is not env:
            found = self._defaults[row] = (env, default_kick(env))
        return found[1]

    def _declaration(self) -> Param:
        """The kick strength (``>= 0``)."""
        return Param(self.strength, low=0.0, bind=False)

    def _misfit(self, kernel: Any) -> str | None:
        """Why the compiled kick cannot kick ``kernel``'s envs (None: it can)."""
        if self.kick is not None:
            return "it kicks with a kick function, which runs per env in Python"
        if kernel.kick is not None:
            return "the kernel kicks with its own Python kick"
        count = len(kernel.velocities)
        if not count:
            return "the kernel declares no velocities"
        if self.dims != 1 and self.dims < count:
            return f"dims={self.dims} gives fewer amounts than the kernel's {count} velocities"
        return None

    def on_launch(self, ctx: HookContext) -> None:
        """Finds each env's default kick now (an env with none fails the launch, not a step hours
        later); with ``engine="numba"``, to kick compiled, makes the arrays and compiles now."""
        # A kick function would write an env's MjData, which the batch never reads (Push writes the batch).
        if ctx.engine == "mujoco" and self.kick is not None and not getattr(self.kick, "writes_the_batch", False):
            raise ValueError(
                f"engine='mujoco' steps the physics in a batch, where a kick function's writes to an env's "
                f"MjData are lost: kick with shmpool.mujoco.Push (it writes the batch), or use engine='python' "
                f"(got kick={self.kick!r:.80})"
            )
        if ctx.engine != "numba":  # envs are Python objects: kicked one by one, whatever ``compiled`` says
            if self.kick is None:
                for row, env in enumerate(ctx.envs):
                    self._default_kick(row, env)
            return
        functions = _compiled_functions(self, ctx, self._misfit(ctx.kernel))
        if functions is None:
            return
        count = len(ctx.env_ids)
        streams = self._make_streams(ctx, (self.dims,), "uniform")
        due, sent, sent_has_strength = (np.zeros(count, dtype=np.bool_) for _ in range(3))
        strengths, sent_strength = np.zeros(count), np.zeros(count)
        strength, every = ctx.applied[self.param], self.every or 0  # type: ignore[index]
        velocities = np.array(ctx.kernel.velocities, dtype=np.int64)
        # Compiles (or loads) both now, for the numba engine's step counts and resets (int64 and
        # bool arrays of the slot's length): none due, so nothing is kicked.
        step_counts, resetting = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.bool_)
        functions.perturb_due(
            due, strengths, strength, step_counts, every, resetting, sent, sent_strength, sent_has_strength
        )
        functions.perturb_kick(ctx.state, velocities, streams.values, 0, due, strengths, self.dims)
        self._compiled = (
            (functions.perturb_due, strength, every, sent, sent_strength, sent_has_strength, due, strengths),
            (functions.perturb_kick, ctx.state, velocities, streams),
        )

    def _kick_compiled(self, ctx: HookContext, compiled: tuple[Any, ...], step_counts: Any, resetting: Any) -> None:
        """The compiled kick: finds the due envs and kicks them, over the slot's arrays."""
        (find_due, strength, every, sent, sent_strength, sent_has, due, strengths), kick = compiled
        events = ctx.events
        for event in events:  # rare: marked in the arrays the compiled function reads, cleared after
            rows = ctx.rows(event.env_ids)
            sent[rows] = True
            if event.payload.size:
                sent_strength[rows], sent_has[rows] = event.payload[0], True
        found = find_due(due, strengths, strength, step_counts, every, resetting, sent, sent_strength, sent_has)
        if events:
            sent[:], sent_has[:] = False, False
        if found:
            function, state, velocities, streams = kick
            function(state, velocities, streams.values, streams.index(ctx.global_step), due, strengths, self.dims)

    def before_step(self, ctx: HookContext) -> None:
        """Kicks the envs that are due or addressed by an event, before they step."""
        compiled = self._compiled
        if compiled is not None:
            self._kick_compiled(ctx, compiled, ctx.step_counts, ctx.resetting)
            return
        due = [] if self.every is None else ctx.due_every(self.every).tolist()
        if not due and not ctx.events:  # the common step: nothing due, no event
            return
        strength = self._sent(ctx)
        if due:
            default = ctx.applied[self.param]  # type: ignore[index]
            for row in due:
                strength.setdefault(row, default[row])
        resetting = ctx.resetting
        self._kick(ctx, [row for row in sorted(strength) if not resetting[row]], strength)

    def _sent(self, ctx: HookContext) -> dict[int, Any]:
        """The rows that this step's events address, each with its strength: the last payload sent to
        it, else its parameter's value."""
        strength: dict[int, Any] = {}
        start, default = int(ctx.env_ids[0]), ctx.applied[self.param]  # type: ignore[index]
        for event in ctx.events:
            payload = event.payload
            for env_id in event.env_ids.tolist():  # the slot's own envs: the reader keeps no other
                row = env_id - start
                if payload.size:
                    strength[row] = payload[0]
                elif row not in strength:
                    strength[row] = default[row]
        return strength

    def _kick(self, ctx: HookContext, rows: list[int], strength: dict[int, Any]) -> None:
        """Kicks the envs at ``rows`` (ascending), each by ``strength[row]`` times its random signs."""
        if not rows:
            return
        streams = self._streams if self._streams is not None else self._make_streams(ctx, (self.dims,), "uniform")
        draws, kick = streams.at(ctx.global_step), self.kick
        for row in rows:
            amounts = strength[row] * np.where(draws[row] < 0.5, -1.0, 1.0)
            if kick is None:
                self._default_kick(row, ctx.envs[row])(amounts)
            else:
                kick(ctx.envs[row], amounts)
        self._kicked = rows

    def after_step(self, ctx: HookContext) -> None:
        """Ends kicks that last one step (a MuJoCo force) once that step is done."""
        clear = getattr(self.kick, "clear", None)
        if clear is not None and len(self._kicked):
            for row in self._kicked:
                clear(ctx.envs[row])
            self._kicked = []
