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
