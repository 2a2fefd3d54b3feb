"""The slot of an engine whose envs step in one call (the numba and MuJoCo engines): its per-env
bookkeeping as numpy arrays, and the episode ends and autoresets of whole rows at once."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shmpool.config import WorkerConfig
from shmpool.infos import InfoWriter
from shmpool.kernels.env import NO_LIMIT
from shmpool.spaces import leaves
from shmpool.workers.envs import Slot
from shmpool.workers.param_applier import ParamApplier


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
