"""What the trainer hands back after a step or reset, assembled from the segment: observations,
rewards, flags and the infos (the env's own, ``final_obs``, ``episode``, ``params``), plus the one
warning per parameter whose raw write a worker refused. An async batch's rows are a ``SlotSet``,
which ``shmpool.pool.batches`` makes and ``Results.batch`` reads."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from ..infos import InfoReader
from ..layout import CONTROL_WORDS, CTL_NUM_DONE, CTL_NUM_INFO, CTL_PARAM_REFUSALS
from ..spaces import Leaf, assemble, is_leaf
from .lifecycle import Parts


class SlotSet:
    """The rows of a set of whole slots, worked out once per set: their env ids in worker order, the
    index that reads them from a field (a slice when the slots are adjacent: no index array), and
    the read-only ``infos["env_id"]`` that ``send`` recognises."""

    __slots__ = ("workers", "rows", "index", "env_id")

    def __init__(self, slots: Sequence[tuple[int, int]], workers: tuple[int, ...]) -> None:
        self.workers = workers
        self.rows = np.concatenate([np.arange(*slots[k]) for k in workers])
        adjacent = all(slots[a][1] == slots[b][0] for a, b in zip(workers, workers[1:]))
        self.index: slice | np.ndarray = slice(int(self.rows[0]), int(self.rows[-1]) + 1) if adjacent else self.rows
        self.env_id = self.rows.astype(np.int32)
        self.env_id.flags.writeable = False  # handed to users, and compared by identity in send

    def take(self, field: np.ndarray) -> np.ndarray:
        """A copy of the set's rows of ``field``."""
        return field[self.index].copy() if isinstance(self.index, slice) else field[self.index]


