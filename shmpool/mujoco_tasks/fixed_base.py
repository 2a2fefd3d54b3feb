"""Tasks of robots fixed to the world: the inverted pendulums, Reacher and Pusher."""

from __future__ import annotations

from typing import Any

import numpy as np

from .task import FLOAT64, Infos, Task, _norm, _squares, _write_parts


class InvertedPendulum(Task):
    """InvertedPendulum: a reward of 1 while the pole stays within 0.2 rad."""

    ids = ("InvertedPendulum-v5",)
    reset_noise = "uniform"

    def observe(self, out: np.ndarray, rows: Any, cfrc_ext: np.ndarray | None) -> None:
        _write_parts(out, rows, (self.arrays["qpos"][rows], self.arrays["qvel"][rows]))

    def results(self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: Any) -> tuple[np.ndarray, np.ndarray, Infos]:
        qpos, qvel = self.arrays["qpos"], self.arrays["qvel"]
        finite = np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1)
        terminated = ~finite | (np.abs(qpos[:, 1]) > 0.2)
        survive = (~terminated).astype(np.int64)  # gymnasium: int(not terminated)
        return survive.astype(np.float64), terminated, {"reward_survive": (survive, 0)}


class InvertedDoublePendulum(Task):
    """InvertedDoublePendulum: alive while the tip stays above 1, penalized for distance and speed."""

    ids = ("InvertedDoublePendulum-v5",)
    reset_noise = "normal"
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
        _write_parts(out, rows, parts)

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
        _write_parts(out, rows, parts)

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
