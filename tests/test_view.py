"""One view of a running pool's channels (:mod:`shmpool.view`): an attached handle's ``params``,
``param_specs`` and ``applied`` are the pool's, until the pool is gone."""

from __future__ import annotations

import helpers
import numpy as np
import pytest

import shmpool
from shmpool import Param


@pytest.mark.parametrize("engine", helpers.ENGINES)
def test_attach_sees_params_and_applied(engine: str, pool_name: str) -> None:
    with shmpool.launch(
        "CartPole-v1", 4, num_workers=2, name=pool_name, params={"length": Param(low=0.1, high=2)}, engine=engine
    ) as pool:
        pool.reset(seed=0)
        with shmpool.attach(pool.name) as handle:
            assert handle.num_envs == 4 and handle.alive
            assert handle.params.dtype == pool.params.dtype
            assert handle.param_specs["length"].high == 2
            handle.params["length"][2] = 1.1
            handle.params.write(3, length=0.3)
            with pytest.raises(ValueError, match="rejected"):
                handle.params.write(3, length=3.0)
            pool.step(np.zeros(4, int))
            assert handle.applied["length"].tolist() == [0.5, 0.5, 1.1, 0.3]
            with pytest.raises(ValueError, match="read-only"):
                handle.applied["length"][0] = 1.0
    with pytest.raises(shmpool.PoolNotFoundError, match="no pool named"):
        shmpool.attach(pool_name)
