"""What runs on the nodes of a Ray cluster pool: the host actor that owns one node's pool
(``_Host``), the registry actor that tells attaching processes where the hosts are and numbers
the parameter writes (``_Registry``), the first thing each of a host's workers runs
(``_leave_host_group``), and the task that removes what dead pools left on a node.

``ray.remote`` is applied to these classes when a cluster pool launches (``shmpool.ray.launcher``), so
that importing this module never imports Ray.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from typing import Any

import numpy as np

from shmpool.errors import EventQueueFullError, PoolClosedError
from shmpool.view import PoolStats


class _Host:
    """The Ray actor that owns one node's pool. Its methods run one at a time, in the order each
    caller sent them: a write, an event or a state lands between two steps, never during one."""

    def __init__(self) -> None:
        self._pool: Any = None
        self._readers: dict[str, Any] = {}  # reader id -> an attached PoolHandle (its own episode cursor)
        self._written = 0  # the newest write version that landed in the block
        self._applied = 0  # the newest write version that a step or reset has run with since
        self._whole_steps = 0  # steps of the whole cluster pool (ClusterPool.step), which every node takes
        self._sends = 0  # steps of this node alone (ClusterPool.send)

    def start(self, env: Any, num_envs: int, pool_name: str, options: dict[str, Any]) -> dict[str, Any]:
        """Launches the node's pool; returns what the cluster needs to know about it."""
        import multiprocess
        import ray

        import shmpool
        from shmpool.config import WORKER_ENTRY_POINT

        # Not fork by default: this process runs Ray's gRPC threads, which a forked child inherits
        # in whatever state they were (forkserver forks from a clean server process instead).
        options = {"start_method": "forkserver", **options}
        # The server preloads the workers' code beside this process's __main__ (multiprocessing's
        # default preload, here Ray's worker script, which each worker would otherwise run itself),
        # so that every worker forked from it starts with both imported.
        worker_module = WORKER_ENTRY_POINT.split(":")[0]
        multiprocess.get_context("forkserver").set_forkserver_preload(["__main__", worker_module])
        options["worker_init"] = functools.partial(_leave_host_group, options.get("worker_init"))
        self._pool = pool = shmpool.launch(env, num_envs, name=pool_name, **options)
        params = pool.param_specs
        try:
            hooks = list(pool.events.hook_names)
        except AttributeError:  # launched without hooks: it takes no events
            hooks = []
        return {
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
            "hooks": hooks,
            "timeout": pool.config.timeout,
        }

    def reset(self, seed: Any, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        version = self._written
        results = self._pool.reset(seed=seed, options=options)
        self._applied = version
        return results

    def step(self, actions: Any, whole: bool) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of this node's pool: part of a step of the whole cluster pool, or (``whole``
        False) a ``send`` to this node alone."""
        version = self._written
        results = self._pool.step(actions)
        self._applied = version  # the workers read the block at the start of the step
        if whole:
            self._whole_steps += 1
        else:
            self._sends += 1
        return results

    def global_steps(self) -> tuple[int, int]:
        """Steps of the whole cluster pool this node took part in, and sends to this node alone."""
        return self._whole_steps, self._sends

    def write(self, version: int, env_ids: np.ndarray | None, values: dict[str, Any]) -> None:
        self._pool.params.write(env_ids, **values)
        self._written = max(self._written, version)

    def params_snapshot(self) -> np.ndarray:
        return self._pool.params.snapshot()

    def params_accepted(self) -> np.ndarray:
        return self._pool.params.accepted.copy()

    def applied(self) -> tuple[np.ndarray, int]:
        return self._pool.applied.copy(), self._applied

    def applied_version(self) -> int:
        return self._applied

    def send_event(self, hook: str, env_ids: list[int] | None, payload: Any, at_step: int | None) -> bool:
        """Queues the event, or returns False if a worker's ring is full: waiting here would hold
        back the very steps that empty it, so the sender waits between its tries instead."""
        try:
            self._pool.events.send(hook, env_ids, payload, at_step=at_step, wait=0.0)
        except EventQueueFullError:
            return False
        return True

    def state_dict(self) -> Any:
        return self._pool.state_dict()

    def load_state_dict(self, state: Any, same_draws: bool) -> None:
        self._pool.load_state_dict(state, same_draws=same_draws)

    def open_reader(self, reader: str) -> None:
        import shmpool

        if reader not in self._readers:
            self._readers[reader] = shmpool.attach(self._pool.name)

    def read_episodes(self, reader: str) -> tuple[np.ndarray, int]:
        handle = self._readers.get(reader)
        if handle is None:  # dropped by close() since the caller last checked: the pool is closing
            raise PoolClosedError(f"pool {self._pool.name!r} on this node was closed")
        episodes = handle.episodes
        return episodes.read(), episodes.lost

    def drop_reader(self, reader: str) -> None:
        handle = self._readers.pop(reader, None)
        if handle is not None:
            handle.close()

    def stats(self) -> PoolStats:
        return self._pool.stats

    def alive(self) -> bool:
        return self._pool is not None and not self._pool.closed

    def env_apply(
        self, function: Any, env_ids: list[int] | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[Any]:
        return self._pool.env_apply(function, env_ids, args=args, kwargs=kwargs)  # type: ignore[no-any-return]

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

    def version(self) -> int:
        return self._version

    def close(self) -> None:
        self._closing = True

    def closing(self) -> bool:
        return self._closing


def remove_stale_pools() -> list[str]:
    """Run as a task on a node: removes the segments of its pools whose owner is dead (what
    ``shmpool gc`` does)."""
    from shmpool.registry import sweep_stale

    return sweep_stale()
