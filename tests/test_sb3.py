"""shmpool.sb3: ShmpoolVecEnv against SB3's own vec-env test suites, and against DummyVecEnv.

SB3's ``tests/test_vec_envs.py`` and ``tests/test_vec_monitor.py`` ship in its source distribution,
not in its wheel, and are not copied here: :func:`sb3_suites` downloads the sdist of the installed
version (``pip download``), takes those two files out into a temporary folder and injects
ShmpoolVecEnv there:

- ``test_vec_envs.py``: ``ShmpoolVecEnv`` joins ``VEC_ENV_CLASSES`` (a textual rewrite of that line),
  so every test parametrized by it runs with ShmpoolVecEnv too. ``test_vec_seeding`` seeds
  ``functools.partial(SubprocVecEnv, start_method=...)`` for every class but DummyVecEnv; it is
  rewritten to use the class under test, so ShmpoolVecEnv is seeded under fork, spawn and forkserver.
- ``test_vec_monitor.py`` builds ``DummyVecEnv`` by name: a ``conftest.py`` written beside it runs
  each of its tests twice, the second time with ``DummyVecEnv`` in that module bound to ShmpoolVecEnv.

A rewrite that no longer matches (SB3 changed the file) fails the test with what to update. Only
the tests that run ShmpoolVecEnv are selected (``-k ShmpoolVecEnv``): SB3's CI tests its own classes.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import helpers
import numpy as np
import pytest
from helpers import CountingEnv, InfoEnv

if TYPE_CHECKING:
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmpool.sb3 import ShmpoolVecEnv

pytestmark = helpers.needs("stable_baselines3")


@pytest.fixture(autouse=True, scope="module")
def sb3_imported() -> None:
    """Imports SB3 (and so torch) when this module's first test runs: at module level every
    pytest-xdist worker would pay for it while collecting, for tests that run on one or two."""
    global make_vec_env, Monitor, DummyVecEnv, ShmpoolVecEnv
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmpool.sb3 import ShmpoolVecEnv


ROOT = Path(__file__).resolve().parents[1]
SUITES = ("test_vec_envs.py", "test_vec_monitor.py")

MONITOR_CONFTEST = '''"""Written by shmpool's tests/test_sb3.py: runs each test of test_vec_monitor.py with SB3's
DummyVecEnv and again with shmpool's ShmpoolVecEnv bound to the name DummyVecEnv in that module."""

import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

from shmpool.sb3 import ShmpoolVecEnv


@pytest.fixture(autouse=True)
def vec_env_class(request, monkeypatch):
    cls = getattr(request, "param", None)
    if cls is not None:
        monkeypatch.setattr(request.module, "DummyVecEnv", cls)
    return cls


def pytest_generate_tests(metafunc):
    if metafunc.module.__name__ == "test_vec_monitor":
        classes = [DummyVecEnv, ShmpoolVecEnv]
        metafunc.parametrize("vec_env_class", classes, indirect=True, ids=[c.__name__ for c in classes])
