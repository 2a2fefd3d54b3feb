"""The errors: one base class, the builtins they resemble, pickling across processes, and the old
names of renamed errors and modules."""

from __future__ import annotations

import pickle
import queue
import sys

import pytest

import shmpool
from shmpool import errors


@pytest.mark.parametrize(("old", "new"), sorted(errors.DEPRECATED_NAMES.items()))
def test_a_renamed_error_keeps_its_old_name_with_a_deprecation_warning(old: str, new: str) -> None:
    for module in (shmpool, errors):
        with pytest.warns(DeprecationWarning, match=f"{old} is deprecated; use {new}"):
            assert getattr(module, old) is getattr(errors, new)
    with pytest.warns(DeprecationWarning):
        exec(f"from shmpool.errors import {old}", {})


def test_shmpool_adapters_is_env_families_under_its_old_name_with_a_deprecation_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shmpool import env_families

    def forget() -> None:  # a module warns when it is imported, the first time only
        monkeypatch.delitem(sys.modules, "shmpool.adapters", raising=False)
        monkeypatch.delitem(vars(shmpool), "adapters", raising=False)  # delattr would import it

    warning = r"shmpool\.adapters is deprecated; use shmpool\.env_families"
    forget()
    with pytest.warns(DeprecationWarning, match=warning) as caught:
        import shmpool.adapters as imported
    forget()
    with pytest.warns(DeprecationWarning, match=warning) as caught_from:
        from shmpool import adapters
    forget()
    with pytest.warns(DeprecationWarning, match=warning) as caught_attribute:
        attribute = shmpool.adapters
    for warned in (caught, caught_from, caught_attribute):  # at the line that imported it
        assert [record.filename for record in warned] == [__file__]
    for module in (imported, adapters, attribute):
        assert module.__all__ == env_families.__all__
        assert all(getattr(module, name) is getattr(env_families, name) for name in env_families.__all__)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchError'"):
        shmpool.NoSuchError  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'NoSuchError'"):
        errors.NoSuchError  # noqa: B018


def test_every_error_derives_from_shmpool_error_and_survives_pickling() -> None:
    made = [
        errors.EventQueueFullError("full"),
        errors.WriterLockTimeoutError("held", holder_pid=123),
        errors.WorkerError("boom", worker_id=1, env_id=3, traceback_text="Traceback ..."),
        errors.KernelAttributeError("not modeled"),
    ]
    for error in made:
        assert isinstance(error, errors.ShmpoolError)
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
    assert isinstance(made[0], queue.Full) and isinstance(made[1], TimeoutError)
    assert pickle.loads(pickle.dumps(made[1])).holder_pid == 123
    assert pickle.loads(pickle.dumps(made[2])).env_id == 3


def test_the_old_timeout_keyword_of_waits_still_works_with_a_deprecation_warning(pool_name: str) -> None:
    with shmpool.launch(
        "CartPole-v1", 2, num_workers=1, name=pool_name, hooks=[shmpool.hooks.Perturb(every=None)], event_capacity=1
    ):
        with pytest.warns(DeprecationWarning, match=r"attach\(timeout=...\) is deprecated; use wait=..."):
            handle = shmpool.attach(pool_name, timeout=1.0)
        with handle:
            handle.events.send("Perturb", [0], [0.0])
            with (
                pytest.warns(DeprecationWarning, match=r"events.send\(timeout=...\) is deprecated"),
                pytest.raises(shmpool.EventQueueFullError),
            ):
                handle.events.send("Perturb", [0], [0.0], timeout=0.05)  # the ring holds one event


def test_a_cluster_node_error_keeps_its_node_and_records_through_pickling() -> None:
    import numpy as np

    import shmpool.ray

    assert shmpool.ray.ClusterNodeError is errors.ClusterNodeError
    error = errors.ClusterNodeError("node 1 (...) of cluster pool 'cl' failed", node=1, node_id="ab" * 28)
    error.records = np.zeros(2, [("env_id", "<i8"), ("node", "<i8")])
    assert isinstance(error, errors.ShmpoolError) and isinstance(error, RuntimeError)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is errors.ClusterNodeError and str(copy) == str(error)
    assert (copy.node, copy.node_id) == (1, "ab" * 28)
    np.testing.assert_array_equal(copy.records, error.records)
    assert pickle.loads(pickle.dumps(errors.ClusterNodeError("gone", node=0))).records is None
