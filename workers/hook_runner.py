"""Running a worker's hooks: one context over the slot, events handed to the hooks they address."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmpool.config import library_code
from shmpool.events import Event, EventReader
from shmpool.hooks import PHASES, HookContext, hook_name
from shmpool.mujoco import simulation_of
from shmpool.protocol import event_rings
from shmpool.spaces import assemble, leaves


class HookError(Exception):
    """A hook raised; the message names it and the envs of the slot it was running over."""

    def __init__(self, name: str, env_ids: tuple[int, int], cause: BaseException) -> None:
        super().__init__(
            f"hook {name!r} raised over envs {env_ids[0]}..{env_ids[1] - 1}: {type(cause).__name__}: {cause}"
        )
        self.name = name
        self.env_ids = env_ids


class _NotLive:
    """An env's ``unwrapped.data`` (or ``unwrapped.model``, once parameters made model fields per
    simulation) while a hook of the user's runs under ``engine="mujoco"``: the batch holds the
    physics and those fields, so reads would see the values of the env's last reset or control call,
    and writes would change nothing. Any use raises, naming the way."""

    def __init__(self, message: str) -> None:
        object.__setattr__(self, "_message", message)

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(self._message.format(name))

    def __setattr__(self, name: str, value: Any) -> None:
        raise RuntimeError(self._message.format(name))


_NO_DATA = _NotLive(
    "env.unwrapped.data.{} in a hook: engine='mujoco' steps the physics in a batch, and an env's MjData "
    "is not its simulation during a step (reads would see its last reset, writes would be lost). Read "
    "the results from the context (ctx.observations, ctx.rewards), change the physics through "
    "shmpool.mujoco's bindings and Push, or launch with engine='python'"
)
_NO_MODEL = _NotLive(
    "env.unwrapped.model.{} in a hook (env.dt reads it too): under engine='mujoco' the parameters written "
    "through shmpool.mujoco's bindings live in the batch, and an env's MjModel does not hold them (reads "
    "would see the values of its last reset, writes would be lost). Look up what never changes (ids, "
    "sizes) in on_launch, read the parameters from ctx.applied, change them through the bindings, or "
    "launch with engine='python'"
)


class HookRunner:
    """Calls the hooks of one worker at each phase of a step, in declared order."""

    def __init__(
        self,
        hooks: list[Any],
        views: dict[str, np.ndarray],
        worker_id: int,
        slot: tuple[int, int],
        seed: int,
        envs: list[Any],
        observation_space: Any,
        action_space: Any,
        request_reset: Any,
        resample: Any,
        params: np.ndarray | None = None,
    ) -> None:
        start, stop = slot
        rows = slice(start, stop)
        self._slot = slot
        self._hooks = hooks
        self._users: set[int] = set()  # under engine="mujoco": the indices of the user's hooks
        #: Whether any hook runs the user's code, which may change what steps an env (``Slot.step``).
        self.runs_user_code = not all(library_code(hook) for hook in hooks)
        self._unwrapped: list[Any] = []
        self._per_simulation: set[str] = set()  # the batch's model fields made per simulation, as they grow
        self._calls = {
            phase: [
                (index, hook_name(hook), getattr(hook, phase))
                for index, hook in enumerate(hooks)
                if callable(getattr(hook, phase, None))
            ]
            for phase in (*PHASES, "on_launch")
        }
        rings = event_rings(views)
        self._events = EventReader(rings, worker_id, slot) if rings is not None else None
        self._due: dict[int, list[Event]] = {}
        ctx = self.ctx = HookContext(request_reset, resample)
        ctx.env_ids = np.arange(start, stop)
        ctx.envs = envs
        ctx.bind_results(
            assemble(
                observation_space,
                iter([views[leaf.field_name("observations")][rows] for leaf in leaves(observation_space)]),
            ),
            views["rewards"][rows],
            views["terminations"][rows],
            views["truncations"][rows],
        )
        # The worker's consistent, validated copy: the shared block itself can be mid-write.
        ctx.params = params
        ctx.applied = views["applied"][rows] if "applied" in views else None
        ctx.episode_indices = views["episode_index"][rows]
        ctx.rng = np.random.default_rng([seed % (1 << 63), worker_id])
        ctx.seed = seed
        ctx.global_step = 0
        ctx.actions = None
        ctx.observation_space = observation_space
        ctx.action_space = action_space
        ctx.reset_rows = np.zeros(0, dtype=np.int64)
        self._none = [False] * (stop - start)

    def on_launch(self, engine: str, kernel: Any = None, state: np.ndarray | None = None) -> None:
        """Tells the context which engine steps the slot (with ``engine="numba"``, its kernel and
        state array) and runs the hooks' ``on_launch``, once, as the worker builds: compiled hooks
        compile (or load) here, not at the first step."""
        ctx = self.ctx
        ctx.engine, ctx.kernel, ctx.state = engine, kernel, state
        self._run("on_launch")
        if engine == "mujoco":  # the user's hooks find no stale MjData (or MjModel) in the envs during steps
            self._unwrapped = [env.unwrapped for env in ctx.envs]
            self._per_simulation = simulation_of(ctx.envs[0]).expanded  # type: ignore[union-attr]
            self._users = {index for index, hook in enumerate(self._hooks) if not library_code(hook)}

    def begin_step(self, global_step: int) -> None:
        """Takes the events due at this step out of the ring, grouped by hook."""
        self.ctx.begin_step(global_step)
        due = None if self._events is None else self._events.due(global_step)
        if due is not None:
            self._due = due
        elif self._due:
            self._due = {}  # the last step's events are done with

    def before_step(self, actions: Any, resetting: list[bool], lengths: list[int]) -> None:
        """Runs ``before_step`` hooks; they may change ``actions`` in place."""
        if not self._calls["before_step"]:
            return
        ctx = self.ctx
        ctx.actions = actions
        ctx.begin_phase(lengths, resetting, self._none, "before_step")
        self._run("before_step")
        ctx.actions = None

    def after_step(self, stepped: list[bool], lengths: list[int]) -> bool:
        """Runs ``after_step`` hooks, which may change the slot's results in place; says if any ran."""
        if not self._calls["after_step"]:
            return False
        ctx = self.ctx
        ctx.begin_phase(lengths, self._none, stepped, "after_step")
        self._run("after_step")
        return True

    def on_reset(self, rows: list[int], lengths: list[int]) -> None:
        """Runs ``on_reset`` hooks for the envs at ``rows``, which just reset."""
        if not self._calls["on_reset"] or not rows:
            return
        ctx = self.ctx
        ctx.reset_rows = np.array(rows)
        ctx.begin_phase(lengths, self._none, self._none, "on_reset")
        self._run("on_reset")

    def _run(self, phase: str) -> None:
        ctx = self.ctx
        for index, name, method in self._calls[phase]:
            ctx.events = self._due.get(index, [])
            # Taken before any is replaced: whatever cuts the swap short, every env gets its own back.
            hidden = (
                [(unwrapped.data, unwrapped.model) for unwrapped in self._unwrapped] if index in self._users else None
            )
            try:
                if hidden is not None:  # (none in on_launch: the user's hooks are known after it)
                    stale_models = bool(self._per_simulation)  # without such fields every model is right
                    for unwrapped in self._unwrapped:
                        unwrapped.data = _NO_DATA
                        if stale_models:
                            unwrapped.model = _NO_MODEL
                method(ctx)
            except Exception as exc:  # noqa: BLE001 - reported to the trainer with the hook's name
                raise HookError(name, self._slot, exc) from exc
            finally:
                if hidden is not None:
                    for unwrapped, (data, model) in zip(self._unwrapped, hidden):
                        unwrapped.data, unwrapped.model = data, model
