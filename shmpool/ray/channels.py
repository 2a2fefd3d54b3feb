"""The channels of a cluster pool that the trainer's ``ClusterPool`` and an attached
``ClusterHandle`` share (``params``, ``applied``, ``episodes``, ``events``, ``stats``,
``state_dict``): each a thin layer over the nodes' own, with global env ids."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from shmpool.errors import ClusterNodeError, EventQueueFullError
from shmpool.options import deadline_after
from shmpool.param_block import env_rows
from shmpool.params import ParamSpec

from .fleet import ClusterStats, NodeInfo, _Fleet
from .params import ClusterParams

if TYPE_CHECKING:
    from typing_extensions import Self

#: Bumped when the shape of a cluster pool's ``state_dict()`` changes.
CLUSTER_STATE_VERSION = 1
#: Seconds between two tries of an event whose ring was full: the node steps meanwhile.
EVENT_RETRY = 0.005


class ClusterEpisodes:
    """Finished-episode records of every node since this reader's last ``read()``: each node's
    records with ``env_id`` made global and a ``node`` field added."""

    def __init__(self, fleet: _Fleet, reader: str, dtype: np.dtype[Any], check: Callable[[], None]) -> None:
        self._fleet = fleet
        self._reader = reader
        self._check = check
        fields: Mapping[str, Any] = dtype.fields or {}
        self.dtype: np.dtype[Any] = np.dtype(
            [(name, fields[name][0]) for name in dtype.names or ()] + [("node", "<i8")]
        )
        self._lost = [0] * len(fleet.nodes)

    @property
    def lost(self) -> int:
        """Records this reader never saw because it fell more than a ring behind, all nodes together."""
        return sum(self._lost)

    def read(self) -> np.ndarray:
        """The new records of every node, ordered by the step they ended at, then global env id.

        Raises:
            ClusterNodeError: naming the node, once a node has failed, as ``applied`` and ``params.write`` do: records
                from only part of the fleet would read as a fleet whose other envs finished no episode. A node known
                to have failed raises before any node is read; one that fails during the read leaves the records that
                the other nodes handed over (their cursors moved on) on the error's ``records``, never dropped.
        """
        self._check()
        fleet = self._fleet
        every = {k: (self._reader,) for k in range(len(fleet.nodes))}
        try:
            parts = fleet.call("read_episodes", every, "episodes.read")
        except ClusterNodeError as error:
            answered = getattr(error, "partial_results", None)  # None: raised before any node was read
            if answered is not None:
                error.records = self._merge(answered)
            raise
        return self._merge(parts)

    def _merge(self, parts: Mapping[int, tuple[np.ndarray, int]]) -> np.ndarray:
        """Each node's ``(records, lost)`` as one array of this reader's dtype, in read() order."""
        fleet = self._fleet
        merged = [np.zeros(0, self.dtype)]
        for index in sorted(parts):
            records, self._lost[index] = parts[index]
            chunk = np.zeros(len(records), self.dtype)
            for name in records.dtype.names or ():
                chunk[name] = records[name]
            chunk["env_id"] += fleet.starts[index]
            chunk["node"] = index
            merged.append(chunk)
        records = np.concatenate(merged)
        return records[np.lexsort((records["env_id"], records["step"]))]


class ClusterEvents:
    """Sends one-shot events to the hooks of the nodes that hold the envs: ``send(hook, env_ids,
    payload)`` as a local pool's ``events.send``, with global env ids."""

    def __init__(self, fleet: _Fleet, label: str, check: Callable[[], None]) -> None:
        self._fleet = fleet
        self._label = label
        self._check = check
        self.hook_names = list(fleet.hook_names)

    def send(
        self,
        hook: str,
        env_ids: int | Sequence[int] | slice | np.ndarray | None,
        payload: Any = None,
        *,
        at_step: int | None = None,
        wait: float | None = 0.0,
    ) -> None:
        """Queues a one-shot event for ``hook`` (its name) concerning the global ``env_ids`` (ids, a slice, or None:
        every env) on each node that holds some of them.

        Each node delivers it once, in send order, at its next step, or when its pool's global step reaches ``at_step``
        (with ``step()`` every node's is the cluster pool's ``global_step``; with ``send()`` each node counts its own
        steps). When a node's ring is full, waits up to ``wait`` seconds (0: not at all; None: as long as it takes)
        while that node steps, then raises ``EventQueueFullError``; nodes that had room keep their event.

        Examples:
            >>> cluster.events.send("Perturb", [0, 5], [0.5])  # envs 0 and 5, wherever they run
        """
        self._check()
        if hook not in self.hook_names:
            raise KeyError(f"no hook named {hook!r}; the pool's hooks are {self.hook_names}")
        fleet = self._fleet
        if env_ids is None:
            pending: dict[int, tuple[Any, ...]] = {
                index: (hook, None, payload, at_step) for index in range(len(fleet.nodes))
            }
        else:
            ids = np.unique(env_rows(env_ids, fleet.num_envs))
            if not ids.size:  # as a local pool: an event for no env is a mistake, not nothing to do
                raise ValueError(f"env_ids must be one or more env ids (or None for all), got {env_ids!r:.100}")
            by_node = fleet.locate(ids)
            pending = {index: (hook, local.tolist(), payload, at_step) for index, (_, local) in by_node.items()}
        deadline = deadline_after(wait, f"{self._label}: events.send")
        while pending:
            sent = fleet.call("send_event", pending, "events.send")
            pending = {index: arguments for index, arguments in pending.items() if not sent[index]}
            if pending and deadline is not None and time.monotonic() >= deadline:
                full = fleet.nodes[min(pending)]
                raise EventQueueFullError(
                    f"{self._label}: an event ring on {full} is full; send with a wait, or launch with a "
                    f"larger event_capacity"
                )
            if pending:
                time.sleep(EVENT_RETRY)


