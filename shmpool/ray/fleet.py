"""The nodes of one cluster pool as the trainer and attached processes both see them: ``_Fleet``
calls the host actors (every Ray failure becomes a ``ClusterNodeError`` naming the node, every
wait has a deadline) and maps global env ids to nodes; ``NodeInfo`` and ``ClusterStats``
describe the nodes. Ray itself is imported here, lazily (``import_ray``), never at import time.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shmpool.errors import ClusterNodeError, PoolClosedError
from shmpool.view import PoolStats

#: The Ray namespace of every actor shmpool.ray creates, so that a process in any namespace finds them.
NAMESPACE = "shmpool"
#: Seconds a Ray call may take beyond the pool's own ``timeout``: the transport, and a busy node.
TRANSPORT_MARGIN = 30.0
#: Seconds a host may take to answer a bookkeeping call (``alive``, ``stats``, a version).
QUICK_CALL = 10.0
#: How long close() waits for all the hosts to close their pools when the pool's timeout is None.
CLOSE_WAIT = 60.0


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
    """A snapshot of every node's pool (``nodes``, one ``shmpool.handle.PoolStats`` each), with totals."""

    nodes: list[PoolStats]
    steps_per_second: int  # env steps per second over the last second or so, all nodes together
    episodes: int  # episodes finished so far, all nodes together
    refusals: dict[str, int]  # raw parameter writes the workers refused, per parameter, all nodes together

    @classmethod
    def of(cls, nodes: list[PoolStats]) -> ClusterStats:
        refusals: dict[str, int] = {}
        for node in nodes:
            for name, count in node.refusals.items():
                refusals[name] = refusals.get(name, 0) + count
        steps, episodes = sum(node.steps_per_second for node in nodes), sum(node.episodes for node in nodes)
        return cls(nodes=nodes, steps_per_second=steps, episodes=episodes, refusals=refusals)


def import_ray() -> Any:
    """The ``ray`` module, imported on first use (``import shmpool.ray`` does not import it)."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - the extra is installed wherever the tests run
        raise ImportError('shmpool.ray needs Ray: pip install "shmpool[ray]"') from exc
    return ray


def actor_name(name: str, index: int | None = None) -> str:
    """The Ray name of cluster pool ``name``'s registry actor, or of node ``index``'s host actor."""
    return f"shmpool/{name}" if index is None else f"shmpool/{name}/{index}"


def first_line(error: BaseException) -> str:
    """The error's type and the first line of its message, for a message about it."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


class _Fleet:
    """The hosts of one cluster pool and how to call them: every Ray failure becomes an error that
    names the node, and every wait has a deadline. Shared by ``ClusterPool`` and ``ClusterHandle``."""

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
        self.hook_names: list[str] = list(description.get("hooks") or [])
        timeout = description["timeout"]
        self.wait: float | None = None if timeout is None else timeout + TRANSPORT_MARGIN
        self.failed: dict[int, tuple[str, ClusterNodeError]] = {}  # node index -> (what happened, its error)
        #: Failed nodes whose host Ray reported dead (not just unreachable): their node still runs, and
        #: may hold what the host's pool left (see teardown.sweep).
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

    def call_all(self, method: str, what: str, *args: Any) -> list[Any]:
        """Calls ``method(*args)`` of every host; their results in node order."""
        results = self.call(method, {index: args for index in range(len(self.nodes))}, what)
        return [results[index] for index in range(len(self.nodes))]

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
        ``ClusterNodeError`` if the host is gone or did not answer in time (by ``deadline``,
        or within the pool's wait)."""
        ray = import_ray()
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
                    ids = node.env_ids
                    cause.add_note(
                        f"raised on {node} of cluster pool {self.name!r}, in {what}; env ids in it, if any, are "
                        f"that node's: its env i is global env {ids.start} + i"
                    )
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
        return self._version("next_version")

    def current_version(self) -> int:
        """The newest write version taken (0 before any): what a write of no env returns."""
        return self._version("version")

    def _version(self, method: str) -> int:
        ray = import_ray()
        try:
            return int(ray.get(getattr(self.registry, method).remote(), timeout=QUICK_CALL))
        except ray.exceptions.RayError as error:
            raise PoolClosedError(
                f"cluster pool {self.name!r} has closed: its registry actor (on the owner's node) is gone "
                f"({first_line(error)})"
            ) from error

    def fail(self, index: int, reason: str, cause: BaseException) -> ClusterNodeError:
        """Records that node ``index`` failed; the error to raise."""
        node = self.nodes[index]
        error = ClusterNodeError(
            f"{node} of cluster pool {self.name!r}: {reason}; the other nodes' pools stay usable until "
            f"close(): {first_line(cause)}",
            node=index,
            node_id=node.node_id,
        )
        self.failed.setdefault(index, (reason, error))
        return error

    def registry_closing(self) -> bool:
        """Whether the cluster pool's owner has closed it (or is gone with its registry)."""
        ray = import_ray()
        try:
            return bool(ray.get(self.registry.closing.remote(), timeout=QUICK_CALL))
        except ray.exceptions.RayError:
            return True

    def locate(self, ids: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Global env ids in any order (repeats kept) -> {node: (their places in ``ids``, their
        local env ids)}, for the nodes that hold some."""
        node_of = np.searchsorted(self.starts, ids, side="right") - 1
        located = {}
        for index in np.unique(node_of).tolist():
            places = np.flatnonzero(node_of == index)
            located[index] = (places, ids[places] - self.starts[index])
        return located
