"""shmpool.ray on a simulated Ray cluster: ``ray.cluster_utils.Cluster`` with two nodes on this
machine (each its own raylet and object store), talking over the loopback address only.

One cluster serves the whole module (it takes seconds to start); each test launches its own
cluster pool on it. The leak check is conftest's, less the processes Ray keeps for itself (see
``no_leftovers`` below); the module's teardown checks that Ray left nothing behind either.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import descendants, shm_entries
from helpers import CountingEnv, PairEnv, StructuredEnv, wait_gone
from ray_support import cmdline, kill_and_wait, no_leftovers_but_rays, ray_environment, wait_for

import shmpool
import shmpool.ray  # cheap: Ray itself is imported on first use
from shmpool.hooks import Reset

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason='needs Ray: pip install -e ".[ray]"'),
    pytest.mark.xdist_group("ray"),  # one cluster for the module
    # Beside the suite's other tests (xdist sends this group out first, with the heaviest), a test
    # takes a few times as long as alone; the first also starts the cluster.
    pytest.mark.timeout(300),
]

ROOT = Path(__file__).resolve().parents[1]
NODES = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A two-node Ray cluster on 127.0.0.1, with this process connected as its driver."""
    before = descendants(os.getpid())
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray puts Unix sockets in it
    with pytest.MonkeyPatch.context() as patch:
        ray_environment(patch, temp)
        import ray
        from ray._private import ray_constants
        from ray.cluster_utils import Cluster

        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # read at import: Ray may be imported already
        node_args = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 << 20}
        simulated = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
        try:
            for _ in range(NODES - 1):
                simulated.add_node(**node_args)
            assert simulated.address.startswith("127.0.0.1:"), simulated.address
            ray.init(address=simulated.address, log_to_driver=False)
            alive = [node for node in ray.nodes() if node["Alive"]]
            assert len(alive) == NODES and {node["NodeManagerAddress"] for node in alive} == {"127.0.0.1"}
            yield simulated
        finally:
            ray.shutdown()
            simulated.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
    alive = sorted(wait_for(lambda: descendants(os.getpid()) - before, 30.0))
    assert not alive, f"Ray left processes behind: {[(pid, cmdline(pid)[:80]) for pid in alive]}"


@pytest.fixture(autouse=True)
def no_leftovers(request: pytest.FixtureRequest, cluster: Any) -> Iterator[None]:
    """conftest's check, less the processes Ray keeps for itself; replaces conftest's for this module."""
    yield from no_leftovers_but_rays(request)


