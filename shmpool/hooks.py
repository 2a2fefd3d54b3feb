"""Hooks: code that runs inside the workers at fixed points of every step, over a worker's whole slot.

A hook is any picklable object with any of these methods, each taking a :class:`HookContext`:

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
each worker keeps its own copy and its state.

A hook's name (its ``name`` attribute, else its class name) addresses events to it: see
``pool.events.send``. Events due at a step are in ``ctx.events`` during every phase of that step.

The built-in hooks below each read a declared parameter per env, so a curriculum can change their
strength per env while training runs. Their randomness comes from per-env streams keyed by the pool
seed, so a run is the same whatever the number of workers. They make their arrays once, in
``on_launch``, and do a step's work over the whole slot: in numpy, or in one call of a numba-compiled
function (:mod:`shmpool.kernels.hooks`). ``compiled=None`` (the default) runs the compiled version
with ``engine="numba"`` and numpy's with ``engine="python"``; ``compiled=True`` runs it on either
engine (``Perturb``: on the numba engine only) and needs ``pip install "shmpool[numba]"`` (the hook
says so when made); ``compiled=False`` runs numpy's. A compiled version that cannot take the pool's
spaces runs numpy's instead, or fails the launch with ``compiled=True``. Both versions read the
same per-env streams and round as numpy does, so they give the same results bit for bit; the
compiled one is compiled when the worker builds (or loaded from numba's cache), never at a step.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium import spaces

from .adapters import adapter_for
from .events import Event
from .kernels import NUMBA_EXTRA
from .params import Param
from .spaces import is_leaf, leaves


class HookContext:
    """What a hook sees: numpy views of its worker's slot, and the slot's envs.

    Attributes:
        env_ids: the pool-wide ids of the slot's envs (row ``i`` of every array is env ``env_ids[i]``).
        envs: the slot's gymnasium envs, for physics-level hooks.
        actions: in ``before_step``, the slot's actions (a writable copy; structured like the action
            space for Dict/Tuple spaces); None in the other phases.
        observations, rewards, terminations, truncations: the slot's rows of the results.
        resetting: in ``before_step``, which envs reset instead of stepping this step (those that
            hooks earlier in the chain asked to reset included).
        stepped: in ``after_step``, which envs stepped (False: they reset this step instead).
        reset_rows: in ``on_reset``, the rows of the envs that just reset.
        params: the slot's parameter records as the worker last read them whole and accepted them
            (read-only; never a half-written record); None without params.
        applied: the slot's rows of the applied block (None without params).
        step_counts: steps taken in the current episode, per env.
        episode_indices: the index of the current episode, per env.
        global_step: the index of the current step of the pool (0 for the first step).
        rng: a ``numpy.random.Generator`` per worker, seeded from the pool seed and the worker id.
        seed: the pool's seed.
        events: the events addressed to the running hook and due this step.
        observation_space, action_space: one env's spaces.
        engine: the engine stepping the slot: ``"python"`` or ``"numba"``.
        kernel: with ``engine="numba"``, the slot's ``shmpool.kernels.BatchKernel``; else None.
        state: with ``engine="numba"``, the slot's kernel state, ``(envs, kernel.state_size)``
            float64 (row ``i`` is ``envs[i].state``); else None.
    """

    env_ids: np.ndarray
    envs: list[Any]
    actions: Any
    observations: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    reset_rows: np.ndarray
    params: np.ndarray | None
    applied: np.ndarray | None
    episode_indices: np.ndarray
    global_step: int
    rng: np.random.Generator
    seed: int
    events: list[Event]
    action_space: spaces.Space[Any]
    observation_space: spaces.Space[Any]
    engine: str = "python"
    kernel: Any = None
    state: np.ndarray | None = None

    def __init__(
        self, request_reset: Callable[[np.ndarray], None], resample: Callable[[list[str], np.ndarray], None]
    ) -> None:
        self._request_reset = request_reset
        self._resample = resample
        self.events = []
        self.begin_phase([], [], [])

    def begin_phase(self, lengths: list[int], resetting: list[bool], stepped: list[bool]) -> None:
        """Sets the per-env flags of the coming phase; they become arrays only if a hook reads them."""
        self._lists = (lengths, resetting, stepped)
        self._arrays: dict[int, np.ndarray] = {}

    def _array(self, which: int) -> np.ndarray:
        array = self._arrays.get(which)
        if array is None:
            array = self._arrays[which] = np.array(self._lists[which])
        return array

    @property
    def step_counts(self) -> np.ndarray:
        """Steps taken in the current episode, per env."""
        return self._array(0)

    @property
    def resetting(self) -> np.ndarray:
        """In ``before_step``: which envs reset instead of stepping this step (those that hooks earlier
        in the chain asked to reset included: read it again after ``request_reset``)."""
        return self._array(1)

    @property
    def stepped(self) -> np.ndarray:
        """In ``after_step``: which envs stepped (False: they reset this step instead)."""
        return self._array(2)

    def rows(self, env_ids: np.ndarray) -> np.ndarray:
        """The rows of the slot's arrays that hold the given pool-wide env ids."""
        return np.asarray(env_ids) - self.env_ids[0]

    def request_reset(self, rows: np.ndarray) -> None:
        """In ``before_step``: reset the envs at ``rows`` instead of stepping them this step."""
        self._request_reset(np.asarray(rows))
        self._arrays.pop(1, None)  # the flags changed: the next read of ``resetting`` shows the new resets

    def resample(self, names: list[str], rows: np.ndarray) -> None:
        """Draws new values of the named ``dist`` parameters for the envs at ``rows``, now."""
        self._resample(list(names), np.asarray(rows))


