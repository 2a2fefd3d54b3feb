"""What an attached process (a curriculum, a dashboard, on any machine of the Ray cluster) uses:
``attach`` finds a running cluster pool by name through its registry actor and returns a
``ClusterHandle`` on every node; closing the handle never affects the cluster pool."""

from __future__ import annotations

import time
import uuid
from typing import Any

from shmpool.errors import PoolClosedError, PoolNotFoundError
from shmpool.options import deadline_after

from .channels import _ClusterChannels
from .fleet import NAMESPACE, QUICK_CALL, _Fleet, actor_name, import_ray


class ClusterHandle(_ClusterChannels):
    """A view of a running cluster pool from any process of the Ray cluster: ``params`` (``write()``
    included), ``applied``, ``applied_version()``, ``episodes`` (its own cursor), ``events`` (when
    the pool has hooks), ``stats``, ``global_step``, ``state_dict()``, ``alive`` and ``nodes``.
    Closing the handle never affects the cluster pool.

    Made by ``attach``; use it as a context manager or call ``close``.
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
        ray = import_ray()
        refs = [host.alive.remote() for host in self._fleet.hosts]
        try:
            return all(ray.get(refs, timeout=QUICK_CALL)) and not self._fleet.registry_closing()
        except ray.exceptions.RayError:
            return False

    @property
    def global_step(self) -> int:
        """How many steps the cluster pool's trainer has taken, as ``ClusterPool.global_step``
        counts them (asks each host: a node that is stepping answers once its step is done)."""
        self._check_open()
        counts = self._fleet.call_all("global_steps", "global_step")
        return max(whole for whole, _ in counts) + sum(sends for _, sends in counts)

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError(f"this handle on cluster pool {self.name!r} is closed")

    def close(self) -> None:
        """Lets go of this handle's episode readers on the nodes; the cluster pool goes on."""
        if self._closed:
            return
        self._closed = True
        ray = import_ray()
        fleet = self._fleet
        refs = [
            host.drop_reader.remote(self._reader) for index, host in enumerate(fleet.hosts) if index not in fleet.failed
        ]
        try:
            ray.get(refs, timeout=QUICK_CALL)
        except ray.exceptions.RayError:
            pass  # a host gone with its pool: nothing of this handle's is left there

    def __repr__(self) -> str:
        return (
            f"ClusterHandle({self.name!r}, env={self.env!r}, num_envs={self.num_envs}, nodes={len(self._fleet.nodes)})"
        )


def attach(name: str, *, address: str | None = None, wait: float | None = None) -> ClusterHandle:
    """Finds the cluster pool called ``name`` on the Ray cluster and returns a handle on every node.

    Works from any process connected to the cluster (a curriculum on any of its machines); one that is not connected
    yet connects to ``address``.

    Args:
        name: The name given to ``shmpool.ray.launch``.
        address: The Ray cluster's address, used only if this process has not called ``ray.init`` (None: ``"auto"``,
            the cluster this machine belongs to or ``RAY_ADDRESS``).
        wait: Seconds to wait for the cluster pool to appear (None: do not wait).

    Raises:
        PoolNotFoundError: if no cluster pool of that name runs (within ``wait``).
    """
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=address or "auto")
    deadline = deadline_after(wait, f"shmpool.ray.attach({name!r})")
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
        registry = ray.get_actor(actor_name(name), namespace=NAMESPACE)
        hosts = [ray.get_actor(actor_name(name, node.index), namespace=NAMESPACE) for node in description["nodes"]]
    except ValueError as exc:
        raise PoolNotFoundError(f"cluster pool {name!r} is closing: {exc}") from exc
    return ClusterHandle(_Fleet(name, registry, hosts, description, owner=False), description)


def _find(ray: Any, name: str) -> dict[str, Any] | None:
    """The published description of cluster pool ``name``, or None if it is not (yet) there."""
    try:
        registry = ray.get_actor(actor_name(name), namespace=NAMESPACE)
        return ray.get(registry.description.remote(), timeout=QUICK_CALL)  # type: ignore[no-any-return]
    except (ValueError, ray.exceptions.RayError):
        return None
