"""What gymnasium's MuJoCo v5 envs compute around their physics, over a whole slot at once
(``engine="mujoco"``, ``shmpool.workers.mujoco_batch``).

Each ``Task`` is one env family's ``step`` after ``do_simulation``: observation, reward,
termination and info, written as numpy operations over the ``(envs, ...)`` arrays that
``mujoco.batch.Batch`` binds, instead of once per env in Python. They give gymnasium's results bit
for bit (``tests/test_mujoco_engine.py`` compares them with ``SyncVectorEnv``): the same operations
in the same order and dtypes, element by element. Where a reduction's order could differ, the one
that matches per-env numpy is used and was checked: row sums over a contiguous last axis (numpy's
pairwise sum per row, as for one env), ``np.vecdot`` for ``np.linalg.norm(ord=2)`` (both a dot
product; ``sqrt(x*x + y*y)`` differs in the last bit), ``einsum`` for Humanoid's mass centre. A
``float32`` action keeps its control cost ``float32`` (NEP 50: a Python float times a float32 is a
float32), as in gymnasium.

The constants a task reads (``_ctrl_cost_weight``, ``_healthy_z_range``, ...) are the unwrapped env's
own attributes, read from the slot's envs, so the v5 constructor arguments given in ``env_kwargs``
hold; every env of a slot must have the same ones (``Task.read_constants`` says which differ).

This module imports neither ``mujoco`` nor the batch: the trainer uses ``TASKS`` to check an env
id at launch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

#: The type of most info values (a numpy float64), as ``Infos`` gives it: made once, not per step.
FLOAT64 = np.float64(0)

#: Step infos: per key, its values for every env of the slot and a value of the type gymnasium's env
#: reports (which fixes how the key is batched: a Python float as float64, a numpy float32 as float32).
Infos = dict[str, tuple[np.ndarray, Any]]


class Task:
    """One env family's work around the physics, over the arrays of a slot's simulations.

    ``arrays`` maps MjData field names (those in ``fields``) to live ``(envs, ...)`` arrays, plus
    ``"cfrc_ext"`` for the tasks that need it after ``mj_rnePostConstraint`` (``contact_forces``).
    """

    #: The gymnasium ids this task runs.
    ids: ClassVar[tuple[str, ...]] = ()
    #: The MjData fields it reads.
    fields: ClassVar[tuple[str, ...]] = ("qpos", "qvel")
    #: The unwrapped env's attributes it computes with.
    constants: ClassVar[tuple[str, ...]] = ()
    #: Constants only some of its envs have (Hopper's ``_healthy_state_range``, not Walker2d's).
    optional_constants: ClassVar[tuple[str, ...]] = ()
    #: Whether it reads ``cfrc_ext`` as gymnasium fills it after the step (``mj_rnePostConstraint``).
    contact_forces: ClassVar[bool] = False

    def __init__(self, arrays: dict[str, np.ndarray], model_field: Callable[[str], np.ndarray]) -> None:
        self.arrays = arrays
        #: Each simulation's values of a model field, ``(envs, ...)`` (per simulation or shared; a
        #: scalar option no binding changed is its one value).
        self.model_field = model_field
        self.c: dict[str, Any] = {}

    def read_constants(self, envs: list[Any], first_env: int) -> None:
        """Takes the constants from the slot's unwrapped envs (pool env ids ``first_env`` on);
        ``ValueError`` naming one that differs (after giving every env back the value it ran with,
        if there was one)."""
        first = envs[0].unwrapped
        present = tuple(name for name in self.optional_constants if hasattr(first, name))
        for name in ("frame_skip", *self.constants, *present):
            value = getattr(first, name)
            for index, env in enumerate(envs[1:], 1):
                other = getattr(env.unwrapped, name)
                if not _same(other, value):
                    if name in self.c:  # a control call made them differ: the envs keep what they ran with
                        for each in envs:
                            setattr(each.unwrapped, name, self.c[name])
                    raise ValueError(
                        f"engine='mujoco' runs one task per slot: {name} is {value!r} in env {first_env} (the "
                        f"slot's first) and {other!r} in env {first_env + index}; give every env the same value "
                        f"(env_kwargs), or use "
                        f"engine='python'"
                    )
            self.c[name] = value

    def before(self) -> Any:
        """What the step needs from before the physics (positions, say), copied."""
        return None

    def observe(self, out: np.ndarray, rows: np.ndarray | slice, cfrc_ext: np.ndarray | None) -> None:
        """Writes the observations of the envs at ``rows`` into ``out[rows]``."""
        raise NotImplementedError

    def results(
        self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, Infos]:
        """Every env's reward (float64), termination and step infos after the physics."""
        raise NotImplementedError


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b))) and type(a) is type(b)
    except (TypeError, ValueError):
        return a is b