PHASES = ("before_step", "after_step", "on_reset")


def hook_name(hook: Any) -> str:
    """The name that events use to address ``hook``."""
    return str(getattr(hook, "name", None) or type(hook).__name__)


class EnvStreams:
    """Per-env random numbers indexed by global step: env ``e`` at step ``s`` gets the same numbers
    whichever worker runs it. Each env has its own generator (seeded from the pool seed, the stream's
    name and the env id) that fills blocks of steps ahead, so a step costs one array index."""

    BLOCK = 64

    def __init__(self, seed: int, name: str, env_ids: np.ndarray, shape: tuple[int, ...], kind: str) -> None:
        # The whole name keys the stream: names sharing a prefix must not share numbers.
        digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
        stream = int.from_bytes(digest, "little") & ((1 << 62) - 1)
        self._generators = [np.random.default_rng([seed % (1 << 63), stream, int(e)]) for e in env_ids]
        if kind not in ("normal", "uniform"):
            raise ValueError(f"kind must be 'normal' or 'uniform', got {kind!r}")
        self._normal = kind == "normal"
        self._shape = shape
        self._block = -1
        self._values = np.zeros((len(env_ids), self.BLOCK, *shape))

    @property
    def values(self) -> np.ndarray:
        """The current block, ``(envs, BLOCK, *shape)``: always this array, refilled in place."""
        return self._values

    def index(self, step: int) -> int:
        """Makes the block holding global step ``step`` the current one; returns the step's index in it."""
        block = step // self.BLOCK
        while self._block < block:  # blocks are made in order, so skipping steps changes nothing
            self._block += 1
            for row, generator in enumerate(self._generators):
                size = (self.BLOCK, *self._shape)
                self._values[row] = generator.standard_normal(size) if self._normal else generator.random(size)
        return step % self.BLOCK

    def at(self, step: int) -> np.ndarray:
        """The numbers of shape ``(envs, *shape)`` for global step ``step``."""
        return self._values[:, self.index(step)]


def _box_leaf(space: spaces.Space[Any], what: str, hook: str) -> spaces.Box:
    if not isinstance(space, spaces.Box) or space.dtype.kind != "f":
        raise TypeError(f"{hook} needs a float Box {what} space, got {space}")
    return space


#: The dtypes the compiled hooks take: numba's number types (float16 is not one).
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_NUMBERS = (np.dtype(np.bool_), *map(np.dtype, np.typecodes["AllInteger"]), *_FLOATS)


def _numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None


def _checked_compiled(hook: str, compiled: bool | None) -> bool | None:
    """A built-in hook's ``compiled`` argument, checked when the hook is made: True needs numba."""
    if compiled is not None and not isinstance(compiled, (bool, np.bool_)):
        raise TypeError(f"{hook}(compiled=...) must be True, False or None, got {compiled!r}")
    if compiled and not _numba_installed():
        raise ImportError(f"{hook}(compiled=True) needs numba, which is not installed: {NUMBA_EXTRA}")
    return None if compiled is None else bool(compiled)


