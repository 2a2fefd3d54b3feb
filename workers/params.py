"""Applying the params block to a worker's envs: read it consistently, validate what changed, apply
each parameter when its ``when`` says, draw randomized ones, and publish what each env uses."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from shmpool.adapters import adapter_for
from shmpool.bindings import Binding, plain_values
from shmpool.draws import derive_seed, draw
from shmpool.layout import CTL_PARAM_REFUSALS
from shmpool.params import ParamSpec, bad_rows, problem, show
from shmpool.protocol import seqlock_read


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
        count = stop - start
        self._specs = specs
        self._seed = seed
        self._label = env_label
        self._env_ids = np.arange(start, stop)
        self._all_rows = np.arange(count)
        self._block = views["params"][start:stop]
        self._seq = views["params_seq"][start:stop]
        self._applied = views["applied"][start:stop]
        self._episodes = views["episode_index"][start:stop]
        self._refusals = views["param_refusals"][worker_id]
        self._refusal_text = views["param_refusal_text"][worker_id]
        self._control = control
        self._record = np.dtype((np.void, self._block.dtype.itemsize))
        self._seen = self._block.copy()  # what a row that never reads whole falls back to at first
        self._seen = self._read()
        self._seen_bytes = self._seen.tobytes()
        self._good = self._seen.copy()  # the last accepted values of every env
        self._step_values = [s for s in specs if s.when == "step" and not s.dist]
        self._step_draws = [s for s in specs if s.when == "step" and s.dist]
        self._episode_specs = [s for s in specs if s.when == "reset" or (s.when == "step" and s.dist)]
        self._rebuild = [s for s in specs if s.when == "rebuild"]
        self._bindings: dict[int, list[Binding | None]] = {
            s.index: [None] * count for s in specs if s.when != "rebuild"
        }
        self._scalars = _ScalarColumns.find(specs, self._block.dtype)
        self._attributes: dict[int, list[tuple[Any, str] | None]] = {index: [None] * count for index in self._bindings}
        self._refreshers: list[Callable[[], None] | None] = [None] * count
        #: Per parameter index: every env's (object, attribute) when all are plain attributes, else
        #: an empty list; filled on first use, emptied when an env is (re)built.
        self._plain: dict[int, list[Any]] = {}
        self._built_with: list[bytes] = [b""] * count

    @property
    def accepted(self) -> np.ndarray:
        """The slot's records as last read whole and validated (read-only): what hooks see as
        ``ctx.params``, never a half-written record."""
        view = self._good.view()
        view.flags.writeable = False
        return view

    # -- consistent reads ------------------------------------------------------------------------

    def _read(self) -> np.ndarray:
        """A copy of the slot's records in which no record is half-written (seqlock reader)."""
        return seqlock_read(self._block, self._seq, self._seen)

    # -- env lifecycle ---------------------------------------------------------------------------

    def constructor_kwargs(self, local: int) -> dict[str, Any]:
        """The ``rebuild`` parameters of env ``local`` as constructor keywords (noted as built with)."""
        self._built_with[local] = self._rebuild_key(local)
        return {s.name: plain_values(self._good[s.name][local : local + 1])[0] for s in self._rebuild}

    def _rebuild_key(self, local: int) -> bytes:
        return b"".join(self._good[s.name][local].tobytes() for s in self._rebuild)

    def attach_env(self, local: int, env: Any) -> None:
        """Resolves the bindings of a (re)built env and applies the current step values to it."""
        for spec in self._specs:
            if spec.when != "rebuild":
                binding = self._bindings[spec.index][local] = Binding(env, spec, self._label)
                self._attributes[spec.index][local] = binding.attribute
        self._plain.clear()  # the env's bindings changed: recompute which parameters are plain
        self._refreshers[local] = adapter_for(env).refresher(env)  # what the env caches from its parameters
        rows = np.array([local])
        for spec in self._step_values:
            self._apply(spec, rows, self._good[spec.name][rows])
        for spec in self._rebuild:
            self._applied[spec.name][local] = self._good[spec.name][local]
        self._refresh(rows)

    def needs_rebuild(self, local: int) -> bool:
        """Whether a ``rebuild`` parameter of env ``local`` changed since it was built."""
        return bool(self._rebuild) and self._rebuild_key(local) != self._built_with[local]

    def begin_episode(self, local: int) -> None:
        """Applies the per-episode values (``reset`` ones, fresh draws) of env ``local``, whose
        episode index has just advanced."""
        if not self._episode_specs:
            return
        rows = np.array([local])
        for spec in self._episode_specs:
            if spec.dist:
                values = draw(
                    spec, self._good[spec.name][rows], self._seed, self._env_ids[rows], self._episodes[rows], 0
                )
            else:
                values = self._good[spec.name][rows]
            self._apply(spec, rows, values)
        self._refresh(rows)

    def rebuilt_seed(self, local: int) -> int:
        """The reset seed of a rebuilt env (its fresh generator would otherwise make the run
        irreproducible), from the pool seed, its id and its episode."""
        return derive_seed(self._seed, int(self._env_ids[local]), int(self._episodes[local]))

    def _apply(self, spec: ParamSpec, rows: np.ndarray, values: np.ndarray) -> None:
        """Sets ``values`` (one per row) on the envs at local ``rows`` and publishes them."""
        bindings = self._bindings[spec.index]
        for local, value in zip(rows.tolist(), plain_values(values)):
            target = self._attributes[spec.index][local]
            if target is not None:  # the common case, a plain attribute: no call through the binding
                setattr(target[0], target[1], value)
            else:
                bindings[local].set(value)  # type: ignore[union-attr]
        self._applied[spec.name][rows] = values

    def _apply_all(self, spec: ParamSpec, values: np.ndarray) -> None:
        """:meth:`_apply` for every env of the slot: a parameter rewritten for all of them (the case of
        a curriculum or a per-step randomization) is set without per-env lookups."""
        targets = self._plain.get(spec.index)
        if targets is None:
            attributes = self._attributes[spec.index]
            targets = self._plain[spec.index] = attributes if all(a is not None for a in attributes) else []
        if not targets or values.ndim != 1:
            self._apply(spec, self._all_rows, values)
            return
        for (owner, name), value in zip(targets, values.tolist()):
            setattr(owner, name, value)
        self._applied[spec.name][:] = values

    def _refresh(self, rows: Iterable[int] | None = None) -> None:
        """Recomputes what the envs at ``rows`` (None: all) derive from their parameters."""
        refreshers = self._refreshers if rows is None else [self._refreshers[int(local)] for local in rows]
        for refresher in refreshers:
            if refresher is not None:
                refresher()

    # -- per command -----------------------------------------------------------------------------

    def changed_block(self) -> tuple[np.ndarray, bytes] | None:
        """A torn-free copy of the slot's block and its bytes if it changed since the last sync, else
        None (one bytes compare in the common case: nothing written)."""
        if self._block.tobytes() == self._seen_bytes:
            return None
        snapshot = self._read()
        snapshot_bytes = snapshot.tobytes()
        return None if snapshot_bytes == self._seen_bytes else (snapshot, snapshot_bytes)

    def sync(self) -> None:
        """Reads the block; validates what changed; applies changed ``step`` values now."""
        changed = self.changed_block()
        if changed is None:
            return
        snapshot, snapshot_bytes = changed
        touched = np.zeros(len(self._env_ids), dtype=np.bool_)
        general = self._specs
        if self._scalars is not None:
            general = self._sync_scalars(snapshot, touched)
        if general:  # the rows that changed, for the parameters the scalar columns do not cover
            rows = np.flatnonzero(snapshot.view(self._record) != self._seen.view(self._record))
        for spec in general:
            new, old = snapshot[spec.name][rows], self._seen[spec.name][rows]
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
            self._good[spec.name][candidates] = values
            if spec.when == "step" and not spec.dist:
                self._apply(spec, candidates, values)
                touched[candidates] = True
        self._refresh(None if touched.all() else np.flatnonzero(touched))
        self._seen, self._seen_bytes = snapshot, snapshot_bytes

    def _sync_scalars(self, snapshot: np.ndarray, touched: np.ndarray) -> list[ParamSpec]:
        """The same as the general path for plain float64 scalars, as whole-slot 2-D array operations
        (the case of a curriculum rewriting several values every step). Returns the other specs."""
        columns = self._scalars
        assert columns is not None
        new, old = columns.matrix(snapshot), columns.matrix(self._seen)
        changed = new.view(np.int64) != old.view(np.int64)  # bitwise, so NaN -> NaN is no change
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
            columns.store(self._good, np.where(accepted, new, columns.matrix(self._good)))
        elif changed.all():  # a writer rewrote every value of the slot: all of them are good
            columns.store(self._good, new)
        else:
            columns.store(self._good, np.where(accepted, new, columns.matrix(self._good)))
        every = accepted.all(axis=0)
        for column in np.nonzero(accepted.any(axis=0) & columns.step)[0]:
            if every[column]:
                self._apply_all(columns.specs[column], new[:, column])
                touched[:] = True
            else:
                rows = np.nonzero(accepted[:, column])[0]
                self._apply(columns.specs[column], rows, new[rows, column])
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
        episodes = self._episodes[stepping]
        steps = np.asarray(lengths)[stepping] + 1
        for spec in self._step_draws:
            values = draw(spec, self._good[spec.name][stepping], self._seed, self._env_ids[stepping], episodes, steps)
            self._apply(spec, stepping, values)
        self._refresh(stepping)

    def resample(self, names: list[str], rows: np.ndarray, lengths: list[int]) -> None:
        """Draws and applies new values of the named ``dist`` parameters for the envs at ``rows``
        now, keyed by each env's step in its episode (so a run stays reproducible)."""
        by_name = {spec.name: spec for spec in self._specs}
        for name in names:
            spec = by_name.get(name)
            if spec is None or not spec.dist:
                raise KeyError(
                    f"{name!r} is not a dist parameter of this pool; those are "
                    f"{[s.name for s in self._specs if s.dist]}"
                )
            steps = np.asarray(lengths)[rows] + 1
            values = draw(
                spec, self._good[spec.name][rows], self._seed, self._env_ids[rows], self._episodes[rows], steps
            )
            self._apply(spec, rows, values)
        self._refresh(rows)

    def _refuse(self, spec: ParamSpec, local: int, value: Any) -> None:
        env_id = int(self._env_ids[local])
        message = (
            f"{self._label}: params[{spec.name!r}][{env_id}] = {show(value)} rejected: {problem(spec, value)}; "
            f"env {env_id} keeps {show(self._good[spec.name][local])}"
        )
        self._refusal_text[spec.index] = message.encode()[: self._refusal_text.dtype.itemsize]
        self._refusals[spec.index] += 1
        self._control[CTL_PARAM_REFUSALS] += 1  # published after the text and the count