def _norm(xy: np.ndarray) -> np.ndarray:
    """``np.linalg.norm(row, ord=2)`` of each row, bit for bit (a dot product, as norm computes it)."""
    return np.sqrt(np.vecdot(xy, xy))


def _squares(values: np.ndarray) -> np.ndarray:
    """``value ** 2`` of each value as a numpy float64 scalar computes it (libm's ``pow``), which
    differs from the ``x * x`` of an array's ``** 2`` in the last bit now and then."""
    return np.array([value**2 for value in values.tolist()], dtype=np.float64)


def _control_cost(weight: float, actions: np.ndarray) -> np.ndarray:
    return weight * np.sum(np.square(actions), axis=1)


class Forward(Task):
    """Runners rewarded for x velocity: HalfCheetah (and the base of the legged ones)."""

    ids: ClassVar[tuple[str, ...]] = ("HalfCheetah-v5",)
    constants: ClassVar[tuple[str, ...]] = (
        "_forward_reward_weight",
        "_ctrl_cost_weight",
        "_exclude_current_positions_from_observation",
    )
    #: Leading qpos entries left out of the observation when positions are excluded.
    skipped = 1

    def before(self) -> Any:
        return self.arrays["qpos"][:, 0].copy()

    def _velocities(self, rows: Any) -> np.ndarray:
        return self.arrays["qvel"][rows]

    def observe(self, out: np.ndarray, rows: Any, cfrc_ext: np.ndarray | None) -> None:
        qpos = self.arrays["qpos"][rows]
        if self.c["_exclude_current_positions_from_observation"]:
            qpos = qpos[:, self.skipped :]
        width = qpos.shape[1]
        out[rows, :width] = qpos
        velocities = self._velocities(rows)
        out[rows, width : width + velocities.shape[1]] = velocities

    def results(self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: Any) -> tuple[np.ndarray, np.ndarray, Infos]:
        x = self.arrays["qpos"][:, 0].copy()
        x_velocity = (x - before) / dt
        forward = self.c["_forward_reward_weight"] * x_velocity
        ctrl = _control_cost(self.c["_ctrl_cost_weight"], actions)
        infos: Infos = {
            "x_position": (x, FLOAT64),
            "x_velocity": (x_velocity, FLOAT64),
            "reward_forward": (forward, FLOAT64),
            "reward_ctrl": (-ctrl, ctrl.dtype.type(0)),
        }
        return forward - ctrl, np.zeros(len(x), dtype=np.bool_), infos


class Hopping(Forward):
    """Hopper and Walker2d: healthy while z, the torso angle (and Hopper's state) stay in range."""

    ids = ("Hopper-v5", "Walker2d-v5")
    constants = (
        *Forward.constants,
        "_healthy_reward",
        "_terminate_when_unhealthy",
        "_healthy_z_range",
        "_healthy_angle_range",
        "init_qpos",
    )

    optional_constants = ("_healthy_state_range",)  # Hopper's only

    def _velocities(self, rows: Any) -> np.ndarray:
        return np.clip(self.arrays["qvel"][rows], -10, 10)

    def _healthy(self) -> np.ndarray:
        qpos, qvel = self.arrays["qpos"], self.arrays["qvel"]
        z, angle = qpos[:, 1], qpos[:, 2]
        min_z, max_z = self.c["_healthy_z_range"]
        min_angle, max_angle = self.c["_healthy_angle_range"]
        healthy = (min_z < z) & (z < max_z) & (min_angle < angle) & (angle < max_angle)
        if "_healthy_state_range" in self.c:
            state = np.concatenate((qpos, qvel), axis=1)[:, 2:]
            low, high = self.c["_healthy_state_range"]
            healthy &= np.all((low < state) & (state < high), axis=1)
        return healthy  # type: ignore[no-any-return]

    def results(self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: Any) -> tuple[np.ndarray, np.ndarray, Infos]:
        x = self.arrays["qpos"][:, 0].copy()
        x_velocity = (x - before) / dt
        forward = self.c["_forward_reward_weight"] * x_velocity
        healthy = self._healthy()
        survive = healthy * self.c["_healthy_reward"]  # gymnasium: a Python bool times the reward
        ctrl = _control_cost(self.c["_ctrl_cost_weight"], actions)
        terminated = ~healthy & bool(self.c["_terminate_when_unhealthy"])
        infos: Infos = {
            "x_position": (x, FLOAT64),
            "z_distance_from_origin": (self.arrays["qpos"][:, 1] - self.c["init_qpos"][1], FLOAT64),
            "x_velocity": (x_velocity, FLOAT64),
            "reward_forward": (forward, FLOAT64),
            "reward_ctrl": (-ctrl, ctrl.dtype.type(0)),
            "reward_survive": (survive, True * self.c["_healthy_reward"]),  # a Python bool times it
        }
        return (forward + survive) - ctrl, terminated, infos


