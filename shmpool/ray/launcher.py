"""The trainer's entry point: ``launch`` places a registry actor and one host actor per chosen
node of the Ray cluster, has each host launch its node's pool, checks that they all built the same
env, publishes where they are, and returns the ``ClusterPool``; a launch that fails ends
every actor it started and sweeps the nodes."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from shmpool.errors import PoolExistsError

from .cluster_pool import ClusterPool
from .fleet import NAMESPACE, QUICK_CALL, TRANSPORT_MARGIN, NodeInfo, _Fleet, actor_name, import_ray
from .node import _Host, _Registry
from .teardown import stop, sweep

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from shmpool.options import OptionsButName


def launch(
    env: Any,
    num_envs: int | None = None,
    *,
    nodes: int | Sequence[str] | None = None,
    name: str | None = None,
    host_options: Mapping[str, Any] | None = None,
    **options: Unpack[OptionsButName],
) -> ClusterPool:
    """Launches one local pool of ``num_envs / len(nodes)`` envs per chosen node of the Ray cluster this process is
    connected to (else Ray's default ``ray.init()`` runs), each owned by a host actor there; returns the cluster pool.

    Args:
        env: What ``shmpool.launch`` takes: a registered id or a callable (shipped to the nodes by Ray), or a
            sequence of callables, one per env of the whole cluster (node order).
        num_envs: Envs over all the nodes, which must split evenly over them (None: the length of ``env``'s sequence).
        nodes: None for every alive node (in Ray's order), an int for the first that many of them, or a list of Ray
            node ids (hex), in the order their envs take.
        name: The cluster pool's name: its host actors are ``shmpool/{name}/{index}`` (Ray namespace ``"shmpool"``)
            and node ``index``'s pool is ``{name}-{index}``; None: a unique one.
        host_options: Ray options of the host actors (``num_cpus`` to reserve cores for the pool's workers, say);
            they take no resource by default. Placement is always the node's, hard.
        **options: The options of ``shmpool.launch``, the same for every node. A ``seed`` makes global env ``i``
            start from ``seed + i`` at the first reset, as in one local pool.

    Raises:
        PoolExistsError: if a cluster pool of that name runs on the cluster.
        ValueError: for ``nodes`` that are not alive nodes of the cluster, or a ``num_envs`` that does not split
            evenly over them.
    """
    if num_envs is None:
        if isinstance(env, str) or callable(env):
            raise TypeError("shmpool.ray.launch() needs num_envs, the envs over all the nodes")
        num_envs = len(env)
    _check_count("num_envs", num_envs)
    if options.get("batch_size") is not None:
        raise TypeError(
            "shmpool.ray.launch takes no batch_size: a cluster pool's recv() returns one whole node (see "
            "ClusterPool.send); launch a local pool for batches of envs"
        )
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init()
    chosen = _choose_nodes(ray, nodes)
    total = int(num_envs)
    if total % len(chosen):
        below = total // len(chosen) * len(chosen)
        raise ValueError(
            f"num_envs={total} does not split evenly over {len(chosen)} nodes (every node steps as many envs: "
            f"recv() returns one whole node); give a multiple of {len(chosen)}, such as "
            f"{below or len(chosen)} or {below + len(chosen)}"
        )
    count = total // len(chosen)
    if name is None:
        name = f"c{os.getpid()}-{secrets.token_hex(3)}"
    envs = _split_env(env, count, len(chosen))
    seed = options.pop("seed", None)

    def strategy(node_id: str) -> Any:
        return NodeAffinitySchedulingStrategy(node_id, soft=False)

    here = ray.get_runtime_context().get_node_id()
    actors: list[Any] = []
    try:
        registry = (
            ray.remote(_Registry)
            .options(name=actor_name(name), namespace=NAMESPACE, num_cpus=0, scheduling_strategy=strategy(here))
            .remote()
        )
    except ValueError as exc:  # Ray refuses a second live actor of the same name
        raise PoolExistsError(f"a cluster pool named {name!r} already runs on this Ray cluster: {exc}") from exc
    actors.append(registry)
    try:
        host_class = ray.remote(_Host)
        hosts = []
        for index, node_id in enumerate(chosen):
            host = host_class.options(
                name=actor_name(name, index),
                namespace=NAMESPACE,
                max_restarts=0,
                max_task_retries=0,
                scheduling_strategy=strategy(node_id),
                **{"num_cpus": 0, **(host_options or {})},
            ).remote()
            actors.append(host)
            hosts.append(host)
        starts = [
            host.start.remote(
                envs[index],
                count,
                f"{name}-{index}",
                {**options, **({} if seed is None else {"seed": seed + index * count})},
            )
            for index, host in enumerate(hosts)
        ]
        launch_wait = float(options.get("launch_timeout", 120.0)) + TRANSPORT_MARGIN
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
        stop(ray, actors, dict(enumerate(actors[1:])), wait=QUICK_CALL)
        sweep(ray, list(chosen))  # every node: a host killed mid-launch leaves its pool behind
        raise


def _check_count(keyword: str, value: Any) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{keyword} must be an int >= 1, got {value!r}")


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
            f"env is a sequence of {len(factories)} callables, but num_envs={count * num_nodes} ({num_nodes} "
            f"node(s) x {count} envs)"
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
        replace(node, **{key: infos[node.index][key] for key in ("node_id", "address", "hostname")})
        for node in provisional
    ]
    keep = ["single_observation_space", "single_action_space", "metadata", "render_mode", "autoreset_mode", "env"]
    keep += ["params", "params_dtype", "episode_dtype", "hooks", "timeout"]
    worker_pids = [infos[index]["worker_pids"] for index in sorted(infos)]
    return {**{key: first[key] for key in keep}, "nodes": nodes, "worker_pids": worker_pids}