def _compiled_functions(hook: Any, ctx: HookContext, misfit: str | None) -> ModuleType | None:
    """:mod:`shmpool.kernels.hooks` if ``hook`` runs compiled in this worker, else None (numpy).

    ``misfit`` says why the compiled version cannot take this pool (None: it can); then
    ``compiled=None`` runs numpy's version and ``compiled=True`` fails the launch."""
    if not (hook.compiled if hook.compiled is not None else ctx.engine == "numba"):
        return None
    if misfit is not None:
        if hook.compiled:
            raise TypeError(f"{hook.name}(compiled=True) cannot run compiled: {misfit}; use compiled=False")
        return None
    from .kernels import hooks as functions  # imports numba: only in workers that run compiled hooks

    return functions


def _width(shape: tuple[int, ...]) -> int:
    """Numbers per env in an array of per-env ``shape``: the columns of its ``(envs, width)`` view."""
    return int(np.prod(shape, dtype=np.int64))


class ObservationNoise:
    """Adds Gaussian noise to observations; std per env from the parameter ``param``.

    Float Box observation spaces; noise is added to observations after each step and after resets.
    ``compiled``: None (compiled with ``engine="numba"``), True or False; see the module docstring.
    """

    def __init__(
        self,
        std: float = 0.0,
        *,
        param: str = "observation_noise",
        name: str | None = None,
        compiled: bool | None = None,
    ) -> None:
        self.std, self.param, self.name = std, param, name or "ObservationNoise"
        self.compiled = _checked_compiled("ObservationNoise", compiled)
        self._streams: EnvStreams | None = None
        self._compiled: tuple[Any, ...] | None = None  # the compiled function and its arrays

    def params(self) -> dict[str, Param]:
        """Declares the noise std (``>= 0``)."""
        return {self.param: Param(self.std, low=0.0, bind=False)}

    def on_launch(self, ctx: HookContext) -> None:
        """Checks the space, makes the noise streams and, to run compiled, compiles now."""
        streams = self._make_streams(ctx)
        observations = ctx.observations
        misfit = None
        if observations.dtype not in _FLOATS or not observations.flags.c_contiguous:
            misfit = f"observations of dtype {observations.dtype} (it takes contiguous float32 or float64 ones)"
        functions = _compiled_functions(self, ctx, misfit)
        if functions is None:
            return
        count = len(observations)
        std = ctx.applied[self.param]  # type: ignore[index]
        function, rows = functions.observation_noise, np.arange(count)
        observations = observations.reshape(count, -1)  # a view: the array is contiguous
        noise = streams.values.reshape(count, EnvStreams.BLOCK, -1)
        function(observations, noise, 0, std, rows[:0])  # compiles (or loads) it now; no rows: changes nothing
        self._compiled = (function, observations, noise, std, rows)

    def _make_streams(self, ctx: HookContext) -> EnvStreams:
        box = _box_leaf(ctx.observation_space, "observation", self.name)
        self._streams = EnvStreams(ctx.seed, self.name, ctx.env_ids, box.shape, "normal")
        self._std_shape = (-1,) + (1,) * len(box.shape)
        self._std = ctx.applied[self.param].reshape(self._std_shape)  # type: ignore[index]
        return self._streams

    def _add_noise(self, ctx: HookContext, rows: np.ndarray | None) -> None:
        """Adds noise to the observations at ``rows`` (None: every row)."""
        streams, compiled = self._streams, self._compiled
        assert streams is not None  # made by on_launch
        if compiled is not None:
            function, observations, noise, std, every_row = compiled
            function(observations, noise, streams.index(ctx.global_step), std, every_row if rows is None else rows)
            return
        std, noise = self._std, streams.at(ctx.global_step)
        if rows is None:
            ctx.observations += noise * std
        else:
            ctx.observations[rows] += noise[rows] * std[rows]

    def after_step(self, ctx: HookContext) -> None:
        """Noise on every observation of the step (first observations of envs that reset included)."""
        self._add_noise(ctx, None)

    def on_reset(self, ctx: HookContext) -> None:
        """Noise on the first observations of envs reset by ``pool.reset()`` or a same-step autoreset."""
        self._add_noise(ctx, ctx.reset_rows)


