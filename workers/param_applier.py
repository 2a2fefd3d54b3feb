"""Applying the params block to a worker's envs: read it consistently, validate what changed, apply
each parameter when its ``when`` says, draw randomized ones, and publish what each env uses.

``ParamApplier`` does all of that for every engine; an engine supplies only its ``Targets``
(``shmpool.workers.targets``), where a column of values lands: each env's attribute or binding
(``EnvTargets``, the Python engine), its model field in a ``mujoco.batch.Batch``
(``shmpool.workers.mujoco_batch.BatchTargets``) or its column of a kernel's parameter matrix
(``shmpool.workers.kernels.KernelColumns``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from shmpool.bindings import plain_values
from shmpool.draws import AheadUniforms, derive_seed, draws, values_from
from shmpool.layout import CTL_PARAM_REFUSALS
from shmpool.params import ParamSpec, bad_rows, problem, show
from shmpool.protocol import W_PARAMS_GENERATION, seqlock_read
from shmpool.workers.targets import Targets


class ParamApplier:
    """The params of one slot: ``sync`` once per command, ``begin_episodes`` at env resets,
    ``before_step`` before the slot's envs step. ``targets``: where values land (None until
    ``land_in``)."""

    def __init__(
        self,
        specs: list[ParamSpec],
        views: dict[str, np.ndarray],
        env_ids: tuple[int, int],
        worker_id: int,
        seed: int,
        control: np.ndarray,
        env_label: str,
        targets: Targets | None = None,
    ) -> None:
        start, stop = env_ids
        count = stop - start
        self.specs = specs
        self._seed = seed
        self._label = env_label
        self._env_ids = np.arange(start, stop)
        self._all_rows = np.arange(count)
        self.block = views["params"][start:stop]
        self._seq = views["params_seq"][start:stop]
        self.writers = views["writers"]
        self.applied = views["applied"][start:stop]
        self._episodes = views["episode_index"][start:stop]
        self._refusals = views["param_refusals"][worker_id]
        self._refusal_text = views["param_refusal_text"][worker_id]
        self._control = control
        self._record = np.dtype((np.void, self.block.dtype.itemsize))
        self.seen = self.block.copy()  # what a row that never reads whole falls back to at first
        self.seen = self._read()
        self.seen_bytes = self.seen.tobytes()
        # The last accepted values of every env, in the segment: a checkpoint saves them for the rows
        # whose block holds a value the workers refused.
        self.good = views["params_accepted"][start:stop]
        self.good[:] = self.seen
        self._step_values = [s for s in specs if s.when == "step" and not s.dist]
        self._step_draws = [s for s in specs if s.when == "step" and s.dist]
        self._episode_specs = [s for s in specs if s.when == "reset" or (s.when == "step" and s.dist)]
        self._episode_draws = [s for s in self._episode_specs if s.dist]
        #: The uniforms of the draws at each reset and at each step, drawn ahead.
        self._episode_uniforms = self._ahead(self._episode_draws, along_steps=False)
        self._step_uniforms = self._ahead(self._step_draws, along_steps=True)
        # The arguments each env's episode drew its ``reset`` dist values from: a redraw mid-episode
        # (``resample``) takes these, not a write that waits for the env's next reset.
        self._episode_arguments = {s.name: self.good[s.name].copy() for s in self._episode_draws if s.when == "reset"}
        self.rebuild = [s for s in specs if s.when == "rebuild"]
        self._scalars = _ScalarColumns.find(specs, self.block.dtype, self.good, self.applied)
        self._built_with: list[bytes] = [b""] * count
        self._targets: Targets = None  # type: ignore[assignment]
        self._compiled: Callable[[], int] | None = None
        if targets is not None:
            self.land_in(targets)

    def land_in(self, targets: Targets) -> None:
        """Where values go from now on."""
        self._targets = targets
        self._compiled = targets.compiled_sync(self)

    @property
    def accepted(self) -> np.ndarray:
        """The slot's records as last read whole and validated (read-only): what hooks see as
        ``ctx.params``, never a half-written record."""
        view = self.good.view()
        view.flags.writeable = False
        return view

    @property
    def per_episode(self) -> bool:
        """Whether some parameter is applied or drawn at each env's reset, or rebuilds the env."""
        return bool(self._episode_specs or self.rebuild)

    def _read(self) -> np.ndarray:
        """A copy of the slot's records in which no record is half-written (seqlock reader)."""
        return seqlock_read(self.block, self._seq, self.seen, self.writers)

    # -- env lifecycle ---------------------------------------------------------------------------

    def constructor_kwargs(self, local: int) -> dict[str, Any]:
        """The ``rebuild`` parameters of env ``local`` as constructor keywords (noted as built with)."""
        self._built_with[local] = self._rebuild_key(local)
        return {s.name: plain_values(self.good[s.name][local : local + 1])[0] for s in self.rebuild}

    def _rebuild_key(self, local: int) -> bytes:
        return b"".join(self.good[s.name][local].tobytes() for s in self.rebuild)

    def attach_env(self, local: int, env: Any) -> None:
        """Notes a (re)built env with the targets, applies the current step values to it, publishes
        its rebuild values, and refreshes what it caches from them."""
        self._targets.attach(local, env)
        rows = np.array([local])
        for spec in self._step_values:
            self._apply(spec, rows, self.good[spec.name][rows])
        for spec in self.rebuild:
            self.applied[spec.name][local] = self.good[spec.name][local]
        self._targets.refresh(rows)

    def needs_rebuild(self, local: int) -> bool:
        """Whether a ``rebuild`` parameter of env ``local`` changed since it was built."""
        return bool(self.rebuild) and self._rebuild_key(local) != self._built_with[local]

    def begin_episodes(self, rows: np.ndarray | int) -> None:
        """Applies the per-episode values (``reset`` ones, fresh draws) of the envs at local
        ``rows`` (an array, or one row), whose episode indices have just advanced."""
        if not self._episode_specs:
            return
        rows = np.atleast_1d(rows)
        for name, arguments in self._episode_arguments.items():
            arguments[rows] = self.good[name][rows]
        drawn, uniforms = self._episode_draws, self._episode_uniforms
        fresh = []
        if uniforms is not None:
            fresh = values_from(drawn, self._arguments(drawn, rows), uniforms.take(rows, self._episodes[rows]))
        by_index = {spec.index: values for spec, values in zip(drawn, fresh)}
        for spec in self._episode_specs:
            self._apply(spec, rows, by_index[spec.index] if spec.dist else self.good[spec.name][rows])
        self._targets.refresh(rows)

    def _ahead(self, specs: list[ParamSpec], along_steps: bool) -> AheadUniforms | None:
        """The uniforms of ``specs``' draws, drawn ahead along episodes or steps; None for no spec."""
        return AheadUniforms(self._seed, self._env_ids, specs, along_steps) if specs else None

    def _arguments(self, specs: list[ParamSpec], rows: np.ndarray) -> list[np.ndarray]:
        """The distribution arguments ``specs`` draw with at ``rows``: a ``reset`` one's from when its
        episode began, a ``step`` one's the last accepted."""
        return [self._episode_arguments.get(spec.name, self.good[spec.name])[rows] for spec in specs]

    def rebuilt_seed(self, local: int) -> int:
        """The reset seed of a rebuilt env (its fresh generator would otherwise make the run
        irreproducible), from the pool seed, its id and its episode."""
        return derive_seed(self._seed, int(self._env_ids[local]), int(self._episodes[local]))

    def _apply(self, spec: ParamSpec, rows: np.ndarray, values: np.ndarray) -> None:
        """Lands ``values`` (one per row) at local ``rows`` and publishes them."""
        self._targets.write(spec, rows, values)
        self.applied[spec.name][rows] = values

    def _apply_all(self, spec: ParamSpec, values: np.ndarray) -> None:
        """``_apply`` for every env of the slot."""
        self._targets.write_all(spec, values)
        self.applied[spec.name][:] = values

    # -- per command -----------------------------------------------------------------------------

    def changed_block(self) -> tuple[np.ndarray, bytes] | None:
        """A torn-free copy of the slot's block and its bytes if it changed since the last sync, else
        None (one bytes compare in the common case: nothing written)."""
        words = self.writers
        generation = words[W_PARAMS_GENERATION]
        raw = self.block.tobytes()
        if raw == self.seen_bytes:
            return None
        if generation == words[W_PARAMS_GENERATION] and not generation & 1:  # no write() meanwhile: whole
            return np.frombuffer(bytearray(raw), self.block.dtype), raw
        snapshot = self._read()
        snapshot_bytes = snapshot.tobytes()
        return None if snapshot_bytes == self.seen_bytes else (snapshot, snapshot_bytes)

    def sync(self, stepping: np.ndarray | None = None) -> None:
        """Reads the block; validates what changed; applies changed ``step`` values now.

        An engine's compiled sync (the numba engine's, for plain float64 parameters) goes first: one
        call reads the records and applies what changed, unless a value is refused, another
        parameter changed or a write is in flight, which it leaves to the path below.
        ``stepping``: a partial step's rows (a mask); the other envs' changes wait for their step."""
        if self._compiled is not None and stepping is None:
            if self.block.tobytes() == self.seen_bytes:  # nothing written: cheaper than the call
                return
            synced = self._compiled()
            if synced >= 0:
                if synced and self._scalars is not None:
                    self._scalars.forget_snapshot()  # the call rewrote ``seen`` in place
                return
        changed = self.changed_block()
        if changed is None:
            return
        snapshot, snapshot_bytes = changed
        if stepping is not None:  # as if the others' records had not changed: the next sync sees them
            snapshot = np.where(stepping, snapshot, self.seen)
            snapshot_bytes = snapshot.tobytes()
        touched = np.zeros(len(self._env_ids), dtype=np.bool_)
        refreshed_by = self._targets.refreshed_by
        general = self.specs
        if self._scalars is not None:
            general = self._sync_scalars(snapshot, touched)
        if general:  # the rows that changed, for the parameters the scalar columns do not cover
            rows = np.flatnonzero(snapshot.view(self._record) != self.seen.view(self._record))
            if not len(rows):  # none (a partial step's envs, when only the others' records changed)
                general = []
        for spec in general:
            new, old = snapshot[spec.name][rows], self.seen[spec.name][rows]
            differs = (new.reshape(len(rows), -1).view(np.uint8) != old.reshape(len(rows), -1).view(np.uint8)).any(
                axis=1
            )
            if not differs.any():
                continue
            candidates, values = rows[differs], new[differs]
            refused = bad_rows(spec, values)
            if refused.any():
                for local, value in zip(candidates[refused], values[refused]):
                    self._refuse(spec, int(local), value)
                candidates, values = candidates[~refused], values[~refused]
            self.good[spec.name][candidates] = values
            if spec.when == "step" and not spec.dist:
                self._apply(spec, candidates, values)
                if spec.index in refreshed_by:
                    touched[candidates] = True
        if touched.any():
            self._targets.refresh(None if touched.all() else np.flatnonzero(touched))
        self.seen, self.seen_bytes = snapshot, snapshot_bytes

    def _sync_scalars(self, snapshot: np.ndarray, touched: np.ndarray) -> list[ParamSpec]:
        """The same as the general path for plain float64 scalars, as whole-slot 2-D array operations
        (the case of a curriculum rewriting several values every step). Returns the other specs."""
        columns = self._scalars
        assert columns is not None
        refreshed_by = self._targets.refreshed_by
        old, new = columns.snapshot_matrix(self.seen), columns.snapshot_matrix(snapshot)
        changed = new.view(np.int64) != old.view(np.int64)  # bitwise, so NaN -> NaN is no change
        if changed.all() and columns.within(new):  # every value rewritten, all good: a few calls in all
            columns.good[:, columns.columns] = new
            if columns.step_specs:
                values = new if len(columns.step_specs) == len(columns.specs) else new[:, columns.step]
                self._targets.write_every_row(columns.step_specs, values)
                columns.publish(values)
            if columns.step_indices & refreshed_by:
                self._targets.refresh()
            return columns.others
        if not changed.any():
            return columns.others
        valid = (new >= columns.low) & (new <= columns.high)  # NaN fails both
        if columns.needs_finite:
            valid &= np.isfinite(new)
        accepted = changed & valid
        if not valid.all():
            for local, column in zip(*np.nonzero(changed & ~valid)):
                spec = columns.specs[column]
                self._refuse(spec, int(local), snapshot[spec.name][local])
        columns.good[:, columns.columns] = np.where(accepted, new, columns.good[:, columns.columns])
        every = accepted.all(axis=0)
        for column in np.nonzero(accepted.any(axis=0) & columns.step)[0]:
            spec = columns.specs[column]
            if every[column]:
                self._apply_all(spec, new[:, column])
                rows: Any = slice(None)
            else:
                rows = np.nonzero(accepted[:, column])[0]
                self._apply(spec, rows, new[rows, column])
            if spec.index in refreshed_by:
                touched[rows] = True
        return columns.others

    def before_step(self, resetting: list[bool], lengths: list[int]) -> None:
        """Draws and applies the ``when="step"`` randomized values of the envs about to step.

        ``resetting[i]``: env ``i`` resets instead of stepping now (it draws at its reset);
        ``lengths[i]``: the steps env ``i`` has taken in its episode.
        """
        if not self._step_draws:
            return
        stepping = np.flatnonzero(~np.asarray(resetting, dtype=np.bool_))
        if not len(stepping):
            return
        steps = np.asarray(lengths)[stepping] + 1
        drawn, uniforms = self._step_draws, self._step_uniforms
        assert uniforms is not None
        grid = uniforms.take(stepping, self._episodes[stepping], steps)
        values = values_from(drawn, self._arguments(drawn, stepping), grid)
        for spec, value in zip(drawn, values):
            self._apply(spec, stepping, value)
        self._targets.refresh(stepping)

    def resample(self, names: list[str], rows: np.ndarray, lengths: list[int]) -> None:
        """Draws and applies new values of the named ``dist`` parameters for the envs at ``rows``
        now, keyed by each env's step in its episode (so a run stays reproducible); a ``reset``
        parameter from the arguments its episode began with."""
        by_name = {spec.name: spec for spec in self.specs}
        for name in names:
            spec = by_name.get(name)
            if spec is None or not spec.dist:
                raise KeyError(
                    f"{name!r} is not a dist parameter of this pool; those are {[s.name for s in self.specs if s.dist]}"
                )
            steps = np.asarray(lengths)[rows] + 1
            episodes, arguments = self._episodes[rows], self._arguments([spec], rows)
            (values,) = draws([spec], arguments, self._seed, self._env_ids[rows], episodes, steps)
            self._apply(spec, rows, values)
        self._targets.refresh(rows)

    def _refuse(self, spec: ParamSpec, local: int, value: Any) -> None:
        env_id = int(self._env_ids[local])
        message = (
            f"{self._label}: params[{spec.name!r}][{env_id}] = {show(value)} rejected: {problem(spec, value)}; "
            f"env {env_id} keeps {show(self.good[spec.name][local])}"
        )
        self._refusal_text[spec.index] = message.encode()[: self._refusal_text.dtype.itemsize]
        self._refusals[spec.index] += 1
        self._control[CTL_PARAM_REFUSALS] += 1  # published after the text and the count


