"""EnvPool's Python API over a pool: code written for EnvPool runs with one import changed.

``import shmpool.envpool as envpool`` gives ``make``, ``make_gym``, ``make_gymnasium``, ``make_spec`` and
``list_all_envs``, as EnvPool 1.2 has them. What they make is a ``gymnasium.vector.VectorEnv`` (and a
``gymnasium.Env``, as EnvPool's is) over a ``shmpool.Pool``, with its live ``params``, ``applied``, ``events`` and
``episodes``. The envs are gymnasium's own, not EnvPool's C++ rewrites: given the same seeds and actions, every env
follows what gymnasium's ``SyncVectorEnv`` gives. What differs from EnvPool: ``docs/guides/envpool.md``.

Examples:
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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from gymnasium.vector import AutoresetMode, VectorEnv

from .options import batch_size_problem, check_env_ids, fixed_options
from .pool import Pool, launch
from .pool.commands import check_reset_mask
from .pool.results import select_rows
from .system import usable_cores
from .view import WrappedPoolChannels

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .options import OptionsButSeedAndBatch

#: The EnvPool API this module follows (shmpool's own version is ``shmpool.__version__``).
__version__ = "1.2.0"

#: The ``env_type`` values taken, and what each means here.
ENV_TYPES = {"gymnasium": "gymnasium's API", "gym": "gymnasium's API (EnvPool 1.x's alias)"}

#: What ``step`` and ``recv`` return: observations, rewards, terminations, truncations, info.
Batch = tuple[Any, Any, Any, Any, dict[str, Any]]

#: EnvPool's default seed.
DEFAULT_SEED = 42

#: EnvPool's keywords that a pool does not take, and what to say instead.
REFUSED_OPTIONS = {
    "num_threads": "say num_workers= (worker processes)",
    "thread_affinity_offset": "workers are processes, placed by the OS",
    "from_pixels": "gymnasium envs render when made with render_mode='rgb_array'",
    "render_width": "a gymnasium env sets its frame size when made (env_kwargs=)",
    "render_height": "a gymnasium env sets its frame size when made (env_kwargs=)",
    "render_camera_id": "a gymnasium env picks its camera when made (env_kwargs=)",
}

#: What ``render_mode`` may be (EnvPool's): frames from ``render()``, or a window the envs draw.
RENDER_MODES = (None, "rgb_array", "human")


class Config(NamedTuple):
    """``spec.config``: EnvPool 1.2's fields in its order (``config`` as a dict); ``num_threads`` is the
    pool's worker count, and the fields of EnvPool's threads and assets hold EnvPool's defaults."""

    num_envs: int
    batch_size: int
    num_threads: int
    max_num_players: int
    thread_affinity_offset: int
    base_path: str
    seed: int
    env_seed: list[int]
    gym_reset_return_info: bool
    max_episode_steps: int | None
    reward_threshold: float | None


def _config(
    task_id: str, num_envs: int, batch_size: int, workers: int, seed: int, max_episode_steps: int | None
) -> Config:
    """The config of a pool of ``workers`` made for ``task_id``."""
    return Config(num_envs, batch_size, workers, 1, -1, "", seed, [], True, *_limits(task_id, max_episode_steps))


@dataclass
class Spec:
    """``env.spec`` and ``make_spec``'s result: the config and one env's spaces, as EnvPool's spec
    gives them; its fields may be assigned (EnvPool code sets ``spec.id``)."""

    id: str
    config: Config
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    reward_threshold: float | None


