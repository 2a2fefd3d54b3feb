"""The parameter block of a whole cluster pool, as the trainer and attached processes see it:
``ClusterParams`` validates a write once, in the writer, then routes each node's rows to the
host that holds them; reads are copies fetched from every node."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from shmpool.param_block import env_rows, named_specs, set_own_attribute, validate
from shmpool.params import ParamSpec, unknown_parameter

from .fleet import ClusterStats, _Fleet


class ClusterParams:
    """The parameter block of a whole cluster pool, with the local ``shmpool.ParamBlock``'s API over global env ids:
    ``write()`` (validated once, here, then routed to the nodes that hold the envs), ``applied``, ``specs``, ``names``,
    ``snapshot()`` and reads by name. Reads are read-only copies fetched from every node: the blocks live on other
    machines, so there is no writable view.
    """

    def __init__(
        self, fleet: _Fleet, specs: list[ParamSpec], dtype: np.dtype[Any], label: str, check: Callable[[], None]
    ) -> None:
        self._fleet = fleet
        self.specs = {spec.name: spec for spec in specs}
        self._dtype = dtype
        self._label = label
        self._check = check

    @property
    def names(self) -> list[str]:
        """The declared parameters, in declaration order."""
        return list(self.specs)

    def __setattr__(self, name: str, value: Any) -> None:
        set_own_attribute(self, name, value, "params.write(env_ids, {name}=values)")

    def __len__(self) -> int:
        return self._fleet.num_envs

    def __repr__(self) -> str:
        return f"ClusterParams({self.names}, num_envs={len(self)}, nodes={len(self._fleet.nodes)})"

    def snapshot(self) -> np.ndarray:
        """Every env's record (global env id order), each node's taken under its writers' lock."""
        self._check()
        parts = self._fleet.call_all("params_snapshot", "params read")
        return read_only(np.concatenate(parts))

    @property
    def dtype(self) -> np.dtype[Any]:
        """The record type: one field per parameter (a sub-record for a distribution)."""
        return self._dtype

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.specs:
            raise unknown_parameter(name, self.names)
        return self.snapshot()[name]

    def __setitem__(self, name: str, value: Any) -> None:
        raise TypeError(f"a cluster pool's params live on its nodes: write them with params.write(env_ids, {name}=...)")

    @property
    def applied(self) -> np.ndarray:
        """What each env uses now (global env id order): a read-only copy fetched from every node."""
        return self.applied_with_versions()[0]

    def applied_with_versions(self) -> tuple[np.ndarray, list[int]]:
        """``applied`` and, per node, the newest write version its envs run with, read together."""
        self._check()
        parts = self._fleet.call_all("applied", "applied read")
        return read_only(np.concatenate([part[0] for part in parts])), [part[1] for part in parts]

    @property
    def accepted(self) -> np.ndarray:
        """Each env's record as its worker last accepted it (global env id order), fetched from every node."""
        self._check()
        return read_only(np.concatenate(self._fleet.call_all("params_accepted", "params read")))

    @property
    def refusals(self) -> dict[str, int]:
        """How many raw writes each parameter's workers refused so far, all nodes together."""
        self._check()
        return ClusterStats.of(self._fleet.call_all("stats", "stats")).refusals

    def write(self, env_ids: int | Sequence[int] | slice | np.ndarray | None, **values: Any) -> int:
        """Validates ``values`` once, then writes each node's rows into its block (atomically per env, as
        ``ParamBlock.write``); returns the write's version (see ``ClusterPool.applied_version``; for a write of no
        env, which takes none, the newest version taken, as ``ParamBlock.write`` returns).

        ``env_ids`` are global: an env id, a sequence or array of them, a slice, or None for every env. A
        distribution's arguments are given as a dict, e.g. ``length={"low": 0.4, "high": 0.6}``. The envs run with the
        values from their next step (``when="step"``) or reset.

        Raises:
            ValueError: naming the parameter, the global env id and the value; nothing is written then.
            KeyError: for a parameter the pool does not declare.
            ClusterNodeError: naming the node, if a node that holds some of ``env_ids`` failed (before anything is
                written when it was known to have failed; the other nodes' rows are written when it fails during it).
        """
        self._check()
        fleet = self._fleet
        ids = np.arange(fleet.num_envs) if env_ids is None else env_rows(env_ids, fleet.num_envs)
        specs = named_specs(self.specs, values)
        if not len(ids):  # no env (an empty list or slice): nothing to write, the current version
            return fleet.current_version()
        unique, reversed_first = np.unique(ids[::-1], return_index=True)
        last = len(ids) - 1 - reversed_first  # each env's row of the values: its last, as ParamBlock.write
        by_node = fleet.locate(unique)
        fleet.check_nodes(list(by_node), "params.write")
        # A dict that leaves some of a distribution's arguments out keeps the block's values for them:
        # those are needed to validate the write as a whole (each node checks again under its lock).
        partial = any(
            spec.dist and isinstance(values[spec.name], Mapping) and set(spec.arguments) - set(values[spec.name])
            for spec in specs
        )
        current = self.snapshot()[ids] if partial else None
        staged = {spec.name: self._stage(spec, ids, values[spec.name], current) for spec in specs}
        version = fleet.next_version()
        arguments = {}
        for index, (places, local) in by_node.items():
            rows = last[places]
            every = env_ids is None or len(local) == len(fleet.nodes[index].env_ids)
            part = {name: _rows_of(value, rows) for name, value in staged.items()}
            arguments[index] = (version, None if every else local, part)
        fleet.call("write", arguments, "params.write")
        return version

    def _stage(self, spec: ParamSpec, ids: np.ndarray, value: Any, current: np.ndarray | None) -> Any:
        """The validated rows of one parameter: the rule of ``ParamBlock.write``, so a node refuses
        what passes here only if another writer changed its block meanwhile."""
        return validate(spec, ids, value, lambda arg: current[spec.name][arg], self._label)  # type: ignore[index]


def _rows_of(value: Any, rows: np.ndarray) -> Any:
    if isinstance(value, dict):
        return {arg: np.ascontiguousarray(array[rows]) for arg, array in value.items()}
    return np.ascontiguousarray(value[rows])


def read_only(array: np.ndarray) -> np.ndarray:
    """``array``, made read-only: a copy fetched from the nodes, which writing to would not change."""
    array.flags.writeable = False
    return array
