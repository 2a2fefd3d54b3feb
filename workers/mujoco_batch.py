"""A worker's slot of gymnasium MuJoCo envs stepped by ``mujoco.batch.Batch`` (``engine="mujoco"``).

Why and how: ``docs/internals.md``, "workers/mujoco_batch.py".
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import numpy as np
from gymnasium.wrappers import TimeLimit

from shmpool.config import WorkerConfig, factory_of, make_env
from shmpool.infos import InfoWriter
from shmpool.kernels import NO_LIMIT
from shmpool.mujoco import ModelBinding, Simulation, call_batch, simulation_of
from shmpool.mujoco_tasks import Infos, task_of
from shmpool.params import ParamSpec
from shmpool.workers.envs import ArraySlot
from shmpool.workers.mujoco_resets import BatchResets
from shmpool.workers.param_applier import ParamApplier
from shmpool.workers.targets import EnvTargets

#: One slot's envs made at a time per process (a trainer's slot may be built beside another pool's).
_COMPILING = threading.Lock()


@contextlib.contextmanager
def _one_compile_per_file(mujoco: Any) -> Iterator[None]:
    """While a slot's envs are made: ``MjModel.from_xml_path`` compiles each file once, and every env
    gets its own copy of that model, as the batch copies a model for each simulation. Compiling is
    deterministic, so the envs are as if each had compiled its own; the worker's launch no longer
    grows with the slot's compiles, and MuJoCo's compiler warnings come once per worker, not per env."""
    with _COMPILING:
        original = mujoco.MjModel.__dict__["from_xml_path"]  # put back exactly as it was
        compile_file = mujoco.MjModel.from_xml_path
        compiled: dict[str, Any] = {}

        def from_xml_path(filename: str, assets: Any = None, vfs: Any = None) -> Any:
            if assets is not None or vfs is not None:  # the files may differ from env to env
                return compile_file(filename, assets, vfs)
            path = os.path.realpath(filename)
            if path not in compiled:
                compiled[path] = compile_file(filename)
            return copy.copy(compiled[path])

        mujoco.MjModel.from_xml_path = staticmethod(from_xml_path)
        try:
            yield
        finally:
            mujoco.MjModel.from_xml_path = original


def _time_limit(env: gymnasium.Env) -> TimeLimit | None:
    layer: Any = env
    while isinstance(layer, gymnasium.Wrapper):
        if isinstance(layer, TimeLimit):
            return layer
        layer = layer.env
    return None


class BatchTargets(EnvTargets):
    """The MuJoCo engine's targets: a parameter bound to a model field
    (``shmpool.mujoco.ModelBinding``) is written for many simulations at once, one numpy assignment
    into the batch's per-simulation field, instead of env by env; the others as the Python engine
    writes them."""

    def __init__(self, specs: list[ParamSpec], count: int, env_label: str) -> None:
        super().__init__(specs, count, env_label)
        self._simulations: dict[int, Simulation | None] = {}
        self._batch_writers: dict[int, Callable[[np.ndarray, np.ndarray], None]] = {}
        #: The batch index of every env of the slot, or None while one has no simulation: what a
        #: write to every env (a curriculum's, every step) passes without a lookup per env.
        self._every_index: np.ndarray | None = None

    def attach(self, local: int, env: Any) -> None:
        """Notes env ``local``'s simulation, then resolves its bindings as the Python engine does."""
        self._simulations[local] = simulation_of(env)
        every = [self._simulations.get(row) for row in range(len(self._all_rows))]
        self._every_index = None if None in every else np.array([one.index for one in every], dtype=np.intp)  # type: ignore[union-attr]
        super().attach(local, env)

    def write(self, spec: ParamSpec, rows: np.ndarray, values: np.ndarray) -> None:
        indices = self._indices(rows)
        if indices is None or not _writes_many(spec):
            super().write(spec, rows, values)
            return
        self._writer(spec, self._simulations[int(rows[0])])(indices, values)  # type: ignore[arg-type]

    def _indices(self, rows: np.ndarray) -> np.ndarray | None:
        """The batch index of each env at ``rows``; None for no rows, or while one has no simulation."""
        if not len(rows):
            return None
        if self._every_index is not None:  # every env attached: one lookup, not one per env
            return self._every_index[rows]
        simulations = [self._simulations.get(local) for local in rows.tolist()]
        return None if None in simulations else np.array([one.index for one in simulations], dtype=np.intp)  # type: ignore[union-attr]

    def _writer(self, spec: ParamSpec, simulation: Simulation) -> Callable[[np.ndarray, np.ndarray], None]:
        """``spec``'s batch writer: one per parameter, every simulation of the slot sharing the batch."""
        write = self._batch_writers.get(spec.index)
        if write is None:
            write = self._batch_writers[spec.index] = spec.bind.batch_writer(simulation)  # type: ignore[union-attr]
        return write

    def write_all(self, spec: ParamSpec, values: np.ndarray) -> None:
        indices = self._every_index
        if indices is not None and _writes_many(spec):
            self._writer(spec, self._simulations[0])(indices, values)  # type: ignore[arg-type]
        elif _writes_many(spec):
            self.write(spec, self._all_rows, values)
        else:
            super().write_all(spec, values)


