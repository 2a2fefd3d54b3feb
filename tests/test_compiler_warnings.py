"""MuJoCo's compiler warnings reach the user once per pool, as Python warnings
(:mod:`shmpool.compiler_warnings`): the trainer's probe warns, the workers' compiles stay quiet. MuJoCo
prints from C, so the pool runs in a subprocess whose stderr is read."""

from __future__ import annotations

import helpers
import pytest

LAUNCH_AND_COUNT = """
import sys, warnings
import shmpool

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    options = {"num_workers": 2, "trainer_slot": False, "engine": sys.argv[2]}
    with shmpool.launch("HalfCheetah-v5", 4, name=sys.argv[1], **options) as pool:
        pool.reset(seed=0)
        pool.step(pool.action_space.sample())
print(sum("settotalmass" in str(warning.message) for warning in caught))
print(caught[0].category.__name__, caught[0].filename)
"""


@helpers.needs("mujoco")
@pytest.mark.parametrize("engine", ["python", "mujoco"])
def test_a_compiler_warning_comes_once_per_pool_as_a_python_warning(pool_name: str, engine: str) -> None:
    result = helpers.run_script(LAUNCH_AND_COUNT, pool_name, engine, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    count, where = result.stdout.splitlines()
    assert count == "1" and where == "RuntimeWarning <string>"  # at the launch call, in the trainer
    assert "settotalmass" not in result.stderr  # no worker printed its own
