"""A worker's slot of envs: what every engine's slot shares (commands, resets, episode records), and
the base of the engines that step every env in one call (``ArraySlot``)."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from shmpool.config import WorkerConfig
from shmpool.episodes import EpisodeWriter
from shmpool.infos import InfoWriter
from shmpool.kernels.env import NO_LIMIT
from shmpool.layout import RESET_THIS_ENV, RESET_WITH_SEED, seed_of
from shmpool.spaces import leaves
from shmpool.workers.hook_runner import HookRunner
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
            if hooks.runs_user_code:  # since the last step, one may have patched a step or wrapped an env
                self.look_again()
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

    def look_again(self) -> None:
        """Makes each env's next step run what its ``step`` now runs, where a hook changed that: called
        before every step of a slot whose hooks run the user's code. An engine that steps the physics
        itself has nothing to look at."""

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


class ArraySlot(Slot):
    """A slot whose per-env bookkeeping is numpy arrays and whose envs step in one call
    (``KernelSlot``, ``MujocoSlot``): one observation and one action array (Box spaces), viewed
    as the slot's rows."""

    def __init__(
        self, config: WorkerConfig, views: dict[str, np.ndarray], info: InfoWriter, params: ParamApplier | None
    ) -> None:
        super().__init__(config, views, info, params)
        rows = slice(self.start, self.stop)
        (obs_leaf,) = leaves(config.observation_space)
        (act_leaf,) = leaves(config.action_space)
        self._obs = views[obs_leaf.field_name("observations")][rows]
        self._final_obs = views[obs_leaf.field_name("final_observations")][rows] if self.same_step else None
        self._actions = views[act_leaf.field_name("actions")][rows]
        count = self.stop - self.start
        self._elapsed = np.zeros(count, dtype=np.int64)
        self._limits = np.full(count, NO_LIMIT, dtype=np.int64)
        self._needs_reset = np.zeros(count, dtype=np.bool_)
        self._stepped = np.zeros(count, dtype=np.bool_)
        self._returns = np.zeros(count, dtype=np.float64)
        self._lengths = np.zeros(count, dtype=np.int64)
        self._starts = np.full(count, time.perf_counter())

    def request_reset(self, rows: np.ndarray) -> None:
        """Makes the envs at ``rows`` reset instead of stepping this step (hooks ask for it)."""
        self._needs_reset[np.atleast_1d(rows)] = True

    def _end_episodes(self, rows: np.ndarray, infos: dict[str, np.ndarray] | None) -> None:
        """``_end_episode`` for the envs at ``rows`` at once; ``infos``: the slot's final info columns
        by key (what the episode metrics read), or None without metrics."""
        self._episode_return[rows] = self._returns[rows]
        self._episode_length[rows] = self._lengths[rows]
        self._episode_time[rows] = np.round(time.perf_counter() - self._starts[rows], 6)
        self._record_episodes(rows, infos)

    def _record_episodes(self, rows: np.ndarray, infos: dict[str, np.ndarray] | None) -> None:
        """Appends the records of the finished episodes of the envs at ``rows`` (their statistics as
        they are now), published together."""
        self._episodes.append_many(
            self.start + rows,
            self._episode_index[rows],
            self.global_step,
            self._returns[rows],
            self._lengths[rows],
            self._terminations[rows],
            self._truncations[rows],
            None if infos is None else {key: values[rows] for key, values in infos.items()},
        )

    def _begin_episodes(self, rows: np.ndarray) -> None:
        """``_begin_episode`` for the envs at ``rows`` at once, for an engine that refuses rebuild
        parameters (none is re-made)."""
        self._returns[rows] = 0.0
        self._lengths[rows] = 0
        self._starts[rows] = time.perf_counter()
        self._episode_index[rows] += 1
        if self._params is not None:
            self._params.begin_episodes(rows)

    def _read_actions(self) -> Any:
        """A private copy of the slot's actions (hooks may edit it)."""
        return self._actions.copy()

    def _restart_rows(self, rows: np.ndarray) -> None:
        """Starts the next episode of the envs at ``rows`` and resets them."""
        raise NotImplementedError

    def _reset_due(self) -> None:
        """Resets the envs due for it (they do not step) and clears their step results."""
        rows = np.flatnonzero(self._needs_reset)
        self._restart_rows(rows)
        self._rewards[rows], self._terminations[rows], self._truncations[rows] = 0.0, False, False
        self._needs_reset[:] = False

    def _end_rows(self, rows: np.ndarray, infos: dict[str, np.ndarray] | None) -> list[int]:
        """Ends the episodes at ``rows``: restarted now under same-step autoreset (returned, for
        ``on_reset``), else due for a reset at their next step."""
        self._end_episodes(rows, infos)
        if self.same_step:
            assert self._final_obs is not None
            self._final_obs[rows] = self._obs[rows]
            self._restart_rows(rows)
            return rows.tolist()  # type: ignore[no-any-return]
        if self.autoreset:
            self._needs_reset[rows] = True
        return []
