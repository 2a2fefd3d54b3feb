"""A worker's slot of envs: stepping, resetting, autoreset and episode accounting."""

from __future__ import annotations

import json
import time
from typing import Any

import gymnasium
import numpy as np
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector import AutoresetMode

from shmpool.config import WorkerConfig, factory_of, make_env
from shmpool.episodes import EpisodeWriter
from shmpool.infos import InfoWriter
from shmpool.layout import RESET_THIS_ENV, RESET_WITH_SEED, seed_of
from shmpool.spaces import ObservationWriter, assemble, flatten, is_leaf, leaves
from shmpool.workers.hook_runner import HookRunner
from shmpool.workers.inner_step import inner_step
from shmpool.workers.param_applier import ParamApplier


class Slot:
    """What every kind of slot shares: its rows of the segment, the episode bookkeeping around a
    reset, the trainer's reset command and the episode records. The kinds differ in how their envs
    are made, stepped and reset (``EnvSlot``: gymnasium envs one by one;
    ``shmpool.workers.kernels.KernelSlot``: a compiled kernel over the slot).

    ``current_env`` is the env id that a failure happened in (or is being worked on), so that the
    failure can name it.
    """

    #: Per env of the slot, set by each kind: the episode's return, length and start time so far.
    _returns: Any
    _lengths: Any
    _starts: Any
    #: The slot's envs (gymnasium envs, or a kernel's per-row views), by row.
    envs: list[Any]
    #: Per env of the slot, set by each kind: whether it stepped (not reset) this step.
    _stepped: Any

    def __init__(
        self, config: WorkerConfig, views: dict[str, np.ndarray], info: InfoWriter, params: ParamApplier | None
    ) -> None:
        self.start, self.stop = config.env_ids
        self.same_step = config.autoreset_mode == AutoresetMode.SAME_STEP
        self.autoreset = config.autoreset_mode != AutoresetMode.DISABLED
        self.current_env: int | None = None
        self._config = config
        self._info = info
        self._params = params
        self._episodes = EpisodeWriter(views, config.worker_id, config.episode_metrics)
        rows = slice(self.start, self.stop)
        self._rewards = views["rewards"][rows]
        self._terminations = views["terminations"][rows]
        self._truncations = views["truncations"][rows]
        self._episode_return = views["episode_return"][rows]
        self._episode_length = views["episode_length"][rows]
        self._episode_time = views["episode_time"][rows]
        self._episode_index = views["episode_index"][rows]
        self._reset_seed = views["reset_seed"][rows]
        self._reset_flags = views["reset_flags"][rows]
        self._reset_options = views["reset_options"]
        self._reset_options_length = views["reset_options_length"]
        self._reset_global_step = views["reset_global_step"]
        self._needs_reset: Any = None  # per env, set by each kind
        self.global_step = 0
        self.hooks: HookRunner | None = None
        self.envs = []

    def hook_engine(self) -> tuple[str, Any, np.ndarray | None]:
        """What ``HookRunner.on_launch`` tells the hooks: the engine, and a kernel's kernel and state."""
        return self._config.engine, None, None

    def _make_all(self, make: Any) -> None:
        """Makes every env of the slot with ``make(local)``, naming the one that fails."""
        self._episode_index[:] = -1  # no episode until the first reset
        for local in range(self.stop - self.start):
            self.current_env = self.start + local
            self.envs.append(make(local))
        self.current_env = None

    def _remake(self, index: int) -> Any:
        """A new env at row ``index`` (a rebuild parameter changed), the old one released."""
        raise NotImplementedError

    def _reset_env(self, index: int, env: Any, seed: int | None, options: dict[str, Any] | None) -> None:
        """Resets env ``index`` and writes its first observation (and infos) to the slot's rows."""
        raise NotImplementedError

    def _begin_episode(self, index: int) -> tuple[Any, int | None]:
        """Starts env ``index``'s next episode before its reset: advances its episode index, re-makes
        it if a rebuild parameter changed, applies per-episode parameters. Returns the env and, for a
        re-made env, the seed its reset needs."""
        self._returns[index] = 0.0
        self._lengths[index] = 0
        self._starts[index] = time.perf_counter()
        self._episode_index[index] += 1
        env, seed = self.envs[index], None
        params = self._params
        if params is not None:
            if params.needs_rebuild(index):
                env = self.envs[index] = self._remake(index)
                seed = params.rebuilt_seed(index)
            params.begin_episodes(index)
        return env, seed

    def _end_episode(self, index: int, terminated: bool, truncated: bool, info: dict[str, Any] | None) -> None:
        """Publishes the statistics of env ``index``'s finished episode and appends its record."""
        self._episode_return[index] = self._returns[index]
        self._episode_length[index] = self._lengths[index]
        self._episode_time[index] = round(time.perf_counter() - self._starts[index], 6)
        self._episodes.append(
            self.start + index,
            int(self._episode_index[index]),
            self.global_step,
            float(self._returns[index]),
            int(self._lengths[index]),
            bool(terminated),
            bool(truncated),
            info,
        )

    def before_call(self) -> None:
        """Called before a control call runs user code on the envs (nothing to prepare here)."""

    def after_call(self) -> None:
        """Called after a control call has run user code on the envs (nothing to redo here)."""

    def resample(self, names: list[str], rows: np.ndarray) -> None:
        """Draws new values of the named ``dist`` parameters for the envs at ``rows`` (hooks ask)."""
        if self._params is None:
            raise KeyError(f"the pool has no parameters to resample ({names})")
        self._params.resample(names, rows, self._lengths)

    def step(self, rows: list[int] | None = None) -> int:
        """Steps every env of the slot with its action; returns how many episodes ended.

        Envs whose previous step ended an episode (next-step autoreset) or that a hook asked to
        reset are reset instead. Hooks see the results before the episode accounting, so their
        changes to rewards and terminations count. ``rows``: a partial step
        (``Pool.step(actions, env_ids=...)``, which the trainer allows without hooks), where only
        the envs at these rows step, sync their parameters and count; the others stay as they are.
        """
        info, params, hooks = self._info, self._params, self.hooks
        info.begin()
        needs_reset, lengths = self._needs_reset, self._lengths
        if rows is not None:
            if not rows:
                return 0  # none of the slot's envs steps: not even the slot's step count moves
            stepping = np.zeros(len(self.envs), dtype=np.bool_)
            stepping[rows] = True
        if params is not None:
            params.sync(None if rows is None else stepping)
        batch = self._read_actions()
        if hooks is not None:
            hooks.begin_step(self.global_step)
            hooks.before_step(batch, needs_reset, lengths)
        actions = self._per_env_actions(batch)
        if params is not None:
            params.before_step(needs_reset if rows is None else np.asarray(needs_reset) | ~stepping, lengths)
        if rows is None:
            self._run_envs(actions)
        else:
            self._run_some(actions, rows)
        changed = hooks is not None and hooks.after_step(self._stepped, lengths)
        episodes_ended = self._account(changed)
        self.global_step += 1
        return episodes_ended

    def _read_actions(self) -> Any:
        """A private copy of the slot's actions (an env may keep its action; hooks may edit it)."""
        raise NotImplementedError

    def _per_env_actions(self, batch: Any) -> Any:
        """Something that ``[i]`` indexes to env ``i``'s action."""
        return batch

    def _run_envs(self, actions: Any) -> None:
        """Steps (or resets, where due) every env and writes its results to the slot's rows."""
        raise NotImplementedError

    def _run_some(self, actions: Any, rows: list[int]) -> None:
        """``_run_envs`` for the envs at ``rows`` only (a partial step)."""
        raise NotImplementedError(f"engine {self._config.engine!r} steps whole slots only")

    def _account(self, changed: bool) -> int:
        """Adds the step to each env's episode, ends the finished ones and runs ``on_reset`` hooks;
        returns how many episodes ended. ``changed``: hooks may have changed the slot's results."""
        raise NotImplementedError

    def reset(self) -> None:
        """Resets the envs that the trainer flagged, with their seeds and the shared options."""
        self._info.begin()
        self.global_step = int(self._reset_global_step[0])
        length = int(self._reset_options_length[0])
        options = json.loads(bytes(self._reset_options[:length]).decode()) if length else None
        if self._params is not None:
            self._params.sync()
        reset_rows = []
        for index in range(len(self.envs)):
            flags = int(self._reset_flags[index])
            if not flags & RESET_THIS_ENV:
                continue
            self.current_env = self.start + index
            env, rebuilt_seed = self._begin_episode(index)
            seed = seed_of(self._reset_seed[index]) if flags & RESET_WITH_SEED else rebuilt_seed
            self._reset_env(index, env, seed, options)
            self._needs_reset[index] = False
            reset_rows.append(index)
        self.current_env = None
        if self.hooks is not None:
            self.hooks.on_reset(reset_rows, self._lengths)


