"""The trainer's side of a cluster pool: ``ClusterPool``, one gymnasium ``VectorEnv`` over the
envs of every node's pool (global env ids in node order), which sends each host actor its rows of
the actions and joins what comes back. Made by ``shmpool.ray.launch``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from shmpool.interfaces import EnvsRandomness
from shmpool.options import check_env_ids
from shmpool.spaces import ActionCheckers, assemble

from .batching import concat, merge_infos
from .channels import _ClusterChannels
from .fleet import QUICK_CALL, _Fleet, import_ray
from .teardown import stop, sweep, wait_dead


class ClusterPool(_ClusterChannels, EnvsRandomness, VectorEnv):  # type: ignore[misc]  # np_random: each env's
    """A gymnasium ``VectorEnv`` over the envs of every node's pool (global env ids in node order).

    Made by ``shmpool.ray.launch``; use it as a context manager or call ``close``. ``reset``
    and ``step`` drive every node at once; ``async_reset``/``send``/``recv`` let a trainer overlap
    nodes (one node per ``recv``: ``batch_size`` is a node's envs). ``params``, ``applied``,
    ``applied_version()``, ``episodes``, ``events``, ``stats`` and ``state_dict()`` are the same as
    on an attached ``shmpool.ray.ClusterHandle``.
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
        self._global_step = 0
        self._channels(description, f"owner-{uuid.uuid4().hex[:12]}")
        #: Actions are checked here, whole, before any node gets its rows: a node refusing its share
        #: would leave the others stepped, and name its own env ids rather than the global ones.
        self._action_checkers = ActionCheckers(self.single_action_space, self._label)

    @property
    def name(self) -> str:  # type: ignore[override]
        """The cluster pool's name, by which ``shmpool.ray.attach`` finds it."""
        return self._fleet.name

    @property
    def batch_size(self) -> int:
        """Envs per ``recv()``: one node's envs (``recv`` returns one whole node)."""
        return len(self._fleet.nodes[0].env_ids)

    @property
    def global_step(self) -> int:
        """How many steps the cluster pool has taken: each ``step()`` (every node) counts one, and so
        does each ``send()`` (one node), as a local pool counts its async batches."""
        return self._global_step

    @property
    def worker_pids(self) -> list[int]:
        """The worker process ids of every node's pool, in node order (each on its own node: see
        ``worker_pids_by_node``)."""
        return [pid for pids in self._description["worker_pids"] for pid in pids]

    @property
    def worker_pids_by_node(self) -> list[list[int]]:
        """Each node's pool's worker process ids (on that node), in node order."""
        return [list(pids) for pids in self._description["worker_pids"]]

    @property
    def alive(self) -> bool:
        """Whether the cluster pool is open and none of its nodes has failed."""
        return not self.closed and not self._fleet.failed

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("failed" if self._fleet.failed else "running")
        return f"ClusterPool({self.name!r}, num_envs={self.num_envs}, nodes={len(self._fleet.nodes)}, {state})"

    def _check_open(self) -> None:
        self._fleet.check_open()

    # -- synchronous: every node at once ----------------------------------------------------------------

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every env (or those in ``options["reset_mask"]``); as a local pool's ``reset``.

        ``seed``: an int (global env ``i`` gets ``seed + i``), one seed (or None) per env, or None.
        Any ``send`` in flight is waited for and its results dropped; a ``reset_mask`` that leaves out
        envs of a node in flight raises ``RuntimeError`` instead (``recv()`` them first).
        """
        self._check_open()
        arguments = self._reset_arguments(seed, options)
        self._drain()
        results = self._fleet.call("reset", arguments, "reset")
        for index, (observations, _) in results.items():
            self._observations[index] = observations
        # A node masked out keeps its observations, as gymnasium's vector envs do.
        observations = concat([self._observations[k] for k in range(len(self._fleet.nodes))])
        infos = [results[k][1] if k in results else {} for k in range(len(self._fleet.nodes))]
        return observations, merge_infos(infos, self._counts())

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
        checked = self._action_checkers.check(actions, np.arange(self.num_envs))
        parts = [self._rows_of(checked, slice(fleet.starts[k], fleet.starts[k + 1])) for k in range(len(fleet.nodes))]
        results = fleet.call("step", {index: (part, True) for index, part in enumerate(parts)}, "step")
        self._global_step += 1
        observations, rewards, terminations, truncations, infos = zip(*(results[k] for k in range(len(fleet.nodes))))
        self._observations.update(enumerate(observations))
        flat = (np.concatenate(rewards), np.concatenate(terminations), np.concatenate(truncations))
        return concat(list(observations)), *flat, merge_infos(list(infos), self._counts())

    # -- asynchronous: one node at a time ---------------------------------------------------------------

    def async_reset(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Starts resetting every env (as ``reset``, without waiting); each ``recv()`` then returns
        the first observations of one node."""
        self._check_open()
        if options is not None and "reset_mask" in options:
            raise ValueError("async_reset resets every env: reset_mask belongs to reset()")
        fleet = self._fleet
        arguments = self._reset_arguments(seed, options)
        self._drain()
        fleet.check_nodes(list(arguments), "async_reset")
        for index, args in arguments.items():
            self._in_flight[index] = (fleet.hosts[index].reset.remote(*args), "reset")

    def send(self, actions: Any, env_ids: Any = None, *, node: int | None = None) -> None:
        """Starts stepping the envs ``env_ids`` (default: those the last ``recv()`` returned) with ``actions``, one row
        per env id in that order; returns at once: ``cluster.send(policy(observations), infos["env_id"])`` after each
        ``recv()``. A send steps one whole node: ``env_ids`` are the global env ids of one node (``infos["env_id"]`` of
        a ``recv()``, in any order), or ``node=k`` names the node instead (its envs in env id order).

        Raises:
            ValueError: for ``env_ids`` that are not exactly one node's, or that disagree with ``node``.
            RuntimeError: if that node is still stepping (``recv()`` it first), or nothing says which node to step (no
                ``env_ids``, no ``node`` and no ``recv()`` yet).
        """
        self._check_open()
        fleet = self._fleet
        if node is not None and (not isinstance(node, (int, np.integer)) or isinstance(node, (bool, np.bool_))):
            raise TypeError(
                f"send(actions, env_ids, *, node=k): node is a node index (infos['node'][0] of a recv()), "
                f"got {type(node).__name__}"
            )
        if isinstance(env_ids, (int, np.integer)):
            raise TypeError(
                f"send(actions, env_ids, *, node=k): env_ids are the global env ids of one node, as a local "
                f"pool's send takes them; to name node {env_ids}, pass node={env_ids}"
            )
        rows = None
        if env_ids is not None:
            of_ids, rows = self._node_of(env_ids)
            if node is not None and node != of_ids:
                raise ValueError(f"send(): env_ids are those of node {of_ids}, but node={node}")
            node = of_ids
        elif node is None:
            if self._last_recv is None:
                raise RuntimeError("send() without env_ids or node= needs a recv() first, to know which envs to step")
            node = self._last_recv
        node = int(node)
        if not 0 <= node < len(fleet.nodes):
            raise IndexError(f"node {node} is outside 0..{len(fleet.nodes) - 1} of cluster pool {self.name!r}")
        if node in self._in_flight:
            raise RuntimeError(f"send() to node {node}, which is still stepping: recv() its results first")
        fleet.check_nodes([node], "send")
        envs = fleet.nodes[node].env_ids
        ids = np.arange(envs.start, envs.stop) if env_ids is None else np.asarray(env_ids)
        checked = self._action_checkers.check(actions, ids)
        part = self._rows_of(checked, slice(None) if rows is None else rows)
        self._in_flight[node] = (fleet.hosts[node].step.remote(part, False), "step")
        self._global_step += 1

    def _rows_of(self, leaves: list[np.ndarray], rows: slice | np.ndarray) -> Any:
        """The actions of ``rows`` of checked leaf arrays, in the action space's structure (a Tuple as
        a tuple, whatever sequence the user gave)."""
        return assemble(self.single_action_space, iter([leaf[rows] for leaf in leaves]))

    def _node_of(self, env_ids: Any) -> tuple[int, np.ndarray | None]:
        """The node whose envs ``env_ids`` are (every one of them, once), and the order in which to
        take the rows of a send's actions to have them in that node's env order (None: as given)."""
        ids = check_env_ids(env_ids, self.num_envs, "send", unique=True)
        fleet = self._fleet
        node = int(np.searchsorted(fleet.starts, ids[0], side="right") - 1) if len(ids) else 0
        envs = fleet.nodes[node].env_ids
        if len(ids) != len(envs) or ids.min() != envs.start or ids.max() != envs.stop - 1:
            raise ValueError(
                f"send() steps one whole node at a time: env_ids must be the global env ids of one node "
                f"(infos['env_id'] of a recv()), e.g. {envs} of {fleet.nodes[node]}; got {ids.tolist()!r:.80}"
            )
        local = ids - envs.start
        return node, None if (np.diff(local) > 0).all() else np.argsort(local)

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Waits for the first node in flight to finish its step (or reset) and returns its envs'
        observations, rewards, terminations, truncations and infos, with ``infos["env_id"]`` (int32,
        global) and ``infos["node"]`` saying which env and node each row is.

        Raises:
            RuntimeError: if no node is in flight.
            ClusterNodeError: naming the node, if the first one to answer failed.
        """
        ray = import_ray()
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
        return concat([observations]), rewards, terminations, truncations, infos

    # -- control calls ------------------------------------------------------------------------------------

    def env_apply(
        self,
        function: Callable[..., Any] | str,
        env_ids: Sequence[int] | None = None,
        *,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Runs ``function(env, *args, **kwargs)`` on each env in ``env_ids`` (global; None: all)
        inside the workers of the nodes that hold them, and returns the results in that order, as a
        local pool's ``env_apply`` (``function`` travels to the nodes with Ray, then to the workers).

        Examples:
            >>> cluster.env_apply("spec")[0].id  # gymnasium's call, on every env of every node
            'CartPole-v1'
        """
        fleet = self._fleet
        what = repr(function)
        arguments = (tuple(args), dict(kwargs or {}))
        if env_ids is None:
            parts = fleet.call_all("env_apply", what, function, None, *arguments)
            return [value for part in parts for value in part]
        ids = check_env_ids(env_ids, self.num_envs, "env_apply", unique=False)
        located = fleet.locate(ids)
        calls = {index: (function, local.tolist(), *arguments) for index, (_, local) in located.items()}
        answers = fleet.call("env_apply", calls, what)
        results: list[Any] = [None] * len(ids)
        for index, (places, _) in located.items():
            for place, value in zip(places.tolist(), answers[index]):
                results[place] = value
        return results

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` of every env (or reads it), as gymnasium's ``VectorEnv.call``."""
        return tuple(self.env_apply(name, args=args, kwargs=kwargs))

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
        # Checked whole before any node resets, as a local pool checks them: one refusing its share
        # would leave the others reset. (Imported here: the local pool's package is not the cluster's.)
        from shmpool.pool.commands import check_reset_mask, checked_seeds, encode_options

        fleet = self._fleet
        seeds = checked_seeds(seed, self.num_envs)
        mask = None
        if options is not None:
            options = dict(options)
            if "reset_mask" in options:
                mask = check_reset_mask(options.pop("reset_mask"), self.num_envs)
                unseen = [node for node in fleet.nodes if node.index not in self._observations]
                skipped = [node.index for node in unseen if not mask[node.env_ids.start : node.env_ids.stop].any()]
                if skipped:
                    raise ValueError(
                        f"the first reset of cluster pool {self.name!r} must reset an env of every node: "
                        f"`options['reset_mask']` resets none of node(s) {skipped}'s"
                    )
                # As a local pool: a send's results that no recv() returned would be dropped for the
                # envs left out, and an episode end among them never seen.
                dropped = [k for k in sorted(self._in_flight) if not mask[fleet.nodes[k].env_ids].all()]
                if dropped:
                    raise RuntimeError(
                        f"cluster pool {self.name!r}: this reset_mask leaves out envs of node(s) {dropped}, whose "
                        f"send() no recv() returned yet: they would be dropped; recv() them first, or reset them too"
                    )
            encode_options(options)
        arguments = {}
        for node in fleet.nodes:
            start, stop = node.env_ids.start, node.env_ids.stop
            node_seed = None if seed is None else seeds[start:stop]  # None: the launch seed, on a first reset
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
        ray = import_ray()
        if not ray.is_initialized():  # disconnected: Ray ended this driver's actors, and their pools with them
            return
        try:  # first, so that an attached process that finds a host gone knows it is no failure
            ray.get(fleet.registry.close.remote(), timeout=QUICK_CALL)
        except Exception:  # noqa: S110 - the registry only tells attached processes; it is killed below
            pass
        live = {index: host for index, host in enumerate(fleet.hosts) if index not in fleet.failed}
        unconfirmed = stop(ray, self._actors, live, fleet.wait)
        for index in fleet.failed:  # failed earlier (died, stuck, cut off): killed by stop above
            wait_dead(ray, fleet.hosts[index], QUICK_CALL)
        swept = sorted(set(unconfirmed) | set(fleet.failed) | fleet.died)
        sweep(ray, [fleet.nodes[index].node_id for index in swept])
