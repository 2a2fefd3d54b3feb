"""Stable-Baselines3 support: ``ShmpoolVecEnv``, an SB3 ``VecEnv`` whose envs run in a shmpool pool.

Needs ``pip install "shmpool[sb3]"``. The pool runs in ``SAME_STEP`` autoreset mode, SB3's convention; ``venv.pool``
is the ``shmpool.Pool`` itself, for its parameters, events and episode records. How to use it: ``docs/guides/sb3.md``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import methodcaller
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate, create_empty_array
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

import shmpool

from .options import fixed_options

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .options import OptionsButStartMethod

#: Infos that the pool adds itself, at the top level of a step's infos (``gymnasium``'s place for
#: them). For an env that finished, SB3 wants them in the finished episode's info, not the reset's.
POOL_EPISODE_KEYS = ("episode",)

#: The dtypes gymnasium batches Python's bool, int and float into: their values come back as those
#: types (an env's np.int64 and np.float64 batch alike, so they do too). A value of any other dtype
#: was a numpy scalar, and stays one, as in SB3's own VecEnvs.
PYTHON_NUMBER_DTYPES = (np.dtype(np.bool_), np.dtype(np.int64), np.dtype(np.float64))


class ShmpoolVecEnv(VecEnv):
    """An SB3 ``VecEnv`` over ``shmpool.launch``: one env per constructor in ``env_fns``.

    Use it as ``make_vec_env(..., vec_env_cls=ShmpoolVecEnv, vec_env_kwargs={...})``, the options
    going to ``shmpool.launch`` (``num_workers``, ``params``, ``hooks``, ``name``, ...).

    Args:
        env_fns: One callable per env, returning a ``gymnasium.Env`` (run in the workers; lambdas
            and closures work, they are shipped with ``dill``).
        start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"``; None: the platform's default.
        **launch_kwargs: Further options of ``shmpool.launch``; ``autoreset_mode`` is always
            ``SAME_STEP`` and ``copy`` always True (SB3 keeps observations across steps).

    Raises:
        ValueError: If two constructors returned the same env object into one worker process.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        start_method: str | None = None,
        **launch_kwargs: Unpack[OptionsButStartMethod],
    ) -> None:
        options = fixed_options("ShmpoolVecEnv", launch_kwargs, autoreset_mode=AutoresetMode.SAME_STEP, copy=True)
        self.closed = True  # until the pool exists: close() has nothing to do
        self.pool = shmpool.launch(list(env_fns), start_method=start_method, **options)
        self.closed = False
        self._actions: Any = None
        try:
            self._check_distinct_envs()
            # The base class reads render_mode through get_attr: the pool must exist by now.
            super().__init__(self.pool.num_envs, self.pool.single_observation_space, self.pool.single_action_space)
            self.metadata = self.pool.get_attr("metadata")[0]  # env 0's, as DummyVecEnv's (VecVideoRecorder's fps)
            # The pool's episode statistics stand in for a Monitor's only where no env has one: a Monitor
            # inside other wrappers (under an Atari stack's EpisodicLifeEnv) says which ends are episodes.
            self._pool_episodes = not any(self.env_is_wrapped(Monitor))
        except BaseException:
            self.close()
            raise
        # Composite action spaces come as one action per env (SB3's convention); the pool takes them
        # batched, as gymnasium does.
        self._batch_actions = isinstance(self.action_space, (spaces.Dict, spaces.Tuple))

    def __repr__(self) -> str:
        return f"ShmpoolVecEnv({self.pool!r})"

    def _check_distinct_envs(self) -> None:
        """Raises if two envs of one worker are one object (``[lambda: env] * n``): DummyVecEnv's check.

        Envs of different workers are separate copies, whatever the constructors returned."""
        seen: dict[tuple[int, int], int] = {}
        for env_id, identity in enumerate(self.pool.env_apply(_identity)):
            if identity in seen:
                raise ValueError(
                    f"env_fns[{seen[identity]}] and env_fns[{env_id}] returned the same env object, which "
                    "would then be stepped as two envs: each constructor must build a new env (for example "
                    "`lambda: gym.make(...)`, not `lambda: env`)"
                )
            seen[identity] = env_id

    # -- reset and step --------------------------------------------------------------------------

    def reset(self) -> VecEnvObs:
        """Resets every env with the seeds and options set since the last reset (then forgotten).

        Envs whose options differ are reset in groups of equal options, one masked reset per group.
        """
        seeds = None if all(seed is None for seed in self._seeds) else list(self._seeds)
        groups = self._option_groups()
        if len(groups) == 1:
            options = groups[0][0]
            # SB3 passes no options for empty ones; the pool's None does the same.
            observations, infos = self.pool.reset(seed=seeds, options=options or None)
            self.reset_infos = unbatch_infos(infos, self.num_envs)
        else:
            for options, mask in groups:
                # An empty group's envs get {} rather than None: a masked reset always has options.
                observations, infos = self.pool.reset(seed=seeds, options={**options, "reset_mask": mask})
                for env_id, info in enumerate(unbatch_infos(infos, self.num_envs)):
                    if mask[env_id]:
                        self.reset_infos[env_id] = info
        self._reset_seeds()
        self._reset_options()
        return observations

    def _option_groups(self) -> list[tuple[dict[str, Any], np.ndarray]]:
        """The distinct reset options, each with the mask of the envs that get them."""
        if len(self._options) != self.num_envs:
            raise ValueError(f"set_options got {len(self._options)} option dicts for {self.num_envs} envs")
        groups: list[tuple[dict[str, Any], np.ndarray]] = []
        for env_id, options in enumerate(self._options):
            options = dict(options or {})
            for known, mask in groups:
                if known == options:
                    mask[env_id] = True
                    break
            else:
                mask = np.zeros(self.num_envs, dtype=np.bool_)
                mask[env_id] = True
                groups.append((options, mask))
        return groups

    def step_async(self, actions: np.ndarray) -> None:
        """Keeps the actions for ``step_wait`` (the pool steps all envs in one call)."""
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        """Steps every env; finished ones are reset at once, as SB3 expects.

        Returns:
            observations, rewards, dones and one info dict per env, with ``terminal_observation``
            for a finished env and ``TimeLimit.truncated`` for all.
        """
        if self._actions is None:
            raise RuntimeError("step_wait() was called without a prior step_async()")
        actions, self._actions = self._actions, None
        if self._batch_actions:
            batch: Any = create_empty_array(self.action_space, self.num_envs)
            actions = concatenate(self.action_space, [actions[env_id] for env_id in range(self.num_envs)], batch)
        observations, rewards, terminations, truncations, infos = self.pool.step(actions)
        dones = terminations | truncations
        infos = dict(infos)
        final_observations = infos.pop("final_obs", None)
        final_infos = unbatch_infos(infos.pop("final_info", {}), self.num_envs)
        for mask in ("_final_obs", "_final_info"):
            infos.pop(mask, None)
        current = unbatch_infos(infos, self.num_envs)
        step_infos: list[dict[str, Any]] = []
        for env_id in range(self.num_envs):
            if dones[env_id]:
                # Same-step autoreset: the top-level infos of a finished env are its reset's.
                info, reset_info = final_infos[env_id], current[env_id]
                for key in POOL_EPISODE_KEYS:
                    if key in reset_info:
                        value = reset_info.pop(key)
                        if self._pool_episodes:
                            info.setdefault(key, value)
                assert final_observations is not None  # the pool sends them for every finished env
                info["terminal_observation"] = final_observations[env_id]
                self.reset_infos[env_id] = reset_info
            else:
                info = current[env_id]
            info["TimeLimit.truncated"] = bool(truncations[env_id] and not terminations[env_id])
            step_infos.append(info)
        return observations, rewards.astype(np.float32), dones, step_infos  # float32, as DummyVecEnv's

    def close(self) -> None:
        """Stops the workers and frees the shared memory; closing twice does nothing."""
        if self.closed:
            return
        self.closed = True
        self.pool.close()

    # -- per-env calls ---------------------------------------------------------------------------

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Attribute ``attr_name`` of each env, found through its wrappers (``get_wrapper_attr``)."""
        return self.pool.env_apply(methodcaller("get_wrapper_attr", attr_name), self._env_ids(indices))

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has ``attr_name`` (checked in the workers: nothing is pickled back)."""
        return all(self.pool.env_apply(methodcaller("has_wrapper_attr", attr_name)))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Sets ``attr_name`` on each env's outermost wrapper, as SB3's own VecEnvs do."""
        self.pool.env_apply(setattr, self._env_ids(indices), args=(attr_name, value))

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Calls method ``method_name`` (found through the wrappers) of each env; returns the results."""
        return self.pool.env_apply(_call_method, self._env_ids(indices), args=(method_name, method_args, method_kwargs))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether each env's wrapper chain, in its worker, holds a ``wrapper_class``."""
        return self.pool.env_apply(_is_wrapped, self._env_ids(indices), args=(wrapper_class,))

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()``, with ``render_mode="rgb_array"``."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None] * self.num_envs
        return self.pool.env_apply("render")

    def _env_ids(self, indices: VecEnvIndices) -> list[int]:
        """SB3's indices (None, an int or an iterable of ints, negative ones from the end) as env ids."""
        if indices is None:
            return list(range(self.num_envs))
        chosen: Iterable[Any] = [indices] if isinstance(indices, (int, np.integer)) else indices
        env_ids = []
        for index in chosen:
            if not -self.num_envs <= index < self.num_envs:
                raise IndexError(f"env index {index} is out of range for {self.num_envs} envs")
            env_ids.append(int(index) % self.num_envs)
        return env_ids


