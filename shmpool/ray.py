"""Beyond one machine: one shmpool pool per node of a Ray cluster, one vector env and one curriculum
over all of them. Needs ``pip install "shmpool[ray]"``.

Shared memory stops at the node, so shmpool stays the fast path inside each node and Ray is the
transport between nodes. Each chosen node gets a *host actor* (hard node affinity) that owns a local
pool; the trainer's :class:`ClusterPool` sends each host its rows of the actions and concatenates
what comes back. The live parameter block never leaves its node: a write travels to the hosts as a
snapshot of the rows it changes, and episode records travel back as copies::

    trainer (the Ray driver)                    node k, one per chosen node
    ─────────────────────────                   ──────────────────────────────────────────────
    shmpool.ray.launch(env, n, name="cl") ──▶ host actor "shmpool/cl/k" ──launch──▶ pool "cl-k"
      cluster.step(actions)  ── rows of k ──▶ host.step ──▶ pool.step (n envs, shared memory)
                             ◀── results ──
      cluster.params.write() ── validated once, rows of k, version v ──▶ pool.params.write
      cluster.episodes.read() ◀── new records (env ids made global, node added) ──
    registry actor "shmpool/cl" (on the trainer's node): the nodes, and the counter of write versions

    any process of the cluster: shmpool.ray.attach("cl") ──▶ the registry, then every host

Global env ids run in node order: node k holds ``nodes[k].env_ids``. Given the same seeds and
actions, :meth:`ClusterPool.step` returns exactly what a local pool of the same total size returns
(``reset(seed=s)`` seeds global env ``i`` with ``s + i``, and ``launch(seed=s)`` does the same for
the first reset). Draws of ``dist`` parameters and hooks' random streams are each node's own
(node ``k``'s pool is seeded with ``seed + nodes[k].env_ids.start``), so they differ from a single
pool's.

Example (``ray.init()`` starts a one-node Ray on this machine; on a cluster, ``address="auto"``):

    >>> import ray
    >>> import shmpool.ray
    >>> ray.init()
    >>> with shmpool.ray.launch("CartPole-v1", 4, num_workers=1, seed=0) as cluster:
    ...     observations, infos = cluster.reset()
    ...     observations, rewards, terminations, truncations, infos = cluster.step(cluster.action_space.sample())
"""

from __future__ import annotations

import functools
import os
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from shmpool.errors import PoolClosedError, PoolExistsError, PoolNotFoundError, ShmpoolError
from shmpool.param_block import env_rows, named_specs, validate
from shmpool.params import ParamSpec
from shmpool.view import PoolStats

__all__ = [
    "ClusterEpisodes",
    "ClusterHandle",
    "ClusterNodeError",
    "ClusterParams",
    "ClusterPool",
    "ClusterStats",
    "NodeInfo",
    "attach",
    "launch",
]

#: The Ray namespace of every actor shmpool.ray creates, so that a process in any namespace finds them.
NAMESPACE = "shmpool"
#: Seconds a Ray call may take beyond the pool's own ``timeout``: the transport, and a busy node.
TRANSPORT_MARGIN = 30.0
#: Seconds a host may take to answer a bookkeeping call (``alive``, ``stats``, a version).
QUICK_CALL = 10.0
#: How long close() waits for all the hosts to close their pools when the pool's timeout is None.
CLOSE_WAIT = 60.0


class ClusterNodeError(ShmpoolError, RuntimeError):
    """A node of a Ray cluster pool failed: its host actor died (``ray.kill``, a crash, its node went
    away) or stopped answering. The message names the node. From then on every call that needs that
    node raises this error: ``step``, ``reset``, ``episodes.read()``, ``applied``, ``stats``, reads of
    ``params`` and writes to its envs; writes to the other nodes' envs still land, and their pools
    stay usable (``shmpool.attach`` on their node) until ``close()``."""

    #: From ``episodes.read()`` when a node failed during the read: what the other nodes handed over.
    records: np.ndarray | None = None

    def __init__(self, message: str, *, node: int, node_id: str = "") -> None:
        super().__init__(message)
        self.node = node
        self.node_id = node_id

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild_node_error, (self.args[0], self.node, self.node_id), {"records": self.records})


def _rebuild_node_error(message: str, node: int, node_id: str) -> ClusterNodeError:
    return ClusterNodeError(message, node=node, node_id=node_id)


@dataclass(frozen=True)
class NodeInfo:
    """One node of a cluster pool."""

    index: int  # the node's place in the cluster pool: its envs come after those of nodes 0..index-1
    node_id: str  # Ray's node id (hex)
    address: str  # the node's IP address, as Ray knows it
    hostname: str
    pool: str  # the name of the node's local pool (``shmpool.attach`` it on that node)
    env_ids: range  # the node's global env ids

    def __str__(self) -> str:
        return f"node {self.index} ({self.hostname} {self.address}, Ray node {self.node_id[:8]})"


@dataclass(frozen=True)
class ClusterStats:
    """A snapshot of every node's pool (``nodes``, one :class:`shmpool.handle.PoolStats` each), with totals."""

    nodes: list[PoolStats]
    steps_per_second: int  # env steps per second over the last second or so, all nodes together
    episodes: int  # episodes finished so far, all nodes together
    refusals: dict[str, int]  # raw parameter writes the workers refused, per parameter, all nodes together


# -- the actors -------------------------------------------------------------------------------------


