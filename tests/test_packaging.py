"""How shmpool installs: the worker code lives in shmpool's namespace, so user modules cannot shadow it;
its submodules are attributes of the package; its layers import one way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TRAIN = """
import sys
import workers  # the user's own module, imported first on purpose
import shmpool

if __name__ == "__main__":  # spawn and forkserver re-import this file in the workers
    assert workers.MINE, "the user's workers module was replaced"
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=sys.argv[1], start_method=sys.argv[2]) as pool:
        pool.reset(seed=0)
        _, rewards, *_ = pool.step([0, 1])
    print(rewards.tolist(), workers.MINE)
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("shape", ["module", "package"])
def test_a_user_module_named_workers_does_not_interfere(
    pool_name: str, tmp_path: Path, start_method: str, shape: str
) -> None:
    if shape == "module":
        (tmp_path / "workers.py").write_text("MINE = True\n")
    else:
        (tmp_path / "workers").mkdir()
        (tmp_path / "workers" / "__init__.py").write_text("MINE = True\n")
    (tmp_path / "train.py").write_text(TRAIN)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "train.py", pool_name, start_method],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["[1.0,", "1.0]", "True"]


def test_the_worker_package_is_shmpools() -> None:
    import shmpool.workers.main

    assert shmpool.workers.main.__name__ == "shmpool.workers.main"
    assert "workers" not in sys.modules or getattr(sys.modules["workers"], "__file__", "") != shmpool.workers.__file__


def test_import_shmpool_is_cheap_and_still_offers_every_public_name() -> None:
    """``import shmpool`` imports neither gymnasium nor numpy (an attached curriculum or the CLI
    starts fast); every public name comes on first use, and ``dir`` lists them for tab completion.
    Once the pool's code is imported, the errors are plain attributes: ``except
    shmpool.StepSentInterrupt`` runs no Python code, where a Ctrl-C could replace the exception."""
    code = (
        "import sys, shmpool\n"
        "heavy = sorted(m for m in ('gymnasium', 'numpy', 'multiprocess') if m in sys.modules)\n"
        "listed = all(name in dir(shmpool) for name in shmpool.__all__)\n"
        "import shmpool.pool\n"
        "bound = 'StepSentInterrupt' in vars(shmpool) and 'WorkerError' in vars(shmpool)\n"
        "print(heavy, listed, bound, shmpool.PoolClosedError.__module__, shmpool.launch.__module__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "True", "True", "shmpool.errors", "shmpool.pool.pool"]


def test_env_family_modules_are_attributes_of_shmpool() -> None:
    import shmpool

    assert shmpool.classic_control.__name__ == "shmpool.classic_control"
    assert shmpool.env_families.__name__ == "shmpool.env_families"


def test_the_layers_hold_and_no_modules_import_each_other() -> None:
    """import-linter's contracts in pyproject.toml: the layers (integrations, pool, channels,
    layout, OS and protocol) and no import cycle between shmpool's modules."""
    root = Path(__file__).resolve().parents[1]
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in result.stdout


def pool_config_options() -> list[tuple[str, object, object]]:
    """``PoolConfig``'s options after ``env`` and ``num_envs``: (name, default, annotation) in order."""
    from dataclasses import MISSING, fields

    from shmpool.config import PoolConfig

    return [
        (option.name, None if option.default is MISSING else option.default, option.type)
        for option in fields(PoolConfig)
        if option.init and option.name not in ("env", "num_envs")
    ]


def test_launch_writes_out_every_option_of_pool_config_in_order_with_its_default() -> None:
    import inspect

    import shmpool

    parameters = list(inspect.signature(shmpool.launch).parameters.values())
    assert [(p.name, p.kind) for p in parameters[:2]] == [
        ("env", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("num_envs", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    ]
    options = [(p.name, p.default, p.annotation) for p in parameters[2:]]
    assert options == pool_config_options()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[2:])


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


def test_every_package_folder_is_installed() -> None:
    """Each folder of ``shmpool`` with an ``__init__.py`` is in ``pyproject.toml``'s package list,
    without which a wheel would leave it out (an editable install would not notice)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "shmpool").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found | {"shmpool.workers"} == listed