def assert_same(ours: Any, theirs: Any, path: str = "") -> None:
    """Equal values, types and dtypes, recursively; an episode's wall-clock time ``t`` is not compared."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and set(ours) == set(theirs), f"{path}: keys {sorted(ours)} != {sorted(theirs)}"
        for key in theirs:
            if not (path.endswith("['episode']") and key == "t"):
                assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(theirs, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(theirs), path
        for index, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{path}[{index}]")
    else:
        ours, theirs = np.asarray(ours), np.asarray(theirs)
        assert ours.dtype == theirs.dtype, f"{path}: dtype {ours.dtype} != {theirs.dtype}"
        if ours.dtype == object:  # final_obs, final_info: None or one env's value per row
            assert len(ours) == len(theirs), path
            for index, (a, b) in enumerate(zip(ours, theirs)):
                assert (a is None) == (b is None), f"{path}[{index}]"
                if a is not None:
                    assert_same(a, b, f"{path}[{index}]")
        else:
            np.testing.assert_array_equal(ours, theirs, err_msg=path)


def test_step_equals_a_local_pool_of_the_same_size(pool_name: str) -> None:
    rng = np.random.default_rng(0)
    with (
        shmpool.ray.launch("CartPole-v1", 6, name=pool_name, num_workers=1, seed=5) as fleet,
        shmpool.launch("CartPole-v1", 6, name=f"{pool_name}-local", num_workers=2, seed=5) as local,
    ):
        assert [node.env_ids for node in fleet.nodes] == [range(0, 3), range(3, 6)]
        assert len({node.node_id for node in fleet.nodes}) == NODES  # one pool per node
        assert fleet.observation_space == local.observation_space and fleet.action_space == local.action_space
        assert_same(fleet.reset(), local.reset())  # the launch seed: global env i starts from 5 + i
        for step in range(40):  # random actions: episodes end at different steps on different nodes
            actions = rng.integers(0, 2, 6)
            assert_same(fleet.step(actions), local.step(actions), f"step {step}")
        assert_same(fleet.reset(seed=11), local.reset(seed=11))
        for step in range(10):
            actions = rng.integers(0, 2, 6)
            assert_same(fleet.step(actions), local.step(actions), f"step {step} after reset(seed=11)")
        mask = np.array([False, False, False, False, True, False])  # node 0 is not even called
        assert_same(
            fleet.reset(seed=2, options={"reset_mask": mask}), local.reset(seed=2, options={"reset_mask": mask})
        )
        actions = rng.integers(0, 2, 6)
        assert_same(fleet.step(actions), local.step(actions), "step after a masked reset")

        # send/recv, one node at a time: each env's trajectory is the same as in a synchronous step.
        expected: tuple[Any, ...] = (local.reset(seed=3)[0], np.zeros(6), np.zeros(6, bool))
        fleet.async_reset(seed=3)
        for round_ in range(6):
            received = [fleet.recv() for _ in range(NODES)]
            env_ids = np.concatenate([infos["env_id"] for *_, infos in received])
            assert sorted(env_ids) == list(range(6))
            for infos in (part[4] for part in received):
                np.testing.assert_array_equal(infos["node"], infos["env_id"] // 3)
            order = np.argsort(env_ids)
            for field in range(3):
                got = np.concatenate([part[field] for part in received])[order]
                np.testing.assert_array_equal(got, expected[field], err_msg=f"round {round_}, field {field}")
            if round_ == 5:
                break
            actions = rng.integers(0, 2, 6)
            expected = local.step(actions)[:3]
            for node in fleet.nodes:
                if round_ % 2:  # the node by its index
                    fleet.send(actions[node.env_ids.start : node.env_ids.stop], node=node.index)
                else:  # by its env ids, as a local pool's send takes them: any order, one row each
                    env_ids = np.array(node.env_ids)[::-1]
                    fleet.send(actions[env_ids], env_ids)


def test_structured_actions_reach_each_node_as_a_local_pool_takes_them(pool_name: str) -> None:
    """Dict and Tuple actions are split leaf by leaf, a Tuple given as a list too (a local pool takes it)."""
    with (
        shmpool.ray.launch(StructuredEnv, 4, name=pool_name, num_workers=1, seed=1) as fleet,
        shmpool.launch(StructuredEnv, 4, name=f"{pool_name}-local", num_workers=1, seed=1) as local,
    ):
        assert_same(fleet.reset(), local.reset())
        batch = fleet.action_space.sample()
        as_lists = {"a": list(batch["a"]), "b": batch["b"]}
        assert_same(fleet.step(as_lists), local.step(batch))
        reversed_rows = {"a": [leaf[[3, 2]] for leaf in batch["a"]], "b": {k: v[[3, 2]] for k, v in batch["b"].items()}}
        fleet.send(reversed_rows, [3, 2])  # node 1's envs, last first
        observations, *_, infos = fleet.recv()
        assert infos["env_id"].tolist() == [2, 3]
        np.testing.assert_array_equal(observations["echo"]["a"][1], batch["a"][1][2:])


def test_a_write_reaches_exactly_those_envs_on_their_nodes(pool_name: str) -> None:
    params = {"a": shmpool.Param(0.0, low=-10.0, high=10.0), "b": shmpool.Param(0.0, low=-10.0, high=10.0)}
    with shmpool.ray.launch(PairEnv, 6, name=pool_name, num_workers=1, params=params, seed=0) as fleet:
        fleet.reset()
        version = fleet.params.write([1, 4], a=5.0)  # env 1 on node 0, env 4 on node 1
        observations = fleet.step(np.zeros(6, np.int64))[0]
        np.testing.assert_array_equal(observations[:, 0], [0, 5, 0, 0, 5, 0])
        assert fleet.applied_version() == [version, version]
        np.testing.assert_array_equal(fleet.applied["a"], [0, 5, 0, 0, 5, 0])

        later = fleet.params.write(np.array([4]), b=2.0)  # node 1 only
        assert later > version and fleet.applied_version() == [version, version]  # not stepped yet
        observations = fleet.step(np.zeros(6, np.int64))[0]
        np.testing.assert_array_equal(observations, [[0, 0], [5, 0], [0, 0], [0, 0], [5, 2], [0, 0]])
        assert fleet.applied_version() == [version, later]

        # Rows of values go to the ids in the order given, on whichever node each lives.
        fleet.params.write([5, 0, 3, 5], b=[7.0, 8.0, 9.0, 6.0])  # env 5 twice: its last row
        fleet.step(np.zeros(6, np.int64))
        np.testing.assert_array_equal(fleet.applied["b"], [8, 0, 0, 9, 2, 6])
        np.testing.assert_array_equal(fleet.params.accepted["b"], [8, 0, 0, 9, 2, 6])

        # Validated once, before any node is written: env 0's good value does not land either.
        with pytest.raises(ValueError, match=r"params\['a'\]\[5\] = 99.0 rejected: outside \[-10.0, 10.0\]"):
            fleet.params.write([0, 5], a=[1.0, 99.0])
        with pytest.raises(KeyError, match="no parameter 'c'"):
            fleet.params.write(None, c=1.0)
        with pytest.raises(TypeError, match="write them with params.write"):
            fleet.params["a"] = 1.0
        with pytest.raises(AttributeError, match=r"params.a = \.\.\. writes no parameter: say params.write\(env_ids"):
            fleet.params.a = 1.0
        with pytest.raises(AttributeError, match="did you mean 'b'"):
            fleet.params.bb = 1.0
        fleet.step(np.zeros(6, np.int64))
        np.testing.assert_array_equal(fleet.params["a"], [0, 5, 0, 0, 5, 0])

        # Another process's writes take versions from the same counter.
        with shmpool.ray.attach(pool_name) as handle:
            assert handle.num_envs == 6 and handle.alive
            third = handle.params.write(slice(2, 4), a=-1.0)  # env 2 on node 0, env 3 on node 1
            assert third > later
        observations = fleet.step(np.zeros(6, np.int64))[0]
        np.testing.assert_array_equal(observations[:, 0], [0, 5, -1, -1, 5, 0])
        assert fleet.applied_version() == [third, third]
        # A write of no env writes nothing and takes no version: it returns the current one, as a
        # local pool's does, in the writer and in an attached process.
        assert fleet.params.write([], a=3.0) == fleet.params.write(slice(6, None), a=3.0) == third
        with shmpool.ray.attach(pool_name) as handle:
            assert handle.params.write(np.array([], np.int64), a=3.0) == third
        assert fleet.params.write([2], a=0.5) == third + 1


def test_episode_records_come_from_every_node(pool_name: str) -> None:
    with shmpool.ray.launch(CountingEnv, 4, name=pool_name, num_workers=1, env_kwargs={"length": 3}) as fleet:
        fleet.reset(seed=0)
        for _ in range(7):  # episodes end at steps 3 and 7 (next-step autoreset in between)
            fleet.step(np.ones(4, np.int64))
        records = fleet.episodes.read()
        assert len(records) == 8 and fleet.episodes.lost == 0
        assert sorted(records["env_id"].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]  # global env ids
        np.testing.assert_array_equal(records["node"], records["env_id"] // 2)
        assert (records["length"] == 3).all() and (records["return"] == 3.0).all()
        assert len(fleet.episodes.read()) == 0  # this reader's cursor moved on
        stats = fleet.stats
        assert stats.episodes == 8 and [node.episodes for node in stats.nodes] == [4, 4]


def test_an_attached_curriculum_process_widens_a_parameter_on_every_node(pool_name: str, cluster: Any) -> None:
    length = shmpool.Param({"low": 0.5, "high": 0.5}, dist="uniform", low=0.1, high=2.0)
    command = [
        sys.executable,
        str(ROOT / "scripts" / "curriculum.py"),
        *("--ray", pool_name, "--ray-address", cluster.address, "--algo", "adr", "--param", "length"),
        *("--buffer", "1", "--p-boundary", "1", "--low-threshold", "-1", "--high-threshold", "0", "--delta", "0.1"),
        *("--poll", "0.02", "--attach-timeout", "60"),
    ]
    with shmpool.ray.launch("CartPole-v1", 4, name=pool_name, num_workers=1, params={"length": length}) as fleet:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            fleet.reset(seed=0)
            rng = np.random.default_rng(0)
            deadline = time.monotonic() + 90
            widened = [False] * NODES
            while not all(widened) and time.monotonic() < deadline:
                for _ in range(10):
                    fleet.step(rng.integers(0, 2, 4))
                block = fleet.params["length"]
                widened = [
                    bool((block["high"][node.env_ids.start : node.env_ids.stop] > 0.5 + 1e-9).any())
                    for node in fleet.nodes
                ]
            assert all(widened), f"ADR did not widen 'length' on every node: {widened}"
            applied = fleet.applied["length"]
            assert (applied >= 0.1).all() and (applied <= 2.0).all()
        finally:
            fleet.close()
            try:
                output, _ = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
    assert process.returncode == 0, output
    assert "attached to ClusterHandle" in output and "length: [0.5, 0.5] -> [" in output, output


def test_a_killed_host_actor_raises_an_error_naming_its_node(pool_name: str) -> None:
    import ray

    params = {"a": shmpool.Param(0.0, low=-10.0, high=10.0)}
    with shmpool.ray.launch(PairEnv, 4, name=pool_name, num_workers=1, params=params, timeout=20.0) as fleet:
        fleet.reset()
        fleet.step(np.zeros(4, np.int64))
        workers = fleet.worker_pids_by_node[1]
        kill_and_wait(ray.get_actor(f"shmpool/{pool_name}/1", namespace="shmpool"))

        started = time.monotonic()
        with pytest.raises(shmpool.ray.ClusterNodeError, match=r"node 1 \(.*\) of cluster pool") as raised:
            fleet.params.write([3], a=1.0)  # env 3 lives on node 1
        assert raised.value.node == 1 and raised.value.node_id == fleet.nodes[1].node_id
        with pytest.raises(shmpool.ray.ClusterNodeError, match="node 1 .* failed earlier"):
            fleet.step(np.zeros(4, np.int64))
        assert time.monotonic() - started < 15.0  # an error, not a hang
        assert not fleet.alive

        # Node 0's pool stays valid until close(): its envs take writes, and it can be attached.
        fleet.params.write([0], a=3.0)
        with shmpool.attach(f"{pool_name}-0") as node_pool:
            assert node_pool.alive and node_pool.params["a"][0] == 3.0
        assert not wait_gone(workers, 10.0), "node 1's pool workers outlived their host"
    assert not shm_entries(pool_name)


def test_launch_refuses_a_name_in_use_and_unknown_nodes(pool_name: str) -> None:
    with shmpool.ray.launch(CountingEnv, 1, name=pool_name, nodes=1, num_workers=1) as fleet:
        assert fleet.num_envs == 1 and len(fleet.nodes) == 1
        with pytest.raises(shmpool.PoolExistsError, match=pool_name):
            shmpool.ray.launch(CountingEnv, 1, name=pool_name, nodes=1, num_workers=1)
        with pytest.raises(ValueError, match="alive nodes"):
            shmpool.ray.launch(CountingEnv, 1, name=f"{pool_name}x", nodes=["ff" * 28], num_workers=1)
    with pytest.raises(shmpool.PoolNotFoundError, match=pool_name):
        shmpool.ray.attach(pool_name)
    with pytest.raises(TypeError, match="takes no batch_size"):
        shmpool.ray.launch(CountingEnv, 2, name=pool_name, nodes=1, num_workers=1, batch_size=1)


def test_send_misuse_and_calls_after_close_are_clear_errors(pool_name: str) -> None:
    fleet = shmpool.ray.launch(CountingEnv, 2, name=pool_name, nodes=1, num_workers=1)
    with fleet:
        fleet.async_reset(seed=0)
        *_, infos = fleet.recv()
        with pytest.raises(TypeError, match=r"node is a node index \(infos\['node'\]\[0\]"):
            fleet.send(np.ones(2, dtype=np.int64), node=infos["env_id"])  # env ids where the node goes
        with pytest.raises(TypeError, match="to name node 0, pass node=0"):
            fleet.send(np.ones(2, dtype=np.int64), 0)  # the old send(actions, node)
        with pytest.raises(ValueError, match=r"one whole node at a time: .* got \[1\]"):
            fleet.send(np.ones(1, dtype=np.int64), [1])  # part of a node
        with pytest.raises(ValueError, match="env_ids are those of node 0, but node=1"):
            fleet.send(np.ones(2, dtype=np.int64), infos["env_id"], node=1)
        fleet.send(np.ones(2, dtype=np.int64), infos["env_id"])  # a local pool's send(actions, env_ids)
        with pytest.raises(RuntimeError, match="node 0, which is still stepping"):
            fleet.send(np.ones(2, dtype=np.int64))
        *_, infos = fleet.recv()
        fleet.send(np.ones(2, dtype=np.int64))  # in flight at close
    fleet.close()
    for call in (lambda: fleet.step(np.ones(2, dtype=np.int64)), fleet.async_reset, fleet.recv):
        with pytest.raises(shmpool.PoolClosedError):
            call()


def test_a_refused_step_or_reset_moves_no_env_on_any_node(pool_name: str) -> None:
    """Actions, seeds and options are checked whole before any node gets its share, as a local pool
    checks them: a node that refused its share left the others stepped or reset, and named its own
    env ids. A NaN wait is refused, as on a local pool, instead of waiting for ever."""
    with shmpool.ray.launch(CountingEnv, 4, name=pool_name, num_workers=1, hooks=[Reset()]) as fleet:
        with pytest.raises(ValueError, match=r"first reset of cluster pool .* resets none of node\(s\) \[1\]'s"):
            fleet.reset(options={"reset_mask": np.array([True, True, False, False])})  # node 1 has nothing yet
        fleet.reset(seed=0)
        with pytest.raises(TypeError, match=r"reset_mask'\]` must be a numpy array"):
            fleet.reset(options={"reset_mask": None})
        with pytest.raises(ValueError, match=r"env 3: action 5 in actions is outside Discrete\(3\)"):
            fleet.step(np.array([1, 1, 1, 5]))
        with pytest.raises(ValueError, match=r"seed\[2\] = -1"):  # SeedError, as gymnasium raises
            fleet.reset(seed=[0, 1, -1, 3])
        with pytest.raises(TypeError, match="plain JSON data"):
            fleet.reset(options={"goal": object()})
        observations, *_ = fleet.step(np.array([1, 1, 1, 1]))
        assert observations[:, 0].tolist() == [1, 1, 1, 1] and fleet.global_step == 1  # one step, on every env
        assert fleet.np_random_seed == (0, 1, 2, 3)  # each env's, as a local pool's (not a trainer's draw)
        # A refused reset drops no send in flight; nor does a mask that leaves out envs of the node in flight.
        fleet.send(np.array([1, 1]), node=1)
        with pytest.raises(ValueError, match=r"seed\[2\] = -1"):
            fleet.reset(seed=[0, 1, -1, 3])
        with pytest.raises(RuntimeError, match=r"reset_mask leaves out envs of node\(s\) \[1\], whose send"):
            fleet.reset(options={"reset_mask": np.array([True, True, True, False])})
        observations, *_, infos = fleet.recv()
        assert infos["env_id"].tolist() == [2, 3] and observations[:, 0].tolist() == [2, 2]
        for wait_forever in (
            lambda: fleet.events.send("Reset", [0], wait=float("nan")),
            lambda: shmpool.ray.attach(pool_name, wait=float("nan")),
        ):
            with pytest.raises(ValueError, match="wait must be a number of seconds or None, got nan"):
                wait_forever()
        with pytest.raises(ValueError, match=r"env_ids must be one or more env ids .* got \[\]"):
            fleet.events.send("Reset", [])  # as a local pool refuses it


@pytest.fixture
def extra_node(cluster: Any) -> Iterator[Any]:
    """A third node of the module's cluster, for a test to remove; removed after the test if it did not."""
    node = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=80 << 20)
    cluster.wait_for_nodes()
    yield node
    if node in cluster.worker_nodes:  # the other tests count on the module's two nodes
        cluster.remove_node(node)
        cluster.wait_for_nodes()


