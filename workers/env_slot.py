"""The slot of gymnasium envs (``engine="python"``): each env stepped, reset and accounted for in
Python, one by one, except where the envs' family steps them all at once (``EnvAdapter.batch_stepper``:
gymnasium's CartPole)."""

from __future__ import annotations

import time
from typing import Any

import gymnasium
import numpy as np
from gymnasium.spaces.utils import is_space_dtype_shape_equiv

from shmpool.config import WorkerConfig, factory_of, make_env
from shmpool.env_families import BatchStep, adapter_for
from shmpool.infos import InfoWriter
from shmpool.spaces import ObservationWriter, assemble, flatten, is_leaf, leaves
from shmpool.workers.envs import Slot
from shmpool.workers.inner_step import inner_step
from shmpool.workers.param_applier import ParamApplier


class EnvSlot(Slot):
    """A slot of gymnasium envs, stepped one by one (or all at once where their family can), with numpy
    views of the slot's rows."""

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
        #: The envs' family's step of them all at once, once every env's stepper is its env's own
        #: ``step`` and the family has one (``EnvAdapter.batch_stepper``); else None.
        self._step_together: BatchStep | None = None

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
        self._step_together = None

    def after_call(self) -> None:
        """Steps every env through all its wrappers again (until ``inner_step`` looks anew): a
        control call (``env_apply``, ``call``, ``set_attr``) may have wrapped one, replaced a layer or
        patched a ``step``."""
        for local, env in enumerate(self.envs):
            self._step_through_wrappers(local, env)

    def look_again(self) -> None:
        """Steps through all its wrappers again each env whose stepper is no longer what stepping it
        runs: a hook patched a ``step`` (on the env, a wrapper or a class) or wrapped the env, with no
        control call (``after_call``). Every env, every step (1.2-1.4 µs per env): a hook may reach an env
        by other ways than ``ctx.envs`` (the user's factory may keep them), and a class from anywhere."""
        local = 0
        try:  # what fails here (an env a hook broke) is named as in _run_envs
            for local, env in enumerate(self.envs):
                stepper = self._steppers[local]
                if local in self._through_wrappers:
                    if env.step != stepper:  # a new bound method each time, equal while self and function are
                        self._step_through_wrappers(local, env)
                    continue
                found = inner_step(env)
                if found is None or found[0] != stepper or found[1] is not self._limits[local]:
                    self._step_through_wrappers(local, env)
        except BaseException:
            self.current_env = self.start + local
            raise

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
        if self._step_together is not None:
            rows = self._run_together(actions, rows)
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
        """Steps the envs whose checker has now done its checks under gymnasium's standard wrappers,
        all at once when their family can (and the observation goes straight to its rows)."""
        for index in list(self._through_wrappers):
            found = inner_step(self.envs[index])
            if found is not None:
                self._steppers[index], self._limits[index] = found
                self._through_wrappers.discard(index)
        if not self._through_wrappers and self._obs_writer.exact is not None and self._act_is_leaf:
            observations, action_dtype = self._obs_writer.exact[0], self._actions[0].dtype
            self._step_together = adapter_for(self.envs[0]).batch_stepper(self._steppers, observations, action_dtype)

    def _run_together(self, actions: np.ndarray, rows: list[int] | None) -> list[int] | None:
        """Steps the envs at ``rows`` (None: all) that are not due to reset with ``_step_together``;
        returns the rows left to run one by one (None: all of them, where it declined). The resets
        due run after the others step: a reset that raises breaks the pool, so the order shows only
        in envs the caller holds references to."""
        needs_reset, count = self._needs_reset, len(self.envs)
        together: list[int] | None = None  # None: every env
        left: list[int] = []
        if rows is not None or True in needs_reset:
            candidates = range(count) if rows is None else rows
            together = [row for row in candidates if not needs_reset[row]]
            left = [row for row in candidates if needs_reset[row]]
            if not together:
                return left
        stepping = range(count) if together is None else together
        # TimeLimit.step's own work (see inner_step), worked out before any env steps: where it raises
        # (a limit someone set to None, say), the envs go one by one and the error names the env.
        limits = [self._limits[row] for row in stepping]
        try:
            counts = [0 if limit is None else limit._elapsed_steps + 1 for limit in limits]
            cut = [
                limit is not None and (True if elapsed >= limit._max_episode_steps else False)
                for limit, elapsed in zip(limits, counts)
            ]
        except Exception:  # noqa: BLE001 - raised again, naming the env, where the env steps by itself
            return rows
        assert self._step_together is not None
        results = self._step_together(together, actions if together is None else actions[together])
        if results is None:
            return rows
        rewards, terminations = results
        for limit, elapsed in zip(limits, counts):
            if limit is not None:
                limit._elapsed_steps = elapsed
        truncations, stepped, step_infos = self._truncation_row, self._stepped, self._step_infos
        if together is None:
            self._reward_row[:], self._termination_row[:], truncations[:] = rewards, terminations, cut
            stepped[:], step_infos[:] = [True] * count, [None] * count
        else:
            for row, reward, terminated, truncated in zip(together, rewards, terminations, cut):
                self._reward_row[row], self._termination_row[row], truncations[row] = reward, terminated, truncated
                stepped[row], step_infos[row] = True, None
        return left

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
