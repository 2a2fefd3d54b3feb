"""The errors: one base class, the builtins they resemble, and pickling across processes."""

from __future__ import annotations

import pickle
import queue

import pytest

import shmpool
from shmpool import errors


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