class ActionNoise:
    """Adds Gaussian noise to actions before the envs step; std per env from ``param``.

    Float Box action spaces; envs clip to their bounds as usual. ``compiled``: None (compiled with
    ``engine="numba"``), True or False; see the module docstring.
    """

    def __init__(
        self, std: float = 0.0, *, param: str = "action_noise", name: str | None = None, compiled: bool | None = None
    ) -> None:
        self.std, self.param, self.name = std, param, name or "ActionNoise"
        self.compiled = _checked_compiled("ActionNoise", compiled)
        self._streams: EnvStreams | None = None
        self._compiled: tuple[Any, ...] | None = None  # the compiled function and its arrays

    def params(self) -> dict[str, Param]:
        """Declares the noise std (``>= 0``)."""
        return {self.param: Param(self.std, low=0.0, bind=False)}

    def on_launch(self, ctx: HookContext) -> None:
        """Checks the space, makes the noise streams and, to run compiled, compiles now."""
        streams = self._make_streams(ctx)
        dtype = np.dtype(ctx.action_space.dtype)
        misfit = None if dtype in _FLOATS else f"actions of dtype {dtype} (it takes float32 or float64 ones)"
        functions = _compiled_functions(self, ctx, misfit)
        if functions is None:
            return
        count, width = len(ctx.env_ids), _width(ctx.action_space.shape)  # type: ignore[arg-type]
        function, std, cast = functions.action_noise, ctx.applied[self.param], np.zeros(1, dtype)  # type: ignore[index]
        noise = streams.values.reshape(count, EnvStreams.BLOCK, width)
        # A step's actions are a fresh (envs, width) array of the space's dtype: compiled for that now.
        function(np.zeros((0, width), dtype), noise, 0, std, cast)
        self._compiled = (function, noise, std, cast)

    def _make_streams(self, ctx: HookContext) -> EnvStreams:
        box = _box_leaf(ctx.action_space, "action", self.name)
        self._streams = EnvStreams(ctx.seed, self.name, ctx.env_ids, box.shape, "normal")
        return self._streams

    def before_step(self, ctx: HookContext) -> None:
        """Noise on this step's actions."""
        streams, actions, compiled = self._streams, ctx.actions, self._compiled
        assert streams is not None  # made by on_launch
        if compiled is not None:
            function, noise, std, cast = compiled
            rows = actions if actions.ndim == 2 else actions.reshape(len(actions), -1)  # a view: a fresh copy
            function(rows, noise, streams.index(ctx.global_step), std, cast)
            return
        std = ctx.applied[self.param]  # type: ignore[index]
        noise = streams.at(ctx.global_step) * std.reshape(-1, *([1] * (actions.ndim - 1)))
        actions += noise.astype(actions.dtype)


