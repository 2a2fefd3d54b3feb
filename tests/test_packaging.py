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


def _import_boxes() -> dict[str, set[str]]:
    """The import graph of the library, its worker code and the scripts: each module a box, each
    folder below ``shmpool`` (a package) one box, ``workers/`` one box per module; what each imports
    at run time (imports under ``if TYPE_CHECKING:`` run nothing)."""
    import ast

    def box(module: str) -> str | None:
        parts = module.split(".")
        if parts[0] == "workers" or parts[:2] == ["shmpool", "workers"]:
            rest = parts[1:] if parts[0] == "workers" else parts[2:]
            return f"workers/{rest[0]}" if rest else "workers/__init__"
        if parts[0] != "shmpool":
            return None
        if len(parts) == 1:
            return "shmpool/__init__"
        return f"shmpool/{parts[1]}/" if (ROOT / "shmpool" / parts[1]).is_dir() else f"shmpool/{parts[1]}"

    graph: dict[str, set[str]] = {}
    for path in [*ROOT.glob("shmpool/**/*.py"), *ROOT.glob("workers/*.py"), *ROOT.glob("scripts/*.py")]:
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ("shmpool.workers" if parts[0] == "workers" else parts[0]) + "".join(f".{p}" for p in parts[1:])
        own = box(name) if parts[0] != "scripts" else f"scripts/{parts[1]}"
        package = name.split(".") if parts[-1] == "__init__" else name.split(".")[:-1]
        tree = ast.parse(path.read_text())
        type_only = {
            id(node)
            for guard in ast.walk(tree)
            if isinstance(guard, ast.If) and "TYPE_CHECKING" in ast.unparse(guard.test)
            for node in ast.walk(guard)
        }
        imported = set()
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                imported.update(f"{base}.{alias.name}" for alias in node.names)
        graph.setdefault(own, set()).update(b for b in map(box, imported) if b is not None and b != own)  # type: ignore[arg-type]
    return graph


def test_the_import_graph_is_at_most_eleven_boxes_tall() -> None:
    """A box stands one above the tallest box it imports: the code stays a few rooms deep, so a
    newcomer follows a call in a few hops. (Cycles between modules are import-linter's check.)"""
    graph = _import_boxes()
    heights: dict[str, int] = {}

    def height(box: str, path: tuple[str, ...] = ()) -> int:
        if box not in heights:
            assert box not in path, f"import cycle: {' -> '.join((*path, box))}"
            heights[box] = 1 + max((height(below, (*path, box)) for below in graph.get(box, ())), default=0)
        return heights[box]

    tallest = max(graph, key=height)
    column = [tallest]
    while graph.get(column[-1]):
        column.append(max(graph[column[-1]], key=height))
    assert height(tallest) <= 11, " -> ".join(column)


def test_every_library_module_is_at_most_500_lines_and_none_keeps_a_deprecation() -> None:
    """Rooms a reader takes in whole, and no shims: nothing has shipped that would need one."""
    modules = [*ROOT.glob("shmpool/**/*.py"), *ROOT.glob("workers/**/*.py")]
    long = {str(path.relative_to(ROOT)): n for path in modules if (n := len(path.read_text().splitlines())) > 500}
    assert not long
    assert not [str(path.relative_to(ROOT)) for path in modules if "deprecat" in path.read_text().lower()]