'''


def rewrite(text: str, pattern: str, replacement: str | Callable[[re.Match[str]], str], what: str) -> str:
    """``text`` with the one match of ``pattern`` replaced; fails the test if it does not match once."""
    new, count = re.subn(pattern, replacement, text, flags=re.MULTILINE | re.DOTALL)
    if count != 1:
        pytest.fail(f"SB3's {what} changed ({count} matches of {pattern!r}): update the injection in {__file__}")
    return new


def inject(folder: Path) -> None:
    """Adds ShmpoolVecEnv to the two suites in ``folder`` (see the module docstring)."""
    path = folder / "test_vec_envs.py"
    text = rewrite(
        path.read_text(),
        r"^VEC_ENV_CLASSES = \[(.*?)\]$",
        r"from shmpool.sb3 import ShmpoolVecEnv\n\nVEC_ENV_CLASSES = [\1, ShmpoolVecEnv]",
        "VEC_ENV_CLASSES in test_vec_envs.py",
    )

    def seed_the_tested_class(match: re.Match[str]) -> str:
        body = match.group(0)
        body = rewrite(
            body, r"^    start_methods = \[None\]$", "    tested_class = vec_env_class\n\\g<0>", "test_vec_seeding"
        )
        return rewrite(
            body,
            r"functools\.partial\(SubprocVecEnv, start_method=start_method\)",
            "functools.partial(tested_class, start_method=start_method)",
            "test_vec_seeding",
        )

    text = rewrite(text, r"^def test_vec_seeding\(.*?(?=^\S)", seed_the_tested_class, "test_vec_seeding")
    path.write_text(text)
    (folder / "conftest.py").write_text(MONITOR_CONFTEST)


@pytest.fixture(scope="module")
def sb3_suites(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding SB3's two vec-env suites, from the installed version's sdist, with
    ShmpoolVecEnv injected."""
    version = importlib.metadata.version("stable-baselines3")
    download = tmp_path_factory.mktemp("sb3-sdist")
    # pip reads the sdist's metadata by building it: with the setuptools at hand (torch brings it),
    # a second of work, where an isolated build first installs its own (the fallback).
    tries = [["--no-build-isolation"], []] if importlib.util.find_spec("setuptools") else [[]]
    for isolation in tries:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", *isolation]
            + ["-d", str(download), "--disable-pip-version-check", "--quiet", f"stable-baselines3=={version}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode == 0:
            break
    assert result.returncode == 0, f"pip could not download the sdist of stable-baselines3=={version}:\n{result.stderr}"
    (archive,) = download.glob("stable_baselines3-*.tar.gz")
    folder = tmp_path_factory.mktemp("sb3-tests")
    with tarfile.open(archive) as tar:
        for name in SUITES:
            # Only these two members are read, by name: nothing else of the archive lands on disk.
            member = tar.getmember(f"{archive.name.removesuffix('.tar.gz')}/tests/{name}")
            source = tar.extractfile(member)
            assert source is not None
            (folder / name).write_bytes(source.read())
    inject(folder)
    return folder


@pytest.mark.timeout(900)
def test_sb3_vec_env_suites_pass_with_shmpool(sb3_suites: Path) -> None:
    report = sb3_suites / "report.xml"
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "ShmpoolVecEnv", "-rs"]
        + ["--timeout", "300", f"--junitxml={report}", *SUITES],
        cwd=sb3_suites,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output, _ = process.communicate(timeout=850)
    assert process.returncode == 0, output[-6000:]
    cases = ElementTree.parse(report).getroot().iter("testcase")
    outcomes: dict[str, str] = {}
    for case in cases:
        kinds = {child.tag for child in case} & {"failure", "error", "skipped"}
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = kinds.pop() if kinds else "passed"
    passed = sorted(name for name, outcome in outcomes.items() if outcome == "passed")
    skipped = sorted(name for name, outcome in outcomes.items() if outcome == "skipped")
    assert not set(outcomes.values()) - {"passed", "skipped"}, output[-6000:]
    print(f"SB3 suites with ShmpoolVecEnv: {len(passed)} passed, {len(skipped)} skipped")  # shown by -rP
    # test_render needs an X server and stays skipped; everything else runs.
    assert all("test_render" in name for name in skipped), skipped
    assert sum("test_vec_monitor" in name for name in passed) == 5, passed
    assert sum("test_vec_envs" in name for name in passed) >= 14, passed
    # Segments of pools left unclosed by SB3's tests are freed when that process exits.
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(f"shmpool-{process.pid}-")]


# -- ShmpoolVecEnv against DummyVecEnv, and its own behaviour ------------------------------------------


def counting(length: int = 3, limit: int | None = None) -> gym.Env:
    """A CountingEnv (observation [steps, last action], terminates after ``length`` steps),
    truncated by a TimeLimit after ``limit`` steps if given."""
    env: gym.Env = CountingEnv(length=length)
    return gym.wrappers.TimeLimit(env, max_episode_steps=limit) if limit else env


def info_env(limit: int | None = None) -> gym.Env:
    """An InfoEnv (numeric infos, nested too; terminates after 4 steps), truncated after ``limit``."""
    env: gym.Env = InfoEnv()
    return gym.wrappers.TimeLimit(env, max_episode_steps=limit) if limit else env


def rollout(venv: Any, actions: np.ndarray) -> list[tuple[Any, ...]]:
    """Every step's (observations, rewards, dones, infos, reset_infos), after a seeded reset."""
    venv.seed(7)
    steps: list[tuple[Any, ...]] = [(venv.reset(), [dict(info) for info in venv.reset_infos])]
    for action in actions:
        observations, rewards, dones, infos = venv.step(action)
        steps.append((observations, rewards, dones, infos, [dict(info) for info in venv.reset_infos]))
    venv.close()
    return steps


def test_steps_match_dummy_vec_env(pool_name: str) -> None:
    fns = [info_env, functools.partial(info_env, limit=3), info_env]  # the second one is truncated
    actions = np.random.default_rng(0).integers(0, 2, size=(11, 3))
    ours = rollout(ShmpoolVecEnv(fns, num_workers=2, name=pool_name), actions)
    theirs = rollout(DummyVecEnv(fns), actions)
    finished = 0
    for mine, reference in zip(ours, theirs):
        if len(mine) == 5:  # a step (the first entry is the reset)
            dones, infos = mine[2], mine[3]
            assert mine[1].dtype == reference[1].dtype == np.float32  # rewards, as DummyVecEnv's buffer
            for env_id in np.flatnonzero(dones):
                # The pool's own episode statistics come on top (DummyVecEnv has them only with a Monitor).
                episode = infos[env_id].pop("episode")
                assert (episode["l"], episode["r"]) == ((3, 3.0) if env_id == 1 else (4, 4.0))
                finished += 1
            assert all("episode" not in info for info in infos)
        np.testing.assert_equal(mine, reference)
    assert finished == 2 + 3 + 2
    assert any(info["TimeLimit.truncated"] for step in ours[1:] for info in step[3])
    assert any("nested" in info for step in ours[1:] for info in step[3])


class _ReportsSuccess(gym.Wrapper):
    """Adds ``info["is_success"]`` to every step as an np.float32, the type gymnasium-robotics' goal envs give it."""

    def step(self, action: Any) -> tuple[Any, ...]:
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated, truncated, {**info, "is_success": np.float32(terminated)}


def monitored_info_env() -> gym.Env:
    """An InfoEnv that reports ``is_success``, under a Monitor that copies infos into ``info["episode"]``."""
    return Monitor(_ReportsSuccess(InfoEnv()), info_keywords=("is_success", "reached", "nested", "ratio"))


def typed(value: Any) -> Any:
    """``value`` with the type of every number and array beside it (``==`` takes np.float32(1) for 1.0),
    an episode's time left out."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items() if key != "t"}
    if isinstance(value, list):
        return [typed(item) for item in value]
    if isinstance(value, np.ndarray):
        return (np.ndarray, value.dtype.str, value.shape, value.tolist())
    return (type(value), value)


def test_infos_keep_the_types_dummy_vec_env_gives(pool_name: str) -> None:
    """Numpy scalars stay numpy scalars (an np.float32 ``is_success``, an np.bool_, an np.int32 nested
    deeper), in a step's infos and in a Monitor's ``info["episode"]``; Python numbers stay Python numbers."""
    actions = np.ones((9, 2), dtype=np.int64)  # every info key at steps 2 and 4 of each episode
    ours = rollout(ShmpoolVecEnv([monitored_info_env] * 2, num_workers=2, name=pool_name), actions)
    theirs = rollout(DummyVecEnv([monitored_info_env] * 2), actions)
    assert typed(ours[0][1]) == typed(theirs[0][1])  # reset_infos
    for mine, reference in zip(ours[1:], theirs[1:]):
        assert typed(mine[3]) == typed(reference[3]) and typed(mine[4]) == typed(reference[4])
    ended = [info for step in ours[1:] for info in step[3] if "episode" in info]
    assert len(ended) == 4 and all(type(info["episode"]["is_success"]) is np.float32 for info in ended)
    assert type(ended[0]["reached"]) is np.bool_ and type(ended[0]["nested"]["depth"]) is np.int32
    assert type(ended[0]["episode"]["r"]) is float and type(ended[0]["count"]) is int


def test_a_monitor_s_episode_wins_over_the_pool_s(pool_name: str) -> None:
    venv = make_vec_env(
        info_env,
        n_envs=2,
        vec_env_cls=ShmpoolVecEnv,
        monitor_kwargs={"info_keywords": ("count",)},  # only the Monitor's episode records "count"
        vec_env_kwargs={"name": pool_name},
    )
    try:
        assert venv.env_is_wrapped(Monitor) == [True, True]
        venv.reset()
        for _ in range(4):
            _, _, dones, infos = venv.step(np.array([1, 1]))
        assert dones.all()
        assert [info["episode"]["r"] for info in infos] == [4.0, 4.0]
        assert [info["episode"]["count"] for info in infos] == [4, 4]
        np.testing.assert_equal([info["terminal_observation"] for info in infos], np.full((2, 1), 0.4, np.float32))
    finally:
        venv.close()


def _cut_short_outside_the_monitor(env: gym.Env) -> gym.Env:
    """An end of episode that the Monitor inside never sees, as an Atari stack's EpisodicLifeEnv makes."""
    return gym.wrappers.TimeLimit(env, max_episode_steps=10)


def test_ends_a_monitor_inside_does_not_count_carry_no_episode_as_under_dummy_vec_env(pool_name: str) -> None:
    """SB3 counts an episode where ``info["episode"]`` is (``evaluate_policy``, ``ep_rew_mean``): where
    the envs have a Monitor, only the Monitor says so, as under DummyVecEnv; the metadata is env 0's."""
    made = {
        cls: make_vec_env("CartPole-v1", 2, seed=0, wrapper_class=_cut_short_outside_the_monitor, vec_env_cls=cls, **kw)
        for cls, kw in ((DummyVecEnv, {}), (ShmpoolVecEnv, {"vec_env_kwargs": {"name": pool_name}}))
    }
    try:
        assert made[ShmpoolVecEnv].metadata == made[DummyVecEnv].metadata
        for venv in made.values():
            venv.reset()
        for step in range(10):
            actions = np.array([step % 2, (step + 1) % 2])
            results = [venv.step(actions) for venv in made.values()]
            dones, episodes = zip(*((d.tolist(), [i.get("episode") for i in infos]) for _, _, d, infos in results))
            assert dones[0] == dones[1] and episodes[0] == episodes[1], (step, dones, episodes)
        assert dones[0] == [True, True] and episodes[0] == [None, None]  # the 10-step cut: the Monitor saw no end
    finally:
        for venv in made.values():
            venv.close()


def test_seeds_and_per_env_options_apply_at_the_next_reset_only(pool_name: str) -> None:
    venv = ShmpoolVecEnv([CountingEnv] * 3, num_workers=2, name=pool_name)
    try:
        venv.seed(10)
        venv.set_options([{"offset": 5}, {}, {"offset": 5}])
        observations = venv.reset()
        assert observations[:, 0].tolist() == [5.0, 0.0, 5.0]
        assert venv.get_attr("seed_used") == [10, 11, 12]
        venv.set_options({"offset": 2})  # one dict: the same options for every env, in one reset
        assert venv.reset()[:, 0].tolist() == [2.0, 2.0, 2.0]
        assert venv.reset()[:, 0].tolist() == [0.0, 0.0, 0.0]  # options and seeds are used once
        assert venv.get_attr("seed_used") == [10, 11, 12]
    finally:
        venv.close()


def test_per_env_calls_take_sb3_indices(pool_name: str) -> None:
    fns = [functools.partial(counting, 3), functools.partial(counting, 4, limit=10), functools.partial(counting, 5)]
    venv = ShmpoolVecEnv(fns, name=pool_name)
    try:
        assert venv.get_attr("length") == [3, 4, 5]
        assert venv.get_attr("length", indices=-1) == [5]
        assert venv.get_attr("length", indices=[np.int64(0), -1]) == [3, 5]
        assert venv.set_attr("tag", 9, indices=range(2)) is None  # on the outermost wrapper, as SB3's
        assert venv.get_attr("tag", indices=[0, 1]) == [9, 9] and not venv.has_attr("tag")
        assert venv.env_method("get_wrapper_attr", "length", indices=[1, 2]) == [4, 5]
        assert venv.has_attr("raise_at")
        with pytest.raises(IndexError, match="out of range for 3 envs"):
            venv.get_attr("length", indices=3)
        with pytest.raises(AttributeError):
            venv.env_method("no_such_method", indices=0)
        assert venv.env_is_wrapped(gym.wrappers.TimeLimit) == [False, True, False]
        assert venv.env_is_wrapped(gym.wrappers.TimeLimit, indices=1) == [True]
        venv.reset()  # still usable after the env's error
    finally:
        venv.close()


def test_get_images_renders_every_env(pool_name: str) -> None:
    venv = make_vec_env(
        "CartPole-v1",
        n_envs=2,
        vec_env_cls=ShmpoolVecEnv,
        env_kwargs={"render_mode": "rgb_array"},
        vec_env_kwargs={"name": pool_name},
    )
    try:
        venv.reset()
        images = venv.get_images()
        assert [image.shape for image in images] == [(400, 600, 3)] * 2
        assert venv.render().shape == (800, 600, 3)  # tiled by SB3: one above the other
    finally:
        venv.close()


def test_one_env_object_returned_twice_into_one_worker_is_refused(pool_name: str) -> None:
    env = CountingEnv()
    with pytest.raises(ValueError, match=r"env_fns\[0\] and env_fns\[1\] returned the same env object"):
        ShmpoolVecEnv([lambda: env] * 2, num_workers=1, start_method="fork", name=pool_name)


@pytest.mark.parametrize("option", [{"copy": False}, {"autoreset_mode": "NextStep"}])
def test_options_sb3_cannot_work_with_are_refused(option: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="ShmpoolVecEnv needs"):
        ShmpoolVecEnv([CountingEnv], **option)


def test_sb3_ppo_script_documents_its_options() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/sb3_ppo.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "--quick" in result.stdout and "(default: 50000)" in result.stdout


def test_sb3_ppo_script_quick_prints_its_evaluations() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/sb3_ppo.py", "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("PPO on CartPole-v1") and "mean return" in lines[1]
    assert [line.split()[0] for line in lines[3:5]] == ["1,024", "2,048"]
    assert "env steps in" in lines[-1]
    assert "env steps: mean return" in result.stderr