class _ScalarColumns:
    """Where a record made only of float64 values keeps its plain scalar parameters, as columns of
    an ``(envs, values)`` matrix view."""

    def __init__(self, specs: list[ParamSpec], others: list[ParamSpec], offsets: list[int], width: int) -> None:
        self.specs = specs
        self.others = others
        self.columns = np.array(offsets)
        self.width = width
        self.low = np.array([s.low.item() for s in specs])
        self.high = np.array([s.high.item() for s in specs])
        self.needs_finite = bool(np.isinf(self.low).any() or np.isinf(self.high).any())
        self.step = np.array([s.when == "step" for s in specs])

    @classmethod
    def find(cls, specs: list[ParamSpec], record: np.dtype[Any]) -> _ScalarColumns | None:
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
        return cls(scalar, [s for s in specs if s not in scalar], offsets, record.itemsize // 8)

    def matrix(self, records: np.ndarray) -> np.ndarray:
        """A copy of the scalar columns of ``records``: an ``(envs, len(specs))`` float64 array."""
        return records.view(np.float64).reshape(len(records), self.width)[:, self.columns]

    def store(self, records: np.ndarray, matrix: np.ndarray) -> None:
        """Writes a matrix of scalar columns back into ``records``."""
        records.view(np.float64).reshape(len(records), self.width)[:, self.columns] = matrix
