"""The trainer's end of a cluster pool: closing the hosts' pools and ending the actors
(``stop``), waiting for a killed host to be gone (``wait_dead``), and removing what dead
hosts' pools left on nodes still in the cluster (``sweep``). Used by ``launch`` when a launch
fails and by ``ClusterPool.close``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .fleet import CLOSE_WAIT, QUICK_CALL
from .node import remove_stale_pools


def sweep(ray: Any, node_ids: list[str]) -> None:
    """Removes what the pools of dead hosts left on their nodes that are still in the cluster. The
    workers of a host that dies remove its pool themselves (see ``node._leave_host_group``); this
    catches what they could not: a host killed before its workers left its process group
    (mid-launch), or workers killed with it. A node gone from the cluster takes no task: its own
    workers are all there is, and ``shmpool gc`` or the next launch on that machine."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
    refs = []
    for node_id in set(node_ids) & alive:  # a node that is gone has nothing left, and takes no task
        strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
        refs.append(
            ray.remote(remove_stale_pools).options(num_cpus=0, max_retries=0, scheduling_strategy=strategy).remote()
        )
    for ref in refs:
        try:
            ray.get(ref, timeout=QUICK_CALL)
        except Exception:  # noqa: S112 - best effort: `shmpool gc` on that node, or its next launch, does it
            continue


def stop(ray: Any, actors: list[Any], hosts: Mapping[int, Any], wait: float | None) -> list[int]:
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
        wait_dead(ray, hosts[index], QUICK_CALL)
    return sorted(unconfirmed)


def wait_dead(ray: Any, actor: Any, timeout: float) -> None:
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