class _Host:
    """The Ray actor that owns one node's pool (``ray.remote`` is applied when a cluster launches, so
    that importing this module never imports Ray). Its methods run one at a time, in the order each
    caller sent them: a write lands between two steps, never during one."""

    def __init__(self) -> None:
        self._pool: Any = None
        self._readers: dict[str, Any] = {}  # reader id -> an attached PoolHandle (its own episode cursor)
        self._written = 0  # the newest write version that landed in the block
        self._applied = 0  # the newest write version that a step or reset has run with since

    def start(self, env: Any, num_envs: int, pool_name: str, options: dict[str, Any]) -> dict[str, Any]:
        """Launches the node's pool; returns what the cluster needs to know about it."""
        import ray

        import shmpool

        # Not fork by default: this process runs Ray's gRPC threads, which a forked child inherits
        # in whatever state they were (forkserver forks from a clean server process instead).
        options = {"start_method": "forkserver", **options}
        options["worker_init"] = functools.partial(_leave_host_group, options.get("worker_init"))
        self._pool = pool = shmpool.launch(env, num_envs, name=pool_name, **options)
        params = pool.param_specs
        return {
            "pid": os.getpid(),
            "worker_pids": pool.worker_pids,
            "hostname": socket.gethostname(),
            "address": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "single_observation_space": pool.single_observation_space,
            "single_action_space": pool.single_action_space,
            "metadata": pool.metadata,
            "render_mode": pool.render_mode,
            "autoreset_mode": pool.autoreset_mode,
            "env": pool.config.env_label,
            # Plain data: a spec's ``bind`` may be a callable that only the node can import.
            "params": [spec.to_json() for spec in params.values()],
            "params_dtype": pool.params.dtype if params else None,
            "episode_dtype": pool.episodes.dtype,
            "timeout": pool.config.timeout,
        }

    def reset(self, seed: Any, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        version = self._written
        results = self._pool.reset(seed=seed, options=options)
        self._applied = version
        return results

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        version = self._written
        results = self._pool.step(actions)
        self._applied = version  # the workers read the block at the start of the step
        return results

    def write(self, version: int, env_ids: np.ndarray | None, values: dict[str, Any]) -> None:
        self._pool.params.write(env_ids, **values)
        self._written = max(self._written, version)

    def params_snapshot(self) -> np.ndarray:
        return self._pool.params.snapshot()

    def applied(self) -> tuple[np.ndarray, int]:
        return self._pool.applied.copy(), self._applied

    def applied_version(self) -> int:
        return self._applied

    def open_reader(self, reader: str) -> None:
        import shmpool

        if reader not in self._readers:
            self._readers[reader] = shmpool.attach(self._pool.name)

    def read_episodes(self, reader: str) -> tuple[np.ndarray, int]:
        episodes = self._readers[reader].episodes
        return episodes.read(), episodes.lost

    def drop_reader(self, reader: str) -> None:
        handle = self._readers.pop(reader, None)
        if handle is not None:
            handle.close()

    def stats(self) -> PoolStats:
        return self._pool.stats

    def alive(self) -> bool:
        return self._pool is not None and not self._pool.closed

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        return self._pool.call(name, *args, **kwargs)

    def set_attr(self, name: str, values: list[Any]) -> None:
        self._pool.set_attr(name, values)

    def close(self) -> None:
        for reader in list(self._readers):
            self.drop_reader(reader)
        if self._pool is not None:
            self._pool.close()


def _leave_host_group(worker_init: Callable[[], Any] | None) -> None:
    """Run first in each worker of a host's pool: moves the worker into a process group of its own,
    then runs the user's ``worker_init``."""
    # Ray kills a dead actor's whole process group (ray.kill, a crash, its node removed: Ray 2.60
    # makes each actor a group leader), and the workers start in the host's group: killed with it
    # at once, they never removed the pool's segment and doorbells, which then stayed in /dev/shm
    # wherever no sweep could reach the node (issue #24). In a group of their own they outlive the
    # host just long enough: their watchdog sees the host's pidfd close, removes only the files
    # they opened, only once the host is dead, and ends the worker within OWNER_GONE_GRACE even
    # when an env is stuck.
    try:
        os.setpgid(0, 0)
    except OSError:  # a session leader cannot: the sweep after a host's death is the fallback
        pass
    if worker_init is not None:
        worker_init()


class _Registry:
    """The Ray actor that tells attaching processes where the hosts are, and numbers the writes."""

    def __init__(self) -> None:
        self._description: dict[str, Any] | None = None
        self._version = 0
        self._closing = False

    def publish(self, description: dict[str, Any]) -> None:
        self._description = description

    def description(self) -> dict[str, Any] | None:
        return None if self._closing else self._description

    def next_version(self) -> int:
        self._version += 1
        return self._version

    def close(self) -> None:
        self._closing = True

    def closing(self) -> bool:
        return self._closing


# -- Ray, imported lazily ---------------------------------------------------------------------------


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - the extra is installed wherever the tests run
        raise ImportError('shmpool.ray needs Ray: pip install "shmpool[ray]"') from exc
    return ray


def _actor_name(name: str, index: int | None = None) -> str:
    return f"shmpool/{name}" if index is None else f"shmpool/{name}/{index}"


# -- the nodes, seen from the trainer or an attached process ------------------------------------------


class _Fleet:
    """The hosts of one cluster pool and how to call them: every Ray failure becomes an error that
    names the node, and every wait has a deadline. Shared by :class:`ClusterPool` and
    :class:`ClusterHandle`."""

    def __init__(self, name: str, registry: Any, hosts: list[Any], description: dict[str, Any], *, owner: bool) -> None:
        self.name = name
        #: The trainer's (True) or an attached process's: a host that an attached process finds gone
        #: may just mean that the owner closed the cluster pool, which is no node's failure.
        self.owner = owner
        self.registry = registry
        self.hosts = hosts
        self.nodes: list[NodeInfo] = description["nodes"]
        self.num_envs = self.nodes[-1].env_ids.stop
        self.starts = np.array([node.env_ids.start for node in self.nodes] + [self.num_envs])
        timeout = description["timeout"]
        self.wait: float | None = None if timeout is None else timeout + TRANSPORT_MARGIN
        self.failed: dict[int, tuple[str, ClusterNodeError]] = {}  # node index -> (what happened, its error)
        #: Failed nodes whose host Ray reported dead (not just unreachable): their node still runs, and
        #: may hold what the host's pool left (see _sweep).
        self.died: set[int] = set()
        self.closed = False

    def check_open(self) -> None:
        if self.closed:
            raise PoolClosedError(f"cluster pool {self.name!r} is closed")

    def check_nodes(self, indices: Sequence[int], what: str) -> None:
        """Raises, naming the node, if one of ``indices`` failed earlier."""
        self.check_open()
        for index in indices:
            if index in self.failed:
                reason, error = self.failed[index]
                raise ClusterNodeError(
                    f"{what}: {self.nodes[index]} of cluster pool {self.name!r} failed earlier ({reason}); the "
                    f"other nodes' pools stay usable until close()",
                    node=index,
                    node_id=self.nodes[index].node_id,
                ) from error

    def call(self, method: str, arguments: Mapping[int, tuple[Any, ...]], what: str) -> dict[int, Any]:
        """Calls ``method`` of the hosts named in ``arguments`` (node -> arguments) all at once and
        returns each one's result; waits for every node before raising the first failure, so that
        nothing is left in flight."""
        self.check_nodes(list(arguments), what)
        refs = {index: getattr(self.hosts[index], method).remote(*args) for index, args in arguments.items()}
        return self.gather(refs, what)

    def gather(self, refs: Mapping[int, Any], what: str) -> dict[int, Any]:
        """The results of ``refs`` (node -> Ray object ref); raises the first failure, naming its node."""
        results: dict[int, Any] = {}
        first: Exception | None = None
        deadline = None if self.wait is None else time.monotonic() + self.wait  # one for all the nodes
        for index, ref in refs.items():
            try:
                results[index] = self.result(index, ref, what, deadline)
            except Exception as error:  # re-raised below, once every node has answered
                first = first or error
        if first is not None:
            first.partial_results = results  # type: ignore[attr-defined]  # what the other nodes answered
            raise first
        return results

    def result(self, index: int, ref: Any, what: str, deadline: float | None = None) -> Any:
        """The result of one host call; raises its error with a note naming the node, or a
        :class:`ClusterNodeError` if the host is gone or did not answer in time (by ``deadline``,
        or within the pool's wait)."""
        ray = _ray()
        node = self.nodes[index]
        timeout = self.wait if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayTaskError as error:
            cause = error.cause
            if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
                # The pool's own error (WorkerError, ValueError, ...): the same type the local pool
                # raises, with the node named, and Ray's text of the remote traceback as context.
                if hasattr(cause, "add_note"):
                    cause.add_note(f"raised on {node} of cluster pool {self.name!r}, in {what}")
                raise cause from error
            raise self.fail(index, f"{what} failed in Ray", error) from error
        except ray.exceptions.GetTimeoutError as error:
            self.raise_if_closed(error)
            raise self.fail(
                index,
                f"{what} got no answer within {self.wait:.0f} s (the host is stuck, or its node is cut off)",
                error,
            ) from error
        except ray.exceptions.RayError as error:
            self.raise_if_closed(error)
            if isinstance(error, ray.exceptions.ActorDiedError):
                self.died.add(index)
            raise self.fail(index, f"its host actor died during {what} ({type(error).__name__})", error) from error

    def raise_if_closed(self, error: BaseException) -> None:
        """In an attached process: raises ``PoolClosedError`` if the owner closed the cluster pool."""
        if not self.owner and self.registry_closing():
            raise PoolClosedError(f"cluster pool {self.name!r} has closed (or its owner died)") from error

    def next_version(self) -> int:
        """A new write version, from the registry's counter (one per cluster pool)."""
        ray = _ray()
        try:
            return int(ray.get(self.registry.next_version.remote(), timeout=QUICK_CALL))
        except ray.exceptions.RayError as error:
            raise PoolClosedError(
                f"cluster pool {self.name!r} has closed: its registry actor (on the owner's node) is gone "
                f"({_first_line(error)})"
            ) from error

    def fail(self, index: int, reason: str, cause: BaseException) -> ClusterNodeError:
        """Records that node ``index`` failed; the error to raise."""
        node = self.nodes[index]
        error = ClusterNodeError(
            f"{node} of cluster pool {self.name!r}: {reason}; the other nodes' pools stay usable until "
            f"close(): {_first_line(cause)}",
            node=index,
            node_id=node.node_id,
        )
        self.failed.setdefault(index, (reason, error))
        return error

    def registry_closing(self) -> bool:
        """Whether the cluster pool's owner has closed it (or is gone with its registry)."""
        ray = _ray()
        try:
            return bool(ray.get(self.registry.closing.remote(), timeout=QUICK_CALL))
        except ray.exceptions.RayError:
            return True

    def split(self, ids: np.ndarray) -> dict[int, np.ndarray]:
        """Sorted global env ids -> {node: its local env ids}, for the nodes that hold some."""
        cuts = np.searchsorted(ids, self.starts)
        return {
            index: ids[cuts[index] : cuts[index + 1]] - self.starts[index]
            for index in range(len(self.nodes))
            if cuts[index + 1] > cuts[index]
        }


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


# -- the channels: params, applied, episodes ---------------------------------------------------------


class ClusterParams:
    """The parameter block of a whole cluster pool, with the local :class:`shmpool.ParamBlock`'s API
    over global env ids: ``write()`` (validated once, here, then routed to the nodes that hold the
    envs), ``applied``, ``specs``, ``names``, ``snapshot()`` and reads by name.

    Reads (``params["gravity"]``, ``applied``) are read-only copies fetched from every node; there
    is no writable view, since the blocks live on other machines: write with ``write()``.
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

    def __len__(self) -> int:
        return self._fleet.num_envs

    def __repr__(self) -> str:
        return f"ClusterParams({self.names}, num_envs={len(self)}, nodes={len(self._fleet.nodes)})"

    def snapshot(self) -> np.ndarray:
        """Every env's record (global env id order), each node's taken under its writers' lock."""
        self._check()
        parts = self._fleet.call("params_snapshot", {k: () for k in range(len(self._fleet.nodes))}, "params read")
        return _read_only(np.concatenate([parts[k] for k in sorted(parts)]))

    @property
    def dtype(self) -> np.dtype[Any]:
        """The record type: one field per parameter (a sub-record for a distribution)."""
        return self._dtype

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.specs:
            raise KeyError(f"no parameter {name!r}; the pool has {self.names}")
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
        parts = self._fleet.call("applied", {k: () for k in range(len(self._fleet.nodes))}, "applied read")
        records = np.concatenate([parts[k][0] for k in sorted(parts)])
        return _read_only(records), [parts[k][1] for k in sorted(parts)]

    @property
    def refusals(self) -> dict[str, int]:
        """How many raw writes each parameter's workers refused so far, all nodes together."""
        self._check()
        stats = self._fleet.call("stats", {k: () for k in range(len(self._fleet.nodes))}, "stats")
        return {name: sum(stats[k].refusals.get(name, 0) for k in stats) for name in self.specs}

    def write(self, env_ids: int | Sequence[int] | slice | np.ndarray | None, **values: Any) -> int:
        """Validates ``values`` once, then writes each node's rows into its block (atomically per env,
        as ``ParamBlock.write``); returns the write's version (see ``ClusterPool.applied_version``;
        0 for a write of no env, which every node has applied).

        ``env_ids`` are global: an env id, a sequence or array of them, a slice, or None for every env.
        A distribution's arguments are given as a dict, e.g. ``length={"low": 0.4, "high": 0.6}``.
        The envs run with the values from their next step (``when="step"``) or reset.

        Raises:
            ValueError: naming the parameter, the global env id and the value; nothing is written then.
            KeyError: for a parameter the pool does not declare.
            ClusterNodeError: naming the node, if a node that holds some of ``env_ids`` failed (before
                anything is written when it was known to have failed; the other nodes' rows are
                written when it fails during the write).
        """
        self._check()
        fleet = self._fleet
        ids = self._env_ids(env_ids)
        specs = named_specs(self.specs, values)
        if not len(ids):  # no env (an empty list or slice): nothing to write, no version to wait for
            return 0
        order = np.argsort(ids, kind="stable")
        by_node = fleet.split(np.unique(ids))
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
        for index, local in by_node.items():
            # Each env's row of the values: its last, if it was given twice (as ParamBlock.write).
            rows = order[np.searchsorted(ids, local + fleet.starts[index], side="right", sorter=order) - 1]
            every = env_ids is None or len(local) == len(fleet.nodes[index].env_ids)
            part = {name: _rows_of(value, rows) for name, value in staged.items()}
            arguments[index] = (version, None if every else local, part)
        fleet.call("write", arguments, "params.write")
        return version

    def _env_ids(self, env_ids: Any) -> np.ndarray:
        """Global env ids in the order given, as ``ParamBlock.write`` takes them (row ``k`` of a
        value goes to env ``env_ids[k]``)."""
        n = self._fleet.num_envs
        return np.arange(n) if env_ids is None else env_rows(env_ids, n)

    def _stage(self, spec: ParamSpec, ids: np.ndarray, value: Any, current: np.ndarray | None) -> Any:
        """The validated rows of one parameter (a dict of them per given argument for a
        distribution): the rule of ``ParamBlock.write``, so a node refuses what passes here only if
        another writer changed its block meanwhile."""
        return validate(spec, ids, value, lambda arg: current[spec.name][arg], self._label)  # type: ignore[index]


def _rows_of(value: Any, rows: np.ndarray) -> Any:
    if isinstance(value, dict):
        return {arg: np.ascontiguousarray(array[rows]) for arg, array in value.items()}
    return np.ascontiguousarray(value[rows])


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


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
            ClusterNodeError: naming the node, once a node has failed, as ``applied`` and
                ``params.write`` do: records from only part of the fleet would read as a fleet whose
                other envs finished no episode. A node known to have failed raises before any node
                is read; one that fails during the read leaves the records that the other nodes
                handed over (their cursors moved on) on the error's ``records``, never dropped.
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


# -- what the trainer and attached processes share ---------------------------------------------------


class _ClusterChannels:
    """``params``, ``applied``, ``applied_version()``, ``episodes``, ``stats`` and ``nodes``: the
    same on the trainer's :class:`ClusterPool` and on an attached :class:`ClusterHandle`."""

    _fleet: _Fleet
    _params: ClusterParams | None
    _episodes: ClusterEpisodes

    def _check_open(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    @property
    def nodes(self) -> list[NodeInfo]:
        """The nodes, in global env id order."""
        return list(self._fleet.nodes)

    @property
    def params(self) -> ClusterParams:
        """The parameter block of every node, by global env id (see :class:`ClusterParams`)."""
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
        fleet = self._fleet
        versions = fleet.call("applied_version", {k: () for k in range(len(fleet.nodes))}, "applied_version")
        return [versions[k] for k in sorted(versions)]

    @property
    def episodes(self) -> ClusterEpisodes:
        """Finished-episode records of every node since this reader's last ``read()``."""
        self._check_open()
        return self._episodes

    @property
    def stats(self) -> ClusterStats:
        """Every node's :class:`PoolStats`, with totals."""
        self._check_open()
        fleet = self._fleet
        stats = fleet.call("stats", {k: () for k in range(len(fleet.nodes))}, "stats")
        nodes = [stats[k] for k in sorted(stats)]
        refusals: dict[str, int] = {}
        for node in nodes:
            for name, count in node.refusals.items():
                refusals[name] = refusals.get(name, 0) + count
        return ClusterStats(
            nodes=nodes,
            steps_per_second=sum(node.steps_per_second for node in nodes),
            episodes=sum(node.episodes for node in nodes),
            refusals=refusals,
        )

    def _channels(self, description: dict[str, Any], reader: str) -> None:
        fleet = self._fleet
        specs = [ParamSpec.from_json(index, data) for index, data in enumerate(description["params"])]
        label = f"{description['env']} (cluster pool {fleet.name!r})"
        self._params = (
            ClusterParams(fleet, specs, description["params_dtype"], label, self._check_open) if specs else None
        )
        fleet.call("open_reader", {k: (reader,) for k in range(len(fleet.nodes))}, "attach")
        self._episodes = ClusterEpisodes(fleet, reader, description["episode_dtype"], self._check_open)


# -- launch, and the trainer's pool ---------------------------------------------------------------------


def launch(
    env: Any,
    num_envs_per_node: int,
    *,
    nodes: int | Sequence[str] | None = None,
    name: str | None = None,
    host_options: Mapping[str, Any] | None = None,
    **launch_kwargs: Any,
) -> ClusterPool:
    """Launches one shmpool pool of ``num_envs_per_node`` envs on each chosen node of the Ray cluster
    this process is connected to (``ray.init()`` first; called without it, Ray's default
    ``ray.init()`` runs), each owned by a host actor placed there; returns the cluster pool.

    Args:
        env: What :func:`shmpool.launch` takes: a registered id or a callable (shipped to the nodes by
            Ray), or a sequence of callables, one per env of the whole cluster (node order).
        num_envs_per_node: Envs in each node's pool.
        nodes: None for every alive node (in Ray's order), an int for the first that many of them,
            or a list of Ray node ids (hex), in the order their envs take.
        name: The cluster pool's name: its host actors are ``shmpool/{name}/{index}`` (Ray namespace
            ``"shmpool"``) and node ``index``'s pool is ``{name}-{index}``; None: a unique one.
        host_options: Ray options of the host actors (``num_cpus`` to reserve cores for the pool's
            workers, say); they take no resource by default. Placement is always the node's, hard.
        **launch_kwargs: The options of :func:`shmpool.launch` (``num_workers``, ``seed``,
            ``params``, ``hooks``, ``timeout``, ...), the same for every node. A ``seed`` makes
            global env ``i`` start from ``seed + i`` at the first reset, as in one local pool.

    Raises:
        PoolExistsError: if a cluster pool of that name runs on the cluster.
        ValueError: for ``nodes`` that are not alive nodes of the cluster.

    Example (on a running cluster, or after ``ray.init()``):

        >>> import shmpool.ray
        >>> with shmpool.ray.launch("CartPole-v1", 8, num_workers=2, seed=0, name="cl") as cluster:
        ...     observations, infos = cluster.reset()
        ...     print(cluster.num_envs, [node.env_ids for node in cluster.nodes])
    """
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init()
    if not isinstance(num_envs_per_node, (int, np.integer)) or num_envs_per_node < 1:
        raise ValueError(f"num_envs_per_node must be an int >= 1, got {num_envs_per_node!r}")
    if "name" in launch_kwargs or "num_envs" in launch_kwargs:
        raise TypeError(
            "shmpool.ray.launch names the nodes' pools and sizes them itself: pass name= and num_envs_per_node"
        )
    if launch_kwargs.get("batch_size") is not None:
        raise TypeError(
            "shmpool.ray.launch takes no batch_size: a cluster pool's recv() returns one whole node (see "
            "ClusterPool.send); launch a local pool for batches of envs"
        )
    chosen = _choose_nodes(ray, nodes)
    count = int(num_envs_per_node)
    if name is None:
        name = f"c{os.getpid()}-{secrets.token_hex(3)}"
    envs = _split_env(env, count, len(chosen))
    seed = launch_kwargs.pop("seed", None)

    def strategy(node_id: str) -> Any:
        return NodeAffinitySchedulingStrategy(node_id, soft=False)

    here = ray.get_runtime_context().get_node_id()
    actors: list[Any] = []
    try:
        registry = (
            ray.remote(_Registry)
            .options(name=_actor_name(name), namespace=NAMESPACE, num_cpus=0, scheduling_strategy=strategy(here))
            .remote()
        )
    except ValueError as exc:  # Ray refuses a second live actor of the same name
        raise PoolExistsError(f"a cluster pool named {name!r} already runs on this Ray cluster: {exc}") from exc
    actors.append(registry)
    try:
        host_class = ray.remote(_Host)
        hosts = []
        for index, node_id in enumerate(chosen):
            options = {"num_cpus": 0, **(host_options or {})}
            host = host_class.options(
                name=_actor_name(name, index),
                namespace=NAMESPACE,
                max_restarts=0,
                max_task_retries=0,
                scheduling_strategy=strategy(node_id),
                **options,
            ).remote()
            actors.append(host)
            hosts.append(host)
        starts = [
            host.start.remote(
                envs[index],
                count,
                f"{name}-{index}",
                {**launch_kwargs, **({} if seed is None else {"seed": seed + index * count})},
            )
            for index, host in enumerate(hosts)
        ]
        launch_wait = float(launch_kwargs.get("launch_timeout", 120.0)) + TRANSPORT_MARGIN
        provisional = [
            NodeInfo(index, node_id, "?", "?", f"{name}-{index}", range(index * count, (index + 1) * count))
            for index, node_id in enumerate(chosen)
        ]
        fleet = _Fleet(
            name, registry, hosts, {"nodes": provisional, "timeout": launch_wait - TRANSPORT_MARGIN}, owner=True
        )
        infos = fleet.gather(dict(enumerate(starts)), "launch")
        description = _describe(name, infos, provisional)
        registry.publish.remote(description)
        return ClusterPool(_Fleet(name, registry, hosts, description, owner=True), description, actors)
    except BaseException:
        _stop(ray, actors, dict(enumerate(actors[1:])), wait=QUICK_CALL)
        _sweep(ray, list(chosen))  # every node: a host killed mid-launch leaves its pool behind
        raise


def _choose_nodes(ray: Any, nodes: int | Sequence[str] | None) -> list[str]:
    alive = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]
    if nodes is None:
        return alive
    if isinstance(nodes, (int, np.integer)):
        if not 1 <= nodes <= len(alive):
            raise ValueError(f"nodes={nodes}, but the cluster has {len(alive)} alive node(s)")
        return alive[: int(nodes)]
    chosen = [str(node) for node in nodes]
    unknown = [node for node in chosen if node not in alive]
    if unknown or not chosen or len(set(chosen)) != len(chosen):
        raise ValueError(f"nodes must be distinct ids of alive nodes {alive}; got {chosen} ({unknown} not alive)")
    return chosen


def _split_env(env: Any, count: int, num_nodes: int) -> list[Any]:
    """The ``env`` argument of each node's pool: the same factory, or its slice of the callables."""
    if isinstance(env, str) or callable(env):
        return [env] * num_nodes
    factories = list(env)
    if len(factories) != count * num_nodes:
        raise ValueError(
            f"env is a sequence of {len(factories)} callables; {num_nodes} node(s) x {count} envs "
            f"needs {count * num_nodes}"
        )
    return [factories[index * count : (index + 1) * count] for index in range(num_nodes)]


def _describe(name: str, infos: dict[int, dict[str, Any]], provisional: list[NodeInfo]) -> dict[str, Any]:
    """The cluster pool's description (what the registry hands attaching processes), checking that
    every node's envs have the same spaces."""
    first = infos[0]
    for index, info in infos.items():
        for key in ("single_observation_space", "single_action_space"):
            if info[key] != first[key]:
                raise ValueError(
                    f"cluster pool {name!r}: node {index} has {key} {info[key]}, node 0 has {first[key]}; "
                    "every node must build the same env (same gymnasium and env versions)"
                )
    nodes = [
        NodeInfo(node.index, info["node_id"], info["address"], info["hostname"], node.pool, node.env_ids)
        for node, info in ((node, infos[node.index]) for node in provisional)
    ]
    keep = ("single_observation_space", "single_action_space", "metadata", "render_mode", "autoreset_mode")
    return {
        **{key: first[key] for key in keep},
        "nodes": nodes,
        "env": first["env"],
        "params": first["params"],
        "params_dtype": first["params_dtype"],
        "episode_dtype": first["episode_dtype"],
        "timeout": first["timeout"],
        "worker_pids": [infos[index]["worker_pids"] for index in sorted(infos)],
        "host_pids": [infos[index]["pid"] for index in sorted(infos)],
    }


def _remove_stale_pools() -> list[str]:
    """Removes the segments of this node's pools whose owner is dead (what ``shmpool gc`` does)."""
    from shmpool.registry import sweep_stale

    return sweep_stale()


def _sweep(ray: Any, node_ids: list[str]) -> None:
    """Removes what the pools of dead hosts left on their nodes that are still in the cluster. The
    workers of a host that dies remove its pool themselves (see ``_leave_host_group``); this catches
    what they could not: a host killed before its workers left its process group (mid-launch), or
    workers killed with it. A node gone from the cluster takes no task: its own workers are all
    there is, and ``shmpool gc`` or the next launch on that machine."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
    refs = []
    for node_id in set(node_ids) & alive:  # a node that is gone has nothing left, and takes no task
        strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
        refs.append(
            ray.remote(_remove_stale_pools).options(num_cpus=0, max_retries=0, scheduling_strategy=strategy).remote()
        )
    for ref in refs:
        try:
            ray.get(ref, timeout=QUICK_CALL)
        except Exception:  # noqa: S112 - best effort: `shmpool gc` on that node, or its next launch, does it
            continue


def _stop(ray: Any, actors: list[Any], hosts: Mapping[int, Any], wait: float | None) -> list[int]:
    """Closes the hosts' pools (all of them within ``wait`` seconds together; None: within
    ``CLOSE_WAIT``) and ends every actor. Returns the nodes whose host did not confirm its close:
    their pools may have been left by a kill, and are swept once the kill has landed."""
    deadline = time.monotonic() + (CLOSE_WAIT if wait is None else wait)
    refs = {}
    unconfirmed = []
    for index, host in hosts.items():
        try:
            refs[index] = host.close.remote()
        except Exception:  # noqa: BLE001 - a host that cannot take the call is killed below all the same
            unconfirmed.append(index)
    for index, ref in refs.items():
        try:
            ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - stuck or dead: killed below, its node swept after
            unconfirmed.append(index)
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: S112
            continue
    for index in unconfirmed:  # a kill is asynchronous: sweep only once the host's process is gone
        _wait_dead(ray, hosts[index], QUICK_CALL)
    return sorted(unconfirmed)


def _wait_dead(ray: Any, actor: Any, timeout: float) -> None:
    """Returns once ``actor`` is dead (its calls fail as such), or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return
        except Exception:  # noqa: BLE001, S110 - not dead yet (a timeout): look again
            pass
        time.sleep(0.05)


