"""The option sets that forwarders of ``launch``'s options take (:mod:`shmpool.options`): PoolConfig's options
but the forwarder's own, typed so that static tools flag a misspelt or mistyped option."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import pool_config_options


@pytest.mark.parametrize(
    ("options_type", "taken_by_the_forwarder"),
    [
        ("LaunchOptions", ()),  # for users' own forwarders
        ("OptionsButBatchSize", ("batch_size",)),  # shmpool.torchrl.ShmpoolEnv
        ("OptionsButName", ("name",)),  # shmpool.ray.launch, shmpool.rllib.vector_env_creator
        ("OptionsButStartMethod", ("start_method",)),  # shmpool.sb3.ShmpoolVecEnv
        ("OptionsButSeedAndBatch", ("seed", "batch_size")),  # shmpool.envpool.make
    ],
)
def test_each_forwarders_typed_options_are_pool_configs_but_its_own(
    options_type: str, taken_by_the_forwarder: tuple[str, ...]
) -> None:
    """The TypedDicts that forwarders unpack (``**options: Unpack[...]``) name PoolConfig's options
    with its annotations, less those the forwarder takes itself."""
    import shmpool.options

    typed = getattr(shmpool.options, options_type)
    expected = {name: annotation for name, _, annotation in pool_config_options() if name not in taken_by_the_forwarder}
    assert typed.__optional_keys__ == set(expected) and not typed.__required_keys__
    declared = {}
    for klass in reversed(typed.__mro__):  # the annotations as written, base first
        declared.update(getattr(klass, "__annotations__", {}))
    written = {name: getattr(declared[name], "__forward_arg__", declared[name]) for name in expected}
    assert written == expected


MISSPELT = """
import shmpool
from shmpool.envpool import make
from shmpool.rllib import vector_env_creator
from shmpool.sb3 import ShmpoolVecEnv
from shmpool.torchrl import ShmpoolEnv
import shmpool.ray

shmpool.launch("CartPole-v1", 4, num_worker=2)
make("CartPole-v1", num_envs=4, num_worker=2)
vector_env_creator("CartPole-v1", num_worker=2)
ShmpoolVecEnv([], num_worker=2)
shmpool.launch("CartPole-v1", 4, num_workers="two")
ShmpoolEnv("CartPole-v1", 4, num_worker=2)
shmpool.ray.launch("CartPole-v1", 4, num_worker=2)
ShmpoolEnv("CartPole-v1", 4, num_workers=2, device="cpu")  # correct calls: no error
make("CartPole-v1", num_envs=4, batch_size=2, seed=1, num_workers=2, params=None)
"""


#: What mypy reads for the test below: shmpool's own signatures, the third-party packages they import
#: taken as ``Any`` (reading torch's, Ray's and numpy's stubs was most of a fresh mypy's time, and
#: checks none of the options).
MYPY_OWN_SIGNATURES = """
[mypy]
ignore_missing_imports = True
follow_imports = silent
incremental = False
[mypy-gymnasium.*,numpy.*,torch.*,torchrl.*,tensordict.*,stable_baselines3.*,ray.*,envpool.*,numba.*,mujoco.*]
follow_imports = skip
"""


def test_static_tools_see_every_launch_option(tmp_path: Path) -> None:
    """mypy flags a misspelt or mistyped option wherever launch options are taken, before anything runs."""
    pytest.importorskip("mypy", reason='needs mypy: pip install -e ".[test-tools]"')
    script = tmp_path / "misspelt.py"
    script.write_text(MISSPELT)
    config = tmp_path / "mypy.ini"
    config.write_text(MYPY_OWN_SIGNATURES)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), str(script)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in result.stdout.splitlines() if ": error:" in line]
    flagged = sorted(int(line.split(":")[1]) for line in lines)
    assert flagged == [9, 10, 11, 12, 13, 14, 15], result.stdout
    assert sum('Unexpected keyword argument "num_worker"' in line for line in lines) == 6, result.stdout