def unbatch_infos(infos: Mapping[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Gymnasium's vector infos (one array per key, with a ``_key`` mask) as one dict per env.

    Nested dicts are split the same way. Values of the dtypes of Python's numbers become Python numbers;
    other numpy scalars (np.float32, np.bool_, an object array's items) stay as the env made them.
    """
    per_env: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    masks = {f"_{key}" for key in infos}  # keys need not be text (a tuple, an int): their masks are
    for key, values in infos.items():
        if key in masks:
            continue  # the mask of another key
        mask = infos.get(f"_{key}")
        if isinstance(values, Mapping):
            nested = unbatch_infos(values, num_envs)
            for env_id in range(num_envs):
                if mask[env_id] if mask is not None else nested[env_id]:
                    per_env[env_id][key] = nested[env_id]
            continue
        python = isinstance(values, np.ndarray) and values.dtype in PYTHON_NUMBER_DTYPES
        for env_id in range(num_envs) if mask is None else np.flatnonzero(mask).tolist():
            value = values[env_id]
            per_env[env_id][key] = value.item() if python and isinstance(value, np.generic) else value
    return per_env


# -- run in the workers, by env_apply --------------------------------------------------------------


def _identity(env: gym.Env) -> tuple[int, int]:
    return os.getpid(), id(env.unwrapped)


def _call_method(env: gym.Env, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return env.get_wrapper_attr(name)(*args, **kwargs)


def _is_wrapped(env: gym.Env, wrapper_class: type[gym.Wrapper]) -> bool:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, wrapper_class):
            return True
        env = env.env
    return False
