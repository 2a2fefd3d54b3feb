"""Parameter bindings and pushes for gymnasium's MuJoCo envs (the ``mujoco`` extra: ``pip install -e ".[mujoco]"``).

Each binding names one entry of the env's ``mujoco.MjModel`` and is resolved once per env, at launch (and again
when an env is re-made); ``log_to_python`` sends MuJoCo's warnings to ``logging``. How to use them:
``docs/guides/mujoco.md``. This module imports ``mujoco`` only when a binding is resolved or ``log_to_python`` is
called; it declares the adapter of gymnasium's MuJoCo envs (``shmpool.env_families``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .env_families import EnvAdapter

_OBJECTS = {"body": "mjOBJ_BODY", "geom": "mjOBJ_GEOM", "joint": "mjOBJ_JOINT", "actuator": "mjOBJ_ACTUATOR"}


class Simulation:
    """Where an env's physics lives under ``engine="mujoco"``: simulation ``index`` of a
    ``mujoco.batch.Batch`` (set on the unwrapped env as ``_shmpool_simulation``). Bindings write its
    per-simulation model fields and ``Push`` its state there, not in the env's own ``MjModel`` and
    ``MjData``, which hold a copy only while a control call runs."""

    def __init__(self, batch: Any, index: int, nominal: Any, expanded: set[str], models_changed: np.ndarray) -> None:
        self.batch, self.index, self.nominal = batch, index, nominal
        #: The batch's per-simulation model fields, shared by its simulations.
        self.expanded = expanded
        #: Per simulation of the batch (shared by them): whether a binding changed its model since
        #: its env's ``MjModel`` was copied. One array, so that a write to many sets it in one store.
        self.models_changed = models_changed


#: Up to how many simulations a small batch call (``forward``, ``set_const``) runs one at a time, on
#: the calling thread. A call on several shares them among the batch's threads, whose helpers sleep
#: after some 50 µs idle and take 20-45 µs to wake (the 2-core VM), more than a few simulations'
#: work: a reset's ``forward`` of two Hoppers took 54 µs in one call, 13 one by one
#: (``docs/benchmarks.md``, "Reset calls that wake no thread").
FEW_SIMULATIONS = 3


def call_batch(call: Callable[[Any], None], ids: Sequence[int] | np.ndarray) -> None:
    """``call(ids)``, a method of ``mujoco.batch.Batch`` on sorted unique simulation ``ids`` (its
    results are the same at any thread count), as one call per simulation for a few of them: then a
    ``SimulationError`` names the first simulation that failed, and the ones after it do not run."""
    if len(ids) > FEW_SIMULATIONS:
        call(ids)
        return
    for index in np.asarray(ids).tolist():
        call([index])


def simulation_of(env: Any) -> Simulation | None:
    """The batch simulation that runs ``env`` under ``engine="mujoco"``; None for an env of its own."""
    return getattr(env.unwrapped, "_shmpool_simulation", None)


def _model_and_data(env: Any) -> tuple[Any, Any]:
    unwrapped = env.unwrapped
    if not hasattr(unwrapped, "model") or not hasattr(unwrapped, "data"):
        raise TypeError(f"{type(unwrapped).__name__} is not a MuJoCo env (it has no .model/.data)")
    return unwrapped.model, unwrapped.data


def object_id(model: Any, kind: str, name: str | int) -> int:
    """The id of the named body, geom, joint or actuator (or the id given, checked); ``ValueError``
    listing the names if unknown."""
    import mujoco

    count = {"body": model.nbody, "geom": model.ngeom, "joint": model.njnt, "actuator": model.nu}[kind]
    if isinstance(name, int):  # models whose objects have no names (gymnasium's Ant: its actuators)
        if not 0 <= name < count:
            raise ValueError(f"the model has no {kind} {name}: its {kind} ids are 0..{count - 1}")
        return name
    index = mujoco.mj_name2id(model, getattr(mujoco.mjtObj, _OBJECTS[kind]), name)
    if index < 0:
        names = [getattr(model, kind)(i).name for i in range(count)]
        raise ValueError(f"the model has no {kind} named {name!r}; its {kind} names are {[n for n in names if n]}")
    return int(index)


class ModelBinding:
    """Binds a parameter to entries of one array of the env's ``MjModel``; use it as ``Param(bind=...)``."""

    def __init__(
        self,
        field: str,
        kind: str | None,
        name: str | int | None,
        axis: int | None,
        *,
        relative: bool = False,
        set_const: bool = False,
    ) -> None:
        self.field, self.kind, self.name, self.axis = field, kind, name, axis
        self.relative, self.set_const = relative, set_const

    def __repr__(self) -> str:
        where = f"{self.name!r}" if self.name is not None else ""
        axis = f", axis={self.axis}" if self.axis is not None else ""
        return f"{self.field}({where}{axis}{', relative=True' if self.relative else ''})"

    def _location(self, model: Any) -> tuple[Any, ...]:
        if self.kind is None:
            return () if self.axis is None else (self.axis,)
        index = object_id(model, self.kind, self.name)  # type: ignore[arg-type]
        if self.kind == "joint" and self.field.startswith("dof_"):  # the joint's first degree of freedom
            index = int(model.jnt_dofadr[index])
        return (index,) if self.axis is None else (index, self.axis)

    def resolve(self, env: Any, param: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        """The (read, write) functions of this binding on ``env``; called once per (re)built env."""
        import mujoco

        simulation = simulation_of(env)
        if simulation is not None:
            return self.resolve_in_batch(simulation)
        model, data = _model_and_data(env)
        owner, attribute = (model.opt, self.field[4:]) if self.field.startswith("opt.") else (model, self.field)
        scalar = not isinstance(getattr(owner, attribute), np.ndarray)
        location, nominal = self._nominal_value(model)
        scratch = mujoco.MjData(model) if self.set_const else None

        def read() -> Any:
            if self.relative:
                return np.ones(nominal.shape)
            return np.array(getattr(owner, attribute)) if scalar else np.array(getattr(owner, attribute)[location])

        def write(value: Any) -> None:
            target = nominal * np.asarray(value) if self.relative else np.asarray(value)
            if scalar:
                setattr(owner, attribute, float(target))
            else:
                getattr(owner, attribute)[location] = target
            if scratch is not None:
                mujoco.mj_setConst(model, scratch)

        return read, write

    def _nominal_value(self, model: Any) -> tuple[tuple[Any, ...], np.ndarray]:
        """Where the bound value sits in a row of the field (``()`` for a scalar option), and its
        value in ``model``."""
        owner, attribute = (model.opt, self.field[4:]) if self.field.startswith("opt.") else (model, self.field)
        array = getattr(owner, attribute)
        if not isinstance(array, np.ndarray):
            return (), np.array(array)
        location = self._location(model)
        return location, np.array(array[location])

    def resolve_in_batch(self, simulation: Simulation) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        """``resolve`` for an env of ``engine="mujoco"``: the same values, written into its
        simulation's row of the batch's per-simulation field by ``batch_writer``."""
        location, nominal = self._nominal_value(simulation.nominal)
        write_many, index = self.batch_writer(simulation), simulation.index
        indices = np.array([index])

        # The batch is looked up through the simulation at each call: closing the slot releases it.
        def read() -> Any:
            if self.relative:
                return np.ones(nominal.shape)
            current = simulation.batch.expanded(self.field)
            return nominal.copy() if current is None else np.array(current[index][location])

        def write(value: Any) -> None:
            write_many(indices, np.asarray(value)[np.newaxis])

        return read, write

    def batch_writer(self, simulation: Simulation) -> Callable[[np.ndarray, np.ndarray], None]:
        """A function writing ``values`` into the simulations ``indices`` (ints) of ``simulation``'s
        batch, value ``k`` to simulation ``indices[k]``: one numpy assignment into the batch's
        per-simulation field (made per simulation at the first write, so a field no parameter
        changes stays shared), and ``set_const`` for those simulations when the field needs it."""
        location, nominal = self._nominal_value(simulation.nominal)

        def write(indices: np.ndarray, values: np.ndarray) -> None:
            batch = simulation.batch  # looked up at each call: closing the slot releases it
            # float64, as the product of a Python number and the nominal, whatever ``values``' dtype
            targets = nominal * np.asarray(values, dtype=np.float64) if self.relative else np.asarray(values)
            expanded = batch.expand(self.field)
            simulation.expanded.add(self.field)
            expanded[(indices,) + location] = targets
            simulation.models_changed[indices] = True
            if self.set_const:
                call_batch(batch.set_const, sorted(set(np.asarray(indices).tolist())))  # takes sorted, unique ids

        return write


def body_mass(body: str, *, relative: bool = False) -> ModelBinding:
    """The mass of a body (derived constants are recomputed after each change)."""
    return ModelBinding("body_mass", "body", body, None, relative=relative, set_const=True)


def geom_friction(geom: str, axis: int | None = 0, *, relative: bool = False) -> ModelBinding:
    """A geom's friction: ``axis`` 0 sliding, 1 torsional, 2 rolling; None for all three (shape (3,))."""
    return ModelBinding("geom_friction", "geom", geom, axis, relative=relative)


def dof_damping(joint: str, *, relative: bool = False) -> ModelBinding:
    """The damping of a joint's (first) degree of freedom."""
    return ModelBinding("dof_damping", "joint", joint, None, relative=relative)


def actuator_gear(actuator: str | int, axis: int = 0, *, relative: bool = False) -> ModelBinding:
    """An actuator's gear (``axis`` 0: the scale from control to joint force); an unnamed actuator by
    its id."""
    return ModelBinding("actuator_gear", "actuator", actuator, axis, relative=relative)


def gravity(axis: int | None = 2, *, relative: bool = False) -> ModelBinding:
    """The gravity vector's ``axis`` component (None: the whole vector, shape (3,))."""
    return ModelBinding("opt.gravity", None, None, axis, relative=relative)


def timestep(*, relative: bool = False) -> ModelBinding:
    """The simulation timestep (``env.dt`` follows: it is the timestep times the frame skip)."""
    return ModelBinding("opt.timestep", None, None, None, relative=relative)


def wind(axis: int | None = 0, *, relative: bool = False) -> ModelBinding:
    """The wind velocity's ``axis`` component (None: the whole vector, shape (3,)); it acts on bodies
    through the medium's density and viscosity (``opt.density``, ``opt.viscosity``), zero in most
    models, so it moves nothing until one of those is set."""
    return ModelBinding("opt.wind", None, None, axis, relative=relative)


def geom_solref(geom: str, axis: int = 0, *, relative: bool = False) -> ModelBinding:
    """A geom's contact ``solref``: ``axis`` 0 the time constant (softer contact when larger), 1 the
    damping ratio."""
    return ModelBinding("geom_solref", "geom", geom, axis, relative=relative)


def geom_solimp(geom: str, axis: int = 0, *, relative: bool = False) -> ModelBinding:
    """A geom's contact ``solimp``: ``axis`` 0 and 1 the impedance at zero and full penetration, 2
    the width over which it changes (3 and 4 shape the curve)."""
    return ModelBinding("geom_solimp", "geom", geom, axis, relative=relative)


def dof_armature(joint: str, *, relative: bool = False) -> ModelBinding:
    """The armature (rotor inertia added to the joint's degree of freedom) of a joint's first degree
    of freedom; derived constants are recomputed after each change."""
    return ModelBinding("dof_armature", "joint", joint, None, relative=relative, set_const=True)


def dof_frictionloss(joint: str, *, relative: bool = False) -> ModelBinding:
    """The dry friction of a joint's first degree of freedom."""
    return ModelBinding("dof_frictionloss", "joint", joint, None, relative=relative)


def actuator_gain(actuator: str | int, *, relative: bool = False) -> ModelBinding:
    """An actuator's gain (``actuator_gainprm[0]``: force per unit of control for a motor)."""
    return ModelBinding("actuator_gainprm", "actuator", actuator, 0, relative=relative)


def scale_randomization(
    body: str = "torso",
    floor: str = "floor",
    mass: tuple[float, float] = (0.8, 1.2),
    friction: tuple[float, float] = (0.5, 1.5),
) -> dict[str, Any]:
    """The usual per-episode randomization of legged-robot papers, as declarations for ``launch``:
    ``mass_scale`` (the body's mass x U(mass)) and ``friction_scale`` (the floor's sliding friction x
    U(friction)), both ``when="reset"`` and changeable by a curriculum through their ``low``/``high``."""
    from .params import Param

    return {
        "mass_scale": Param(
            dist="uniform",
            default={"low": mass[0], "high": mass[1]},
            low=0.5 * mass[0],
            high=2.0 * mass[1],
            when="reset",
            bind=body_mass(body, relative=True),
        ),
        "friction_scale": Param(
            dist="uniform",
            default={"low": friction[0], "high": friction[1]},
            low=0.2 * friction[0],
            high=2.0 * friction[1],
            when="reset",
            bind=geom_friction(floor, axis=0, relative=True),
        ),
    }


class Push:
    """A kick for ``shmpool.hooks.Perturb`` on MuJoCo envs: an external force on a named body for
    the next step (``mode="force"``, through ``data.xfrc_applied``) or a change of the body's
    velocity (``mode="velocity"``, added to the ``qvel`` of the joints that move it)."""

    #: Under ``engine="mujoco"`` it writes the env's simulation in the batch (``Perturb`` checks).
    writes_the_batch = True

    def __init__(self, body: str = "torso", mode: str = "force") -> None:
        if mode not in ("force", "velocity"):
            raise ValueError(f"Push mode must be 'force' or 'velocity', got {mode!r}")
        self.body, self.mode = body, mode
        self._ids: dict[int, int] = {}

    def _body(self, model: Any) -> int:
        key = id(model)
        if key not in self._ids:
            self._ids[key] = object_id(model, "body", self.body)
        return self._ids[key]

    def _state(self, env: Any, field: str) -> tuple[Any, np.ndarray]:
        """The env's model and its state field ``field``: in its simulation's row of the batch under
        ``engine="mujoco"``, else in its own ``MjData``."""
        simulation = simulation_of(env)
        if simulation is not None:
            return simulation.nominal, simulation.batch.bind(field)[simulation.index]
        model, data = _model_and_data(env)
        return model, getattr(data, field)

    def __call__(self, env: Any, amounts: np.ndarray) -> None:
        if self.mode == "force":
            model, forces = self._state(env, "xfrc_applied")
            forces[self._body(model), : min(3, len(amounts))] = amounts[:3]
            return
        model, velocities = self._state(env, "qvel")
        body = self._body(model)
        start, count = int(model.body_dofadr[body]), int(model.body_dofnum[body])
        if start < 0 or count == 0:
            raise ValueError(f"body {self.body!r} has no degrees of freedom of its own to push")
        used = min(count, len(amounts))
        velocities[start : start + used] += amounts[:used]

    def clear(self, env: Any) -> None:
        """Removes the force after the step it acted on."""
        if self.mode == "force":
            model, forces = self._state(env, "xfrc_applied")
            forces[self._body(model)] = 0.0


class MujocoAdapter(EnvAdapter):
    """gymnasium's MuJoCo envs: parameters live in the ``MjModel`` (bind them with the functions
    above, which keep the model consistent themselves), and the velocities ``hooks.Perturb`` would
    kick depend on the robot, so it needs a ``Push``."""

    name = "MuJoCo"
    classes = ("gymnasium.envs.mujoco.mujoco_env:MujocoEnv",)

    def kicker(self, env: Any) -> Callable[[np.ndarray], None]:
        raise TypeError(
            f"Perturb has no default kick for MuJoCo envs ({type(env.unwrapped).__name__}): give it "
            f"kick=shmpool.mujoco.Push(body) (a force on the body, or mode='velocity')"
        )


ADAPTERS = [MujocoAdapter()]

#: Where ``log_to_python`` sends MuJoCo's warnings.
logger = logging.getLogger("mujoco")


def _warning(message: str) -> None:
    logger.warning("%s", message.rstrip())


def log_to_python() -> None:
    """Sends MuJoCo's warnings in this process to the ``"mujoco"`` logger (level WARNING) instead of
    MuJoCo's default handler, which prints them and appends them to ``MUJOCO_LOG.TXT`` in the working
    directory. Process-wide and idempotent; does nothing when ``mujoco`` is not installed.

    A forked worker inherits it; for every start method pass it as
    ``launch(..., worker_init=shmpool.mujoco.log_to_python)`` and call it in the trainer too.
    """
    try:
        import mujoco
    except ImportError:
        return
    mujoco.set_mju_user_warning(_warning)
