"""Every kind of pool and handle offers the API of shmpool.interfaces, signatures included."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

import pytest

import shmpool
from shmpool.handle import PoolHandle
from shmpool.interfaces import HandleAPI, ParamsAPI, PoolAPI
from shmpool.param_block import ParamBlock
from shmpool.pool import Pool
from shmpool.ray import ClusterHandle, ClusterParams, ClusterPool  # Ray itself is imported on first use only

IMPLEMENTATIONS = [
    (Pool, PoolAPI),
    (PoolHandle, HandleAPI),
    (ParamBlock, ParamsAPI),
    (ClusterPool, PoolAPI),
    (ClusterHandle, HandleAPI),
    (ClusterParams, ParamsAPI),
]


def members(protocol: type) -> dict[str, Any]:
    """The protocol's members (its own and inherited), by name."""
    found: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if klass is object or not getattr(klass, "_is_protocol", False):
            continue
        found.update({name: value for name, value in vars(klass).items() if not name.startswith("_")})
    if "__getitem__" in vars(protocol):
        found["__getitem__"] = vars(protocol)["__getitem__"]
    return found


def parameters(function: Any) -> list[tuple[str, Any, bool]]:
    """Name, kind and whether it has a default, of each parameter but ``self``."""
    return [
        (p.name, p.kind, p.default is not inspect.Parameter.empty)
        for p in inspect.signature(function).parameters.values()
        if p.name != "self"
    ]


@pytest.mark.parametrize(("implementation", "protocol"), IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_implementation_offers_its_protocol_with_the_same_signatures(implementation: type, protocol: type) -> None:
    for name, member in members(protocol).items():
        declared = any(name in vars(klass).get("__annotations__", {}) for klass in implementation.__mro__)
        assert hasattr(implementation, name) or declared, f"{implementation.__name__} lacks {name}"
        if isinstance(member, property):
            # A property, or an attribute every instance sets (gymnasium's VectorEnv.num_envs).
            offered = inspect.getattr_static(implementation, name, None)
            assert isinstance(offered, property) or declared, f"{implementation.__name__}.{name} must be a property"
        else:
            mine = parameters(getattr(implementation, name))
            wanted = parameters(member)
            # Extra keyword-only parameters with defaults, or **kwargs, are fine: a call written for
            # the protocol works.
            extra_ok = [
                p
                for p in mine
                if p not in wanted
                and (p[1] is inspect.Parameter.VAR_KEYWORD or p[1] is inspect.Parameter.KEYWORD_ONLY and p[2])
            ]
            assert [p for p in mine if p not in extra_ok] == wanted, (
                f"{implementation.__name__}.{name}{mine} != {wanted}"
            )


def test_a_launched_pool_and_an_attached_handle_are_instances(pool_name: str) -> None:
    # With a hook: the events of a pool without hooks raise AttributeError, so it does not count as one.
    hooks = [shmpool.hooks.Perturb(every=None)]
    with shmpool.launch(
        "CartPole-v1", 2, num_workers=1, name=pool_name, params={"length": shmpool.Param()}, hooks=hooks
    ) as pool:
        assert isinstance(pool, PoolAPI) and isinstance(pool.params, ParamsAPI)
        assert pool.alive
        with shmpool.attach(pool_name) as handle:
            assert isinstance(handle, HandleAPI) and isinstance(handle.params, ParamsAPI)
            assert handle.alive
    assert not pool.alive


def test_the_cluster_classes_are_checked_without_ray() -> None:
    # The signature checks above need no Ray: importing shmpool.ray imports Ray on first use only,
    # so this file runs where the extra is not installed.
    code = "import sys, shmpool.ray; assert not any(m == 'ray' or m.startswith('ray.') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
