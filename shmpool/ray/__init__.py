"""Beyond one machine: one shmpool pool per node of a Ray cluster, one vector env and one curriculum
over all of them, with the API of ``shmpool.interfaces``. Needs ``pip install "shmpool[ray]"``;
``import shmpool.ray`` does not import Ray (its first use does).

Shared memory stops at the node, so shmpool stays the fast path inside each node and Ray is the
transport between nodes. Each chosen node gets a *host actor* (hard node affinity) that owns a local
pool; the trainer's ``ClusterPool`` sends each host its rows of the actions and concatenates
what comes back. The live parameter block never leaves its node: a write travels to the hosts as a
snapshot of the rows it changes, and episode records travel back as copies::

    trainer (the Ray driver)                    node k, one per chosen node
    ─────────────────────────                   ──────────────────────────────────────────────
    shmpool.ray.launch(env, n, name="cl") ──▶ host actor "shmpool/cl/k" ──launch──▶ pool "cl-k"
      cluster.step(actions)  ── rows of k ──▶ host.step ──▶ pool.step (n / nodes envs, shared memory)
                             ◀── results ──
      cluster.params.write() ── validated once, rows of k, version v ──▶ pool.params.write
      cluster.events.send()  ── envs of k ──▶ pool.events.send
      cluster.episodes.read() ◀── new records (env ids made global, node added) ──
    registry actor "shmpool/cl" (on the trainer's node): the nodes, and the counter of write versions

    any process of the cluster: shmpool.ray.attach("cl") ──▶ the registry, then every host

Global env ids run in node order: node k holds ``nodes[k].env_ids``. Given the same seeds and
actions, ``ClusterPool.step`` returns exactly what a local pool of the same total size returns
(``reset(seed=s)`` seeds global env ``i`` with ``s + i``, and ``launch(seed=s)`` does the same for
the first reset). Draws of ``dist`` parameters and hooks' random streams are each node's own
(node ``k``'s pool is seeded with ``seed + nodes[k].env_ids.start``), so they differ from a single
pool's.

The modules, by where their code runs: ``.node`` (the actors on the nodes), ``.launcher``,
``.cluster_pool``, ``.batching`` and ``.teardown`` (the trainer), ``.handle`` (attached
processes), and ``.fleet``, ``.params`` and ``.channels`` (what the last two share).

Example (``ray.init()`` starts a one-node Ray on this machine; on a cluster, ``address="auto"``):

    >>> import ray
    >>> import shmpool.ray
    >>> ray.init()
    >>> with shmpool.ray.launch("CartPole-v1", 4, num_workers=1, seed=0) as cluster:
    ...     observations, infos = cluster.reset()
    ...     observations, rewards, terminations, truncations, infos = cluster.step(cluster.action_space.sample())
"""

from __future__ import annotations

from shmpool.errors import ClusterNodeError

from .channels import ClusterEpisodes, ClusterEvents
from .cluster_pool import ClusterPool
from .fleet import ClusterStats, NodeInfo
from .handle import ClusterHandle, attach
from .launcher import launch
from .params import ClusterParams

__all__ = [
    "ClusterEpisodes",
    "ClusterEvents",
    "ClusterHandle",
    "ClusterNodeError",
    "ClusterParams",
    "ClusterPool",
    "ClusterStats",
    "NodeInfo",
    "attach",
    "launch",
]