class Swimming(Forward):
    """Swimmer: rewarded for x velocity, positions in the plane reported."""

    ids = ("Swimmer-v5",)
    skipped = 2

    def before(self) -> Any:
        return self.arrays["qpos"][:, 0:2].copy()

    def _xy(self) -> np.ndarray:
        return self.arrays["qpos"][:, 0:2].copy()

    def _planar(self, before: Any, dt: Any) -> tuple[np.ndarray, Infos]:
        xy = self._xy()
        velocity = (xy - before) / (dt if np.ndim(dt) == 0 else dt[:, None])
        qpos = self.arrays["qpos"]
        infos: Infos = {
            "x_position": (qpos[:, 0].copy(), FLOAT64),
            "y_position": (qpos[:, 1].copy(), FLOAT64),
            "distance_from_origin": (_norm(qpos[:, 0:2]), FLOAT64),
            "x_velocity": (velocity[:, 0].copy(), FLOAT64),
            "y_velocity": (velocity[:, 1].copy(), FLOAT64),
        }
        return velocity[:, 0].copy(), infos

    def results(self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: Any) -> tuple[np.ndarray, np.ndarray, Infos]:
        x_velocity, infos = self._planar(before, dt)
        forward = self.c["_forward_reward_weight"] * x_velocity
        ctrl = _control_cost(self.c["_ctrl_cost_weight"], actions)
        infos["reward_forward"] = (forward, FLOAT64)
        infos["reward_ctrl"] = (-ctrl, ctrl.dtype.type(0))
        return forward - ctrl, np.zeros(len(x_velocity), dtype=np.bool_), infos


class Ant(Swimming):
    """Ant: the main body's planar velocity, contact forces clipped into the observation and cost."""

    ids = ("Ant-v5",)
    fields: ClassVar[tuple[str, ...]] = ("qpos", "qvel", "xpos")
    constants = (
        *Forward.constants,
        "_healthy_reward",
        "_terminate_when_unhealthy",
        "_healthy_z_range",
        "_contact_cost_weight",
        "_contact_force_range",
        "_main_body",
        "_include_cfrc_ext_in_observation",
    )
    contact_forces = True
    skipped = 2

    def read_constants(self, envs: list[Any], first_env: int) -> None:
        super().read_constants(envs, first_env)
        unwrapped = envs[0].unwrapped
        self.body = unwrapped.data.body(self.c["_main_body"]).id  # a name or an id, as data.body takes it

    def _xy(self) -> np.ndarray:
        return self.arrays["xpos"][:, self.body, :2].copy()

    before = _xy

    def _clipped(self, cfrc_ext: np.ndarray) -> np.ndarray:
        low, high = self.c["_contact_force_range"]
        return np.clip(cfrc_ext, low, high)

    def observe(self, out: np.ndarray, rows: Any, cfrc_ext: np.ndarray | None) -> None:
        super().observe(out, rows, cfrc_ext)
        if self.c["_include_cfrc_ext_in_observation"]:
            assert cfrc_ext is not None
            width = self.arrays["qpos"].shape[1] - 2 * bool(self.c["_exclude_current_positions_from_observation"])
            width += self.arrays["qvel"].shape[1]
            forces = self._clipped(cfrc_ext[rows][:, 1:])
            out[rows, width:] = forces.reshape(len(forces), -1)

    def results(self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: Any) -> tuple[np.ndarray, np.ndarray, Infos]:
        x_velocity, infos = self._planar(before, dt)
        forward = x_velocity * self.c["_forward_reward_weight"]
        qpos, qvel = self.arrays["qpos"], self.arrays["qvel"]
        min_z, max_z = self.c["_healthy_z_range"]
        finite = np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1)
        healthy = finite & (min_z <= qpos[:, 2]) & (qpos[:, 2] <= max_z)
        survive = healthy * self.c["_healthy_reward"]
        ctrl = _control_cost(self.c["_ctrl_cost_weight"], actions)
        forces = np.square(self._clipped(cfrc_ext))
        contact = self.c["_contact_cost_weight"] * np.sum(forces.reshape(len(forces), -1), axis=1)
        terminated = ~healthy & bool(self.c["_terminate_when_unhealthy"])
        infos["reward_forward"] = (forward, FLOAT64)
        infos["reward_ctrl"] = (-ctrl, ctrl.dtype.type(0))
        infos["reward_contact"] = (-contact, FLOAT64)
        infos["reward_survive"] = (survive, np.True_ * self.c["_healthy_reward"])  # a numpy bool times it
        return (forward + survive) - (ctrl + contact), terminated, infos