class ActionDelay:
    """Delays each env's actions by ``param`` steps (an int per env, up to ``max_steps``).

    Until an episode has had that many actions, the env repeats the episode's first action: with a
    delay of 2 an env receives a0, a0, a0, a1, a2, ... Array action spaces (Box, Discrete,
    MultiDiscrete, MultiBinary). ``compiled``: None (compiled with ``engine="numba"``), True or
    False; see the module docstring.
    """

    def __init__(
        self,
        steps: int = 1,
        *,
        max_steps: int | None = None,
        param: str = "action_delay",
        name: str | None = None,
        compiled: bool | None = None,
    ) -> None:
        self.steps, self.param, self.name = int(steps), param, name or "ActionDelay"
        self.max_steps = int(max_steps if max_steps is not None else steps)
        if not 0 <= self.steps <= self.max_steps:
            raise ValueError(f"ActionDelay needs 0 <= steps <= max_steps, got {steps}, {max_steps}")
        self.compiled = _checked_compiled("ActionDelay", compiled)
        self._history = np.zeros(0)
        self._count = np.zeros(0, dtype=np.int64)
        self._episodes = np.zeros(0, dtype=np.int64)  # each env's episode index at its last action
        self._episodes_seen = b""  # the same as bytes
        self._delay = np.zeros(0, dtype=np.int64)  # each env's delay: its column of ``applied``, found at launch
        self._compiled: tuple[Any, ...] | None = None  # the compiled function and its arrays

    def params(self) -> dict[str, Param]:
        """Declares the delay in steps (an int in ``[0, max_steps]``)."""
        return {self.param: Param(self.steps, low=0, high=self.max_steps, dtype="int64", bind=False)}

    def on_launch(self, ctx: HookContext) -> None:
        """Checks the space, makes the shift registers and, to run compiled, compiles now."""
        if not is_leaf(ctx.action_space):
            raise TypeError(f"{self.name} needs an array action space (Box, Discrete, MultiDiscrete, MultiBinary)")
        (leaf,) = leaves(ctx.action_space)
        count, width = len(ctx.env_ids), _width(leaf.shape)
        self._history = np.zeros((count, self.max_steps + 1, *leaf.shape), dtype=leaf.dtype)
        self._count = np.zeros(count, dtype=np.int64)
        self._rows = np.arange(count)
        self._episodes = ctx.episode_indices.copy()
        self._episodes_seen = self._episodes.tobytes()
        self._delay = ctx.applied[self.param]  # type: ignore[index]
        misfit = None if leaf.dtype in _NUMBERS else f"actions of dtype {leaf.dtype}"
        functions = _compiled_functions(self, ctx, misfit)
        if functions is None:
            return
        history = self._history.reshape(count, self.max_steps + 1, width)
        arguments = (history, self._count, self._episodes, ctx.episode_indices, self._delay, self.max_steps)
        # A step's actions are a fresh (envs, width) array of the leaf's dtype: compiled for that now.
        functions.action_delay(np.zeros((0, width), leaf.dtype), *arguments)
        self._compiled = (functions.action_delay, *arguments)

    def before_step(self, ctx: HookContext) -> None:
        """Records this step's actions and replaces them with the delayed ones."""
        actions, compiled = ctx.actions, self._compiled
        if compiled is not None:
            rows = actions if actions.ndim == 2 else actions.reshape(len(actions), -1)  # a view: a fresh copy
            compiled[0](rows, *compiled[1:])
            return
        episodes = ctx.episode_indices
        # A shift register per env: column j holds the action of j steps ago; column ``count`` holds
        # the episode's first action, which stands in for actions older than the episode.
        history, count = self._history, self._count
        # An env whose episode changed since its last action (however it reset, whichever hook asked
        # and in whatever order) starts afresh: this action is its episode's first. (Compared as
        # bytes: most steps start no episode, and this is a third of an array compare and any().)
        seen = episodes.tobytes()
        if seen != self._episodes_seen:
            new = episodes != self._episodes
            count[new] = 0
            self._episodes[new] = episodes[new]
            self._episodes_seen = seen
        history[:, 1:] = history[:, :-1]
        history[:, 0] = actions
        actions[...] = history[self._rows, np.minimum(self._delay, count)]
        count += 1  # past max_steps too: the delay, at most max_steps, caps the column it picks


class RewardScale:
    """Multiplies each env's reward by the parameter ``param`` (per env).

    ``compiled``: None (compiled with ``engine="numba"``), True or False; see the module docstring.
    """

    def __init__(
        self, scale: float = 1.0, *, param: str = "reward_scale", name: str | None = None, compiled: bool | None = None
    ) -> None:
        self.scale, self.param, self.name = scale, param, name or "RewardScale"
        self.compiled = _checked_compiled("RewardScale", compiled)
        self._scale = np.zeros(0)  # each env's scale: its column of ``applied``, found at launch
        self._compiled: tuple[Any, ...] | None = None  # the compiled function and its arrays

    def params(self) -> dict[str, Param]:
        """Declares the scale."""
        return {self.param: Param(self.scale, bind=False)}

    def on_launch(self, ctx: HookContext) -> None:
        """To run compiled, compiles now."""
        self._scale = ctx.applied[self.param]  # type: ignore[index]
        functions = _compiled_functions(self, ctx, None)
        if functions is not None:
            functions.reward_scale(ctx.rewards[:0], self._scale)  # compiles (or loads) it now; no rows: changes nothing
            self._compiled = (functions.reward_scale, self._scale)

    def after_step(self, ctx: HookContext) -> None:
        """Scales this step's rewards."""
        compiled = self._compiled
        if compiled is not None:
            compiled[0](ctx.rewards, compiled[1])
        else:
            ctx.rewards *= self._scale


def default_kick(env: Any) -> Callable[[np.ndarray], None]:
    """``env``'s own kick, from its family's adapter (:mod:`shmpool.adapters`): a function adding
    ``amounts`` to its velocities; ``TypeError`` if its adapter knows none."""
    adapter = adapter_for(env)
    kick = adapter.kicker(env)
    if kick is None:
        raise TypeError(
            f"Perturb has no default kick for {type(env.unwrapped).__name__} (no adapter in shmpool.adapters "
            f"knows its velocities); give it a kick function kick(env, amounts)"
        )
    return kick