class EnvPoolAPI(WrappedPoolChannels, VectorEnv, gym.Env):  # type: ignore[misc]
    """A pool behind EnvPool's Python API (see the module's docstring); made by ``make``."""

    metadata: dict[str, Any] = {"render_modes": ["rgb_array", "human"], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, task_id: str, pool: Pool, spec: Spec, render_mode: str | None, render_env_id: int) -> None:
        self.pool = pool
        self.task_id = task_id
        self.spec = spec  # type: ignore[assignment]  # EnvPool's spec, not gymnasium's EnvSpec
        self._spec = spec
        self.render_mode = render_mode
        self._render_env_id = render_env_id
        self.all_env_ids: npt.NDArray[np.int32] = np.arange(pool.num_envs, dtype=np.int32)
        self.all_env_ids.flags.writeable = False
        # EnvPool counts each episode's steps (``info["elapsed_step"]``); gymnasium envs do not say.
        self._elapsed = np.zeros(pool.num_envs, dtype=np.int32)
        self._ended = np.zeros(pool.num_envs, dtype=np.bool_)  # autoresets on its next step
        self._resetting = np.zeros(pool.num_envs, dtype=np.bool_)  # an async reset not yet received
        self._never_reset = np.ones(pool.num_envs, dtype=np.bool_)  # its first step resets it
        self._all_reset = False  # no env left in _never_reset: a full step goes straight to the pool
        # The env ids the last recv handed out (a copy the caller may write) and the pool's own array
        # of them: sending those back unchanged takes the pool's shortcut for its own ids.
        self._handed_out: tuple[np.ndarray, np.ndarray] | None = None
        self._async = False  # async_reset/send used since the last reset(): step() goes through them

    # -- what EnvPool code reads ---------------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """``spec.config`` as a dict."""
        return self._spec.config._asdict()

    @property
    def num_envs(self) -> int:  # type: ignore[override]
        return self.pool.num_envs

    @property
    def is_async(self) -> bool:
        """True when a ``recv`` returns fewer envs than the pool has (``batch_size < num_envs``)."""
        return self.pool.batch_size < self.pool.num_envs

    @property
    def is_vector_env(self) -> bool:
        """Always True: the flag older vector-aware wrappers read."""
        return True

    @property
    def observation_space(self) -> gym.Space[Any]:  # type: ignore[override]
        """One env's observation space (EnvPool's convention)."""
        return self.pool.single_observation_space

    @property
    def action_space(self) -> gym.Space[Any]:  # type: ignore[override]
        """One env's action space (EnvPool's convention)."""
        return self.pool.single_action_space

    single_observation_space = observation_space
    """One env's observation space: the same object as ``observation_space``, as in EnvPool."""
    single_action_space = action_space
    """One env's action space: the same object as ``action_space``, as in EnvPool."""

    # -- EnvPool's calls -----------------------------------------------------------------------------

    def reset(  # type: ignore[override]
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
            ids = self._ids(env_id, "reset")
        if len(ids) < self.num_envs:
            mask = np.zeros(self.num_envs, dtype=np.bool_)
            mask[ids] = True
            options = {**(options or {}), "reset_mask": mask}
        observations, infos = self.pool.reset(seed=seed, options=options)
        self._async = False
        self._elapsed[ids] = 0
        self._ended[ids] = False
        self._resetting[:] = False
        self._never_reset[ids] = False
        self._all_reset = not self._never_reset.any()
        # The pool returns every env's rows after a masked reset: EnvPool returns those reset only.
        return select_rows(observations, ids, self.num_envs), self._info(select_rows(infos, ids, self.num_envs), ids)

    def step(  # type: ignore[override]
        self, action: Any, env_id: npt.ArrayLike | None = None
    ) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Steps the envs ``env_id`` (None: all) and returns their results in that order; an env never
        reset is reset instead (its row: the reset's observation, reward 0, no flags), as in EnvPool."""
        if self.is_async or self._async:
            self.send(action, env_id)
            return self.recv()
        if env_id is None and self._all_reset:  # the common case, checked first
            return self._batch(self.pool.step(action), self.all_env_ids)
        ids = self.all_env_ids if env_id is None else self._ids(env_id, "step")
        everyone = len(ids) == self.num_envs and np.array_equal(ids, self.all_env_ids)
        fresh = self._never_reset[ids]
        if fresh.any():
            return self._reset_by_step(action, ids, fresh, everyone)
        return self._batch(self.pool.step(action) if everyone else self.pool.step(action, env_ids=ids), ids)

    def async_reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> None:
        """Starts resetting every env; each ``recv()`` then returns ``batch_size`` of them."""
        self.pool.async_reset(seed=seed, options=options)
        self._async = True
        self._resetting[:] = True
        self._never_reset[:] = False
        self._all_reset = True

    def send(self, action: Any, env_id: npt.ArrayLike | None = None) -> None:
        """Starts stepping the envs ``env_id`` (None: every env) with ``action``, one row each; before
        any reset, starts resetting every env instead (EnvPool resets an env on its first step)."""
        if self._never_reset.all():
            self.async_reset()
            return
        handed = self._handed_out
        if handed is not None and env_id is handed[0] and np.array_equal(handed[0], handed[1]):
            env_id = handed[1]  # the pool's own array of them: no check to repeat
        self.pool.send(action, self.all_env_ids if env_id is None else env_id)
        self._async = True

    def recv(self) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """The next ``batch_size`` envs to finish their step or reset: observations, rewards,
        terminations, truncations and info (``env_id``, ``elapsed_step``, the envs' own keys)."""
        results = self.pool.recv()
        ids = results[4]["env_id"]
        batch = self._batch(results, ids, self._resetting[ids])  # a batch's infos hold its rows only
        self._resetting[ids] = False
        self._handed_out = (batch[4]["env_id"], ids)
        return batch

    def render(self, env_ids: npt.ArrayLike | None = None, camera_id: int | None = None) -> np.ndarray | None:  # type: ignore[override]
        """Frames of the envs ``env_ids`` (None: ``render_env_id``, 0 by default), stacked, with
        ``render_mode="rgb_array"``; with ``"human"``, the env draws its own window and this returns None."""
        if self.render_mode not in ("rgb_array", "human"):
            raise RuntimeError(
                f"{self.task_id}: render() needs render_mode='rgb_array' or 'human' when the env is made; "
                f"it was made with render_mode={self.render_mode!r}"
            )
        if camera_id is not None:
            raise ValueError(
                f"{self.task_id}: render(camera_id={camera_id}): a gymnasium env picks its camera when made; "
                f"pass env_kwargs={{'camera_id': {camera_id}}} to make"
            )
        ids = check_env_ids(
            np.atleast_1d(self._render_env_id if env_ids is None else env_ids), self.num_envs, "render", unique=False
        )
        if self.render_mode == "human" and len(ids) != 1:
            raise ValueError(f"{self.task_id}: render_mode='human' renders one env; got env_ids={ids.tolist()}")
        frames = self.pool.env_apply("render", ids.tolist())
        if self.render_mode == "human":
            return None
        return np.stack(frames)

    def close(self, **kwargs: Any) -> None:
        """Closes the pool (idempotent); takes gymnasium's ``VectorEnv.close`` keywords."""
        self.pool.close()
        self.closed = True

    def __len__(self) -> int:
        return self.num_envs

    def __repr__(self) -> str:
        return f"shmpool.envpool.EnvPoolAPI({self.task_id!r}, {self._spec.config})"

    __str__ = __repr__

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _ids(self, env_id: npt.ArrayLike | None, what: str) -> np.ndarray:
        if env_id is None:
            return self.all_env_ids
        ids = check_env_ids(np.atleast_1d(env_id), self.num_envs, f"{self.task_id}: {what}", unique=True)
        if not len(ids):
            raise ValueError(f"{self.task_id}: {what}: no env ids")
        return ids

    def _reset_by_step(
        self, action: Any, ids: np.ndarray, fresh: np.ndarray, everyone: bool
    ) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """A synchronous step of ``ids`` some of which (``fresh``) were never reset: the others step
        first (a refused partial step changes nothing), then those reset; the rows come back in the
        order of ``ids``."""
        step_part = None
        if not fresh.all():
            stepping = np.flatnonzero(~fresh)
            step_part = self.step(select_rows(action, stepping, len(ids)), ids[stepping])
        observations, info = self.reset(None if everyone and fresh.all() else ids[fresh])
        count = int(fresh.sum())
        reset_part = (observations, np.zeros(count, np.float32), np.zeros(count, np.bool_), np.zeros(count, np.bool_))
        if step_part is None:
            return (*reset_part, info)
        return _interleave((*reset_part, info), step_part, fresh)  # type: ignore[no-any-return]

    def _batch(
        self, results: Any, ids: np.ndarray, reset: np.ndarray | None = None
    ) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """The pool's results for the envs ``ids`` in EnvPool's form (float32 rewards, EnvPool's
        info), their ``elapsed_step`` advanced; ``reset``: which rows are a reset's."""
        observations, rewards, terminations, truncations, infos = results
        self._count_steps(ids, terminations | truncations, reset)
        return observations, rewards.astype(np.float32), terminations, truncations, self._info(infos, ids)

    def _count_steps(self, ids: np.ndarray, done: np.ndarray, reset: np.ndarray | None = None) -> None:
        """Advances ``elapsed_step`` of ``ids``: 0 for a reset, or a step that autoreset an ended env."""
        fresh = self._ended[ids] if reset is None else self._ended[ids] | reset
        self._elapsed[ids] = np.where(fresh, 0, self._elapsed[ids] + 1)
        self._ended[ids] = done  # a reset's row has no flags

    def _info(self, infos: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
        """EnvPool's info for the rows ``ids`` of ``infos`` (which holds those rows only); every array
        is the caller's to write (Tianshou writes into ``env_id``)."""
        # Masks only where rows lack the key (EnvPool's infos have none); ``episode`` keeps its own always.
        full = {mask for key in infos if key != "episode" and (mask := "_" + key) in infos and infos[mask].all()}
        info = {key: value for key, value in infos.items() if key != "env_id" and key not in full}
        info["env_id"] = np.array(ids, dtype=np.int32)
        info["players"] = {"env_id": info["env_id"].copy()}
        info["elapsed_step"] = self._elapsed[ids]  # a copy: fancy indexing
        return info


def _interleave(first: Any, second: Any, in_first: np.ndarray) -> Any:
    """Rows ``in_first`` from ``first`` and the others from ``second``, in order; a key of only one
    of two dicts gets zeros in the other's rows."""
    if isinstance(first, tuple):
        return tuple(_interleave(a, b, in_first) for a, b in zip(first, second))
    if isinstance(first, dict) or isinstance(second, dict):
        first, second = first or {}, second or {}
        return {key: _interleave(first.get(key), second.get(key), in_first) for key in {**first, **second}}
    like = np.asarray(first if first is not None else second)
    merged = np.zeros((len(in_first), *like.shape[1:]), dtype=like.dtype)
    if first is not None:
        merged[in_first] = first
    if second is not None:
        merged[~in_first] = second
    return merged


def make(
    task_id: str,
    env_type: str = "gymnasium",
    num_envs: int = 1,
    batch_size: int | None = None,
    seed: int = DEFAULT_SEED,
    max_episode_steps: int | None = None,
    render_mode: str | None = None,
    render_env_id: int = 0,
    gym_reset_return_info: bool = True,
    **launch_options: Unpack[OptionsButSeedAndBatch],
) -> EnvPoolAPI:
    """A pool of ``num_envs`` gymnasium ``task_id`` envs behind EnvPool's API.

    ``batch_size`` (None or 0: ``num_envs``) envs per ``recv``; ``max_episode_steps`` overrides the registered limit;
    ``render_mode`` is the envs'. Further options go to ``shmpool.launch``; ``episode_statistics`` is off unless given
    (EnvPool's info has no ``episode`` key), ``recv_order`` is ``"sent"`` unless given, and ``autoreset_mode`` is
    ``NEXT_STEP``.
    """
    _refuse(task_id, env_type, gym_reset_return_info, render_mode, launch_options)
    # EnvPool's API autoresets on the next step
    options = fixed_options(f"shmpool.envpool ({task_id})", launch_options, autoreset_mode=AutoresetMode.NEXT_STEP)
    env_kwargs = _env_kwargs(options.pop("env_kwargs", None), max_episode_steps, render_mode)
    batch_size = None if batch_size in (0, num_envs) else batch_size  # EnvPool's 0: every env
    if options.get("num_workers") is None and batch_size is not None:  # a synchronous pool: launch's placement
        options["num_workers"] = _workers_for_batches(num_envs, batch_size)
    options.setdefault("episode_statistics", False)
    options.setdefault("recv_order", "sent")
    pool = launch(task_id, num_envs, batch_size=batch_size, seed=seed, env_kwargs=env_kwargs or None, **options)
    try:
        config = _config(task_id, pool.num_envs, pool.batch_size, pool.num_workers, seed, max_episode_steps)
        spec = Spec(task_id, config, pool.single_observation_space, pool.single_action_space, config.reward_threshold)
        return EnvPoolAPI(task_id, pool, spec, render_mode, render_env_id)
    except BaseException:
        pool.close()
        raise


def make_gymnasium(task_id: str, **kwargs: Any) -> EnvPoolAPI:
    """``make`` with ``env_type="gymnasium"``."""
    return make(task_id, env_type="gymnasium", **kwargs)


make_gym = make_gymnasium  # EnvPool 1.x's make_gym makes gymnasium's API too


def make_dm(task_id: str, **kwargs: Any) -> Any:
    """Refused: pools speak gymnasium's API, not dm_env's ``TimeStep``."""
    return make(task_id, env_type="dm", **kwargs)


def make_spec(
    task_id: str,
    num_envs: int = 1,
    batch_size: int | None = None,
    seed: int = DEFAULT_SEED,
    max_episode_steps: int | None = None,
    render_mode: str | None = None,
    num_workers: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    **make_options: Any,
) -> Spec:
    """The ``Spec`` that ``make`` with these arguments gives its env, without starting a pool: one
    env is made and closed to read its spaces. Refused as by ``make``: another ``env_type``,
    ``gym_reset_return_info=False``, an unknown ``render_mode``, EnvPool's thread options; launch's
    other options are not used (nor checked)."""
    env_type, reset_info = make_options.pop("env_type", "gymnasium"), make_options.pop("gym_reset_return_info", True)
    _refuse(task_id, env_type, reset_info, render_mode, make_options)
    batch = None if batch_size in (None, 0, num_envs) else batch_size
    if num_workers is None:  # as make places the pool: launch's placement when synchronous
        from .config import PoolConfig

        synchronous = int(PoolConfig(env=task_id, num_envs=num_envs).num_workers)  # type: ignore[arg-type]
        num_workers = synchronous if batch is None else _workers_for_batches(num_envs, batch)
    batch_size = num_envs if batch is None else batch
    env = gym.make(task_id, **_env_kwargs(env_kwargs, max_episode_steps, render_mode))
    try:
        observation_space, action_space = env.observation_space, env.action_space
    finally:
        env.close()
    config = _config(task_id, num_envs, batch_size, num_workers, seed, max_episode_steps)
    return Spec(task_id, config, observation_space, action_space, config.reward_threshold)


def list_all_envs() -> list[str]:
    """Every registered gymnasium id (each can be made here, as gymnasium makes it)."""
    return sorted(gym.registry)


def _env_kwargs(
    env_kwargs: dict[str, Any] | None, max_episode_steps: int | None, render_mode: str | None
) -> dict[str, Any]:
    """The envs' keyword arguments: the user's, with EnvPool's ``max_episode_steps`` and ``render_mode``."""
    kwargs = dict(env_kwargs or {})
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    return kwargs


def _refuse(task_id: str, env_type: str, reset_info: bool, render_mode: str | None, options: Mapping[str, Any]) -> None:
    """Raises for what a pool does not take: another ``env_type``, ``gym_reset_return_info=False``, an
    unknown ``render_mode``, EnvPool's options of its threads (the first of them in sorted order)."""
    if env_type not in ENV_TYPES:
        raise ValueError(
            f"{task_id}: env_type={env_type!r} is not supported; shmpool.envpool takes {list(ENV_TYPES)} "
            f"(pools speak gymnasium's API; dm_env's TimeStep is not offered)"
        )
    if not reset_info:
        raise ValueError(f"{task_id}: gym_reset_return_info=False: reset() always returns (observations, info)")
    for key in sorted(options.keys() & REFUSED_OPTIONS.keys())[:1]:
        raise TypeError(f"{task_id}: EnvPool's {key}= is not taken here: {REFUSED_OPTIONS[key]}")
    if render_mode not in RENDER_MODES:
        raise ValueError(f"{task_id}: render_mode={render_mode!r}; it is one of {list(RENDER_MODES)}")


def _limits(task_id: str, max_episode_steps: int | None) -> tuple[int | None, float | None]:
    """``max_episode_steps`` (or the registered one) and the registered ``reward_threshold``."""
    registered = gym.spec(task_id) if isinstance(task_id, str) else None
    if registered is None:
        return max_episode_steps, None
    limit = registered.max_episode_steps if max_episode_steps is None else max_episode_steps
    return limit, registered.reward_threshold


def _workers_for_batches(num_envs: int, batch_size: int | None) -> int:
    """The most worker processes, up to the usable cores, whose equal slots make up ``batch_size``
    envs (a batch is whole slots): EnvPool takes any batch size, so ported code does not choose."""
    cores = max(1, min(usable_cores(), num_envs))
    batch = num_envs if batch_size is None else batch_size
    if batch == num_envs:
        return cores
    fitting = [w for w in range(1, cores + 1) if num_envs % w == 0 and batch % (num_envs // w) == 0]
    if not fitting:
        raise ValueError(batch_size_problem(num_envs, cores, batch, workers_by_default=True))
    return max(fitting)
