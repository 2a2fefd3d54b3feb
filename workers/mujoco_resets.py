"""Resets of an ``engine="mujoco"`` slot at batch speed (``BatchResets``): each env's ``np_random``
draws gymnasium's reset noise in gymnasium's order, and the states go into the batch's rows at once.

Why and how: ``docs/internals.md``, "workers/mujoco_resets.py".
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import gymnasium
import numpy as np
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit

from shmpool.mujoco_tasks import Task

#: The wrappers ``gymnasium.make`` puts on every env, whose ``reset`` the slot does itself: the time
#: limit's count is the slot's, and the other two only note that a first reset happened.
_MAKES_WRAPPERS = (TimeLimit, OrderEnforcing, PassiveEnvChecker)
#: What decides a reset of a gymnasium MuJoCo env: none of it may be the user's.
_RESET_METHODS = ("reset", "reset_model", "_get_reset_info", "set_state", "np_random")
_GYMNASIUM_DIR = os.path.realpath(os.path.dirname(gymnasium.__file__)) + os.sep


def resets_as_gymnasiums(env: gymnasium.Env) -> bool:
    """Whether ``env``'s reset is exactly what gymnasium's MuJoCo env and ``make``'s wrappers do:
    no other wrapper, no reset method of the user's (a subclass's, or patched on a class or an
    instance), no human rendering."""
    layer: Any = env
    while isinstance(layer, gymnasium.Wrapper):
        if type(layer) not in _MAKES_WRAPPERS or "reset" in vars(layer):
            return False
        layer = layer.env
    if getattr(layer, "render_mode", None) == "human":
        return False
    own = vars(layer)
    for name in _RESET_METHODS:
        found = inspect.getattr_static(type(layer), name, None)
        function = found.fget if isinstance(found, property) else found
        if name in own or not _gymnasiums_own(function):
            return False
    return True


def _gymnasiums_own(function: Any) -> bool:
    """Whether ``function`` is gymnasium's own code: by the file its code was compiled from, so that
    a subclass's override, a method patched onto gymnasium's class and a wrapper that copied
    gymnasium's names (``functools.wraps``) are all the user's."""
    code = getattr(function, "__code__", None)
    return (
        code is not None
        and not hasattr(function, "__wrapped__")
        and os.path.realpath(code.co_filename).startswith(_GYMNASIUM_DIR)
    )


class BatchResets:
    """Which envs of a slot reset in the batch, and the states they reset to: ``mj_resetData``'s template state with
    ``qpos`` and ``qvel`` set to ``init_qpos``/``init_qvel`` plus noise from each env's ``np_random``. Why one template
    serves every simulation: ``docs/internals.md``, "workers/mujoco_resets.py".
    """

    def __init__(self, mujoco: Any, nominal: Any, task: Task) -> None:
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        data = mujoco.MjData(nominal)
        mujoco.mj_resetData(nominal, data)
        #: The state every simulation starts a reset from (time 0, no warm start, no forces).
        self.template = np.empty(mujoco.mj_stateSize(nominal, spec))
        mujoco.mj_getState(nominal, data, self.template, spec)
        start = mujoco.mj_stateSize(nominal, mujoco.mjtState.mjSTATE_TIME)
        self._qpos = slice(start, start + nominal.nq)
        self._qvel = slice(start + nominal.nq, start + nominal.nq + nominal.nv)
        self._nq, self._nv = nominal.nq, nominal.nv
        self._noise = task.reset_noise
        # State that mj_resetData takes from the model beyond qpos0, or that set_state leaves alone.
        extra = sum(getattr(mujoco.mjtState, name, 0) for name in ("mjSTATE_HISTORY", "mjSTATE_PLASTIC"))
        self._usable = (
            task.reset_noise is not None
            and nominal.nmocap == nominal.neq == nominal.nplugin == 0
            and (not extra or mujoco.mj_stateSize(nominal, int(extra)) == 0)
        )
        #: Per env: whether it resets here (else through gymnasium's ``reset``).
        self.in_batch = np.zeros(0, dtype=np.bool_)
        self._unwrapped: list[Any] = []
        self._scales = np.zeros(0)
        self._init_qpos = np.zeros((0, self._nq))
        self._init_qvel = np.zeros((0, self._nv))

    def plan(self, envs: list[gymnasium.Env]) -> None:
        """Reads which envs reset here and their constants (after the envs are made, and after every
        control call, which may have wrapped an env or changed its ``init_qpos``). An env whose
        constants are not what ``reset_model`` draws with here (a scale that is no number, say)
        resets through gymnasium."""
        unwrapped: list[Any] = [env.unwrapped for env in envs]
        in_batch = np.zeros(len(envs), dtype=np.bool_)
        scales, init_qpos, init_qvel = (
            np.zeros(len(envs)),
            np.zeros((len(envs), self._nq)),
            np.zeros((len(envs), self._nv)),
        )
        for row, (env, one) in enumerate(zip(envs, unwrapped) if self._usable else ()):
            if not resets_as_gymnasiums(env):
                continue
            scale = getattr(one, "_reset_noise_scale", None)
            position, velocity = np.asarray(one.init_qpos), np.asarray(one.init_qvel)
            if (
                isinstance(scale, (int, float, np.integer, np.floating))
                and not isinstance(scale, (bool, np.bool_))
                and position.shape == (self._nq,)
                and velocity.shape == (self._nv,)
                and position.dtype == velocity.dtype == np.float64
            ):
                in_batch[row], scales[row], init_qpos[row], init_qvel[row] = True, scale, position, velocity
        # Assigned together: a plan is never half read.
        self._unwrapped, self.in_batch = unwrapped, in_batch
        self._scales, self._init_qpos, self._init_qvel = scales, init_qpos, init_qvel

    def write(self, rows: np.ndarray, state: np.ndarray) -> None:
        """Draws the reset noise of the envs at ``rows`` from their own generators, as their
        ``reset_model`` does, and writes their reset states into the batch's ``state`` rows."""
        nq, nv, uniform = self._nq, self._nv, self._noise == "uniform"
        position_noise, velocity_noise = np.empty((len(rows), nq)), np.empty((len(rows), nv))
        unwrapped, scales = self._unwrapped, self._scales
        for index, row in enumerate(rows.tolist()):
            generator, scale = unwrapped[row].np_random, scales[row]
            position_noise[index] = generator.uniform(low=-scale, high=scale, size=nq)
            if uniform:
                velocity_noise[index] = generator.uniform(low=-scale, high=scale, size=nv)
            else:
                velocity_noise[index] = generator.standard_normal(nv)
        if not uniform:  # gymnasium: init_qvel + scale * standard_normal(nv)
            velocity_noise *= scales[rows, None]
        states = np.empty((len(rows), len(self.template)))
        states[:] = self.template
        states[:, self._qpos] = self._init_qpos[rows] + position_noise
        states[:, self._qvel] = self._init_qvel[rows] + velocity_noise
        state[rows] = states
