"""Applying the params block to a worker's envs: read it consistently, validate what changed, apply
each parameter when its ``when`` says, draw randomized ones, and publish what each env uses."""

from __future__ import annotations

import keyword
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from shmpool.bindings import Binding, plain_values
from shmpool.draws import derive_seed, draw
from shmpool.env_families import adapter_for
from shmpool.layout import CTL_PARAM_REFUSALS
from shmpool.params import ParamSpec, bad_rows, problem, show
from shmpool.protocol import W_PARAMS_GENERATION, seqlock_read


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
        self._writers = views["writers"]
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
        self._scalars = _ScalarColumns.find(specs, self._block.dtype, self._good, self._applied)
        self._attributes: dict[int, list[tuple[Any, str] | None]] = {index: [None] * count for index in self._bindings}
        self._refreshers: list[Callable[[], None] | None] = [None] * count
        self._adapters: list[tuple[Any, Any] | None] = [None] * count  # (adapter, env) of each env
        #: Refreshes every env of the slot at once (an adapter's ``refresher_of_many``), or None when
        #: their own refreshers are called one by one; False: not looked for since an env was attached.
        self._refresh_every: Callable[[], None] | None | bool = False
        #: The indices of the parameters whose change some env must refresh after (its adapter derives
        #: values from them); grows as envs are attached.
        self._refreshed_by: set[int] = set()
        #: Per parameter index: every env's (object, attribute) when all are plain attributes, else
        #: an empty list; filled on first use, emptied when an env is (re)built.
        self._plain: dict[int, list[Any]] = {}
        #: Sets the scalar ``step`` parameters of every env in one loop, or None when one is not a
        #: plain attribute of its env (``_attribute_setter``); made on first use, like ``_plain``.
        self._every_row_setter: tuple[Callable[[list[Any], np.ndarray], None], list[Any]] | None = None
        self._built_with: list[bytes] = [b""] * count

    @property
    def accepted(self) -> np.ndarray:
        """The slot's records as last read whole and validated (read-only): what hooks see as
        ``ctx.params``, never a half-written record."""
        view = self._good.view()
        view.flags.writeable = False
        return view

    @property
    def per_episode(self) -> bool:
        """Whether some parameter is applied or drawn at each env's reset, or rebuilds the env."""
        return bool(self._episode_specs or self._rebuild)

    # -- consistent reads ------------------------------------------------------------------------

    def _read(self) -> np.ndarray:
        """A copy of the slot's records in which no record is half-written (seqlock reader)."""
        return seqlock_read(self._block, self._seq, self._seen, self._writers)

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
        self._every_row_setter = None
        adapter = adapter_for(env)
        refresher = self._refreshers[local] = adapter.refresher(env)  # what the env caches from its parameters
        self._adapters[local], self._refresh_every = (adapter, env), False
        if refresher is not None:
            self._refreshed_by.update(self._inputs_of(adapter, env, local))
        self._apply_current(local)

    def _apply_current(self, local: int) -> None:
        """Applies the current step values to (re)built env ``local``, publishes its rebuild values,
        and refreshes what it caches from them."""
        rows = np.array([local])
        for spec in self._step_values:
            self._apply(spec, rows, self._good[spec.name][rows])
        for spec in self._rebuild:
            self._applied[spec.name][local] = self._good[spec.name][local]
        self._refresh(rows)

    def _inputs_of(self, adapter: Any, env: Any, local: int) -> list[int]:
        """The parameters whose change the refresher of env ``local`` must follow: those bound to one
        of its adapter's ``refresh_inputs``, or to anything it cannot see (a path, a setter)."""
        inputs, unwrapped = adapter.refresh_inputs, env.unwrapped
        found = []
        for spec in self._specs:
            if spec.when == "rebuild" or spec.bind is False:
                continue
            attribute = self._attributes[spec.index][local]
            if inputs is None or attribute is None or attribute[0] is not unwrapped or attribute[1] in inputs:
                found.append(spec.index)
        return found

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
        """``_apply`` for every env of the slot: a parameter rewritten for all of them (the case of
        a curriculum or a per-step randomization) is set without per-env lookups."""
        targets = self._plain_targets(spec)
        if not targets or values.ndim != 1:
            self._apply(spec, self._all_rows, values)
            return
        for (owner, name), value in zip(targets, values.tolist()):
            setattr(owner, name, value)
        self._applied[spec.name][:] = values

    def _refresh(self, rows: Iterable[int] | None = None) -> None:
        """Recomputes what the envs at ``rows`` (None: all) derive from their parameters."""
        if rows is None:
            if self._refresh_every is False:
                self._refresh_every = self._refresher_of_every_env()
            if callable(self._refresh_every):
                self._refresh_every()
                return
        refreshers = self._refreshers if rows is None else [self._refreshers[int(local)] for local in rows]
        for refresher in refreshers:
            if refresher is not None:
                refresher()

    def _refresher_of_every_env(self) -> Callable[[], None] | None:
        """One refresher of the whole slot, when its envs all have one from the same adapter."""
        attached = [pair for pair in self._adapters if pair is not None]
        if len(attached) != len(self._adapters) or None in self._refreshers:
            return None
        adapter = attached[0][0]
        if any(other is not adapter for other, _ in attached):
            return None
        refresh: Callable[[], None] | None = adapter.refresher_of_many([env for _, env in attached])
        return refresh

    # -- per command -----------------------------------------------------------------------------

    def changed_block(self) -> tuple[np.ndarray, bytes] | None:
        """A torn-free copy of the slot's block and its bytes if it changed since the last sync, else
        None (one bytes compare in the common case: nothing written)."""
        words = self._writers
        generation = words[W_PARAMS_GENERATION]
        raw = self._block.tobytes()
        if raw == self._seen_bytes:
            return None
        if generation == words[W_PARAMS_GENERATION] and not generation & 1:  # no write() meanwhile: whole
            return np.frombuffer(bytearray(raw), self._block.dtype), raw
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
                if spec.index in self._refreshed_by:
                    touched[candidates] = True
        if touched.any():
            self._refresh(None if touched.all() else np.flatnonzero(touched))
        self._seen, self._seen_bytes = snapshot, snapshot_bytes

    def _sync_scalars(self, snapshot: np.ndarray, touched: np.ndarray) -> list[ParamSpec]:
        """The same as the general path for plain float64 scalars, as whole-slot 2-D array operations
        (the case of a curriculum rewriting several values every step). Returns the other specs."""
        columns = self._scalars
        assert columns is not None
        old, new = columns.snapshot_matrix(self._seen), columns.snapshot_matrix(snapshot)
        changed = new.view(np.int64) != old.view(np.int64)  # bitwise, so NaN -> NaN is no change
        if changed.all() and columns.within(new):  # every value rewritten, all good: a few calls in all
            columns.good[:, columns.columns] = new
            self._apply_every_row(columns, new)
            if columns.step_indices & self._refreshed_by:
                self._refresh()
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
            if spec.index in self._refreshed_by:
                touched[rows] = True
        return columns.others

    def _apply_every_row(self, columns: _ScalarColumns, new: np.ndarray) -> None:
        """Applies the ``step`` columns of ``new`` (every env, every scalar) and publishes them: one
        loop of attribute stores over the slot when all of them are plain attributes."""
        step = columns.step_specs
        if not step:
            return
        values = new if len(step) == len(columns.specs) else new[:, columns.step]
        if self._every_row_setter is None:
            targets = [self._plain_targets(spec) for spec in step]
            owners = [env_targets[0][0] for env_targets in zip(*targets)] if all(targets) else []
            same_owner = owners and all(
                target[0] is owner for env_targets, owner in zip(zip(*targets), owners) for target in env_targets
            )
            names = [target[1] for target in next(zip(*targets))] if same_owner else []
            uniform = same_owner and all([t[1] for t in env_targets] == names for env_targets in zip(*targets))
            setter = _attribute_setter(names) if uniform else None
            self._every_row_setter = (setter, owners) if setter is not None else (self._set_each, [])
        setter, owners = self._every_row_setter
        setter(owners, values)
        columns.publish(values)

    def _set_each(self, _owners: list[Any], values: np.ndarray) -> None:
        """The general case of ``_apply_every_row``: parameter by parameter."""
        assert self._scalars is not None
        for column, spec in enumerate(self._scalars.step_specs):
            self._apply_all(spec, values[:, column])

    def _plain_targets(self, spec: ParamSpec) -> list[Any]:
        """Every env's ``(object, attribute)`` of ``spec`` when all are plain attributes, else []."""
        targets = self._plain.get(spec.index)
        if targets is None:
            attributes = self._attributes[spec.index]
            targets = self._plain[spec.index] = attributes if all(a is not None for a in attributes) else []
        return targets

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

    def matrix(self, records: np.ndarray) -> np.ndarray:
        """The scalar columns of ``records`` (a view when they are adjacent, else a copy: callers do
        not write to it): an ``(envs, len(specs))`` float64 array."""
        return records.view(np.float64).reshape(len(records), self.width)[:, self.columns]

    def snapshot_matrix(self, snapshot: np.ndarray) -> np.ndarray:
        """``matrix`` of a snapshot of the block (never changed once taken), made once: a sync's
        new snapshot is the next sync's last one."""
        cached, matrix = self._snapshot
        if cached is not snapshot:
            matrix = self.matrix(snapshot)
            self._snapshot = (snapshot, matrix)
        return matrix

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


def _attribute_setter(names: list[str]) -> Callable[[list[Any], np.ndarray], None] | None:
    """A function ``set(owners, values)`` doing ``owners[i].<names[j]> = values[i, j]`` (as a Python
    float) for every ``i`` and ``j``, compiled for ``names`` (None if one is not an identifier): a
    store statement per name costs a fifth of ``setattr`` with the name looked up per value, which
    was most of a curriculum's per-step cost in the workers."""
    if not all(name.isidentifier() and not keyword.iskeyword(name) for name in names):
        return None
    values = ", ".join(f"v{j}" for j in range(len(names))) + ","
    stores = "".join(f"\n        owner.{name} = v{j}" for j, name in enumerate(names))
    namespace: dict[str, Any] = {}
    exec(f"def set(owners, rows):\n    for owner, ({values}) in zip(owners, rows.tolist()):{stores}", namespace)  # noqa: S102
    return namespace["set"]  # type: ignore[no-any-return]