class Humanoid(Swimming):
    """Humanoid: the mass centre's velocity, body inertias, velocities, actuator and contact forces."""

    ids = ("Humanoid-v5",)
    fields: ClassVar[tuple[str, ...]] = (
        "qpos",
        "qvel",
        "xipos",
        "cinert",
        "cvel",
        "qfrc_actuator",
        "ctrl",
        "ten_length",
        "ten_velocity",
    )
    constants = (
        *Forward.constants,
        "_healthy_reward",
        "_terminate_when_unhealthy",
        "_healthy_z_range",
        "_contact_cost_weight",
        "_contact_cost_range",
        "_include_cinert_in_observation",
        "_include_cvel_in_observation",
        "_include_qfrc_actuator_in_observation",
        "_include_cfrc_ext_in_observation",
    )
    contact_forces = True
    skipped = 2

    def _xy(self) -> np.ndarray:
        masses = self.model_field("body_mass")
        centre = np.einsum("sb,sbj->sj", masses, self.arrays["xipos"]) / masses.sum(axis=1)[:, None]
        return centre[:, 0:2].copy()

    before = _xy

    def observe(self, out: np.ndarray, rows: Any, cfrc_ext: np.ndarray | None) -> None:
        arrays, c = self.arrays, self.c
        qpos = arrays["qpos"][rows]
        if c["_exclude_current_positions_from_observation"]:
            qpos = qpos[:, 2:]
        parts = [qpos, arrays["qvel"][rows]]
        for flag, part in (
            ("_include_cinert_in_observation", lambda: arrays["cinert"][rows][:, 1:]),
            ("_include_cvel_in_observation", lambda: arrays["cvel"][rows][:, 1:]),
            ("_include_qfrc_actuator_in_observation", lambda: arrays["qfrc_actuator"][rows][:, 6:]),
            ("_include_cfrc_ext_in_observation", lambda: cfrc_ext[rows][:, 1:]),  # type: ignore[index]
        ):
            if c[flag] is True:  # gymnasium compares with ``is True``
                values = part()
                parts.append(values.reshape(len(values), -1))
        start = 0
        for part in parts:
            out[rows, start : start + part.shape[1]] = part
            start += part.shape[1]

    def results(self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: Any) -> tuple[np.ndarray, np.ndarray, Infos]:
        x_velocity, planar = self._planar(before, dt)
        c, qpos = self.c, self.arrays["qpos"]
        forward = c["_forward_reward_weight"] * x_velocity
        min_z, max_z = c["_healthy_z_range"]
        healthy = (min_z < qpos[:, 2]) & (qpos[:, 2] < max_z)
        survive = healthy * c["_healthy_reward"]
        ctrl = _control_cost(c["_ctrl_cost_weight"], self.arrays["ctrl"])  # gymnasium: data.ctrl, float64
        contact = c["_contact_cost_weight"] * np.sum(np.square(cfrc_ext).reshape(len(cfrc_ext), -1), axis=1)
        contact = np.clip(contact, *c["_contact_cost_range"])
        terminated = ~healthy & bool(c["_terminate_when_unhealthy"])
        infos: Infos = {
            "x_position": planar["x_position"],
            "y_position": planar["y_position"],
            "tendon_length": (self.arrays["ten_length"].copy(), self.arrays["ten_length"][0].copy()),
            "tendon_velocity": (self.arrays["ten_velocity"].copy(), self.arrays["ten_velocity"][0].copy()),
            "distance_from_origin": planar["distance_from_origin"],
            "x_velocity": planar["x_velocity"],
            "y_velocity": planar["y_velocity"],
            "reward_survive": (survive, np.True_ * c["_healthy_reward"]),  # a numpy bool times it
            "reward_forward": (forward, FLOAT64),
            "reward_ctrl": (-ctrl, FLOAT64),
            "reward_contact": (-contact, FLOAT64),
        }
        return (forward + survive) - (ctrl + contact), terminated, infos