def test_a_node_removed_mid_step_leaves_no_segment_after_close(
    pool_name: str, cluster: Any, extra_node: Any, tmp_path: Path
) -> None:
    import functools
    import threading

    import ray
    from helpers import StepMarkerEnv

    head = ray.get_runtime_context().get_node_id()
    quick, stuck = tmp_path / "quick", tmp_path / "stuck"
    for folder in (quick, stuck):
        folder.mkdir()
    envs = [functools.partial(StepMarkerEnv, str(quick), 0.0), functools.partial(StepMarkerEnv, str(stuck), 60.0)]
    nodes = [head, extra_node.node_id]
    fleet = shmpool.ray.launch(envs, 2, nodes=nodes, name=pool_name, num_workers=1, timeout=20.0)
    try:
        fleet.reset(seed=0)
        workers = fleet.worker_pids
        # Ray kills a dead actor's process group: a worker left in its host's would die with it,
        # before removing anything. Checked here too because on a shared machine another user's
        # launch may sweep the leftovers before the checks below look.
        assert all(os.getpgid(pid) == pid for pid in workers), "a worker stayed in its host's process group"
        errors: list[BaseException] = []

        def step() -> None:
            try:
                fleet.step(np.zeros(2, np.int64))
            except BaseException as error:  # noqa: BLE001 - checked below
                errors.append(error)

        stepping = threading.Thread(target=step)
        stepping.start()
        assert not wait_for(lambda: not list(stuck.iterdir()), 20.0), "node 1's env never started its step"
        cluster.remove_node(extra_node)
        stepping.join(30.0)
        assert not stepping.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], shmpool.ray.ClusterNodeError), errors
        assert errors[0].node == 1
        # Nothing can reach the removed node to sweep it: its own workers remove its pool.
        node_1 = f"{pool_name}-1"
        assert not wait_for(lambda: shm_entries(node_1), 15.0), f"left in /dev/shm: {shm_entries(node_1)}"
        assert not wait_gone(fleet.worker_pids_by_node[1], 5.0), "the removed node's pool workers outlived their host"
    finally:
        fleet.close()
    assert not wait_for(lambda: shm_entries(pool_name), 15.0), f"left in /dev/shm: {shm_entries(pool_name)}"
    assert not wait_gone(workers, 5.0), "pool workers outlived close()"


