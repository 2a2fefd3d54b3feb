"""Where a worker's accepted parameter values land (see ``shmpool.workers.param_applier``): the
interface every engine's targets follow, and the Python engine's, each env's attributes."""

from __future__ import annotations

import keyword
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

import numpy as np

from shmpool.bindings import Binding, plain_values, refresher_follows
from shmpool.env_families import adapter_for
from shmpool.params import ParamSpec

if TYPE_CHECKING:
    from shmpool.workers.param_applier import ParamApplier


class Targets:
    """Where one engine's accepted values land, and what it recomputes after them. ``rows`` are
    local rows of the slot; ``values`` one per row (``write_every_row``: a column per spec)."""

    #: The indices of the parameters whose change some row must ``refresh`` after.
    refreshed_by: AbstractSet[int] = frozenset()

    def attach(self, local: int, env: Any) -> None:
        """Notes a (re)built env at row ``local``."""

    def write(self, spec: ParamSpec, rows: np.ndarray, values: np.ndarray) -> None:
        """Lands ``spec``'s ``values`` at ``rows``."""
        raise NotImplementedError

    def write_all(self, spec: ParamSpec, values: np.ndarray) -> None:
        """``write`` for every row (a curriculum's or a per-step randomization's case)."""
        raise NotImplementedError

    def write_every_row(self, specs: list[ParamSpec], values: np.ndarray) -> None:
        """Lands ``values[:, j]`` of ``specs[j]`` for every row and spec."""
        for column, spec in enumerate(specs):
            self.write_all(spec, values[:, column])

    def refresh(self, rows: Iterable[int] | None = None) -> None:
        """Recomputes what the rows (None: all) derive from their parameters."""

    def compiled_sync(self, applier: ParamApplier) -> Callable[[], int] | None:
        """``sync`` as one compiled call for this engine, if it has one (see ``ParamApplier.sync``)."""
        return None


class EnvTargets(Targets):
    """The Python engine's targets: each env's bound attribute, or its binding's setter; what an
    env caches from its parameters is recomputed by its family adapter's refresher."""

    def __init__(self, specs: list[ParamSpec], count: int, env_label: str) -> None:
        self._specs = specs
        self._label = env_label
        self._all_rows = np.arange(count)
        bound = [s.index for s in specs if s.when != "rebuild"]
        self._bindings: dict[int, list[Binding | None]] = {index: [None] * count for index in bound}
        self._attributes: dict[int, list[tuple[Any, str] | None]] = {index: [None] * count for index in bound}
        self._refreshers: list[Callable[[], None] | None] = [None] * count
        self._adapters: list[tuple[Any, Any] | None] = [None] * count  # (adapter, env) of each env
        #: Refreshes every env of the slot at once (an adapter's ``refresher_of_many``), or None when
        #: their own refreshers are called one by one; False: not looked for since an env was attached.
        self._refresh_every: Callable[[], None] | None | bool = False
        self.refreshed_by: set[int] = set()  # grows as envs are attached
        #: Per parameter index: every env's (object, attribute) when all are plain attributes, else
        #: an empty list; filled on first use, emptied when an env is (re)built.
        self._plain: dict[int, list[Any]] = {}
        #: The store loop of ``write_every_row`` and the objects it stores into, or None when some
        #: parameter is not a plain attribute of its env; False: not made since an env was attached.
        self._store_loop: tuple[Callable[[list[Any], np.ndarray], None], list[Any]] | None | bool = False

    def attach(self, local: int, env: Any) -> None:
        """Resolves the bindings of a (re)built env, and which of its parameters its adapter follows."""
        for spec in self._specs:
            if spec.when != "rebuild":
                binding = self._bindings[spec.index][local] = Binding(env, spec, self._label)
                self._attributes[spec.index][local] = binding.attribute
        self._plain.clear()  # the env's bindings changed: recompute which parameters are plain
        self._store_loop = False
        adapter = adapter_for(env)
        refresher = self._refreshers[local] = adapter.refresher(env)  # what the env caches from its parameters
        self._adapters[local], self._refresh_every = (adapter, env), False
        if refresher is not None:
            self.refreshed_by.update(self._inputs_of(adapter, env, local))

    def _inputs_of(self, adapter: Any, env: Any, local: int) -> list[int]:
        """The parameters whose change the refresher of env ``local`` must follow: those bound to one
        of its adapter's ``refresh_inputs``, or to anything it cannot see (a path, a setter)."""
        inputs, unwrapped = adapter.refresh_inputs, env.unwrapped
        found = []
        for spec in self._specs:
            if spec.when == "rebuild" or spec.bind is False:
                continue
            attribute = self._attributes[spec.index][local]
            if refresher_follows(None if attribute is None or attribute[0] is not unwrapped else attribute[1], inputs):
                found.append(spec.index)
        return found

    def write(self, spec: ParamSpec, rows: np.ndarray, values: np.ndarray) -> None:
        bindings = self._bindings[spec.index]
        for local, value in zip(rows.tolist(), plain_values(values)):
            target = self._attributes[spec.index][local]
            if target is not None:  # the common case, a plain attribute: no call through the binding
                setattr(target[0], target[1], value)
            else:
                bindings[local].set(value)  # type: ignore[union-attr]

    def write_all(self, spec: ParamSpec, values: np.ndarray) -> None:
        targets = self._plain_targets(spec)
        if not targets or values.ndim != 1:
            self.write(spec, self._all_rows, values)
            return
        for (owner, name), value in zip(targets, values.tolist()):
            setattr(owner, name, value)

    def write_every_row(self, specs: list[ParamSpec], values: np.ndarray) -> None:
        """One loop of attribute stores over the slot when every spec is a plain attribute of one
        object per env, with the same names; else spec by spec. Made for the first ``specs`` given:
        the applier passes the same ones (its scalar ``step`` parameters) every time."""
        if self._store_loop is False:
            self._store_loop = self._make_store_loop(specs)
        if self._store_loop is None:
            super().write_every_row(specs, values)
            return
        setter, owners = self._store_loop  # type: ignore[misc]
        setter(owners, values)

    def _make_store_loop(
        self, specs: list[ParamSpec]
    ) -> tuple[Callable[[list[Any], np.ndarray], None], list[Any]] | None:
        """``_attribute_setter`` for ``specs`` and every env's object, when each spec is a plain
        attribute of the same object of its env, under the same name in every env; else None."""
        targets = [self._plain_targets(spec) for spec in specs]
        per_env = list(zip(*targets)) if all(targets) else []  # each env's (object, attribute) per spec
        names = [name for _, name in per_env[0]] if per_env else []
        if not per_env or any(
            [name for _, name in env] != names or any(owner is not env[0][0] for owner, _ in env) for env in per_env
        ):
            return None
        setter = _attribute_setter(names)
        return None if setter is None else (setter, [env[0][0] for env in per_env])

    def _plain_targets(self, spec: ParamSpec) -> list[Any]:
        """Every env's ``(object, attribute)`` of ``spec`` when all are plain attributes, else []."""
        targets = self._plain.get(spec.index)
        if targets is None:
            attributes = self._attributes[spec.index]
            targets = self._plain[spec.index] = attributes if all(a is not None for a in attributes) else []
        return targets

    def refresh(self, rows: Iterable[int] | None = None) -> None:
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
