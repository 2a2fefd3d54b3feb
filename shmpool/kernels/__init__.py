"""Compiled batch envs: ``launch(env_id, num_envs, engine="numba")`` steps each worker's whole slot in
one numba-jitted call instead of env by env in Python.

A :class:`BatchKernel` describes one such env: its spaces, the float64 state it keeps per env, the
parameters it reads (by their gymnasium attribute names, with nominal values), a jitted ``step`` over
the slot and a Python ``reset`` for one env. A worker keeps the slot's state as an ``(envs, state_size)``
array and the parameters as an ``(envs, len(params))`` matrix; parameters are read, validated, drawn
and published exactly as with the Python engine (:mod:`shmpool.workers.params`), but an accepted value
lands in its matrix column instead of an env attribute, and the kernel reads the matrix each step.
Values an env caches from its parameters (CartPole's ``total_mass`` and ``polemass_length``) are
parameters too, recomputed by the kernel's ``refresh`` wherever the Python engine's adapter recomputes
them, and nowhere else: as on gymnasium's env, ``set_attr("masspole", ...)`` leaves them as they were.
Resets run the kernel's Python ``reset``, from each env's own ``np_random`` seeded as
gymnasium seeds it, so the same seeds give the same initial states. A kernel whose episodes are short
(CartPole's last about 20 random steps: a reset per step in every worker) may also give ``draw`` and
``start``: the workers then draw each env's next option-less resets ahead, several at a time, and
autoreset in one compiled call (see :class:`BatchKernel`); the env's ``np_random`` is rewound to where
gymnasium's would be whenever Python code asks for it.

Built-in kernels (:mod:`shmpool.kernels.classic_control`) reproduce gymnasium's ``CartPole-v1``,
``Pendulum-v1``, ``MountainCar-v0``, ``MountainCarContinuous-v0`` and ``Acrobot-v1`` bit for bit
(``gymnasium.make`` of them, ``TimeLimit`` included). Register one of your own with :func:`register`::

    import math

    import numba
    import numpy as np
    from gymnasium import spaces

    import shmpool
    from shmpool.kernels import BatchKernel


    @numba.njit(cache=True)
    def drift_step(state, params, actions, stepping, observations, rewards, terminations):
        for i in range(state.shape[0]):
            if stepping[i]:  # rows that reset this step are not stepped
                state[i, 0] += params[i, 0] * (actions[i] - 0.5)  # params[:, 0] is "speed"
                observations[i, 0] = state[i, 0]
                rewards[i] = -abs(state[i, 0])
                terminations[i] = abs(state[i, 0]) > 1.0


    def drift_reset(rng, params, options, state, observation):
        state[0] = rng.uniform(-0.5, 0.5)
        observation[0] = state[0]


    DRIFT = BatchKernel(
        observation_space=spaces.Box(-math.inf, math.inf, (1,), np.float32),
        action_space=spaces.Discrete(2),
        state_size=1,
        params={"speed": 0.1},
        step=drift_step,
        reset=drift_reset,
        max_episode_steps=100,
        velocities=(),
    )
    shmpool.kernels.register("Drift-v0", DRIFT)
    pool = shmpool.launch("Drift-v0", 64, engine="numba", params={"speed": shmpool.Param(low=0, high=1)})

Control calls (``get_attr``, ``set_attr``, ``call``, ``env_apply``) see each env as a
:class:`KernelEnv`, which does with an attribute what gymnasium's env does, or refuses it: its
parameters are read and written in the parameter matrix, ``state`` is the env's state in gymnasium's
shape, ``_max_episode_steps`` and ``_elapsed_steps`` are ``TimeLimit``'s (a new limit holds from the
next step), and writing an attribute of the gymnasium env that the kernel does not model
(``BatchKernel.unsupported``: CartPole's ``kinematics_integrator``, rendering attributes, ...) raises
:class:`KernelAttributeError` naming the alternatives, instead of being ignored. Other names are
plain attributes, as on a gymnasium env.

This module imports neither numba nor any kernel: the registry holds import strings (or your
objects) and :func:`load` imports a kernel only when a pool uses it.
"""

from __future__ import annotations

import functools
import importlib
import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from ..adapters import EnvAdapter
from ..episodes import episode_dtype
from ..errors import KernelAttributeError