def test_reads_after_a_node_failed_raise_an_error_naming_it(pool_name: str) -> None:
    import ray

    params = {"sleep": shmpool.Param(0.0, low=0.0, high=0.01)}
    launch_options: dict[str, Any] = {"num_workers": 1, "params": params, "env_kwargs": {"length": 2}, "timeout": 20.0}
    with shmpool.ray.launch(CountingEnv, 4, name=pool_name, **launch_options) as fleet:
        fleet.reset(seed=0)
        for _ in range(2):  # every env ends an episode, on both nodes
            fleet.step(np.ones(4, np.int64))
        kill_and_wait(ray.get_actor(f"shmpool/{pool_name}/1", namespace="shmpool"))

        # Failing during the read: node 0 handed its records over (its cursor moved on); they ride
        # on the error rather than being dropped.
        with pytest.raises(shmpool.ray.ClusterNodeError, match=r"node 1 \(.*\) of cluster pool") as raised:
            fleet.episodes.read()
        assert raised.value.node == 1 and raised.value.records is not None
        assert sorted(raised.value.records["env_id"].tolist()) == [0, 1]
        assert (raised.value.records["node"] == 0).all()

        # Failed earlier: every read that needs node 1 raises the same way, before any node is read.
        for read in (fleet.episodes.read, lambda: fleet.applied, lambda: fleet.params["sleep"], lambda: fleet.stats):
            with pytest.raises(shmpool.ray.ClusterNodeError, match=r"node 1 \(.*\) .* failed earlier") as raised:
                read()
            assert raised.value.node == 1 and raised.value.records is None
        fleet.params.write([0], sleep=0.0)  # node 0's envs still take writes