def kick_velocity(env: Any, amounts: np.ndarray) -> None:
    """Adds ``amounts`` (one per velocity entry) to ``env``'s velocities, as its adapter knows them
    (classic control: the velocity entries of ``env.unwrapped.state``)."""
    default_kick(env)(amounts)


class Perturb:
    """Kicks envs: every ``every`` steps of each episode and/or when it receives an event.

    The kick adds ``strength`` (the parameter ``param``, per env; an event's payload[0] overrides
    it) times a random sign, per dimension (``dims``), to each velocity of the env (the default
    kick of the env's adapter, found once per env: classic control adds to the velocity entries of
    its state) or, with a ``kick`` function ``kick(env, amounts)``, does whatever that does: for
    MuJoCo envs ``shmpool.mujoco.Push("torso")`` applies a force for one step (``dims=3``) or
    changes the body's velocity. A kick with a ``clear(env)`` method is cleared after the step.
    An env whose step is a reset (the step after its episode ended, with next-step autoreset) is
    not kicked, by ``every`` or by an event: it takes no physics step to push, and a push carried
    into its new episode would land where nobody sent it.

    ``compiled`` applies to ``engine="numba"`` only: there the default kick of a kernel that declares
    its ``velocities`` runs compiled, over the slot's state array in one call (None or True; True
    fails the launch where it cannot: a ``kick`` function, a kernel's own ``kick``, no velocities);
    False kicks env by env. With ``engine="python"`` the envs are Python objects and are kicked one
    by one whatever ``compiled`` says. Both give the same results bit for bit.
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
        self.strength, self.every, self.param, self.name = strength, every, param, name or "Perturb"
        self.kick = kick  # None: each env's default kick
        self.dims = dims
        self.compiled = _checked_compiled("Perturb", compiled)
        self._compiled: tuple[Any, ...] | None = None  # the compiled functions and their arrays
        self._streams: EnvStreams | None = None
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

    def params(self) -> dict[str, Param]:
        """Declares the kick strength (``>= 0``)."""
        return {self.param: Param(self.strength, low=0.0, bind=False)}

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
        if ctx.engine != "numba":  # envs are Python objects: kicked one by one, whatever ``compiled`` says
            if self.kick is None:
                for row, env in enumerate(ctx.envs):
                    self._default_kick(row, env)
            return
        functions = _compiled_functions(self, ctx, self._misfit(ctx.kernel))
        if functions is None:
            return
        count = len(ctx.env_ids)
        streams = self._streams = EnvStreams(ctx.seed, self.name, ctx.env_ids, (self.dims,), "uniform")
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
        if self.every is None and not ctx.events:  # kicked by events only, and none came: nothing to do
            return
        strength = self._sent(ctx)
        if self.every is not None:
            counts = ctx.step_counts
            default = ctx.applied[self.param]  # type: ignore[index]
            for row in np.flatnonzero((counts > 0) & (counts % self.every == 0)).tolist():
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
        if self._streams is None:
            self._streams = EnvStreams(ctx.seed, self.name, ctx.env_ids, (self.dims,), "uniform")
        draws, kick = self._streams.at(ctx.global_step), self.kick
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


class Resample:
    """Draws new values of ``dist`` parameters for every env every ``every`` steps of its episode."""

    def __init__(self, params: Sequence[str], *, every: int, name: str | None = None) -> None:
        if every < 1:
            raise ValueError(f"Resample(every=...) must be >= 1, got {every}")
        self.names, self.every, self.name = list(params), every, name or "Resample"

    def on_launch(self, ctx: HookContext) -> None:
        """Checks that every name is a ``dist`` parameter of the pool (a redraw of no env: the one
        check there is), so that a typo fails the launch, not the step of the first redraw."""
        ctx.resample(self.names, np.zeros(0, dtype=np.int64))

    def before_step(self, ctx: HookContext) -> None:
        """Redraws for the envs whose step count is a multiple of ``every``."""
        due = (ctx.step_counts > 0) & (ctx.step_counts % self.every == 0) & ~ctx.resetting
        if due.any():
            ctx.resample(self.names, np.flatnonzero(due))


class Reset:
    """Resets the envs it receives in events, in place of their next step (reward 0, not done)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or "Reset"

    def before_step(self, ctx: HookContext) -> None:
        """Turns this step of the addressed envs into a reset."""
        for event in ctx.events:
            ctx.request_reset(ctx.rows(event.env_ids))