def _writes_many(spec: ParamSpec) -> bool:
    """Whether ``spec``'s binding is a plain ``ModelBinding``, whose ``batch_writer`` writes what its
    per-simulation writer would (a subclass that changes how it resolves is written env by env)."""
    bind = spec.bind
    return isinstance(bind, ModelBinding) and type(bind).resolve_in_batch is ModelBinding.resolve_in_batch


class MujocoSlot(ArraySlot):
    """The envs of one slot as the simulations of one ``mujoco.batch.Batch``."""

    current_env: int | None

    def __init__(
        self, config: WorkerConfig, views: dict[str, np.ndarray], info: InfoWriter, params: ParamApplier | None
    ) -> None:
        super().__init__(config, views, info, params)
        self._task_type = task_of(config.env_factory)
        count = self.stop - self.start
        self._step_infos: Infos = {}
        self._zero_forces: np.ndarray | None = None
        #: Per env: whether its last command stepped it (else it reset), for what its ``MjData`` holds
        #: after ``mj_rnePostConstraint`` when a control call materializes it.
        self._after_step = np.zeros(count, dtype=np.bool_)
        #: Per env: whether its ``MjData`` holds its state as a control call left it, with no step or
        #: reset since (then another call sees it as it is, as on gymnasium's env).
        self._held_by_env = np.zeros(count, dtype=np.bool_)
        #: The task's fields in each env's ``MjData`` as the last control call left them, until a step.
        self._left_by_call: dict[str, np.ndarray] | None = None

    # -- building ----------------------------------------------------------------------------------

    def build(self) -> None:
        """Makes the slot's envs, the batch of their simulations and the task around them."""
        import mujoco
        import mujoco.batch

        with _one_compile_per_file(mujoco):
            self._make_all(self._make_env)
        first = self.envs[0].unwrapped
        self._mujoco = mujoco
        self._state_spec = mujoco.mjtState.mjSTATE_INTEGRATION
        #: The model every simulation starts from, never written: relative parameters scale its values.
        self.nominal = copy.copy(first.model)
        self.batch = mujoco.batch.Batch(self.nominal, len(self.envs), nthread=self._config.threads, persistent=True)
        task = self.task = self._task_type({}, self._model_field)
        for field in (*task.fields, "ctrl"):
            task.arrays[field] = self.batch.bind(field)
        self._ctrl = task.arrays["ctrl"]
        if task.contact_forces:
            self._forces = np.zeros((len(self.envs), *first.data.cfrc_ext.shape))
            self._zero_forces = np.zeros_like(self._forces)
            #: Each env's ``MjData``, and its ``cfrc_ext`` (a view: it stays valid with the data).
            self._datas = [env.unwrapped.data for env in self.envs]
            self._data_forces = [data.cfrc_ext for data in self._datas]
            #: What ``mj_rnePostConstraint`` adds into ``cfrc_ext``, per simulation: its contacts, its
            #: equality constraints' rows and the forces applied to its bodies.
            self._force_sources = (
                self.batch.bind("ncon"),
                self.batch.bind("ne"),
                self.batch.bind("xfrc_applied").reshape(len(self.envs), -1),
            )
        # Whether mj_forward computes the contact forces (an acceleration-stage sensor makes it run
        # mj_rnePostConstraint): then a reset leaves them in the env's data, and in its observation.
        probe = mujoco.MjData(self.nominal)
        probe.cfrc_ext[:] = np.nan
        mujoco.mj_forward(self.nominal, probe)
        self._forces_at_reset = not np.isnan(probe.cfrc_ext).any()
        self._read_envs()
        self._resets = BatchResets(mujoco, self.nominal, task)
        self._resets.plan(self.envs)
        #: The model fields that bindings made per simulation.
        self.expanded: set[str] = set()
        models_changed = np.zeros(len(self.envs), dtype=np.bool_)
        for local, env in enumerate(self.envs):
            simulation = Simulation(self.batch, local, self.nominal, self.expanded, models_changed)
            env.unwrapped._shmpool_simulation = simulation
            if self._params is not None:
                self._params.attach_env(local, env)

    def _make_env(self, local: int) -> gymnasium.Env:
        env_id = self.start + local
        env = make_env(factory_of(self._config.env_factory, local), self._config.env_kwargs)
        for what, got, expected in (
            ("observation", env.observation_space, self._config.observation_space),
            ("action", env.action_space, self._config.action_space),
        ):
            if got != expected:
                env.close()
                raise ValueError(f"env {env_id} has {what} space {got}, but the pool was launched with {expected}")
        return env

    def _read_envs(self) -> None:
        """Takes the task's constants and each env's time limit from the envs."""
        self.task.read_constants(self.envs, self.start)
        self._shared_dt = self.nominal.opt.timestep * self.task.c["frame_skip"]  # the nominal is never written
        for local, env in enumerate(self.envs):
            limit = _time_limit(env)
            self._limits[local] = NO_LIMIT if limit is None else min(int(limit._max_episode_steps), NO_LIMIT - 1)

    def close(self) -> None:
        """Closes every env, ignoring errors (the worker is exiting), and releases the batch now.

        Now, not whenever the garbage collector gets to it: in the trainer's slot, a batch still
        alive when the trainer forks another pool's workers is copied into them without its
        threads, and destroying that copy there aborts the worker (``thread::join failed``)."""
        for env in self.envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - an env failing to close must not stop the others
                pass
            simulation = env.unwrapped.__dict__.pop("_shmpool_simulation", None)
            if simulation is not None:  # its bindings' and pushes' way to the batch
                simulation.batch = None
        if hasattr(self, "task"):
            self.task.arrays.clear()
            del self.task, self.batch, self._ctrl

    def _remake(self, index: int) -> Any:
        raise AssertionError("engine='mujoco' refuses rebuild parameters at launch")

    # -- control calls: each env materialized --------------------------------------------------------

    def before_call(self) -> None:
        """Copies each simulation's model, data and step count into its env, for user code to see:
        its ``MjData`` as gymnasium's env holds it (after a step, ``mj_rnePostConstraint``'s ``cacc``,
        ``cfrc_int`` and ``cfrc_ext``; after a reset, zeros there unless an acceleration sensor had
        ``mj_forward`` compute them)."""
        batch, rne = self.batch, self._mujoco.mj_rnePostConstraint
        self._states_before_call = batch.state.copy()
        for local, env in enumerate(self.envs):
            unwrapped = env.unwrapped
            model = batch.get_model(local, unwrapped.model)
            if self._held_by_env[local]:  # its data as the last call left it: the batch's is no newer
                continue
            data = batch.get_data(local, unwrapped.data)
            if self._after_step[local] or self._forces_at_reset:
                rne(model, data)
            else:
                data.cacc[:], data.cfrc_int[:], data.cfrc_ext[:] = 0.0, 0.0, 0.0
            limit = _time_limit(env)
            if limit is not None and limit._elapsed_steps is not None:
                limit._elapsed_steps = int(self._elapsed[local])

    def after_call(self) -> None:
        """Takes back what a control call may have changed: each env's state, time limit and
        step count, its model fields that bindings made per simulation, and the task's constants.
        Other model fields stay the batch's, shared by every simulation: edit them with
        ``engine="python"``, or bind them to a parameter."""
        batch, mujoco = self.batch, self._mujoco
        expanded = sorted(self.expanded)
        for local, env in enumerate(self.envs):
            unwrapped = env.unwrapped
            mujoco.mj_getState(unwrapped.model, unwrapped.data, batch.state[local], self._state_spec)
            limit = _time_limit(env)
            if limit is not None and limit._elapsed_steps is not None:
                self._elapsed[local] = limit._elapsed_steps
            # Derived constants are not recomputed: with engine="python" a call that edits the env's
            # model directly leaves them as they were too.
            model = unwrapped.model
            for name in expanded:
                owner, attribute = (model.opt, name[4:]) if name.startswith("opt.") else (model, name)
                batch.expand(name)[local] = getattr(owner, attribute)
        # A state the call changed (gymnasium's set_state, say) continues from its derived fields, as
        # the env's own mj_forward computed them; the others keep theirs, from the last step.
        moved = np.flatnonzero((batch.state != self._states_before_call).any(axis=1))
        if len(moved):
            call_batch(batch.forward, moved)
        # The next step reads what it needs from before the physics (Ant's body position, say) from
        # the derived fields of each env's MjData as the call left them, as gymnasium's env does:
        # recomputed if the call ran mj_forward (set_state does), else stale, whatever the state is now.
        datas = [env.unwrapped.data for env in self.envs]
        self._left_by_call = {name: np.stack([getattr(data, name) for data in datas]) for name in self.task.fields}
        self._held_by_env[:] = True
        try:
            self._read_envs()  # raises for constants the envs may not differ in (the call is refused)
        finally:
            self._resets.plan(self.envs)  # what the call changed about resets holds either way

    # -- resets --------------------------------------------------------------------------------------

    def _reset_env(self, index: int, env: Any, seed: int | None, options: dict[str, Any] | None) -> None:
        self._reset_one(index, env, seed, options)
        self._observe_reset(np.array([index]))

    def _reset_one(self, index: int, env: Any, seed: int | None, options: dict[str, Any] | None) -> None:
        """Resets env ``index`` through gymnasium and puts the state it drew into its simulation (its
        observation follows from ``_observe_reset``)."""
        _, env_info = env.reset(seed=seed, options=options)
        unwrapped = env.unwrapped
        self._mujoco.mj_getState(unwrapped.model, unwrapped.data, self.batch.state[index], self._state_spec)
        self._elapsed[index] = 0
        if env_info:
            self._info.add(index, env_info)

    def _restart_rows(self, rows: np.ndarray) -> None:
        """Starts the next episode of the envs at ``rows`` and resets them (autoreset, or a hook's
        request): in the batch where the reset is gymnasium's own (``BatchResets``), else through
        the env's ``reset``; then their observations and reset infos."""
        try:
            self._begin_episodes(rows)
        except Exception:
            self._name_failing_env(rows)
            raise
        in_batch = self._resets.in_batch[rows]
        for index in rows[~in_batch].tolist():
            self.current_env = self.start + index
            self._reset_one(index, self.envs[index], None, None)
        self.current_env = None
        batched = rows[in_batch]
        if len(batched):
            self._resets.write(batched, self.batch.state)
            self._elapsed[batched] = 0
        self._observe_reset(rows)
        if len(batched):
            shown = np.zeros(len(self.envs), dtype=np.bool_)
            shown[batched] = True
            self._add_infos(self.task.reset_infos(), shown, ())

    def _name_failing_env(self, rows: np.ndarray) -> None:
        """Names the env whose per-episode parameters failed to apply (a binding of the user's, say):
        they are applied again row by row, which gives the same values (the draws are keyed by
        episode); the first of ``rows`` if none fails again."""
        self.current_env = self.start + int(rows[0])
        for index in rows.tolist() if self._params is not None else []:
            try:
                self._params.begin_episodes(index)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 - found it: the original failure is raised
                self.current_env = self.start + index
                return

    def _observe_reset(self, rows: np.ndarray) -> None:
        """Computes the reset simulations' derived fields with their own models (``mj_forward``, as
        the env's ``set_state`` does) and writes their observations; no contact forces yet, unless an
        acceleration sensor has ``mj_forward`` compute them."""
        call_batch(self.batch.forward, rows)
        forces = self._zero_forces
        if forces is not None and self._forces_at_reset:
            forces = self._contact_forces(rows)
        self.task.observe(self._obs, rows, forces)
        self._after_step[rows] = False
        self._held_by_env[rows] = False

    # -- stepping ------------------------------------------------------------------------------------

    def _run_envs(self, actions: np.ndarray) -> None:
        """Resets the envs due for it, then steps all the others in one call of the batch."""
        needs_reset, stepping = self._needs_reset, self._stepped
        np.logical_not(needs_reset, out=stepping)
        everyone = bool(stepping.all())
        if not everyone:
            self._reset_due()
        ids = None if everyone else np.flatnonzero(stepping)
        if ids is not None and not len(ids):  # every env reset this step
            self._step_infos = {}
            return
        task = self.task
        before = task.before()
        if self._left_by_call is not None:  # after a call: from there (with the parameters of this step)
            if before is not None:
                held = self._held_by_env  # the envs reset since the call start from the batch's state
                before[held] = task.before_from(self._left_by_call)[held]
            self._left_by_call = None
            self._held_by_env[:] = False
        if everyone:
            self._ctrl[:] = actions
        else:
            self._ctrl[ids] = actions[ids]
        try:
            self.batch.step(ids, nstep=task.c["frame_skip"])
        except self._mujoco.batch.SimulationError as exc:  # as gymnasium's env raises MuJoCo's error
            failed = list(getattr(exc, "ids", []))
            self.current_env = self.start + int(failed[0]) if failed else None  # the failure names it
            raise
        self._after_step[ids if ids is not None else slice(None)] = True
        forces = self._contact_forces(ids) if task.contact_forces else None
        rewards, terminations, infos = task.results(before, actions, self._dt(), forces)
        rows: Any = slice(None) if everyone else ids
        task.observe(self._obs, rows, forces)
        self._rewards[rows] = rewards[rows]
        self._terminations[rows] = terminations[rows]
        elapsed = self._elapsed
        elapsed[rows] += 1
        self._truncations[rows] = elapsed[rows] >= self._limits[rows]
        self._step_infos = infos

    def _model_field(self, name: str) -> Any:
        """Each simulation's values of model field ``name`` (``"opt.<name>"`` for options), ``(envs,
        ...)``; the shared value of a scalar option that no binding made per simulation."""
        if name in self.expanded:
            return self.batch.expanded(name)
        owner, attribute = (self.nominal.opt, name[4:]) if name.startswith("opt.") else (self.nominal, name)
        nominal = getattr(owner, attribute)
        if not isinstance(nominal, np.ndarray):
            return nominal
        return np.broadcast_to(nominal, (len(self.envs), *nominal.shape))

    def _dt(self) -> Any:
        """Each simulation's ``env.dt`` (the timestep times the frame skip), or the one they share."""
        if "opt.timestep" not in self.expanded:
            return self._shared_dt
        return self.batch.expanded("opt.timestep") * self.task.c["frame_skip"]

    def _contact_forces(self, ids: np.ndarray | None) -> np.ndarray:
        """``cfrc_ext`` as gymnasium's env has it after a step: ``mj_rnePostConstraint`` on each
        stepped simulation's data (materialized into its env's ``MjData``, with its model).

        That function zeroes ``cfrc_ext``, then adds only the forces applied to bodies
        (``xfrc_applied``), contacts and connect and weld constraints (rows within ``ne``): a
        simulation with no contact, no equality row and no applied force (about half of Ant's steps
        and 60% of Humanoid's with random actions) gets zeros, without the ``MjData`` copy that is
        nearly all of the function's cost here."""
        get_data, rne, forces = self.batch.get_data, self._mujoco.mj_rnePostConstraint, self._forces
        datas, results, nominal = self._datas, self._data_forces, self.nominal
        contacts, equalities, applied = self._force_sources
        acted = (contacts != 0) | (equalities != 0) | applied.any(axis=1)
        rows = np.arange(len(datas)) if ids is None else ids
        acted_rows = acted[rows]
        forces[rows[~acted_rows]] = 0.0
        own_models = bool(self.expanded)  # else every simulation runs the nominal model
        for local in rows[acted_rows].tolist():
            rne(self._model_of(local) if own_models else nominal, get_data(local, datas[local]))
            forces[local] = results[local]
        return forces

    def _model_of(self, local: int) -> Any:
        """Simulation ``local``'s own model, materialized into its env's ``MjModel`` when its
        parameters changed."""
        unwrapped = self.envs[local].unwrapped
        simulation: Simulation = unwrapped._shmpool_simulation
        if simulation.models_changed[simulation.index]:
            self.batch.get_model(local, unwrapped.model)
            simulation.models_changed[simulation.index] = False
        return unwrapped.model

    def _account(self, changed: bool) -> int:
        """Adds the step to each env's episode, ends the finished ones (resetting them now under
        same-step autoreset), writes the step infos and runs ``on_reset`` hooks; returns how many
        episodes ended."""
        stepped, returns, lengths = self._stepped, self._returns, self._lengths
        # Every env stepped (the common case): whole-array operations, cheaper than masked ones.
        rows: Any = slice(None) if stepped.all() else stepped
        returns[rows] += self._rewards[rows]
        lengths[rows] += 1
        ended = stepped & (self._terminations | self._truncations)
        ended_rows = ended.nonzero()[0] if ended.any() else None
        same_step_resets: list[int] = []
        infos = self._step_infos
        shown = rows
        if ended_rows is not None:
            if self.same_step:
                self._add_infos(infos, ended, ("final_info",))
                shown = stepped & ~ended
            metrics = bool(self._config.episode_metrics)
            same_step_resets = self._end_rows(ended_rows, {k: v for k, (v, _) in infos.items()} if metrics else None)
        self._add_infos(infos, shown, ())
        if self.hooks is not None:
            self.hooks.on_reset(same_step_resets, lengths)  # type: ignore[arg-type]
        return 0 if ended_rows is None else len(ended_rows)

    def _add_infos(self, infos: Infos, rows: Any, prefix: tuple[str, ...]) -> None:
        """Adds the step infos of the envs at ``rows`` (a bool mask, or a slice of them all)."""
        if isinstance(rows, slice) or rows.any():
            for key, (values, like) in infos.items():
                self._info.add_column((*prefix, key), values, rows, like)