def test_num_envs_is_the_total_split_evenly_over_the_nodes(pool_name: str) -> None:
    with pytest.raises(ValueError, match=r"num_envs=3 does not split evenly over 2 nodes .* such as 2 or 4"):
        shmpool.ray.launch(CountingEnv, 3, name=pool_name, num_workers=1)
    with pytest.raises(TypeError, match="needs num_envs"):
        shmpool.ray.launch(CountingEnv, name=pool_name, num_workers=1)
    started = time.monotonic()
    with pytest.raises(shmpool.PoolNotFoundError, match=pool_name):
        shmpool.ray.attach(pool_name, wait=0.5)
    assert time.monotonic() - started >= 0.5  # waited for it to appear
    fns = [CountingEnv] * 4
    with shmpool.ray.launch(fns, name=pool_name, num_workers=1, seed=0) as given:
        with shmpool.ray.launch(CountingEnv, 4, name=f"{pool_name}-new", num_workers=1, seed=0) as new:
            assert given.num_envs == new.num_envs == 4 and given.batch_size == new.batch_size == 2
            assert [node.env_ids for node in new.nodes] == [range(2), range(2, 4)]
            assert [node.env_ids for node in given.nodes] == [range(2), range(2, 4)]
            assert_same(given.reset(), new.reset())
            actions = np.array([0, 1, 2, 1])
            assert_same(given.step(actions), new.step(actions))
            with pytest.raises(AttributeError, match="launched without hooks, so it takes no events"):
                given.events  # noqa: B018
            with shmpool.ray.attach(pool_name, wait=5.0) as handle:
                assert handle.num_envs == 4 and handle.alive


