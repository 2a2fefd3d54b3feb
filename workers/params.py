"""Applying the params block to a worker's envs: read it consistently, validate what changed, apply
each parameter when its ``when`` says, draw randomized ones, and publish what each env uses."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmpool.layout import CTL_PARAM_REFUSALS
from shmpool.params import Binding, ParamSpec, bad_rows, derive_seed, draw, problem, refresh_derived, show

#: Reads of a record that a writer is changing are retried this often before the env keeps its
#: values for this step (a writer killed mid-write leaves its records odd until the next write).
SEQLOCK_RETRIES = 64


class ParamApplier:
    """The params of one slot: ``sync`` once per command, ``begin_episode`` at each env reset,
    ``before_step`` before the slot's envs step."""

    def __init__(
        self,
        specs: list[ParamSpec],
        views: dict[str, np.ndarray],
        env_ids: tuple[int, int],
        worker_id: int,
        seed: int,
        control: np.ndarray,
        env_label: str,
    ) -> None:
        start, stop = env_ids
        self._specs = specs
        self._seed = seed
        self._label = env_label
        self._env_ids = np.arange(start, stop)
        self._block = views["params"][start:stop]
        self._seq = views["params_seq"][start:stop]
        self._applied = views["applied"][start:stop]
        self._episodes = views["episode_index"][start:stop]
        self._refusals = views["param_refusals"][worker_id]
        self._refusal_text = views["param_refusal_text"][worker_id]
        self._control = control
        self._record = np.dtype((np.void, self._block.dtype.itemsize))
        self._seen = self._block.copy()
        self._seen = self._read()
        self._good = self._seen.copy()  # the last accepted values of every env
        self._step_values = [s for s in specs if s.when == "step" and not s.dist]
        self._step_draws = [s for s in specs if s.when == "step" and s.dist]
        self._episode_specs = [s for s in specs if s.when == "reset" or (s.when == "step" and s.dist)]
        self._rebuild = [s for s in specs if s.when == "rebuild"]
        self._bindings: list[dict[int, Binding]] = [{} for _ in range(stop - start)]
        self._built_with: list[bytes] = [b""] * (stop - start)

    # -- consistent reads ------------------------------------------------------------------------

    def _read(self) -> np.ndarray:
        """A copy of the slot's records in which no record is half-written (seqlock reader)."""
        snapshot = self._block.copy()
        for _ in range(SEQLOCK_RETRIES):
            before = self._seq.copy()
            snapshot_now = self._block.copy()
            after = self._seq.copy()
            whole = (before == after) & (before % 2 == 0)
            snapshot[whole] = snapshot_now[whole]
            if whole.all():
                return snapshot
        # Records still being written keep what this worker last saw.
        snapshot[~whole] = self._seen[~whole]
        return snapshot

    # -- env lifecycle ---------------------------------------------------------------------------

    def constructor_kwargs(self, local: int) -> dict[str, Any]:
        """The ``rebuild`` parameters of env ``local`` as constructor keywords (noted as built with)."""
        self._built_with[local] = self._rebuild_key(local)
        return {s.name: _plain(self._good[s.name][local]) for s in self._rebuild}

    def _rebuild_key(self, local: int) -> bytes:
        return b"".join(self._good[s.name][local].tobytes() for s in self._rebuild)

    def attach_env(self, local: int, env: Any) -> None:
        """Resolves the bindings of a (re)built env and applies the current step values to it."""
        self._bindings[local] = {
            s.index: Binding(env, s, self._label) for s in self._specs if s.when != "rebuild"
        }
        for spec in self._step_values:
            self._apply(local, spec, self._good[spec.name][local])
        for spec in self._rebuild:
            self._applied[spec.name][local] = self._good[spec.name][local]
        refresh_derived(env)

    def needs_rebuild(self, local: int) -> bool:
        """Whether a ``rebuild`` parameter of env ``local`` changed since it was built."""
        return bool(self._rebuild) and self._rebuild_key(local) != self._built_with[local]

    def begin_episode(self, local: int, env: Any) -> None:
        """Applies the per-episode values (``reset`` ones, fresh draws) of env ``local``, whose
        episode index has just advanced."""
        episode = int(self._episodes[local])
        for spec in self._episode_specs:
            if spec.dist:
                value = draw(spec, self._good[spec.name][local : local + 1], self._seed,
                             self._env_ids[local : local + 1], np.array([episode]), 0)[0]
            else:
                value = self._good[spec.name][local]
            self._apply(local, spec, value)
        if self._episode_specs:
            refresh_derived(env)

    def rebuilt_seed(self, local: int) -> int:
        """The reset seed of a rebuilt env (its fresh generator would otherwise make the run
        irreproducible), from the pool seed, its id and its episode."""
        return derive_seed(self._seed, int(self._env_ids[local]), int(self._episodes[local]))

    def _apply(self, local: int, spec: ParamSpec, value: np.ndarray) -> None:
        self._bindings[local][spec.index].set(np.asarray(value))
        self._applied[spec.name][local] = value

    # -- per command -----------------------------------------------------------------------------

    def sync(self, envs: list[Any]) -> None:
        """Reads the block; validates what changed; applies changed ``step`` values now."""
        snapshot = self._read()
        changed = snapshot.view(self._record) != self._seen.view(self._record)
        if not changed.any():
            return
        rows = np.flatnonzero(changed)
        touched: set[int] = set()
        for spec in self._specs:
            new = snapshot[spec.name][rows]
            differs = new.reshape(len(rows), -1).view(np.uint8) != self._seen[spec.name][rows].reshape(len(rows), -1).view(np.uint8)
            differs = differs.any(axis=1)
            if not differs.any():
                continue
            candidates = rows[differs]
            values = snapshot[spec.name][candidates]
            refused = bad_rows(spec, values)
            for local in candidates[refused]:
                self._refuse(spec, int(local), snapshot[spec.name][local])
            accepted = candidates[~refused]
            self._good[spec.name][accepted] = snapshot[spec.name][accepted]
            if spec.when == "step" and not spec.dist:
                for local in accepted:
                    self._apply(int(local), spec, self._good[spec.name][local])
                    touched.add(int(local))
        for local in touched:
            refresh_derived(envs[local])
        self._seen[rows] = snapshot[rows]

    def before_step(self, envs: list[Any], resetting: list[bool], lengths: list[int]) -> None:
        """Draws and applies the ``when="step"`` randomized values of the envs about to step.

        ``resetting[i]``: env ``i`` resets instead of stepping now (it draws at its reset);
        ``lengths[i]``: the steps env ``i`` has taken in its episode.
        """
        if not self._step_draws:
            return
        stepping = np.flatnonzero(~np.asarray(resetting, dtype=np.bool_))
        if not len(stepping):
            return
        episodes = self._episodes[stepping]
        steps = np.asarray(lengths)[stepping] + 1
        for spec in self._step_draws:
            values = draw(spec, self._good[spec.name][stepping], self._seed, self._env_ids[stepping], episodes, steps)
            for row, local in enumerate(stepping):
                self._apply(int(local), spec, values[row])
        for local in stepping:
            refresh_derived(envs[int(local)])

    def _refuse(self, spec: ParamSpec, local: int, value: Any) -> None:
        env_id = int(self._env_ids[local])
        message = (
            f"{self._label}: params[{spec.name!r}][{env_id}] = {show(value)} rejected: {problem(spec, value)}; "
            f"env {env_id} keeps {show(self._good[spec.name][local])}"
        )
        self._refusal_text[spec.index] = message.encode()[: self._refusal_text.dtype.itemsize]
        self._refusals[spec.index] += 1
        self._control[CTL_PARAM_REFUSALS] += 1  # published after the text and the count


def _plain(value: Any) -> Any:
    array = np.asarray(value)
    return array.item() if array.ndim == 0 else array.copy()