#: The extra that installs numba.
NUMBA_EXTRA = 'pip install "shmpool[numba]"'

#: The built-in kernels, by gymnasium id: import strings, imported on first use.
BUILTIN: dict[str, str] = {
    "CartPole-v1": "shmpool.kernels.classic_control:CARTPOLE",
    "Pendulum-v1": "shmpool.kernels.classic_control:PENDULUM",
    "MountainCar-v0": "shmpool.kernels.classic_control:MOUNTAIN_CAR",
    "MountainCarContinuous-v0": "shmpool.kernels.classic_control:MOUNTAIN_CAR_CONTINUOUS",
    "Acrobot-v1": "shmpool.kernels.classic_control:ACROBOT",
}
_registered: dict[str, BatchKernel | str] = {}

Step = Callable[..., None]
Reset = Callable[[np.random.Generator, np.ndarray, "dict[str, Any] | None", np.ndarray, np.ndarray], None]
Kick = Callable[[np.ndarray, np.ndarray], None]
Draw = Callable[[np.random.Generator, int], np.ndarray]
Refresh = Callable[[np.ndarray], None]
SetState = Callable[[np.ndarray, np.ndarray], None]

#: ``_max_episode_steps`` of an env without a time limit, in the slot's ``limits`` array: a count no
#: episode reaches, so that the compiled time limit needs no test for "none".
NO_LIMIT = np.iinfo(np.int64).max
#: What a KernelEnv models besides its kernel's parameters: gymnasium's env's and ``TimeLimit``'s
#: attributes, and the ones every gymnasium env has.
MODELED = (
    "state",
    "_max_episode_steps",
    "_elapsed_steps",
    "observation_space",
    "action_space",
    "metadata",
    "spec",
    "np_random",
    "np_random_seed",
    "_np_random",
    "_np_random_seed",
)