def test_events_env_apply_global_step_and_state_dict_go_through_the_nodes(pool_name: str, tmp_path: Path) -> None:
    import pickle
    import threading

    from helpers import EventLog

    from shmpool.interfaces import HandleAPI, ParamsAPI, PoolAPI

    params = {"a": shmpool.Param(0.0, low=-10.0, high=10.0)}
    hooks = [EventLog(str(tmp_path))]
    options: dict[str, Any] = {"num_workers": 1, "params": params, "hooks": hooks, "event_capacity": 1, "seed": 0}
    with shmpool.ray.launch(PairEnv, 4, name=pool_name, **options) as fleet, shmpool.ray.attach(pool_name) as handle:
        assert isinstance(fleet, PoolAPI) and isinstance(fleet.params, ParamsAPI)
        assert isinstance(handle, HandleAPI) and isinstance(handle.params, ParamsAPI)
        assert fleet.batch_size == 2
        assert fleet.worker_pids == [pid for pids in fleet.worker_pids_by_node for pid in pids]
        assert len(fleet.worker_pids) == 2

        # env_apply: global env ids in any order, repeats kept, each run on its node.
        fleet.set_attr("a", [0.0, 1.0, 2.0, 3.0])
        assert fleet.env_apply("a", [3, 0, 2, 0]) == [3.0, 0.0, 2.0, 0.0]
        assert fleet.env_apply("a") == [0.0, 1.0, 2.0, 3.0] and fleet.call("a") == (0.0, 1.0, 2.0, 3.0)
        with pytest.raises(IndexError, match=r"env_apply: env ids \[4\] are outside 0..3"):
            fleet.env_apply("a", [4])

        # global_step: a step() counts one, a send() one, as a local pool counts; a handle agrees.
        fleet.reset(seed=0)
        fleet.step(np.zeros(4, np.int64))
        fleet.step(np.zeros(4, np.int64))
        assert fleet.global_step == handle.global_step == 2
        fleet.async_reset(seed=0)
        for _ in range(3):
            *_, infos = fleet.recv()
            fleet.send(np.zeros(2, np.int64), infos["env_id"])
        for _ in range(NODES):
            fleet.recv()
        assert fleet.global_step == handle.global_step == 5
        fleet.reset(seed=0)

        # events: each goes to the nodes that hold its envs, with their local env ids.
        with pytest.raises(KeyError, match="no hook named 'Nope'"):
            fleet.events.send("Nope", [0])
        fleet.events.send("Log", [1, 2], [7])  # env 1 on node 0, env 2 on node 1
        fleet.step(np.zeros(4, np.int64))
        fleet.events.send("Log", [0], [8])  # fills node 0's ring (capacity 1)
        with pytest.raises(shmpool.EventQueueFullError, match=r"an event ring on node 0 \(.*\) is full"):
            fleet.events.send("Log", [0, 3], [9])  # node 1 had room: it keeps its event
        outcome: list[object] = []

        def send_when_there_is_room() -> None:
            try:
                handle.events.send("Log", [1], [10], wait=None)
                outcome.append("sent")
            except BaseException as error:  # noqa: BLE001 - checked below
                outcome.append(error)

        sender = threading.Thread(target=send_when_there_is_room)
        sender.start()
        sender.join(0.5)
        assert sender.is_alive() and outcome == [], outcome  # node 0's ring is full and nobody steps
        fleet.step(np.zeros(4, np.int64))  # drains the rings
        sender.join(30.0)
        assert not sender.is_alive() and outcome == ["sent"], outcome
        fleet.step(np.zeros(4, np.int64))

        def logged(node: int) -> list[str]:  # payload and env ids (numpy 2 writes np.int64(3)), not the step
            file = tmp_path / f"events-{fleet.worker_pids_by_node[node][0]}.txt"
            lines = file.read_text().splitlines()
            return [re.sub(r"np\.int64\((-?\d+)\)", r"\1", re.sub(r" \d+ \[", " [", line)) for line in lines]

        assert logged(0) == ["7 [1]", "8 [0]", "10 [1]"]
        assert logged(1) == ["7 [0]", "9 [1]"]

        # state_dict: every node's state, loaded back whole (from any process) or not at all.
        fleet.params.write([1, 2], a=4.0)
        state = pickle.loads(pickle.dumps(fleet.state_dict()))
        assert state["num_envs"] == 4 and len(state["nodes"]) == NODES
        np.testing.assert_array_equal(np.concatenate([part["params"]["a"] for part in state["nodes"]]), [0, 4, 4, 0])
        fleet.params.write(None, a=-1.0)
        handle.load_state_dict(state)
        np.testing.assert_array_equal(fleet.params["a"], [0, 4, 4, 0])
        fleet.params.write(None, a=-2.0)
        refused = pickle.loads(pickle.dumps(state))
        refused["nodes"][1]["params"]["a"][:] = 99.0  # node 0's part loads, node 1 refuses its own
        with pytest.raises(ValueError, match=r"99\.0"):
            fleet.load_state_dict(refused)
        np.testing.assert_array_equal(fleet.params["a"], [-2, -2, -2, -2])  # node 0 got its state back
        with pytest.raises(ValueError, match="saved from 1 node"):
            fleet.load_state_dict({**state, "nodes": state["nodes"][:1]})
        with pytest.raises(ValueError, match="not a cluster pool state"):
            fleet.load_state_dict(state["nodes"][0])


def test_evaluate_on_a_cluster_pool_gives_the_local_result(pool_name: str) -> None:
    def policy(observations: np.ndarray) -> np.ndarray:
        return (observations[:, 2] > 0).astype(np.int64)

    grid = {"length": [0.4, 1.0], "masspole": [0.1, 0.2]}
    on_cluster = shmpool.evaluate(
        "CartPole-v1",
        policy,
        grid=grid,
        episodes=2,
        seed=4,
        launch=shmpool.ray.launch,
        name=pool_name,
        num_workers=1,
        progress=False,
    )
    local = shmpool.evaluate("CartPole-v1", policy, grid=grid, episodes=2, seed=4, num_workers=2, progress=False)
    assert on_cluster.cells == local.cells
    np.testing.assert_array_equal(on_cluster.returns, local.returns)
    np.testing.assert_array_equal(on_cluster.lengths, local.lengths)