class EnvSlot(Slot):
    """A slot of gymnasium envs, stepped one by one, with numpy views of the slot's rows."""

    def __init__(
        self, config: WorkerConfig, views: dict[str, np.ndarray], info: InfoWriter, params: ParamApplier | None
    ) -> None:
        super().__init__(config, views, info, params)
        rows = slice(self.start, self.stop)
        self._obs_space = config.observation_space
        self._act_space = config.action_space
        self._obs_leaves = leaves(self._obs_space)
        self._act_leaves = leaves(self._act_space)
        self._obs = [views[leaf.field_name("observations")][rows] for leaf in self._obs_leaves]
        self._final_obs = (
            [views[leaf.field_name("final_observations")][rows] for leaf in self._obs_leaves] if self.same_step else []
        )
        self._actions = [views[leaf.field_name("actions")][rows] for leaf in self._act_leaves]
        self._act_is_leaf = is_leaf(self._act_space)
        self._obs_writer = ObservationWriter(self._obs_space, self._obs)

        count = self.stop - self.start
        self._needs_reset = [False] * count
        self._returns = [0.0] * count
        self._lengths = [0] * count
        self._starts = [time.perf_counter()] * count
        self._reward_row: list[Any] = [0.0] * count
        self._termination_row = [False] * count
        self._truncation_row = [False] * count
        self._stepped = [False] * count
        self._step_infos: list[dict[str, Any] | None] = [None] * count
        #: Per env: what the loop steps (see ``inner_step``), and the ``TimeLimit`` whose count
        #: the loop keeps when it steps under it (None: the stepped callable counts, if anything does).
        self._steppers: list[Any] = [None] * count
        self._limits: list[Any] = [None] * count  # TimeLimit or None
        #: The envs stepped through all their wrappers (``env.step``) until ``inner_step`` finds
        #: what lies under them: after they are made, and after a control call.
        self._through_wrappers: set[int] = set()

    def build(self) -> None:
        """Makes the slot's envs and checks their spaces against the pool's."""
        self._make_all(self._make)

    def _make(self, local: int) -> gymnasium.Env:
        env_id = self.start + local
        kwargs = self._config.env_kwargs
        if self._params is not None:
            kwargs = {**kwargs, **self._params.constructor_kwargs(local)}
        env = make_env(factory_of(self._config.env_factory, local), kwargs)
        same_observations = self._config.same_observation_spaces
        for what, got, expected, agrees in (
            ("observation", env.observation_space, self._obs_space, not same_observations),
            ("action", env.action_space, self._act_space, False),
        ):
            if got != expected and not (agrees and is_space_dtype_shape_equiv(got, expected)):
                env.close()
                rule = (
                    "the same shapes and dtypes"
                    if agrees
                    else "the same spaces (observation_mode='different' lets observation bounds differ)"
                )
                raise ValueError(
                    f"env {env_id} has {what} space {got}, but the pool was launched with {expected}; "
                    f"every env of a pool must have {rule}"
                )
        if self._params is not None:
            self._params.attach_env(local, env)
        self._step_through_wrappers(local, env)
        return env

    def _step_through_wrappers(self, local: int, env: gymnasium.Env) -> None:
        self._steppers[local], self._limits[local] = env.step, None
        self._through_wrappers.add(local)

    def after_call(self) -> None:
        """Steps every env through all its wrappers again (until ``inner_step`` looks anew): a
        control call (``env_apply``, ``call``, ``set_attr``) may have wrapped one, replaced a layer or
        patched a ``step``."""
        for local, env in enumerate(self.envs):
            self._step_through_wrappers(local, env)

    def close(self) -> None:
        """Closes every env, ignoring errors (the worker is exiting)."""
        for env in self.envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - an env failing to close must not stop the others
                pass

    # -- writing results -------------------------------------------------------------------------

    def _read_actions(self) -> Any:
        """A private copy of the slot's actions (an env may keep its action; hooks may edit it)."""
        if self._act_is_leaf:
            return self._actions[0].copy()
        return assemble(self._act_space, iter([view.copy() for view in self._actions]))

    def _per_env_actions(self, batch: Any) -> Any:
        """Something that ``[i]`` indexes to env ``i``'s action."""
        if self._act_is_leaf:
            return batch
        parts = flatten(self._act_space, batch)
        return [assemble(self._act_space, iter([part[i] for part in parts])) for i in range(len(self.envs))]

    def _remake(self, index: int) -> gymnasium.Env:
        self.envs[index].close()
        return self._make(index)

    def _reset_env(self, index: int, env: Any, seed: int | None, options: dict[str, Any] | None) -> None:
        observation, env_info = env.reset(seed=seed, options=options)
        self._obs_writer.write(index, observation)
        if env_info:
            self._info.add(index, env_info)

    # -- commands --------------------------------------------------------------------------------

    def request_reset(self, rows: np.ndarray) -> None:
        """Makes the envs at ``rows`` reset instead of stepping this step (hooks ask for it)."""
        for row in np.atleast_1d(rows).tolist():
            self._needs_reset[row] = True

    def _run_some(self, actions: Any, rows: list[int]) -> None:
        """``_run_envs`` for the envs at ``rows`` only: the others are neither stepped nor counted."""
        self._stepped[:] = [False] * len(self.envs)
        self._run_envs(actions, rows)

    def _run_envs(self, actions: Any, rows: list[int] | None = None) -> None:
        """Steps (or resets, where due) every env (or those at ``rows``) and writes its results to
        the slot's rows."""
        info, needs_reset, envs = self._info, self._needs_reset, self.envs
        rewards, terminations, truncations = self._reward_row, self._termination_row, self._truncation_row
        stepped, step_infos, steppers, limits = self._stepped, self._step_infos, self._steppers, self._limits
        write_observation = self._obs_writer.write
        # The common case checked inline (a call per env costs more than the check): an array of
        # exactly the leaf's shape and dtype; anything else goes through the checking writer.
        exact_view, exact_shape, exact_dtype = self._obs_writer.exact or (None, None, None)
        env_info: dict[str, Any] | None
        index = 0
        try:  # the failing env is named from the loop's index: a store per env would cost more
            for index, env in enumerate(envs) if rows is None else ((row, envs[row]) for row in rows):
                if needs_reset[index]:
                    env, seed = self._begin_episode(index)
                    observation, env_info = env.reset(seed=seed)
                    rewards[index], terminations[index], truncations[index] = 0.0, False, False
                    needs_reset[index], stepped[index] = False, False
                    if env_info:
                        info.add(index, env_info)
                else:
                    limit, action = limits[index], actions[index]
                    observation, rewards[index], terminations[index], truncated, env_info = steppers[index](action)
                    if limit is not None:  # TimeLimit.step's own work (see inner_step)
                        elapsed = limit._elapsed_steps = limit._elapsed_steps + 1
                        if elapsed >= limit._max_episode_steps:
                            truncated = True
                    truncations[index], stepped[index], step_infos[index] = truncated, True, env_info
                if (
                    observation.__class__ is np.ndarray
                    and observation.shape == exact_shape
                    and observation.dtype is exact_dtype
                    and exact_view is not None
                ):
                    exact_view[index] = observation
                else:
                    write_observation(index, observation)  # raises for one that does not fit the space
        except BaseException:
            self.current_env = self.start + index
            raise
        self._rewards[:] = rewards
        self._terminations[:] = terminations
        self._truncations[:] = truncations
        if self._through_wrappers:
            self._find_inner_steps()

    def _find_inner_steps(self) -> None:
        """Steps the envs whose checker has now done its checks under gymnasium's standard wrappers."""
        for index in list(self._through_wrappers):
            found = inner_step(self.envs[index])
            if found is not None:
                self._steppers[index], self._limits[index] = found
                self._through_wrappers.discard(index)

    def _account(self, changed: bool) -> int:
        """Adds the step to each env's episode, ends the episodes that finished (resetting them now
        under same-step autoreset) and runs ``on_reset`` hooks; returns how many episodes ended.
        ``changed``: hooks may have changed the results in the slot's rows."""
        info, needs_reset, returns, lengths = self._info, self._needs_reset, self._returns, self._lengths
        stepped, step_infos, observations = self._stepped, self._step_infos, self._obs
        if changed:
            rewards, terminations, truncations = (
                self._rewards.tolist(),
                self._terminations.tolist(),
                self._truncations.tolist(),
            )
        else:
            rewards, terminations, truncations = self._reward_row, self._termination_row, self._truncation_row
        episodes_ended, same_step_resets = 0, []
        index = 0
        try:  # the failing env is named from the loop's index, as in _run_envs
            for index, did_step in enumerate(stepped):
                if not did_step:
                    continue
                returns[index] += float(rewards[index])
                lengths[index] += 1
                env_info = step_infos[index]
                if terminations[index] or truncations[index]:
                    episodes_ended += 1
                    self._end_episode(index, terminations[index], truncations[index], env_info)
                    if self.same_step:
                        for live, final in zip(observations, self._final_obs):
                            final[index] = live[index]
                        if env_info:
                            info.add(index, env_info, ("final_info",))
                        env, seed = self._begin_episode(index)
                        observation, env_info = env.reset(seed=seed)
                        self._obs_writer.write(index, observation)
                        same_step_resets.append(index)
                    elif self.autoreset:
                        needs_reset[index] = True
                if env_info:
                    info.add(index, env_info)
        except BaseException:
            self.current_env = self.start + index
            raise
        if self.hooks is not None:
            self.hooks.on_reset(same_step_resets, lengths)
        return episodes_ended