@dataclass(frozen=True)
class BatchKernel:
    """A batch env compiled with numba: everything a worker needs to run a whole slot in one call.

    Attributes:
        observation_space: one env's observations: a 1-D float Box (the kernel writes rows of
            ``observations`` in its dtype).
        action_space: one env's actions: ``Discrete`` (``actions`` is an int64 array of shape
            ``(envs,)``) or a 1-D Box (``(envs, size)`` of its dtype).
        state_size: float64 numbers of state per env: the columns of the slot's state array.
        params: the parameters the kernel reads, in column order of the parameter matrix, with their
            nominal values. ``launch(params=...)`` may declare any of them by name (or ``bind`` to
            one); the others keep their nominal values. Names follow the gymnasium env's attributes.
        step: a numba-jitted ``step(state, params, actions, stepping, observations, rewards,
            terminations)`` over the slot: for every row ``i`` with ``stepping[i]`` it advances
            ``state[i]`` with the parameters ``params[i]`` and action ``actions[i]`` and writes
            ``observations[i]``, ``rewards[i]`` and ``terminations[i]``; other rows stay untouched.
            ``state`` and ``params`` are C-contiguous float64 ``(envs, state_size)`` and ``(envs,
            len(params))`` arrays. Decorate it with ``numba.njit(cache=True)``: workers compile it
            once, at launch, and later launches load it from numba's cache. The time limit
            (``max_episode_steps``) is applied around it.
        reset: a Python function ``reset(rng, params, options, state, observation)`` for one env:
            draws its initial state from ``rng`` (the env's ``np_random``, seeded as gymnasium seeds
            it), writes ``state`` (its row of the state array) and ``observation``. ``params`` is
            the env's row of the parameter matrix, ``options`` the reset options (None without).
        max_episode_steps: the episode length at which ``truncations`` is set (``TimeLimit``); None:
            no limit. ``launch(env_kwargs={"max_episode_steps": n})`` overrides it.
        velocities: the state columns that ``hooks.Perturb``'s default kick adds to.
        constructor: parameters that are also constructor keywords of the env: ``env_kwargs`` and
            ``Param(when="rebuild")`` may give them.
        kick: instead of adding to ``velocities``, a Python ``kick(state, amounts)`` for one env's
            state row (for state the kick must change in other ways).
        metadata: the env's ``metadata``.
        draw: with ``start``, what ``reset`` draws without options, for ``count`` resets at once: a
            Python ``draw(rng, count)`` returning a float64 ``(count, width)`` array whose row ``k``
            is exactly what the ``k``-th option-less reset from now would draw from ``rng``, for every
            ``count`` (numpy's generators fill an array value by value, so ``rng.uniform(low, high,
            (count, 4))`` is ``count`` calls of ``rng.uniform(low, high, (4,))``). None: every reset
            runs ``reset`` in Python.
        start: a numba-jitted ``start(resetting, draws, params, state, observations)`` over the slot:
            for every row ``i`` with ``resetting[i]``, what ``reset`` does without options given the
            values it would draw, ``draws[i]`` (a row of ``draw``'s result); other rows stay
            untouched. Workers use it for autoresets (``NEXT_STEP``) when no parameter is drawn or
            applied per episode; it must match ``reset`` bit for bit.
        refresh: with ``refresh_inputs``, for parameters that the env computes from others once (in
            ``__init__``, as CartPole its ``total_mass``): a Python ``refresh(params)`` that recomputes
            them in place in every row of a ``(rows, len(params))`` matrix, as ``__init__`` does. The
            workers call it where the Python engine's adapter recomputes them (after a declared
            parameter changes one of ``refresh_inputs``, at an episode's per-episode values); a write
            of an input through ``set_attr`` leaves them stale, as on gymnasium's env.
        refresh_inputs: the parameters that ``refresh`` reads.
        state_columns: how many leading state columns are the gymnasium env's ``state`` (what
            ``KernelEnv.state`` shows and takes); the others are the kernel's own bookkeeping. None:
            all of them.
        set_state: how a value assigned to ``KernelEnv.state`` is stored: a Python ``set_state(row,
            value)`` given the env's whole state row and the value as a numeric array of shape
            ``(state_columns,)``; it raises ``ValueError`` for a value whose next step it would not
            compute as gymnasium's env does (a float32 state that gymnasium then steps in float32).
            None: stored as float64.
        unsupported: attributes of the gymnasium env that the kernel does not model (a constant it
            hard-codes, an option it lacks, rendering): setting one on a :class:`KernelEnv` raises
            :class:`KernelAttributeError` instead of being ignored.
    """

    observation_space: spaces.Box
    action_space: spaces.Discrete | spaces.Box
    state_size: int
    params: Mapping[str, float]
    step: Step
    reset: Reset
    max_episode_steps: int | None = None
    velocities: Sequence[int] = ()
    constructor: Sequence[str] = ()
    kick: Kick | None = None
    metadata: Mapping[str, Any] = field(default_factory=lambda: {"render_modes": []})
    draw: Draw | None = None
    start: Step | None = None
    refresh: Refresh | None = None
    refresh_inputs: Sequence[str] = ()
    state_columns: int | None = None
    set_state: SetState | None = None
    unsupported: Sequence[str] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.observation_space, spaces.Box) or len(self.observation_space.shape) != 1:
            raise TypeError(f"BatchKernel.observation_space must be a 1-D Box, got {self.observation_space}")
        if not isinstance(self.action_space, spaces.Discrete) and not (
            isinstance(self.action_space, spaces.Box) and len(self.action_space.shape) == 1
        ):
            raise TypeError(f"BatchKernel.action_space must be Discrete or a 1-D Box, got {self.action_space}")
        unknown = set(self.constructor) - set(self.params)
        if unknown:
            raise ValueError(f"BatchKernel.constructor names {sorted(unknown)}, which are not among its params")
        if (self.draw is None) != (self.start is None):
            raise ValueError("BatchKernel.draw and BatchKernel.start go together: give both or neither")
        if (self.refresh is None) != (not self.refresh_inputs):
            raise ValueError("BatchKernel.refresh and BatchKernel.refresh_inputs go together: give both or neither")
        unknown = set(self.refresh_inputs) - set(self.params)
        if unknown:
            raise ValueError(f"BatchKernel.refresh_inputs names {sorted(unknown)}, which are not among its params")
        if self.state_columns is not None and not 0 < self.state_columns <= self.state_size:
            raise ValueError(
                f"BatchKernel.state_columns must be within [1, state_size={self.state_size}], got {self.state_columns}"
            )
        clash = set(self.unsupported) & {*self.params, *MODELED}
        if clash:
            raise ValueError(f"BatchKernel.unsupported names {sorted(clash)}, which the kernel models")

    @property
    def columns(self) -> dict[str, int]:
        """Each parameter's column in the parameter matrix."""
        return {name: column for column, name in enumerate(self.params)}

    def nominal(self, count: int, overrides: Mapping[str, Any] | None = None) -> np.ndarray:
        """A C-contiguous ``(count, len(params))`` parameter matrix of nominal values, ``overrides``
        (constructor keywords) applied."""
        values = dict(self.params)
        values.update(overrides or {})
        matrix = np.ascontiguousarray(np.tile(np.array(list(values.values()), dtype=np.float64), (count, 1)))
        if self.refresh is not None:  # what __init__ derives from the constructor's values
            self.refresh(matrix)
        return matrix

    def arrays(self, count: int) -> dict[str, np.ndarray]:
        """Empty arrays of the types a worker passes to ``step`` for ``count`` envs (the warm-up
        compiles exactly the signature the workers call)."""
        if isinstance(self.action_space, spaces.Discrete):
            actions = np.zeros(count, dtype=np.int64)
        else:
            actions = np.zeros((count, *self.action_space.shape), dtype=self.action_space.dtype)
        return {
            "state": np.zeros((count, self.state_size), dtype=np.float64),
            "params": self.nominal(count),
            "actions": actions,
            "stepping": np.zeros(count, dtype=np.bool_),
            "observations": np.zeros((count, *self.observation_space.shape), dtype=self.observation_space.dtype),
            "rewards": np.zeros(count, dtype=np.float64),
            "terminations": np.zeros(count, dtype=np.bool_),
        }

    def warm_up(self) -> None:
        """Compiles ``step`` and the workers' bookkeeping around it for the workers' argument types
        (or loads them from numba's cache) by calling them over envs that do not step."""
        from . import slot

        arrays = self.arrays(1)
        self.step(*arrays.values())
        flags, numbers, counts = np.zeros(1, np.bool_), np.zeros(1), np.zeros(1, np.int64)
        slot.time_limit(counts, flags, counts, flags, flags)
        slot.add_step(flags, numbers, flags, flags, numbers, counts, flags)
        values = np.zeros((1, 1))
        slot.accept_scalars(
            values, values, values, counts, numbers, numbers, flags, counts, counts, values, values, flags, flags
        )
        if self.start is not None:  # compiled autoresets and episode ends
            slot.end_episodes(flags, numbers, counts, numbers, 0.0, numbers, counts, numbers, flags)
            ring = np.zeros(1, episode_dtype(None, ()))
            slot.record_episodes(flags, 0, counts, 0, numbers, counts, flags, flags, ring, 0)
            draws = np.zeros((1, 1, self.draw_width))
            episode = (numbers, counts, numbers, counts, counts, numbers, flags, flags)
            slot.restart(flags, flags, counts, draws, draws[0], 0.0, *episode)
            self.start(flags, draws[0], arrays["params"], arrays["state"], arrays["observations"])

    @functools.cached_property
    def draw_width(self) -> int:
        """How many values ``draw`` gives per reset (0 without ``draw``); ``ValueError`` if its result
        is not a ``(count, width)`` float array."""
        if self.draw is None:
            return 0
        drawn = self.draw(np.random.default_rng(0), 2)
        if not isinstance(drawn, np.ndarray) or drawn.ndim != 2 or len(drawn) != 2 or drawn.dtype.kind != "f":
            raise ValueError(
                f"BatchKernel.draw(rng, count) must return a (count, width) float array, got "
                f"{type(drawn).__name__} {getattr(drawn, 'shape', '')} for count=2"
            )
        return int(drawn.shape[1])