class ClusterPool(_ClusterChannels, VectorEnv):
    """A gymnasium ``VectorEnv`` over the envs of every node's pool (global env ids in node order).

    Made by :func:`launch`; use it as a context manager or call :meth:`close`. ``reset`` and ``step``
    drive every node at once; ``async_reset``/``send``/``recv`` let a trainer overlap nodes (one
    node per ``recv``). ``params``, ``applied``, ``applied_version()``, ``episodes`` and ``stats``
    are the same as on an attached :class:`ClusterHandle`.
    """

    def __init__(self, fleet: _Fleet, description: dict[str, Any], actors: list[Any]) -> None:
        self._fleet = fleet
        self._actors = actors
        self._description = description
        self.num_envs = fleet.num_envs
        self.single_observation_space = description["single_observation_space"]
        self.single_action_space = description["single_action_space"]
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = dict(description["metadata"])
        self.render_mode = description["render_mode"]
        self.autoreset_mode: AutoresetMode = description["autoreset_mode"]
        #: Each node's latest observations: what a reset whose mask skips a node returns for it.
        self._observations: dict[int, Any] = {}
        #: send()/async_reset() calls in flight: node -> (Ray ref, "step" or "reset").
        self._in_flight: dict[int, tuple[Any, str]] = {}
        self._last_recv: int | None = None
        self._channels(description, f"owner-{uuid.uuid4().hex[:12]}")

    @property
    def name(self) -> str:  # type: ignore[override]
        """The cluster pool's name, by which :func:`attach` finds it."""
        return self._fleet.name

    @property
    def worker_pids(self) -> list[list[int]]:
        """Each node's pool's worker process ids (on that node)."""
        return [list(pids) for pids in self._description["worker_pids"]]

    @property
    def alive(self) -> bool:
        """Whether the cluster pool is open and none of its nodes has failed."""
        return not self.closed and not self._fleet.failed

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("failed" if self._fleet.failed else "running")
        return f"ClusterPool({self.name!r}, num_envs={self.num_envs}, nodes={len(self._fleet.nodes)}, {state})"

    def __enter__(self) -> ClusterPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        self._fleet.check_open()

    # -- synchronous: every node at once ----------------------------------------------------------------

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every env (or those in ``options["reset_mask"]``); as a local pool's ``reset``.

        ``seed``: an int (global env ``i`` gets ``seed + i``), one seed (or None) per env, or None.
        Any ``send`` in flight is waited for and its results dropped.
        """
        self._drain()
        arguments = self._reset_arguments(seed, options)
        results = self._fleet.call("reset", arguments, "reset")
        parts = []
        for index in range(len(self._fleet.nodes)):
            if index in results:
                self._observations[index] = results[index][0]
                parts.append((index, results[index][0], results[index][1]))
            else:  # masked out: its envs keep their observations, as gymnasium's vector envs do
                parts.append((index, self._observations[index], {}))
        observations = _concat([part[1] for part in parts])
        return observations, _merge_infos([part[2] for part in parts], self._counts())

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every env with its row of ``actions``; each node steps its pool, all at once.

        Raises:
            ClusterNodeError: naming the node whose host actor died or did not answer in time.
        """
        self._check_open()
        if self._in_flight:
            raise RuntimeError(
                f"step() while nodes {sorted(self._in_flight)} are stepping after send(): recv() them first, or reset()"
            )
        fleet = self._fleet
        parts = _split_actions(actions, fleet.starts, self.num_envs)
        results = fleet.call("step", {index: (part,) for index, part in enumerate(parts)}, "step")
        ordered = [results[index] for index in range(len(fleet.nodes))]
        for index, result in enumerate(ordered):
            self._observations[index] = result[0]
        return (
            _concat([result[0] for result in ordered]),
            np.concatenate([result[1] for result in ordered]),
            np.concatenate([result[2] for result in ordered]),
            np.concatenate([result[3] for result in ordered]),
            _merge_infos([result[4] for result in ordered], self._counts()),
        )

    # -- asynchronous: one node at a time ---------------------------------------------------------------

    def async_reset(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Starts resetting every env (as :meth:`reset`, without waiting); each ``recv()`` then returns
        the first observations of one node."""
        self._check_open()
        if options is not None and "reset_mask" in options:
            raise ValueError("async_reset resets every env: reset_mask belongs to reset()")
        self._drain()
        fleet = self._fleet
        arguments = self._reset_arguments(seed, options)
        fleet.check_nodes(list(arguments), "async_reset")
        for index, args in arguments.items():
            self._in_flight[index] = (fleet.hosts[index].reset.remote(*args), "reset")

    def send(self, actions: Any, node: int | None = None) -> None:
        """Starts stepping the envs of ``node`` (default: the node the last ``recv()`` returned) with
        ``actions``, one row per env of that node; returns at once.

        Example:
            >>> cluster.async_reset(seed=0)
            >>> for _ in range(100):
            ...     observations, rewards, terminations, truncations, infos = cluster.recv()
            ...     cluster.send(policy(observations), node=int(infos["node"][0]))
        """
        self._check_open()
        fleet = self._fleet
        if node is not None and (not isinstance(node, (int, np.integer)) or isinstance(node, (bool, np.bool_))):
            raise TypeError(
                f"send(actions, node): node is a node index (infos['node'][0] of a recv()), not env ids; "
                f"got {type(node).__name__}"
            )
        if node is None:
            if self._last_recv is None:
                raise RuntimeError("send() without node= needs a recv() first, to know which node to step")
            node = self._last_recv
        if not 0 <= node < len(fleet.nodes):
            raise IndexError(f"node {node} is outside 0..{len(fleet.nodes) - 1} of cluster pool {self.name!r}")
        if node in self._in_flight:
            raise RuntimeError(f"send() to node {node}, which is still stepping: recv() its results first")
        fleet.check_nodes([node], "send")
        count = len(fleet.nodes[node].env_ids)
        part = _split_actions(actions, np.array([0, count]), count)[0]
        self._in_flight[node] = (fleet.hosts[node].step.remote(part), "step")

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Waits for the first node in flight to finish its step (or reset) and returns its envs'
        observations, rewards, terminations, truncations and infos, with ``infos["env_id"]`` (int32,
        global) and ``infos["node"]`` saying which env and node each row is.

        Raises:
            RuntimeError: if no node is in flight.
            ClusterNodeError: naming the node, if the first one to answer failed.
        """
        ray = _ray()
        fleet = self._fleet
        self._check_open()
        if not self._in_flight:
            raise RuntimeError("recv() with no node in flight: call async_reset() or send() first")
        refs = {ref: index for index, (ref, _) in self._in_flight.items()}
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=fleet.wait)
        if not ready:
            index = min(self._in_flight)
            self._in_flight.pop(index)
            raise fleet.fail(index, "recv() got no answer in time", TimeoutError(f"{fleet.wait} s"))
        index = refs[ready[0]]
        ref, kind = self._in_flight.pop(index)
        result = fleet.result(index, ref, "recv")
        self._last_recv = index
        count = len(fleet.nodes[index].env_ids)
        if kind == "reset":
            observations, infos = result
            rewards, terminations, truncations = np.zeros(count), np.zeros(count, bool), np.zeros(count, bool)
        else:
            observations, rewards, terminations, truncations, infos = result
        self._observations[index] = observations
        infos = dict(infos)
        infos["env_id"] = np.arange(fleet.starts[index], fleet.starts[index] + count, dtype=np.int32)
        infos["node"] = np.full(count, index, dtype=np.int32)
        return _concat([observations]), rewards, terminations, truncations, infos

    # -- control calls ------------------------------------------------------------------------------------

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` of every env (or reads it), as gymnasium's ``VectorEnv.call``."""
        fleet = self._fleet
        results = fleet.call("call", {k: (name, args, kwargs) for k in range(len(fleet.nodes))}, f"call {name!r}")
        return tuple(value for index in sorted(results) for value in results[index])

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env, as gymnasium's ``get_attr``."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Sets attribute ``name`` of every env: one value per env (a list or tuple), or one for all."""
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr got {len(values)} values for {self.num_envs} envs")
        fleet = self._fleet
        arguments = {node.index: (name, list(values[node.env_ids.start : node.env_ids.stop])) for node in fleet.nodes}
        fleet.call("set_attr", arguments, f"set_attr({name!r})")

    def render(self) -> tuple[Any, ...] | None:  # type: ignore[override]
        """Every env's ``render()``."""
        return self.call("render")

    # -- helpers -------------------------------------------------------------------------------------------

    def _counts(self) -> list[int]:
        return [len(node.env_ids) for node in self._fleet.nodes]

    def _reset_arguments(
        self, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None
    ) -> dict[int, tuple[Any, dict[str, Any] | None]]:
        """Each node's ``(seed, options)`` for a reset (nodes that a ``reset_mask`` skips left out)."""
        fleet = self._fleet
        if seed is not None and not isinstance(seed, (int, np.integer)):
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset got {len(seeds)} seeds for num_envs={self.num_envs}")
        mask = None
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = options.pop("reset_mask")
            if not isinstance(mask, np.ndarray) or mask.shape != (self.num_envs,) or mask.dtype != np.bool_:
                raise ValueError(f"`options['reset_mask']` must be a bool numpy array of shape ({self.num_envs},)")
            if not mask.any():
                raise ValueError(f"`options['reset_mask']` must contain at least one True value, got {mask}")
        arguments = {}
        for node in fleet.nodes:
            start, stop = node.env_ids.start, node.env_ids.stop
            if seed is None:
                node_seed: Any = None
            elif isinstance(seed, (int, np.integer)):
                node_seed = int(seed) + start
            else:
                node_seed = seeds[start:stop]
            node_options = options
            if mask is not None:
                if not mask[start:stop].any() and node.index in self._observations:
                    continue  # none of its envs resets: it keeps its observations, and is not called
                node_options = {**(options or {}), "reset_mask": mask[start:stop].copy()}
            arguments[node.index] = (node_seed, node_options)
        return arguments

    def _drain(self) -> None:
        """Waits for the nodes in flight and drops their results (reset() goes back to step())."""
        in_flight, self._in_flight = self._in_flight, {}
        for index, (ref, _) in in_flight.items():
            self._fleet.result(index, ref, "a send() that reset() abandoned")

    def close_extras(self, **kwargs: Any) -> None:
        """Closes every node's pool (no segment is left on any node) and ends the host actors; safe to
        call more than once. A node that failed is not asked: its pool's workers remove its segment
        and doorbells within about a second of their host's death (a node still in the cluster is
        swept as well)."""
        fleet = self._fleet
        if fleet.closed:
            return
        fleet.closed = True
        self._in_flight = {}  # what was sent is abandoned with the nodes' pools
        ray = _ray()
        if not ray.is_initialized():  # disconnected: Ray ended this driver's actors, and their pools with them
            return
        try:  # first, so that an attached process that finds a host gone knows it is no failure
            ray.get(fleet.registry.close.remote(), timeout=QUICK_CALL)
        except Exception:  # noqa: S110 - the registry only tells attached processes; it is killed below
            pass
        live = {index: host for index, host in enumerate(fleet.hosts) if index not in fleet.failed}
        unconfirmed = _stop(ray, self._actors, live, fleet.wait)
        for index in fleet.failed:  # failed earlier (died, stuck, cut off): killed by _stop above
            _wait_dead(ray, fleet.hosts[index], QUICK_CALL)
        swept = sorted(set(unconfirmed) | set(fleet.failed) | fleet.died)
        _sweep(ray, [fleet.nodes[index].node_id for index in swept])


def _concat(parts: list[Any]) -> Any:
    """Batches of observations (one per node) as one batch: leaves concatenated, Dict and Tuple kept."""
    first = parts[0]
    if isinstance(first, dict):
        return {key: _concat([part[key] for part in parts]) for key in first}
    if isinstance(first, tuple):
        return tuple(_concat([part[i] for part in parts]) for i in range(len(first)))
    return np.concatenate([np.asarray(part) for part in parts])


def _split_actions(actions: Any, starts: np.ndarray, num_envs: int) -> list[Any]:
    """Each node's rows of a batch of actions (Dict and Tuple actions split leaf by leaf)."""
    if isinstance(actions, Mapping):
        per_key = {key: _split_actions(value, starts, num_envs) for key, value in actions.items()}
        return [{key: parts[k] for key, parts in per_key.items()} for k in range(len(starts) - 1)]
    if isinstance(actions, tuple):
        per_item = [_split_actions(value, starts, num_envs) for value in actions]
        return [tuple(parts[k] for parts in per_item) for k in range(len(starts) - 1)]
    array = np.asarray(actions)
    if array.ndim == 0 or len(array) != num_envs:
        raise ValueError(f"actions must have one row per env ({num_envs}), got shape {array.shape}")
    return [array[starts[k] : starts[k + 1]] for k in range(len(starts) - 1)]


def _merge_infos(parts: list[dict[str, Any]], counts: list[int]) -> dict[str, Any]:
    """Each node's vector infos as one: arrays concatenated; a key that a node lacks gets that node's
    rows filled as gymnasium fills an env without it (zeros, None, or False for a ``_key`` mask)."""
    keys: dict[str, None] = {}
    for part in parts:
        keys.update(dict.fromkeys(part))
    merged: dict[str, Any] = {}
    for key in keys:
        values = [part.get(key) for part in parts]
        sample = next(value for value in values if value is not None)
        if isinstance(sample, dict):
            merged[key] = _merge_infos([value if isinstance(value, dict) else {} for value in values], counts)
            continue
        sample = np.asarray(sample)
        merged[key] = np.concatenate(
            [
                np.asarray(value) if value is not None else _blank(key, sample, count)
                for value, count in zip(values, counts)
            ]
        )
    return merged


def _blank(key: str, sample: np.ndarray, count: int) -> np.ndarray:
    if key.startswith("_"):
        return np.zeros(count, np.bool_)
    if sample.dtype == object:
        return np.full(count, None, dtype=object)
    return np.zeros((count, *sample.shape[1:]), sample.dtype)


# -- attach ------------------------------------------------------------------------------------------


class ClusterHandle(_ClusterChannels):
    """A view of a running cluster pool from any process of the Ray cluster: ``params`` (``write()``
    included), ``applied``, ``applied_version()``, ``episodes`` (its own cursor), ``stats``,
    ``alive`` and ``nodes``. Closing the handle never affects the cluster pool.

    Made by :func:`attach`; use it as a context manager or call :meth:`close`.
    """

    def __init__(self, fleet: _Fleet, description: dict[str, Any]) -> None:
        self._fleet = fleet
        self.name = fleet.name
        self.num_envs = fleet.num_envs
        self.env = str(description["env"])
        self._closed = False
        self._reader = f"handle-{uuid.uuid4().hex[:12]}"
        self._channels(description, self._reader)

    @property
    def alive(self) -> bool:
        """Whether the cluster pool is open and every node's pool runs (asks each host)."""
        if self._closed or self._fleet.failed:
            return False
        ray = _ray()
        refs = [host.alive.remote() for host in self._fleet.hosts]
        try:
            return all(ray.get(refs, timeout=QUICK_CALL)) and not self._fleet.registry_closing()
        except ray.exceptions.RayError:
            return False

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError(f"this handle on cluster pool {self.name!r} is closed")

    def close(self) -> None:
        """Lets go of this handle's episode readers on the nodes; the cluster pool goes on."""
        if self._closed:
            return
        self._closed = True
        ray = _ray()
        fleet = self._fleet
        refs = [
            host.drop_reader.remote(self._reader) for index, host in enumerate(fleet.hosts) if index not in fleet.failed
        ]
        try:
            ray.get(refs, timeout=QUICK_CALL)
        except ray.exceptions.RayError:
            pass  # a host gone with its pool: nothing of this handle's is left there

    def __enter__(self) -> ClusterHandle:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ClusterHandle({self.name!r}, env={self.env!r}, num_envs={self.num_envs}, nodes={len(self._fleet.nodes)})"
        )


def attach(name: str, *, address: str | None = None, timeout: float | None = None) -> ClusterHandle:
    """Finds the cluster pool called ``name`` on the Ray cluster and returns a handle on every node.

    Works from any process connected to the cluster; one that is not connected yet connects to
    ``address`` (None: ``"auto"``, the cluster this machine belongs to or ``RAY_ADDRESS``).

    Args:
        name: The name given to :func:`launch`.
        address: The Ray cluster's address, used only if this process has not called ``ray.init``.
        timeout: Seconds to wait for the cluster pool to appear (None: do not wait).

    Raises:
        PoolNotFoundError: if no cluster pool of that name runs (within ``timeout``).

    Example (a curriculum on any machine of the cluster):

        >>> import shmpool.ray
        >>> with shmpool.ray.attach("cl", address="auto", timeout=30) as handle:
        ...     handle.params.write(None, length=0.7)
        ...     records = handle.episodes.read()
    """
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address or "auto")
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        description = _find(ray, name)
        if description is not None:
            break
        if deadline is None or time.monotonic() > deadline:
            raise PoolNotFoundError(
                f"no cluster pool named {name!r} runs on this Ray cluster (namespace {NAMESPACE!r})"
            )
        time.sleep(0.1)
    try:
        registry = ray.get_actor(_actor_name(name), namespace=NAMESPACE)
        hosts = [ray.get_actor(_actor_name(name, node.index), namespace=NAMESPACE) for node in description["nodes"]]
    except ValueError as exc:
        raise PoolNotFoundError(f"cluster pool {name!r} is closing: {exc}") from exc
    return ClusterHandle(_Fleet(name, registry, hosts, description, owner=False), description)


def _find(ray: Any, name: str) -> dict[str, Any] | None:
    """The published description of cluster pool ``name``, or None if it is not (yet) there."""
    try:
        registry = ray.get_actor(_actor_name(name), namespace=NAMESPACE)
        return ray.get(registry.description.remote(), timeout=QUICK_CALL)  # type: ignore[no-any-return]
    except (ValueError, ray.exceptions.RayError):
        return None