class _ClusterChannels:
    """``params``, ``applied``, ``applied_version()``, ``episodes``, ``events``, ``stats``,
    ``state_dict()`` and ``nodes``: the same on the trainer's ``ClusterPool`` and on an attached
    ``ClusterHandle``."""

    _fleet: _Fleet
    _params: ClusterParams | None
    _episodes: ClusterEpisodes
    _events: ClusterEvents | None

    def _check_open(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    close: Callable[..., None]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def nodes(self) -> list[NodeInfo]:
        """The nodes, in global env id order."""
        return list(self._fleet.nodes)

    @property
    def params(self) -> ClusterParams:
        """The parameter block of every node, by global env id (see ``ClusterParams``)."""
        self._check_open()
        if self._params is None:
            raise AttributeError(f"cluster pool {self._fleet.name!r} was launched without params")
        return self._params

    @property
    def applied(self) -> np.ndarray:
        """What each env uses now, one read-only record per global env id."""
        return self.params.applied

    @property
    def param_specs(self) -> dict[str, ParamSpec]:
        """The declared parameters by name, as plain data."""
        return dict(self._params.specs) if self._params is not None else {}

    def applied_version(self) -> list[int]:
        """Per node, the newest write version (what ``params.write`` returned) that its envs run with:
        a step or reset has run on that node since the write landed. Versions come from one counter
        per cluster pool, shared by every writing process, in the order writes start; 0 before any."""
        self._check_open()
        return self._fleet.call_all("applied_version", "applied_version")

    @property
    def episodes(self) -> ClusterEpisodes:
        """Finished-episode records of every node since this reader's last ``read()``."""
        self._check_open()
        return self._episodes

    @property
    def events(self) -> ClusterEvents:
        """Sends one-shot events to the nodes' hooks, by global env id (see ``ClusterEvents``)."""
        self._check_open()
        if self._events is None:
            raise AttributeError(f"cluster pool {self._fleet.name!r} was launched without hooks, so it takes no events")
        return self._events

    @property
    def stats(self) -> ClusterStats:
        """Every node's ``PoolStats``, with totals."""
        self._check_open()
        return ClusterStats.of(self._fleet.call_all("stats", "stats"))

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint of every node's pool, as plain data: ``{"version", "num_envs", "nodes"}`` with one local pool
        state per node (see ``shmpool.checkpoints``: parameters, episode indices, the node's draw seed), in node order.

        Examples:
            >>> state = cluster.state_dict()
            >>> fresh.load_state_dict(state)  # a cluster pool launched with the same arguments
        """
        self._check_open()
        states = self._fleet.call_all("state_dict", "state_dict")
        return {"version": CLUSTER_STATE_VERSION, "num_envs": self._fleet.num_envs, "nodes": states}

    def load_state_dict(self, state: Mapping[str, Any], *, same_draws: bool = True) -> None:
        """Loads a ``state_dict`` of a cluster pool launched with the same env, ``num_envs``, number of nodes, params
        and seed: each node loads its own part (see ``shmpool.Pool.load_state_dict``), whole or not at all (if a node
        refuses its part, the nodes that had loaded theirs get their previous state back before the error is raised).

        Raises:
            ValueError: for a state that is not a cluster pool's, or one of another number of nodes or envs, or one a
                node refuses (naming the field, with the node in a note).
        """
        self._check_open()
        fleet = self._fleet
        version = state.get("version") if isinstance(state, Mapping) else type(state).__name__
        known = type(version) is int and version == CLUSTER_STATE_VERSION  # type(): True is no version
        if not isinstance(state, Mapping) or "nodes" not in state or not known:
            raise ValueError(
                f"not a cluster pool state of version {CLUSTER_STATE_VERSION} (got version {version!r:.60}); a "
                f"local pool's state loads into that pool, or into one node's: shmpool.attach(f'{fleet.name}-{{node}}')"
            )
        states = list(state["nodes"])
        if len(states) != len(fleet.nodes) or state.get("num_envs") != fleet.num_envs:
            raise ValueError(
                f"cannot load this state into cluster pool {fleet.name!r}: it was saved from {len(states)} node(s) "
                f"and num_envs={state.get('num_envs')!r}, this one has {len(fleet.nodes)} node(s) and "
                f"num_envs={fleet.num_envs}; launch with the same num_envs and nodes"
            )
        before = fleet.call_all("state_dict", "load_state_dict")
        every = {index: (part, same_draws) for index, part in enumerate(states)}
        try:
            fleet.call("load_state_dict", every, "load_state_dict")
        except Exception as error:
            loaded = getattr(error, "partial_results", None) or {}
            if loaded:  # the state they had, which loaded there before
                fleet.call("load_state_dict", {index: (before[index], False) for index in loaded}, "load_state_dict")
            raise

    def _channels(self, description: dict[str, Any], reader: str) -> None:
        fleet = self._fleet
        specs = [ParamSpec.from_json(index, data) for index, data in enumerate(description["params"])]
        label = self._label = f"{description['env']} (cluster pool {fleet.name!r})"
        self._params = (
            ClusterParams(fleet, specs, description["params_dtype"], label, self._check_open) if specs else None
        )
        self._events = ClusterEvents(fleet, label, self._check_open) if fleet.hook_names else None
        fleet.call("open_reader", {k: (reader,) for k in range(len(fleet.nodes))}, "attach")
        self._episodes = ClusterEpisodes(fleet, reader, description["episode_dtype"], self._check_open)