# -- the registry ---------------------------------------------------------------------------------


def register(env_id: str, kernel: BatchKernel | str) -> None:
    """Makes ``launch(env_id, ..., engine="numba")`` run ``kernel``.

    ``kernel`` is a :class:`BatchKernel`, or the import string ``"module:NAME"`` of one, which the
    workers import themselves (the form that works with every start method; an object is inherited by
    forked workers and pickled for the others). Registration is per process: register in the process
    that launches the pool. A built-in id registered again runs your kernel instead.
    """
    if not isinstance(env_id, str) or not env_id:
        raise TypeError(f"register: env_id must be a non-empty str, got {env_id!r}")
    if isinstance(kernel, str):
        if ":" not in kernel:
            raise ValueError(f"register: a kernel import string is 'module:NAME', got {kernel!r}")
    elif not isinstance(kernel, BatchKernel):
        raise TypeError(f"register: kernel must be a BatchKernel or a 'module:NAME' string, got {kernel!r:.80}")
    _registered[env_id] = kernel


def compiled_ids() -> list[str]:
    """The env ids that ``engine="numba"`` runs: the built-in ones and those registered here."""
    return sorted({*BUILTIN, *_registered})


def find(env_id: Any) -> BatchKernel | str:
    """The registered kernel (or its import string) of ``env_id``; ``ValueError`` listing the compiled ids."""
    if not isinstance(env_id, str) or env_id not in _registered and env_id not in BUILTIN:
        what = repr(env_id) if isinstance(env_id, str) else f"a {type(env_id).__name__} (not a registered id)"
        raise ValueError(
            f"engine='numba' has no compiled kernel for {what}; compiled ids: {', '.join(compiled_ids())} "
            f"(register your own with shmpool.kernels.register, or use engine='python')"
        )
    return _registered.get(env_id) or BUILTIN[env_id]


