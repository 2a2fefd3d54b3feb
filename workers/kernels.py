"""A worker's slot run by a compiled batch kernel (``engine="numba"``, ``shmpool.kernels``).

``KernelSlot`` is the kernel engine's ``shmpool.workers.env_slot.EnvSlot``: the same commands, autoreset, episode
accounting, hooks and results, but the slot's envs are rows of a state array stepped by one call of the kernel, with
the time limit and episode accounting done over the slot's arrays. Resets run the kernel's Python reset per env;
autoresets of a kernel with ``draw`` and ``start`` run compiled, from resets drawn ahead (``_restart_drawn``).
Parameters land in the kernel's parameter matrix (``KernelColumns``) through the same ``ParamApplier`` as every
engine's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from shmpool.config import WorkerConfig
from shmpool.infos import InfoWriter
from shmpool.kernels import BatchKernel, KernelEnv, load
from shmpool.params import ParamSpec, in_float64_words, is_plain_float64
from shmpool.workers.envs import ArraySlot
from shmpool.workers.param_applier import ParamApplier
from shmpool.workers.targets import Targets

#: Option-less resets each env draws ahead for compiled autoresets. The refill (a generator state
#: saved, one ``draw`` call) is paid once per this many episodes of an env.
RESETS_DRAWN_AHEAD = 16


class KernelColumns(Targets):
    """The numba engine's targets: a parameter's values go to its column of the kernel's parameter
    matrix (one ``bind=False``, which only hooks read, nowhere); what the env caches from its
    parameters is recomputed by the kernel's ``refresh`` where the Python engine's adapter recomputes
    it. Its ``compiled_sync`` is ``shmpool.kernels.slot.sync_scalars``."""

    def __init__(self, specs: list[ParamSpec], matrix: np.ndarray, kernel: BatchKernel) -> None:
        self._matrix = matrix
        self._kernel_refresh = kernel.refresh
        targets = {
            spec.index: spec.name if spec.bind is None else str(spec.bind) for spec in specs if spec.bind is not False
        }
        self.columns = {index: kernel.columns[target] for index, target in targets.items()}
        # As EnvTargets finds them for the Python engine's adapters.
        self.refreshed_by = {
            spec.index for spec in specs if spec.when != "rebuild" and targets.get(spec.index) in kernel.refresh_inputs
        }

    def write(self, spec: ParamSpec, rows: np.ndarray, values: np.ndarray) -> None:
        column = self.columns.get(spec.index)
        if column is not None:
            self._matrix[rows, column] = values

    def write_all(self, spec: ParamSpec, values: np.ndarray) -> None:
        column = self.columns.get(spec.index)
        if column is not None:
            self._matrix[:, column] = values

    def refresh(self, rows: Any = None) -> None:
        """Runs the kernel's ``refresh`` over the matrix rows ``rows`` (None: all)."""
        refresh = self._kernel_refresh
        if refresh is None:
            return
        if rows is None:
            refresh(self._matrix)
        else:
            part = self._matrix[rows]  # a copy: fancy indexing
            refresh(part)
            self._matrix[rows] = part

    def compiled_sync(self, applier: ParamApplier) -> Callable[[], int] | None:
        """``ParamApplier.sync`` as one call of ``sync_scalars``, or None when the block's records are
        not made of 8-byte fields or hold no plain float64 parameter. The call returns 0 or more when
        it synced (``seen`` is then the fresh copy), less than 0 when the general path must."""
        block, applied = applier.block, applier.applied
        if not (in_float64_words(block.dtype) and in_float64_words(applied.dtype)):
            return None
        plain = [s for s in applier.specs if is_plain_float64(s)]
        if not plain:
            return None
        import numba

        from shmpool.kernels.slot import sync_scalars
        from shmpool.protocol.compiled import entry_point

        words = np.full(block.dtype.itemsize // 8, -1, dtype=np.int64)
        for p, spec in enumerate(plain):
            words[block.dtype.fields[spec.name][1] // 8] = p  # type: ignore[index]
        count = len(block)
        shared = block.view(np.float64).reshape(count, -1)  # the slot's rows of the shared block
        touched = np.zeros(count, dtype=np.bool_)  # the rows it touched, for the refresh
        accepting = (
            applier.writers,
            applier.good.view(np.float64).reshape(count, -1),
            words,
            np.array([s.low.item() for s in plain]),
            np.array([s.high.item() for s in plain]),
            np.array([s.when == "step" for s in plain]),
            np.array([self.columns.get(s.index, -1) for s in plain], dtype=np.int64),
            np.array([applied.dtype.fields[s.name][1] // 8 for s in plain], dtype=np.int64),  # type: ignore[index]
            self._matrix,
            applied.view(np.float64).reshape(count, -1),
            np.array([s.index in self.refreshed_by for s in plain], dtype=np.bool_),
            touched,
        )
        fresh = np.empty_like(shared)
        # ``applier.seen`` as last viewed, and its float64 matrix view (the general path makes a new
        # ``seen``; the call writes the fresh copy into it).
        viewed: list[Any] = [applier.seen, applier.seen.view(np.float64).reshape(count, -1)]
        # The same arrays every call (``seen`` is another of the same type after the general path):
        # typed once, not by numba's dispatcher at every step.
        arguments = (shared, fresh, viewed[1], *accepting)
        function = entry_point(sync_scalars, tuple(numba.typeof(argument) for argument in arguments))

        def sync() -> int:
            seen = applier.seen
            if viewed[0] is not seen:
                viewed[:] = seen, seen.view(np.float64).reshape(count, -1)
            result: int = function(shared, fresh, viewed[1], *accepting)
            if result <= 0:
                return result
            applier.seen_bytes = seen.tobytes()  # ``seen`` now holds the fresh copy: the general path compares with it
            rows = result - 1
            if rows:  # as the general path refreshes the rows that changed an input
                self.refresh(None if rows == count else np.flatnonzero(touched))
            return result

        return sync


class KernelSlot(ArraySlot):
    """The envs of one slot as rows of a compiled kernel's arrays, with the interface the worker
    uses (``build``, ``step``, ``reset``, ``close``, ``envs``, ``hooks``, ``current_env``)."""

    def __init__(
        self, config: WorkerConfig, views: dict[str, np.ndarray], info: InfoWriter, params: ParamApplier | None
    ) -> None:
        super().__init__(config, views, info, params)
        self.kernel: BatchKernel = load(config.kernel)

        count = self.stop - self.start
        kwargs = dict(config.env_kwargs)
        self._max_steps = kwargs.pop("max_episode_steps", None)  # checked by KernelEnv, as TimeLimit does
        kwargs.pop("render_mode", None)
        from shmpool.kernels import slot  # imports numba: only in the workers of this engine

        self._slot = slot
        self._constructor = kwargs
        # What the kernel reads and writes; the KernelEnv of each row is a view of these.
        self.arrays: dict[str, np.ndarray] = {
            "state": np.zeros((count, self.kernel.state_size), dtype=np.float64),
            "params": self.kernel.nominal(count, kwargs),
            "observations": self._obs,
            "elapsed": self._elapsed,
            "limits": self._limits,  # each env's time limit (its KernelEnv's _max_episode_steps)
        }
        self._state, self._matrix = self.arrays["state"], self.arrays["params"]
        # Autoresets run compiled (_restart_drawn) when nothing must happen in Python at an episode's
        # start: the kernel can start an env from drawn values, resets come at the next step, and no
        # parameter is applied, drawn or rebuilt per episode.
        self._drawn_resets = (
            self.kernel.start is not None
            and self.autoreset
            and not self.same_step
            and (params is None or not params.per_episode)
        )
        if self._drawn_resets:
            width = self.kernel.draw_width
            self.arrays["draws"] = np.zeros((count, RESETS_DRAWN_AHEAD, width))
            self.arrays["cursor"] = np.full(count, RESETS_DRAWN_AHEAD, dtype=np.int64)  # none drawn yet
            self._current_draws = np.zeros((count, width))
            self._restarting = np.zeros(count, dtype=np.bool_)
        self._stepping = np.zeros(count, dtype=np.bool_)
        self._ended = np.zeros(count, dtype=np.bool_)

    def build(self) -> None:
        """Makes the slot's env views, applies the parameters, and compiles the kernel (or loads it
        from numba's cache) by calling it over envs that do not step, so no step pays for it."""
        if self._params is not None:
            self._columns = KernelColumns(self._params.specs, self._matrix, self.kernel)
            self._params.land_in(self._columns)
        self._make_all(self._make)
        idle = self._stepping  # all False: nothing steps, nothing is counted
        self.kernel.step(
            self._state, self._matrix, self._actions.copy(), idle, self._obs, self._rewards, self._terminations
        )
        self._slot.time_limit(self._elapsed, idle, self._limits, self._truncations, self._stepped)
        self._slot.add_step(
            self._stepped,
            self._rewards,
            self._terminations,
            self._truncations,
            self._returns,
            self._lengths,
            self._ended,
        )
        if self._drawn_resets:  # nothing ended or due for a reset: no change but the compiling
            self._restart(0.0)
            self._end_episodes_compiled(0)

    def hook_engine(self) -> tuple[str, Any, np.ndarray | None]:
        """The numba engine, the slot's kernel and its state array."""
        return "numba", self.kernel, self._state

    def _make(self, local: int) -> KernelEnv:
        """A fresh env at row ``local``: a new ``np_random``, its row of the matrix as a new env's
        attributes (what ``set_attr`` wrote on the env it replaces is gone, as with gymnasium), its
        constructor values in it, and the slot's time limit."""
        self._matrix[local] = self.kernel.nominal(1, self._constructor)[0]
        params = self._params
        if params is not None:  # its rebuild values, as its constructor would take them
            constructed = params.constructor_kwargs(local)
            for spec in params.rebuild:
                self._columns.write(spec, np.array([local]), np.array([constructed[spec.name]]))
        env = KernelEnv(
            self.kernel, self.arrays, local, max_episode_steps=self._max_steps, env_label=self._config.env_label
        )
        if params is not None:
            params.attach_env(local, env)
        return env

    def close(self) -> None:
        """Nothing to release: the arrays go with the process."""
        self.envs.clear()

    # -- commands --------------------------------------------------------------------------------

    def _run_envs(self, actions: np.ndarray) -> None:
        """Resets the envs due for it, in Python, then steps all the others in one kernel call."""
        needs_reset, stepping = self._needs_reset, self._stepping
        np.logical_not(needs_reset, out=stepping)
        if not stepping.all() and (not self._drawn_resets or self._restart_drawn()):
            self._reset_due()  # the others (all, without drawn resets)
        self.kernel.step(self._state, self._matrix, actions, stepping, self._obs, self._rewards, self._terminations)
        self._slot.time_limit(self._elapsed, stepping, self._limits, self._truncations, self._stepped)

    def _restart_drawn(self) -> int:
        """Resets, in one compiled call and the kernel's ``start``, the envs due for it that have a
        drawn reset left, and refills the envs that used their last one. Returns how many envs due
        for a reset had none left (still marked in ``needs_reset``)."""
        left, exhausted = self._restart(time.perf_counter())
        if exhausted:
            for index in np.flatnonzero(self._restarting & (self.arrays["cursor"] >= RESETS_DRAWN_AHEAD)).tolist():
                self.current_env = self.start + index
                self.envs[index].refill_draws()
            self.current_env = None
        return left

    def _restart(self, now: float) -> tuple[int, int]:
        result: tuple[int, int] = self._slot.restart(
            self._needs_reset,
            self._restarting,
            self.arrays["cursor"],
            self.arrays["draws"],
            self._current_draws,
            now,
            self._returns,
            self._lengths,
            self._starts,
            self._episode_index,
            self._elapsed,
            self._rewards,
            self._terminations,
            self._truncations,
        )
        self.kernel.start(self._restarting, self._current_draws, self._matrix, self._state, self._obs)  # type: ignore[misc]
        return result

    def _end_episodes_compiled(self, count: int) -> None:
        """``_account``'s ``count`` episode ends under compiled autoresets: the statistics and the
        resets to come compiled, and the records too when they hold no parameters or metrics."""
        self._slot.end_episodes(
            self._ended,
            self._returns,
            self._lengths,
            self._starts,
            time.perf_counter(),
            self._episode_return,
            self._episode_length,
            self._episode_time,
            self._needs_reset,
        )
        episodes = self._episodes
        ring = episodes.plain_ring
        if ring is None:
            self._record_episodes(np.flatnonzero(self._ended), None)
            return
        head = episodes.reserve(count)
        self._slot.record_episodes(
            self._ended,
            self.start,
            self._episode_index,
            self.global_step,
            self._returns,
            self._lengths,
            self._terminations,
            self._truncations,
            ring,
            head,
        )
        episodes.publish(count)  # after the records: a reader trusts what the head covers

    def _restart_rows(self, rows: np.ndarray) -> None:
        """Resets the envs at ``rows`` one by one, in Python (drawing their next resets ahead again)."""
        for index in rows.tolist():
            self.current_env = self.start + index
            env, seed = self._begin_episode(index)
            env.reset(seed=seed)
        self.current_env = None

    def _remake(self, index: int) -> KernelEnv:
        return self._make(index)

    def _reset_env(self, index: int, env: Any, seed: int | None, options: dict[str, Any] | None) -> None:
        env.reset(seed=seed, options=options)  # writes the row's state and observation itself

    def _account(self, changed: bool) -> int:
        """Adds the step to each env's episode, ends the finished ones (resetting them now under
        same-step autoreset) and runs ``on_reset`` hooks; returns how many episodes ended."""
        returns, lengths, ended = self._returns, self._lengths, self._ended
        count = self._slot.add_step(
            self._stepped, self._rewards, self._terminations, self._truncations, returns, lengths, ended
        )
        if not count:
            return 0
        same_step_resets = []
        if self._drawn_resets:
            self._end_episodes_compiled(count)
        else:
            same_step_resets = self._end_rows(np.flatnonzero(ended), None)
        if self.hooks is not None:
            self.hooks.on_reset(same_step_resets, lengths)  # type: ignore[arg-type]
        return int(count)
