"""The ``Task`` every MuJoCo family's slot-wide step derives from, and the numeric helpers that
keep its results bit for bit gymnasium's."""

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
    #: How its env's ``reset_model`` draws the velocity noise after the position noise (uniform in
    #: ``±_reset_noise_scale``): ``"uniform"`` likewise, ``"normal"`` a standard normal times the
    #: scale; None: a reset the slot leaves to the env (Reacher's goal, say).
    reset_noise: ClassVar[str | None] = None

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

    def before_from(self, fields: dict[str, np.ndarray]) -> Any:
        """``before()`` computed from ``fields`` (MjData field names to ``(envs, ...)`` values) in
        place of the batch's."""
        bound = self.arrays
        self.arrays = {**bound, **fields}
        try:
            return self.before()
        finally:
            self.arrays = bound

    def observe(self, out: np.ndarray, rows: np.ndarray | slice, cfrc_ext: np.ndarray | None) -> None:
        """Writes the observations of the envs at ``rows`` into ``out[rows]``."""
        raise NotImplementedError

    def results(
        self, before: Any, actions: np.ndarray, dt: Any, cfrc_ext: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, Infos]:
        """Every env's reward (float64), termination and step infos after the physics."""
        raise NotImplementedError

    def reset_infos(self) -> Infos:
        """Every env's reset info as its ``_get_reset_info`` reports it, after the reset's forward."""
        return {}


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


def _write_parts(out: np.ndarray, rows: Any, parts: Any) -> None:
    """Writes ``parts`` (``(rows, width)`` arrays) side by side into ``out[rows]``."""
    start = 0
    for part in parts:
        out[rows, start : start + part.shape[1]] = part
        start += part.shape[1]


def _control_cost(weight: float, actions: np.ndarray) -> np.ndarray:
    # np.add.reduce is what np.sum calls (the same sums), without its Python dispatch on every step.
    return weight * np.add.reduce(np.square(actions), axis=1)