def require_numba() -> None:
    """Raises ``ImportError`` naming the extra when numba is not installed."""
    try:
        import numba  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"engine='numba' needs numba, which is not installed: {NUMBA_EXTRA}") from exc


def load(kernel: BatchKernel | str) -> BatchKernel:
    """The kernel itself: ``kernel``, or the object its import string names (imported now)."""
    if isinstance(kernel, BatchKernel):
        return kernel
    require_numba()
    module_name, _, attribute = kernel.partition(":")
    found = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(found, BatchKernel):
        raise TypeError(f"{kernel!r} is not a shmpool.kernels.BatchKernel (got {type(found).__name__})")
    return found


def check_options(kernel: BatchKernel, env_id: str, specs: Sequence[Any], env_kwargs: Mapping[str, Any]) -> None:
    """Checks at launch that the declared parameters and ``env_kwargs`` are ones the kernel reads.

    A parameter must bind (by its name or a ``bind`` path) to one of the kernel's parameters, as a
    scalar; or be ``bind=False`` (values only hooks read). ``env_kwargs`` may hold
    ``max_episode_steps`` and the kernel's constructor parameters.
    """
    known = ", ".join(kernel.params)
    for spec in specs:
        if spec.bind is False:
            continue
        target = spec.name if spec.bind is None else spec.bind
        if not isinstance(target, str) or target not in kernel.params:
            shown = f"binds {target!r}" if isinstance(target, str) else "binds through a function or object"
            raise ValueError(
                f"engine='numba': params[{spec.name!r}] {shown}, which the {env_id} kernel does not read; its "
                f"parameters are {known} (bind=False declares a value only hooks read)"
            )
        if spec.shape:
            raise ValueError(f"engine='numba': params[{spec.name!r}] must be a scalar, got shape {spec.shape}")
        if spec.when == "rebuild" and target not in kernel.constructor:
            raise ValueError(
                f"engine='numba': params[{spec.name!r}] is when='rebuild', but {target!r} is not a constructor "
                f"keyword of {env_id} ({', '.join(kernel.constructor) or 'none'})"
            )
    allowed = {"max_episode_steps", "render_mode", *kernel.constructor}
    for key, value in env_kwargs.items():
        if key not in allowed:
            raise ValueError(
                f"engine='numba': env_kwargs[{key!r}] is not something the {env_id} kernel takes; it takes "
                f"{', '.join(sorted(allowed))}"
            )
        if key == "render_mode" and value is not None:
            raise ValueError("engine='numba': compiled envs do not render; render_mode must be None")


# -- one env of a slot, as a gymnasium env --------------------------------------------------------


