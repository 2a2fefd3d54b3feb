"""Tasks of free-moving robots, rewarded for moving or standing: HalfCheetah, Hopper, Walker2d,
Swimmer, Ant, Humanoid and HumanoidStandup."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .task import FLOAT64, Infos, Task, _control_cost, _norm, _write_parts


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
    reset_noise = "normal"

    def reset_infos(self) -> Infos:
        return {"x_position": (self.arrays["qpos"][:, 0].copy(), FLOAT64)}

    def before(self) -> Any:
        return self.arrays["qpos"][:, 0].copy()

    def _velocities(self, rows: Any) -> np.ndarray:
        return self.arrays["qvel"][rows]

    def observe(self, out: np.ndarray, rows: Any, cfrc_ext: np.ndarray | None) -> None:
        qpos = self.arrays["qpos"][rows]
        if self.c["_exclude_current_positions_from_observation"]:
            qpos = qpos[:, self.skipped :]
        _write_parts(out, rows, (qpos, self._velocities(rows)))

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
    reset_noise = "uniform"

    def reset_infos(self) -> Infos:
        qpos = self.arrays["qpos"]
        return {
            "x_position": (qpos[:, 0].copy(), FLOAT64),
            "z_distance_from_origin": (qpos[:, 1] - self.c["init_qpos"][1], FLOAT64),
        }

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
            # np.all's reduction, without its Python wrapper (a few microseconds on every step)
            healthy &= np.logical_and.reduce((low < state) & (state < high), axis=1)
        return healthy

    def results(self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: Any) -> tuple[np.ndarray, np.ndarray, Infos]:
        x = self.arrays["qpos"][:, 0].copy()
        x_velocity = (x - before) / dt
        forward = self.c["_forward_reward_weight"] * x_velocity
        healthy = self._healthy()
        survive = healthy * self.c["_healthy_reward"]
        # gymnasium's healthy flag times the reward: Hopper's all(...) is a Python bool, Walker2d's
        # `and` of comparisons a numpy bool (True * True is an int, np.True_ * True a numpy bool).
        flag = True if "_healthy_state_range" in self.c else np.True_
        ctrl = _control_cost(self.c["_ctrl_cost_weight"], actions)
        terminated = ~healthy & bool(self.c["_terminate_when_unhealthy"])
        infos: Infos = {
            "x_position": (x, FLOAT64),
            "z_distance_from_origin": (self.arrays["qpos"][:, 1] - self.c["init_qpos"][1], FLOAT64),
            "x_velocity": (x_velocity, FLOAT64),
            "reward_forward": (forward, FLOAT64),
            "reward_ctrl": (-ctrl, ctrl.dtype.type(0)),
            "reward_survive": (survive, flag * self.c["_healthy_reward"]),
        }
        return (forward + survive) - ctrl, terminated, infos


class Swimming(Forward):
    """Swimmer: rewarded for x velocity, positions in the plane reported."""

    ids = ("Swimmer-v5",)
    skipped = 2
    reset_noise = "uniform"

    def _positions(self) -> Infos:
        """Where each env is in the plane: its reset infos, and the first of its step infos."""
        qpos = self.arrays["qpos"]
        return {
            "x_position": (qpos[:, 0].copy(), FLOAT64),
            "y_position": (qpos[:, 1].copy(), FLOAT64),
            "distance_from_origin": (_norm(qpos[:, 0:2]), FLOAT64),
        }

    reset_infos = _positions

    def before(self) -> Any:
        return self.arrays["qpos"][:, 0:2].copy()

    def _xy(self) -> np.ndarray:
        return self.arrays["qpos"][:, 0:2].copy()

    def _planar(self, before: Any, dt: Any) -> tuple[np.ndarray, Infos]:
        xy = self._xy()
        velocity = (xy - before) / (dt if np.ndim(dt) == 0 else dt[:, None])
        infos: Infos = {
            **self._positions(),
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
    reset_noise = "normal"

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

    def _tendons(self) -> Infos:
        lengths, velocities = self.arrays["ten_length"], self.arrays["ten_velocity"]
        return {
            "tendon_length": (lengths.copy(), lengths[0].copy()),
            "tendon_velocity": (velocities.copy(), velocities[0].copy()),
        }

    def reset_infos(self) -> Infos:
        planar = self._positions()
        return {
            "x_position": planar["x_position"],
            "y_position": planar["y_position"],
            **self._tendons(),
            "distance_from_origin": planar["distance_from_origin"],
        }

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
        _write_parts(out, rows, parts)

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
            **self._tendons(),
            "distance_from_origin": planar["distance_from_origin"],
            "x_velocity": planar["x_velocity"],
            "y_velocity": planar["y_velocity"],
            "reward_survive": (survive, np.True_ * c["_healthy_reward"]),  # a numpy bool times it
            "reward_forward": (forward, FLOAT64),
            "reward_ctrl": (-ctrl, FLOAT64),
            "reward_contact": (-contact, FLOAT64),
        }
        return (forward + survive) - (ctrl + contact), terminated, infos


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

    def reset_infos(self) -> Infos:
        qpos = self.arrays["qpos"]
        return {
            "x_position": (qpos[:, 0].copy(), FLOAT64),
            "y_position": (qpos[:, 1].copy(), FLOAT64),
            "z_distance_from_origin": (qpos[:, 2] - self.c["init_qpos"][2], FLOAT64),
            **self._tendons(),
        }

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
            **self._tendons(),
            "reward_linup": (up, FLOAT64),
            "reward_quadctrl": (-ctrl, FLOAT64),
            "reward_impact": (-impact, FLOAT64),
        }
        return up - ctrl - impact + 1, np.zeros(len(height), dtype=np.bool_), infos
