"""Beyond one machine: one shmpool pool per node of a Ray cluster, one vector env and one curriculum
over all of them, with the API of ``shmpool.interfaces``. Needs ``pip install "shmpool[ray]"``;
``import shmpool.ray`` does not import Ray (its first use does).

How to use it: ``docs/guides/ray.md``. Why and how: ``docs/internals.md``, "shmpool/ray/__init__.py".
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