class InvertedPendulum(Task):
    """InvertedPendulum: a reward of 1 while the pole stays within 0.2 rad."""

    ids = ("InvertedPendulum-v5",)

    def observe(self, out: np.ndarray, rows: Any, cfrc_ext: np.ndarray | None) -> None:
        nq = self.arrays["qpos"].shape[1]
        out[rows, :nq] = self.arrays["qpos"][rows]
        out[rows, nq:] = self.arrays["qvel"][rows]

    def results(self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: Any) -> tuple[np.ndarray, np.ndarray, Infos]:
        qpos, qvel = self.arrays["qpos"], self.arrays["qvel"]
        finite = np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1)
        terminated = ~finite | (np.abs(qpos[:, 1]) > 0.2)
        survive = (~terminated).astype(np.int64)  # gymnasium: int(not terminated)
        return survive.astype(np.float64), terminated, {"reward_survive": (survive, 0)}


class InvertedDoublePendulum(Task):
    """InvertedDoublePendulum: alive while the tip stays above 1, penalized for distance and speed."""

    ids = ("InvertedDoublePendulum-v5",)
    fields = ("qpos", "qvel", "site_xpos", "qfrc_constraint")
    constants = ("_healthy_reward",)

    def observe(self, out: np.ndarray, rows: Any, cfrc_ext: np.ndarray | None) -> None:
        qpos, qvel = self.arrays["qpos"][rows], self.arrays["qvel"][rows]
        angles = qpos[:, 1:]
        parts = (
            qpos[:, :1],
            np.sin(angles),
            np.cos(angles),
            np.clip(qvel, -10, 10),
            np.clip(self.arrays["qfrc_constraint"][rows], -10, 10)[:, :1],
        )
        start = 0
        for part in parts:
            out[rows, start : start + part.shape[1]] = part
            start += part.shape[1]

    def results(self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: Any) -> tuple[np.ndarray, np.ndarray, Infos]:
        tip = self.arrays["site_xpos"][:, 0]
        x, y = tip[:, 0].copy(), tip[:, 2].copy()
        terminated = y <= 1
        qvel = self.arrays["qvel"]
        v1, v2 = qvel[:, 1], qvel[:, 2]
        distance = 0.01 * _squares(x) + _squares(y - 2)
        velocity = 0.001 * _squares(v1) + 0.005 * _squares(v2)
        alive = self.c["_healthy_reward"] * (~terminated).astype(np.int64)
        infos: Infos = {
            "reward_survive": (alive, self.c["_healthy_reward"] * 1),  # the reward times an int
            "distance_penalty": (-distance, FLOAT64),
            "velocity_penalty": (-velocity, FLOAT64),
        }
        return alive - distance - velocity, terminated, infos


class HumanoidStandup(Humanoid):
    """HumanoidStandup: rewarded for the torso's height (per unit of timestep), as Humanoid observed."""

    ids = ("HumanoidStandup-v5",)
    fields = ("qpos", "qvel", "cinert", "cvel", "qfrc_actuator", "ctrl", "ten_length", "ten_velocity")
    constants = (
        "_ctrl_cost_weight",
        "_impact_cost_weight",
        "_impact_cost_range",
        "_exclude_current_positions_from_observation",
        "_include_cinert_in_observation",
        "_include_cvel_in_observation",
        "_include_qfrc_actuator_in_observation",
        "_include_cfrc_ext_in_observation",
        "init_qpos",
    )

    def before(self) -> Any:
        return None

    def results(self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: Any) -> tuple[np.ndarray, np.ndarray, Infos]:
        c, qpos = self.c, self.arrays["qpos"]
        height = qpos[:, 2].copy()
        up = (height - 0) / self.model_field("opt.timestep")
        ctrl = c["_ctrl_cost_weight"] * np.sum(np.square(self.arrays["ctrl"]), axis=1)
        impact = c["_impact_cost_weight"] * np.sum(np.square(cfrc_ext).reshape(len(cfrc_ext), -1), axis=1)
        impact = np.clip(impact, *c["_impact_cost_range"])
        infos: Infos = {
            "x_position": (qpos[:, 0].copy(), FLOAT64),
            "y_position": (qpos[:, 1].copy(), FLOAT64),
            "z_distance_from_origin": (height - c["init_qpos"][2], FLOAT64),
            "tendon_length": (self.arrays["ten_length"].copy(), self.arrays["ten_length"][0].copy()),
            "tendon_velocity": (self.arrays["ten_velocity"].copy(), self.arrays["ten_velocity"][0].copy()),
            "reward_linup": (up, FLOAT64),
            "reward_quadctrl": (-ctrl, FLOAT64),
            "reward_impact": (-impact, FLOAT64),
        }
        return up - ctrl - impact + 1, np.zeros(len(height), dtype=np.bool_), infos