class Results:
    """Reads one pool's results out of its segment's views."""

    def __init__(self, parts: Parts, observation_space: Any, observation_leaves: list[Leaf]) -> None:
        config = self._config = parts.config
        views = self._views = parts.lifecycle.views
        self._words = parts.waiter.words
        self._space = observation_space
        self._is_leaf = is_leaf(observation_space)
        self._num_workers = len(config.slots)
        self._num_envs = config.num_envs
        self._info_params = config.info_params and bool(config.param_specs)
        self._param_names = [spec.name for spec in config.param_specs]
        self._observations = [views[leaf.field_name("observations")] for leaf in observation_leaves]
        # Each leaf's final observations, and whether they come as Python ints: a Discrete leaf, which
        # gymnasium's envs observe as an int and SyncVectorEnv passes on as it is.
        self._final_observations = [
            (views[leaf.field_name("final_observations")], isinstance(leaf.space, spaces.Discrete))
            for leaf in observation_leaves
            if config.same_step
        ]
        self._infos = InfoReader(
            views["info_keys"], views["info_values"], views["info_mask"], views["control"], config.slots
        )
        self._episode_statistics = config.episode_statistics
        self._own_episode_warned = False
        self._refusals_seen = [0] * self._num_workers
        self._refusals_warned: set[int] = set()
        # What every step reads, looked up once: the flags arrays and each worker's info and
        # episode-end counts (a word index per worker).
        self._flags = (views["rewards"], views["terminations"], views["truncations"])
        self._info_counts = [k * CONTROL_WORDS + CTL_NUM_INFO for k in range(self._num_workers)]
        self._done_counts = [k * CONTROL_WORDS + CTL_NUM_DONE for k in range(self._num_workers)]

    def observations(self) -> Any:
        """The observations of every env: copies, or the shared views with ``copy=False``."""
        arrays = [view.copy() for view in self._observations] if self._config.copy else self._observations
        if self._is_leaf:
            return arrays[0]
        return assemble(self._space, iter(arrays))

    def step(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Observations, rewards, terminations, truncations and infos of the step just done."""
        words = self._words
        rewards, terminations, truncations = self._flags
        rewards, terminations, truncations = rewards.copy(), terminations.copy(), truncations.copy()
        infos: dict[str, Any] = {}
        for index in self._info_counts:
            if words[index]:
                self._read_infos(infos)
                break
        for index in self._done_counts:
            if words[index]:
                self._add_episode_infos(infos, terminations | truncations)
                break
        if self._info_params:
            self._add_param_infos(infos)
        return self.observations(), rewards, terminations, truncations, infos

    def batch(
        self, slot_set: SlotSet, were_reset: list[bool]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The results of a set of whole slots (an async batch: see ``shmpool.pool.batches``), with
        ``infos["env_id"]``; a slot whose command was a reset has zero rewards and no flags."""
        views, words, slots = self._views, self._words, self._config.slots
        take = slot_set.take
        rewards, terminations, truncations = (
            take(views["rewards"]),
            take(views["terminations"]),
            take(views["truncations"]),
        )
        infos: dict[str, Any] = {}
        size, at, ended = len(slot_set.rows), 0, False
        for worker_id, was_reset in zip(slot_set.workers, were_reset):
            start, stop = slots[worker_id]
            base = worker_id * CONTROL_WORDS
            if was_reset:  # the rows still hold the slot's last step
                rewards[at : at + stop - start] = 0.0
                terminations[at : at + stop - start] = truncations[at : at + stop - start] = False
            elif words[base + CTL_NUM_DONE]:
                ended = True
            if words[base + CTL_NUM_INFO]:
                self._infos.read_into(infos, worker_id, at, size)
            at += stop - start
        if ended:
            self._add_episode_infos(infos, terminations | truncations, slot_set.rows)
        if self._info_params:
            applied = views["applied"]
            infos["params"] = {name: take(applied[name]) for name in self._param_names}
        infos["env_id"] = slot_set.env_id
        arrays = [take(view) for view in self._observations]
        observations = arrays[0] if self._is_leaf else assemble(self._space, iter(arrays))
        return observations, rewards, terminations, truncations, infos

    def reset(self) -> tuple[Any, dict[str, Any]]:
        """Observations and infos of the reset just done."""
        infos: dict[str, Any] = {}
        self._read_infos(infos)
        if self._info_params:
            self._add_param_infos(infos)
        return self.observations(), infos

    def _read_infos(self, infos: dict[str, Any]) -> None:
        words = self._words
        reported = [worker for worker in range(self._num_workers) if words[worker * CONTROL_WORDS + CTL_NUM_INFO]]
        if reported:
            self._infos.read_all(infos, reported)

    def _add_param_infos(self, infos: dict[str, Any]) -> None:
        applied = self._views["applied"]
        infos["params"] = {name: applied[name].copy() for name in self._param_names}

    def _add_episode_infos(self, infos: dict[str, Any], dones: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Adds ``final_obs`` (same-step autoreset) and ``episode`` for the envs that are ``dones``;
        ``rows``: the env id of each row (an async batch), None for every env in order."""
        views = self._views
        # Row by row: few envs end on a step, and numpy's whole-array machinery (np.where, masked
        # copies) costs more than that, above all in a training loop, whose policy leaves it out of
        # the caches between steps.
        ended = np.flatnonzero(dones).tolist()
        if self._config.same_step:
            final = np.empty(len(dones), dtype=object)  # None in every row
            for row in ended:
                env_id = row if rows is None else int(rows[row])
                if self._is_leaf:
                    view, as_int = self._final_observations[0]
                    final[row] = int(view[env_id]) if as_int else view[env_id].copy()
                else:
                    parts = [
                        int(view[env_id]) if as_int else view[env_id].copy()
                        for view, as_int in self._final_observations
                    ]
                    final[row] = assemble(self._space, iter(parts))
            infos["final_obs"], infos["_final_obs"] = final, dones.copy()
            infos.setdefault("final_info", {})
            infos["_final_info"] = dones.copy()
        if not self._episode_statistics:
            return
        if "episode" in infos:  # the env's own (a RecordEpisodeStatistics inside it): it wins
            if not self._own_episode_warned:
                self._own_episode_warned = True
                warnings.warn(
                    f"{self._config.env_label} reports its own info['episode']; the pool keeps it and does not "
                    f"add its own (launch with episode_statistics=False to silence this)",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return
        returns, lengths, times = views["episode_return"], views["episode_length"], views["episode_time"]
        if rows is not None:
            returns, lengths, times = returns[rows], lengths[rows], times[rows]
        infos["episode"] = {"r": _only(ended, returns), "l": _only(ended, lengths), "t": _only(ended, times)}
        infos["_episode"] = dones

    def warn_refusals(self) -> None:
        """One warning per parameter the first time a worker refuses a raw write of it."""
        words, views = self._words, self._views
        for worker_id in range(self._num_workers):
            count = words[worker_id * CONTROL_WORDS + CTL_PARAM_REFUSALS]
            if count == self._refusals_seen[worker_id]:
                continue
            self._refusals_seen[worker_id] = count
            for spec in self._config.param_specs:
                if spec.index in self._refusals_warned or not views["param_refusals"][worker_id, spec.index]:
                    continue
                self._refusals_warned.add(spec.index)
                text = bytes(views["param_refusal_text"][worker_id, spec.index]).decode(errors="replace")
                warnings.warn(
                    f"{text} (further refusals of {spec.name!r} are counted in pool.params.refusals, not warned)",
                    RuntimeWarning,
                    stacklevel=5,
                )


def _only(rows: list[int], values: np.ndarray) -> np.ndarray:
    """``values`` at ``rows``, zeros elsewhere, in their dtype (gymnasium's ``RecordEpisodeStatistics``)."""
    result = np.zeros(len(values), dtype=values.dtype)
    if len(rows) > 8:  # many: one fancy index beats a scalar copy per row
        result[rows] = values[rows]
    else:
        for row in rows:
            result[row] = values[row]
    return result


def select_rows(values: Any, ids: np.ndarray, num_envs: int) -> Any:
    """The rows ``ids`` of every per-env array (one row for each of ``num_envs``) in ``values``,
    nested dicts and tuples followed; a list is such an array, anything else is kept as it is."""
    if len(ids) == num_envs and np.array_equal(ids, np.arange(num_envs)):
        return values
    if isinstance(values, dict):
        return {key: select_rows(value, ids, num_envs) for key, value in values.items()}
    if isinstance(values, tuple):
        return tuple(select_rows(value, ids, num_envs) for value in values)
    if isinstance(values, list):
        values = np.asarray(values)
    if isinstance(values, np.ndarray) and values.ndim and len(values) == num_envs:
        return values[ids]
    return values
