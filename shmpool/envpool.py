"""EnvPool's Python API over a pool: ``make`` and ``make_gymnasium``.

Code written for EnvPool (``envpool.make(task_id, env_type="gymnasium", num_envs=..., batch_size=...)``,
then ``reset``/``step`` or ``async_reset``/``send``/``recv`` with ``info["env_id"]``) runs on shmpool
with one import changed, and gains live parameters: ``env.params``, ``env.applied``, ``env.events``
and ``env.episodes`` are the pool's. The envs are gymnasium's own, not EnvPool's C++ rewrites: given
the same seeds and actions, every env follows what gymnasium's ``SyncVectorEnv`` gives.

What differs from EnvPool, and why:

- ``observation_space`` and ``action_space`` are one env's spaces, as in EnvPool (a pool's own are
  batched, as in gymnasium); ``env.pool`` is the ``shmpool.Pool`` underneath.
- ``env_type``: ``"gymnasium"``, and ``"gym"``, which EnvPool 1.x also takes to mean gymnasium's API.
  ``"dm"`` (dm_env ``TimeStep``s) is refused: shmpool's pools speak gymnasium's API only.
- Envs autoreset on the step after their episode ends (gymnasium's ``NEXT_STEP``, EnvPool's rule):
  that step returns the reset observation, reward 0 and no flags, and ``elapsed_step`` 0.
- Rewards are float32, EnvPool's dtype (gymnasium's envs return Python floats, which its vector envs
  gather as float64): each is gymnasium's reward rounded to float32.
- A ``recv`` returns the envs whose step was sent first (``recv_order="sent"``), waiting for them:
  EnvPool's queue gives that order when steps cost the same, and code written for it expects every
  env once per ``num_envs / batch_size`` recvs. shmpool's workers are processes that the OS may
  deschedule; first-finished order (``recv_order="finished"``, the pool's default) would then return
  one slot twice before another.
- A batch is made of whole slots (a worker process steps its slot at once): ``batch_size`` must be
  a multiple of ``num_envs / num_workers``. Without ``num_workers``, ``make`` picks the most
  workers (up to the usable cores) for which it is. A synchronous pool (``batch_size=num_envs``)
  steps every env at once: ``step(action, env_id)`` with some of them is refused.
- ``reset(env_id)`` resets some envs of a synchronous pool (or ``options={"reset_mask": ...}``,
  not both); an async pool resets every env, as ``async_reset()``.
- ``batch_size=0`` (EnvPool's "every env"), ``num_threads`` and ``recv(reset, return_info)`` are not
  taken: say ``batch_size=None``, ``num_workers``, and ``recv()``.
- A Ctrl-C inside ``recv`` after the pool handed the batch out loses that batch here (the pool's
  own ``recv`` never does: its batches are queued again); ``pool.recv()`` has the guarantee.
- ``seed`` defaults to EnvPool's 42; env ``i`` gets ``seed + i`` on its first reset, as gymnasium's
  vector envs seed them.

Example:
    >>> import numpy as np
    >>> import shmpool.envpool as envpool   # was: import envpool
    >>> env = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=4, batch_size=2, num_workers=2)
    >>> env.async_reset()
    >>> for _ in range(10):
    ...     observations, rewards, terminations, truncations, info = env.recv()
    ...     env.send(np.zeros(len(info["env_id"]), dtype=np.int64), info["env_id"])
    >>> env.close()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from gymnasium.vector import AutoresetMode

from .options import check_env_ids, fixed_options
from .pool import Pool, launch
from .pool.commands import check_reset_mask
from .system import usable_cores
from .view import WrappedPoolChannels

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .options import OptionsButSeedAndBatch

#: The ``env_type`` values taken, and what each means here.
ENV_TYPES = {"gymnasium": "gymnasium's API", "gym": "gymnasium's API (EnvPool 1.x's alias)"}

#: EnvPool's default seed.
DEFAULT_SEED = 42


class Config(NamedTuple):
    """What ``spec.config`` holds: the settings EnvPool code reads (``config`` is it as a dict)."""

    num_envs: int
    batch_size: int
    num_workers: int
    seed: int
    max_episode_steps: int | None
    reward_threshold: float | None


@dataclass(frozen=True)
class Spec:
    """``env.spec``: the config and one env's spaces, as EnvPool's spec gives them."""

    config: Config
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    reward_threshold: float | None


class EnvPoolAPI(WrappedPoolChannels):
    """A pool behind EnvPool's Python API (see the module's docstring); made by ``make``."""

    def __init__(self, task_id: str, pool: Pool, seed: int, max_episode_steps: int | None) -> None:
        self.pool = pool
        self.task_id = task_id
        registered = gym.spec(task_id) if isinstance(task_id, str) else None
        reward_threshold = None if registered is None else registered.reward_threshold
        if max_episode_steps is None and registered is not None:
            max_episode_steps = registered.max_episode_steps
        config = Config(pool.num_envs, pool.batch_size, pool.num_workers, seed, max_episode_steps, reward_threshold)
        self.spec = Spec(config, pool.single_observation_space, pool.single_action_space, reward_threshold)
        self.all_env_ids: npt.NDArray[np.int32] = np.arange(pool.num_envs, dtype=np.int32)
        self.all_env_ids.flags.writeable = False
        # EnvPool counts each episode's steps (``info["elapsed_step"]``); gymnasium envs do not say.
        self._elapsed = np.zeros(pool.num_envs, dtype=np.int32)
        self._ended = np.zeros(pool.num_envs, dtype=np.bool_)  # autoresets on its next step
        self._resetting = np.zeros(pool.num_envs, dtype=np.bool_)  # an async reset not yet received
        self._async = False  # async_reset/send used since the last reset(): step() goes through them

    # -- what EnvPool code reads ---------------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """``spec.config`` as a dict."""
        return self.spec.config._asdict()

    @property
    def num_envs(self) -> int:
        return self.pool.num_envs

    @property
    def is_async(self) -> bool:
        """True when a ``recv`` returns fewer envs than the pool has (``batch_size < num_envs``)."""
        return self.pool.batch_size < self.pool.num_envs

    @property
    def observation_space(self) -> gym.Space[Any]:
        """One env's observation space (EnvPool's convention)."""
        return self.pool.single_observation_space

    @property
    def action_space(self) -> gym.Space[Any]:
        """One env's action space (EnvPool's convention)."""
        return self.pool.single_action_space

    @property
    def single_observation_space(self) -> gym.Space[Any]:
        """One env's observation space (the same as ``observation_space``, as in EnvPool)."""
        return self.pool.single_observation_space

    @property
    def single_action_space(self) -> gym.Space[Any]:
        """One env's action space (the same as ``action_space``, as in EnvPool)."""
        return self.pool.single_action_space

    # -- EnvPool's calls -----------------------------------------------------------------------------

    def reset(
        self, env_id: npt.ArrayLike | None = None, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets the envs ``env_id`` (None: all) and returns their observations and info; an async
        pool (``batch_size < num_envs``) resets all and returns the first batch, as EnvPool does."""
        if self.is_async:
            if env_id is not None:
                raise ValueError(
                    f"{self.task_id}: an async pool (batch_size={self.pool.batch_size} < num_envs={self.num_envs}) "
                    f"resets every env: call reset() without env_id, or async_reset() then recv()"
                )
            self.async_reset(seed=seed, options=options)
            observations, _, _, _, info = self.recv()
            return observations, info
        if options is not None and "reset_mask" in options:
            if env_id is not None:
                raise ValueError(f"{self.task_id}: pass either env_id or options['reset_mask'], not both")
            ids = np.flatnonzero(check_reset_mask(options["reset_mask"], self.num_envs))
        else:
            ids = self._ids(env_id)
        if len(ids) < self.num_envs:
            mask = np.zeros(self.num_envs, dtype=np.bool_)
            mask[ids] = True
            options = {**(options or {}), "reset_mask": mask}
        observations, infos = self.pool.reset(seed=seed, options=options)
        self._async = False
        self._elapsed[ids] = 0
        self._ended[ids] = False
        self._resetting[:] = False
        # The pool returns every env's rows after a masked reset: EnvPool returns those reset only.
        return self._rows(observations, ids), self._info(self._rows(infos, ids), ids)

    def step(self, action: Any, env_id: npt.ArrayLike | None = None) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Steps the envs ``env_id`` (None: all) and returns a batch: ``send`` then ``recv``, or one
        synchronous step of every env when nothing is in flight."""
        everyone = env_id is None or np.array_equal(np.asarray(env_id), self.all_env_ids)
        if not self.is_async and not everyone:
            raise ValueError(
                f"{self.task_id}: env_id={np.asarray(env_id).tolist()}: a synchronous pool (batch_size = num_envs) "
                f"steps every env at once; launch with a batch_size of whole slots to step some of them"
            )
        if everyone and not self._async and not self.is_async:
            observations, rewards, terminations, truncations, infos = self.pool.step(action)
            ids = self.all_env_ids
            self._count_steps(ids, terminations | truncations)
            return observations, rewards.astype(np.float32), terminations, truncations, self._info(infos, ids)
        self.send(action, env_id)
        return self.recv()

    def async_reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> None:
        """Starts resetting every env; each ``recv()`` then returns ``batch_size`` of them."""
        self.pool.async_reset(seed=seed, options=options)
        self._async = True
        self._resetting[:] = True

    def send(self, action: Any, env_id: npt.ArrayLike | None = None) -> None:
        """Starts stepping the envs ``env_id`` (None: every env) with ``action``, one row each."""
        ids = self.all_env_ids if env_id is None else env_id
        self.pool.send(action, ids)
        self._async = True

    def recv(self) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """The next ``batch_size`` envs to finish their step or reset: observations, rewards,
        terminations, truncations and info (``env_id``, ``elapsed_step``, the envs' own keys)."""
        observations, rewards, terminations, truncations, infos = self.pool.recv()
        ids = infos["env_id"]
        reset = self._resetting[ids]
        self._count_steps(ids, terminations | truncations, reset)
        self._resetting[ids] = False
        # The pool's infos of a batch hold the batch's rows only: nothing to select.
        return observations, rewards.astype(np.float32), terminations, truncations, self._info(infos, ids)

    def close(self) -> None:
        """Closes the pool (idempotent)."""
        self.pool.close()

    def __enter__(self) -> EnvPoolAPI:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __len__(self) -> int:
        return self.num_envs

    def __repr__(self) -> str:
        return f"shmpool.envpool.EnvPoolAPI({self.task_id!r}, {self.spec.config})"

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _ids(self, env_id: npt.ArrayLike | None) -> np.ndarray:
        if env_id is None:
            return self.all_env_ids
        ids = check_env_ids(np.atleast_1d(env_id), self.num_envs, f"{self.task_id}: reset", unique=True)
        if not len(ids):
            raise ValueError(f"{self.task_id}: reset: no env ids")
        return ids

    def _count_steps(self, ids: np.ndarray, done: np.ndarray, reset: np.ndarray | None = None) -> None:
        """Advances ``elapsed_step`` of ``ids``: 0 for a reset, or a step that autoreset an ended env."""
        fresh = self._ended[ids] if reset is None else self._ended[ids] | reset
        self._elapsed[ids] = np.where(fresh, 0, self._elapsed[ids] + 1)
        self._ended[ids] = done  # a reset's row has no flags

    def _rows(self, values: Any, ids: np.ndarray) -> Any:
        if len(ids) == self.num_envs and np.array_equal(ids, self.all_env_ids):
            return values
        if isinstance(values, dict):
            return {key: self._rows(value, ids) for key, value in values.items()}
        if isinstance(values, tuple):
            return tuple(self._rows(value, ids) for value in values)
        return values[ids]

    def _info(self, infos: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
        """EnvPool's info for the rows ``ids`` of ``infos`` (which holds those rows only)."""
        info = {key: value for key, value in infos.items() if key != "env_id"}
        env_id = infos.get("env_id", ids if ids.dtype == np.int32 else ids.astype(np.int32))
        info["env_id"] = env_id
        info["players"] = {"env_id": env_id}
        info["elapsed_step"] = self._elapsed[ids]  # a copy: fancy indexing
        return info


def make(
    task_id: str,
    env_type: str = "gymnasium",
    num_envs: int = 1,
    batch_size: int | None = None,
    seed: int = DEFAULT_SEED,
    max_episode_steps: int | None = None,
    **launch_options: Unpack[OptionsButSeedAndBatch],
) -> EnvPoolAPI:
    """A pool of ``num_envs`` gymnasium ``task_id`` envs behind EnvPool's API.

    ``batch_size`` (None: ``num_envs``) envs per ``recv``; ``max_episode_steps`` overrides the
    registered limit. Further options go to ``shmpool.launch`` (``num_workers``, ``params``,
    ``hooks``, ``name``, ``engine``, ...); ``episode_statistics`` is off unless given (EnvPool's
    info has no ``episode`` key), ``recv_order`` is ``"sent"`` unless given, and ``autoreset_mode``
    is ``NEXT_STEP``.
    """
    if env_type not in ENV_TYPES:
        raise ValueError(
            f"{task_id}: env_type={env_type!r} is not supported; shmpool.envpool takes {list(ENV_TYPES)} "
            f"(pools speak gymnasium's API; dm_env's TimeStep is not offered)"
        )
    # EnvPool's API autoresets on the next step
    options = fixed_options(f"shmpool.envpool ({task_id})", launch_options, autoreset_mode=AutoresetMode.NEXT_STEP)
    env_kwargs = dict(options.pop("env_kwargs", None) or {})
    if max_episode_steps is not None:
        env_kwargs["max_episode_steps"] = max_episode_steps
    if options.get("num_workers") is None:
        options["num_workers"] = _workers_for_batches(num_envs, batch_size)
    options.setdefault("episode_statistics", False)
    options.setdefault("recv_order", "sent")
    pool = launch(task_id, num_envs, batch_size=batch_size, seed=seed, env_kwargs=env_kwargs or None, **options)
    try:
        return EnvPoolAPI(task_id, pool, seed, max_episode_steps)
    except BaseException:
        pool.close()
        raise


def _workers_for_batches(num_envs: int, batch_size: int | None) -> int:
    """The most worker processes, up to the usable cores, whose equal slots make up ``batch_size``
    envs (a batch is whole slots): EnvPool takes any batch size, so ported code does not choose."""
    cores = max(1, min(usable_cores(), num_envs))
    batch = num_envs if batch_size is None else batch_size
    fitting = [w for w in range(1, cores + 1) if num_envs % w == 0 and batch % (num_envs // w) == 0]
    return cores if batch == num_envs else max(fitting, default=cores)  # none: launch names the problem


def make_gymnasium(task_id: str, **kwargs: Any) -> EnvPoolAPI:
    """``make`` with ``env_type="gymnasium"``."""
    return make(task_id, env_type="gymnasium", **kwargs)


def list_all_envs() -> Sequence[str]:
    """Every registered gymnasium id (each can be made here, as gymnasium makes it)."""
    return sorted(gym.registry)