class Reaching(Task):
    """Reacher and Pusher: arms rewarded for closing distances between bodies, never terminated."""

    ids = ("Reacher-v5", "Pusher-v5")
    fields = ("qpos", "qvel", "xpos")
    constants = ("_reward_dist_weight", "_reward_control_weight")
    optional_constants = ("_reward_near_weight",)  # Pusher's only

    def read_constants(self, envs: list[Any], first_env: int) -> None:
        super().read_constants(envs, first_env)
        self.reacher = "_reward_near_weight" not in self.c
        names = ("fingertip", "target") if self.reacher else ("tips_arm", "object", "goal")
        self.bodies = [envs[0].unwrapped.data.body(name).id for name in names]

    def _com(self, which: int, rows: Any = slice(None)) -> np.ndarray:
        """``get_body_com`` of the task's body ``which``, for the envs at ``rows``."""
        return self.arrays["xpos"][rows][:, self.bodies[which]]

    def observe(self, out: np.ndarray, rows: Any, cfrc_ext: np.ndarray | None) -> None:
        qpos, qvel = self.arrays["qpos"][rows], self.arrays["qvel"][rows]
        if self.reacher:
            theta = qpos[:, :2]
            offset = (self._com(0, rows) - self._com(1, rows))[:, :2]
            parts = (np.cos(theta), np.sin(theta), qpos[:, 2:], qvel[:, :2], offset)
        else:
            parts = (qpos[:, :7], qvel[:, :7], self._com(0, rows), self._com(1, rows), self._com(2, rows))
        start = 0
        for part in parts:
            out[rows, start : start + part.shape[1]] = part
            start += part.shape[1]

    def results(self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: Any) -> tuple[np.ndarray, np.ndarray, Infos]:
        c = self.c
        ctrl = -np.sum(np.square(actions), axis=1) * c["_reward_control_weight"]
        if self.reacher:
            distance = -_norm(self._com(0) - self._com(1)) * c["_reward_dist_weight"]
            infos: Infos = {"reward_dist": (distance, FLOAT64), "reward_ctrl": (ctrl, ctrl.dtype.type(0))}
            return distance + ctrl, np.zeros(len(ctrl), dtype=np.bool_), infos
        near = -_norm(self._com(1) - self._com(0)) * c["_reward_near_weight"]
        distance = -_norm(self._com(1) - self._com(2)) * c["_reward_dist_weight"]
        infos = {
            "reward_dist": (distance, FLOAT64),
            "reward_ctrl": (ctrl, ctrl.dtype.type(0)),
            "reward_near": (near, FLOAT64),
        }
        return distance + ctrl + near, np.zeros(len(ctrl), dtype=np.bool_), infos


#: The gymnasium ids ``engine="mujoco"`` runs, and their tasks.
TASKS: dict[str, type[Task]] = {
    env_id: task
    for task in (
        Forward,
        Hopping,
        Swimming,
        Ant,
        Humanoid,
        HumanoidStandup,
        InvertedPendulum,
        InvertedDoublePendulum,
        Reaching,
    )
    for env_id in task.ids
}


def task_of(env: Any) -> type[Task]:
    """The task of ``env`` (a registered id), or ``ValueError`` listing the ids the engine runs."""
    if not isinstance(env, str) or env not in TASKS:
        raise ValueError(
            f"engine='mujoco' runs gymnasium's MuJoCo v5 envs {sorted(TASKS)} by id, got {env!r:.80}; "
            f"use engine='python' for any other env"
        )
    return TASKS[env]