class _ScalarColumns:
    """Where a record made only of float64 values keeps its plain scalar parameters, as columns of
    an ``(envs, values)`` matrix view, and where ``applied`` keeps the same parameters."""

    def __init__(
        self,
        specs: list[ParamSpec],
        others: list[ParamSpec],
        offsets: list[int],
        width: int,
        good: np.ndarray,
        applied: np.ndarray,
    ) -> None:
        self.specs = specs
        self.others = others
        self.columns = _columns(offsets)
        self.width = width
        self.good = good.view(np.float64).reshape(len(good), width)  # the applier's accepted values
        self._snapshot: tuple[np.ndarray | None, np.ndarray] = (None, self.good)
        self.low = np.array([s.low.item() for s in specs])
        self.high = np.array([s.high.item() for s in specs])
        self._bounds = list(zip(self.low.tolist(), self.high.tolist()))
        self.needs_finite = bool(np.isinf(self.low).any() or np.isinf(self.high).any())
        self.step = np.array([s.when == "step" for s in specs])
        self.step_specs = [s for s in specs if s.when == "step"]
        self.step_indices = {s.index for s in self.step_specs}
        # ``applied`` as an (envs, words) float64 matrix, when its records are made of float64 values.
        fields = [applied.dtype.fields[s.name] for s in self.step_specs]  # type: ignore[index]
        plain = applied.dtype.itemsize % 8 == 0 and all(d == np.float64 and o % 8 == 0 for d, o, *_ in fields)
        self._applied = applied
        self._applied_columns = _columns([o // 8 for _, o, *_ in fields]) if plain else None
        if plain:
            self._applied_matrix = applied.view(np.float64).reshape(len(applied), applied.dtype.itemsize // 8)

    @classmethod
    def find(
        cls, specs: list[ParamSpec], record: np.dtype[Any], good: np.ndarray, applied: np.ndarray
    ) -> _ScalarColumns | None:
        """The columns, or None when the record holds anything but float64 values."""
        leaves = [record.fields[s.name][0] for s in specs]  # type: ignore[index]
        if any(
            leaf.fields is not None
            and any(sub.base != np.float64 for sub, *_ in leaf.fields.values())
            or leaf.fields is None
            and leaf.base != np.float64
            for leaf in leaves
        ):
            return None
        if record.itemsize % 8:
            return None
        scalar = [s for s in specs if not s.dist and not s.shape]
        if not scalar:
            return None
        offsets = [record.fields[s.name][1] // 8 for s in scalar]  # type: ignore[index]
        return cls(scalar, [s for s in specs if s not in scalar], offsets, record.itemsize // 8, good, applied)

    def snapshot_matrix(self, snapshot: np.ndarray) -> np.ndarray:
        """The scalar columns of a snapshot of the block (never changed once taken) as an ``(envs,
        len(specs))`` float64 array, made once: a sync's new snapshot is the next sync's last one."""
        cached, matrix = self._snapshot
        if cached is not snapshot:
            matrix = snapshot.view(np.float64).reshape(len(snapshot), self.width)[:, self.columns]
            self._snapshot = (snapshot, matrix)
        return matrix

    def forget_snapshot(self) -> None:
        """Drops the matrix ``snapshot_matrix`` made last, whose snapshot was changed in place."""
        self._snapshot = (None, self.good)

    def within(self, matrix: np.ndarray) -> bool:
        """Whether every value of ``matrix`` is finite (where a bound is infinite) and within its
        column's bounds: one min and one max per column."""
        smallest, largest = matrix.min(axis=0).tolist(), matrix.max(axis=0).tolist()
        for (low, high), small, large in zip(self._bounds, smallest, largest):
            if not low <= small <= large <= high:  # NaN fails every comparison
                return False
            if self.needs_finite and not (math.isfinite(small) and math.isfinite(large)):
                return False
        return True

    def publish(self, values: np.ndarray) -> None:
        """Writes the ``step`` columns ``values`` (every env) into the ``applied`` records."""
        if self._applied_columns is not None:
            self._applied_matrix[:, self._applied_columns] = values
            return
        for column, spec in enumerate(self.step_specs):
            self._applied[spec.name][:] = values[:, column]


def _columns(indices: list[int]) -> slice | np.ndarray:
    """What picks the columns ``indices`` of a matrix: a slice when they are adjacent and in order
    (the common record, all of whose fields are scalars), for a view and plain copies instead of
    fancy indexing, which a curriculum's per-step sync feels; else an index array."""
    first = indices[0] if indices else 0
    if indices == list(range(first, first + len(indices))):
        return slice(first, first + len(indices))
    return np.array(indices, dtype=np.int64)