class KernelEnv(gymnasium.Env[np.ndarray, Any]):
    """One env of a compiled kernel, as a gymnasium env: row ``row`` of a slot's arrays.

    Workers make one per env of their slot: hooks see them as ``ctx.envs``, control calls
    (``get_attr``, ``env_apply``, ...) run on them, and ``reset`` runs the kernel's Python reset from
    the env's own ``np_random``. Its attributes do what gymnasium's env (``TimeLimit`` included) does
    with them: each parameter the kernel reads is read and written in the parameter matrix, ``state``
    is the env's state in gymnasium's shape, ``_max_episode_steps`` and ``_elapsed_steps`` are the
    time limit's; the gymnasium env's attributes the kernel does not model (``BatchKernel.unsupported``)
    raise :class:`KernelAttributeError`. Made without ``arrays`` it is a standalone env with arrays of
    its own (the trainer's probe at launch).
    """

    def __init__(
        self,
        kernel: BatchKernel,
        arrays: Mapping[str, np.ndarray] | None = None,
        row: int = 0,
        *,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        env_label: str | None = None,
        **constructor: Any,
    ) -> None:
        if render_mode is not None:
            raise ValueError("compiled envs do not render; render_mode must be None")
        unknown = set(constructor) - set(kernel.constructor)
        if unknown:
            raise TypeError(f"unexpected keywords {sorted(unknown)}; the kernel takes {list(kernel.constructor)}")
        if arrays is None:
            arrays = {
                **kernel.arrays(1),
                "elapsed": np.zeros(1, dtype=np.int64),
                "limits": np.zeros(1, dtype=np.int64),
            }
            arrays["params"][:] = kernel.nominal(1, constructor)
        # Set before any other attribute: __setattr__ and __getattr__ look them up.
        object.__setattr__(self, "_columns", kernel.columns)
        object.__setattr__(self, "_unsupported", frozenset(kernel.unsupported))
        self._kernel = kernel
        self._arrays = arrays
        self._row = row
        self._label = env_label or "this compiled env"
        limit = kernel.max_episode_steps if max_episode_steps is None else max_episode_steps
        arrays["limits"][row] = NO_LIMIT if limit is None else min(int(limit), NO_LIMIT - 1)
        self.observation_space = kernel.observation_space
        self.action_space = kernel.action_space
        self.metadata = dict(kernel.metadata)
        #: The generator's state before the resets drawn ahead into this row of ``arrays["draws"]``
        #: (a slot's autoresets, :meth:`refill_draws`); None while none are.
        self._drawn_from: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        columns = self.__dict__.get("_columns", {})
        if name in columns:
            return float(self.__dict__["_arrays"]["params"][self.__dict__["_row"], columns[name]])
        if name in self.__dict__.get("_unsupported", ()):
            raise KernelAttributeError(self._not_modeled(name, "so it has no value to read"))
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        columns = self.__dict__.get("_columns", {})
        if name in columns:
            self._arrays["params"][self._row, columns[name]] = self._parameter(name, value)
        elif name in self.__dict__.get("_unsupported", ()):
            # Stored, it would be an attribute no step reads: gymnasium's env would act on it.
            raise KernelAttributeError(self._not_modeled(name, "so setting it is refused (the kernel would ignore it)"))
        else:
            object.__setattr__(self, name, value)

    def _not_modeled(self, name: str, what: str) -> str:
        """Why ``name`` is refused, and what to use instead."""
        return (
            f"{self._label} (engine='numba'): the compiled kernel does not model {name!r}, {what}; change "
            f"what it runs with through its parameters ({', '.join(self._columns)}: with set_attr, or declared "
            f"as a shmpool.Param in launch(params=...)), or use engine='python' to run gymnasium's own env"
        )

    def _parameter(self, name: str, value: Any) -> float:
        """``value`` for parameter ``name``, as the float64 the kernel computes with; ``TypeError`` for a
        value gymnasium's env would compute with differently (a float32 makes its arithmetic float32)."""
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if not isinstance(value, numbers.Real):
            raise TypeError(
                f"{self._label} (engine='numba'): {name} = {value!r:.80} refused: the kernel's parameters "
                f"are real numbers"
            )
        if isinstance(value, np.floating) and value.dtype.itemsize != 8:
            raise TypeError(
                f"{self._label} (engine='numba'): {name} = {value!r} refused: gymnasium's env may compute with "
                f"a {value.dtype} in {value.dtype} arithmetic, which the kernel does not reproduce; give a "
                f"Python float"
            )
        return float(value)

    @property
    def state(self) -> np.ndarray:
        """The env's state, as gymnasium's env holds it (a view of its row of the slot's state array:
        writing it changes the env); setting it takes gymnasium's shape."""
        return self._arrays["state"][self._row, : self._kernel.state_columns]

    @state.setter
    def state(self, value: Any) -> None:
        row = self._arrays["state"][self._row]
        size = len(self.state)
        try:
            values = np.asarray(value)
        except ValueError as exc:  # a ragged sequence
            raise ValueError(f"{self._label} (engine='numba'): state = {value!r:.80} refused: {exc}") from exc
        if values.shape != (size,) or values.dtype.kind not in "biuf":
            raise ValueError(
                f"{self._label} (engine='numba'): state = {value!r:.80} refused: gymnasium's state of this env "
                f"is {size} real numbers, got shape {values.shape} of {values.dtype}"
            )
        try:
            if self._kernel.set_state is None:
                row[:size] = values
            else:
                self._kernel.set_state(row, values)
        except ValueError as exc:
            raise ValueError(f"{self._label} (engine='numba'): state = {value!r:.80} refused: {exc}") from exc

    @property
    def _max_episode_steps(self) -> int | None:
        """``TimeLimit``'s limit: the env's episodes are truncated at this many steps (None: never)."""
        limit = int(self._arrays["limits"][self._row])
        return None if limit == NO_LIMIT else limit

    @_max_episode_steps.setter
    def _max_episode_steps(self, value: Any) -> None:
        # Compared with the step count from the next step on, as TimeLimit compares it.
        self._arrays["limits"][self._row] = min(self._count("_max_episode_steps", value), NO_LIMIT - 1)

    @property
    def _elapsed_steps(self) -> int:
        """``TimeLimit``'s count: the steps of the env's episode so far."""
        return int(self._arrays["elapsed"][self._row])

    @_elapsed_steps.setter
    def _elapsed_steps(self, value: Any) -> None:
        self._arrays["elapsed"][self._row] = self._count("_elapsed_steps", value)

    def _count(self, name: str, value: Any) -> int:
        """``value`` as ``TimeLimit``'s ``name`` (an int, clipped to int64); ``TypeError`` for anything
        else (gymnasium's TimeLimit would fail at the next step)."""
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{self._label} (engine='numba'): {name} = {value!r:.80} refused: it must be an int")
        return max(min(int(value), NO_LIMIT), -NO_LIMIT)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Seeds ``np_random`` as gymnasium does, runs the kernel's reset and restarts the time limit."""
        if seed is not None:
            self._settle_draws()  # the generator it replaces is left where gymnasium's would be
        super().reset(seed=seed)
        row, arrays = self._row, self._arrays
        observation = arrays["observations"][row]
        self._kernel.reset(self.np_random, arrays["params"][row], options, arrays["state"][row], observation)
        arrays["elapsed"][row] = 0
        if "draws" in arrays:
            self.refill_draws()
        return observation.copy(), {}

    @property  # type: ignore[override]
    def np_random(self) -> np.random.Generator:
        """The env's generator, exactly where gymnasium's would be: resets drawn ahead and not used
        are given back first."""
        self._settle_draws()
        return gymnasium.Env.np_random.fget(self)  # type: ignore[attr-defined,no-any-return]

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._settle_draws()
        gymnasium.Env.np_random.fset(self, value)  # type: ignore[attr-defined]

    def refill_draws(self) -> None:
        """Draws the env's next option-less resets ahead (the kernel's ``draw``) into its row of the
        slot's ``draws``, for the slot's compiled autoresets; draws nothing (its resets then run in
        Python) while anything else holds its generator: another env given the same one, or a hook
        that kept it and draws from it, would get different numbers than with gymnasium."""
        self._settle_draws()
        gymnasium.Env.np_random.fget(self)  # type: ignore[attr-defined]  # made, if it was not yet
        if not _held_by_owner_only(self):
            return
        rng, draws = self._np_random, self._arrays["draws"]
        assert rng is not None and self._kernel.draw is not None
        self._drawn_from = dict(rng.bit_generator.state)
        draws[self._row] = self._kernel.draw(rng, draws.shape[1])
        self._arrays["cursor"][self._row] = 0

    def _settle_draws(self) -> None:
        """Puts the generator where the resets used so far would have left it, and forgets the rest."""
        saved = self._drawn_from
        if saved is None:
            return
        cursor, size = self._arrays["cursor"], self._arrays["draws"].shape[1]
        used = int(cursor[self._row])
        if used < size:  # all used: the generator is already there
            rng = gymnasium.Env.np_random.fget(self)  # type: ignore[attr-defined]
            rng.bit_generator.state = saved
            if used:
                assert self._kernel.draw is not None
                self._kernel.draw(rng, used)
        self._drop_draws()

    def _drop_draws(self) -> None:
        if self._drawn_from is not None:
            self._drawn_from = None
            self._arrays["cursor"][self._row] = self._arrays["draws"].shape[1]

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Steps this env alone, time limit included (workers step whole slots with the kernel instead)."""
        arrays, row = self._arrays, self._row
        work = self._kernel.arrays(len(arrays["state"]))  # only this row steps
        work["actions"][row] = action
        work["stepping"][row] = True
        self._kernel.step(
            arrays["state"],
            arrays["params"],
            work["actions"],
            work["stepping"],
            arrays["observations"],
            work["rewards"],
            work["terminations"],
        )
        arrays["elapsed"][row] += 1
        truncated = bool(arrays["elapsed"][row] >= arrays["limits"][row])
        observation = arrays["observations"][row].copy()
        return observation, float(work["rewards"][row]), bool(work["terminations"][row]), truncated, {}

    def kick(self, amounts: np.ndarray) -> None:
        """``hooks.Perturb``'s default kick: adds ``amounts`` to the env's velocities."""
        state = self._arrays["state"][self._row]
        if self._kernel.kick is not None:
            self._kernel.kick(state, np.asarray(amounts, dtype=np.float64))
            return
        velocities = list(self._kernel.velocities)
        state[velocities] += np.asarray(amounts, dtype=np.float64)[: len(velocities)]

    def render(self) -> Any:
        """Compiled envs do not render."""
        raise NotImplementedError("compiled envs (engine='numba') do not render; use engine='python' to render")


def _references(owner: Any) -> tuple[int, int]:
    """How many references ``owner._np_random`` and its bit generator have, counted the same way for
    every owner (the counts include this function's own)."""
    return sys.getrefcount(owner._np_random), sys.getrefcount(owner._np_random.bit_generator)


class _Owner:
    def __init__(self) -> None:
        self._np_random = np.random.default_rng(0)


#: What :func:`_references` counts for a generator that one attribute alone refers to; None where
#: Python keeps no reference counts (PyPy): nothing is drawn ahead there.
_SOLE_OWNER = _references(_Owner()) if hasattr(sys, "getrefcount") else None


def _held_by_owner_only(owner: Any) -> bool:
    """Whether ``owner._np_random`` is a ``numpy.random.Generator`` that nothing but ``owner`` refers
    to, and likewise its bit generator (CPython reference counts)."""
    if _SOLE_OWNER is None or type(owner._np_random) is not np.random.Generator:
        return False
    generator, bit_generator = _references(owner)
    return generator <= _SOLE_OWNER[0] and bit_generator <= _SOLE_OWNER[1]


class KernelAdapter(EnvAdapter):
    """What shmpool's generic code needs to know about :class:`KernelEnv` (``hooks.Perturb``'s kick)."""

    name = "compiled kernel"
    classes = ("shmpool.kernels:KernelEnv",)

    def kicker(self, env: Any) -> Callable[[np.ndarray], None] | None:
        """Adds ``amounts`` to the velocities the env's kernel declares."""
        unwrapped = env.unwrapped
        if not unwrapped._kernel.velocities and unwrapped._kernel.kick is None:
            raise TypeError(
                "Perturb has no default kick for this compiled kernel: it declares no velocities and no kick"
            )
        return unwrapped.kick  # type: ignore[no-any-return]


#: Found by :func:`shmpool.adapters.adapter_for` (this module is one of its families).
ADAPTERS = [KernelAdapter()]


class KernelFactory:
    """Makes the standalone :class:`KernelEnv` of a registered kernel (the trainer's probe at launch);
    picklable, as env factories are."""

    def __init__(self, kernel: BatchKernel | str) -> None:
        self.kernel = kernel

    def __call__(self, **kwargs: Any) -> KernelEnv:
        return KernelEnv(load(self.kernel), **kwargs)
