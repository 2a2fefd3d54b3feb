"""``shmpool.evaluate`` (:mod:`shmpool.evaluation`): a policy over a grid or samples of parameter
cells, each episode reproducible from its seed, checked against a ``SyncVectorEnv`` loop by hand."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from helpers import ENGINES, needs

import shmpool


def lean_policy(observations: np.ndarray) -> np.ndarray:
    """Pushes toward the pole's lean: episodes of tens of steps, longer for longer poles."""
    return (observations[:, 2] > 0).astype(np.int64)


def by_hand(
    cells: list[dict[str, Any]], episodes: int, seed: int, max_episode_steps: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each cell's episodes in a ``SyncVectorEnv`` of its own, one env per episode, reset with the
    seeds ``evaluate`` promises; an env's first episode is the one recorded."""
    returns = np.zeros((len(cells), episodes))
    lengths = np.zeros((len(cells), episodes), dtype=np.int64)
    for i, cell in enumerate(cells):
        envs = gym.vector.SyncVectorEnv(
            [lambda: gym.make("CartPole-v1", max_episode_steps=max_episode_steps)] * episodes
        )
        for env in envs.envs:
            for name, value in cell.items():
                setattr(env.unwrapped, name, value)
            cartpole = env.unwrapped
            cartpole.total_mass = cartpole.masspole + cartpole.masscart  # what __init__ derives
            cartpole.polemass_length = cartpole.masspole * cartpole.length
        observations, _ = envs.reset(seed=[seed + i * episodes + j for j in range(episodes)])
        running, steps = np.zeros(episodes), np.zeros(episodes, dtype=np.int64)
        done = np.zeros(episodes, dtype=bool)
        while not done.all():
            observations, rewards, terminations, truncations, _ = envs.step(lean_policy(observations))
            running += np.where(done, 0.0, rewards)
            steps += ~done
            done |= terminations | truncations
        returns[i], lengths[i] = running, steps
        envs.close()
    return returns, lengths


GRID = {"length": [0.3, 0.6, 1.2], "masspole": [0.05, 0.2]}


@pytest.mark.parametrize(
    ("num_envs", "num_workers", "engine"),
    [(None, 2, "python"), (5, 1, "python"), pytest.param(4, 2, "numba", marks=ENGINES[1].marks)],
)
def test_a_grid_gives_what_a_hand_written_loop_gives_whatever_the_pool(
    num_envs: int | None, num_workers: int, engine: Any
) -> None:
    evaluation = shmpool.evaluate(
        "CartPole-v1",
        lean_policy,
        grid=GRID,
        episodes=3,
        seed=5,
        num_envs=num_envs,
        num_workers=num_workers,
        engine=engine,
        progress=False,
    )
    assert evaluation.cells == [
        {"length": length, "masspole": mass} for length in GRID["length"] for mass in GRID["masspole"]
    ]
    returns, lengths = by_hand(evaluation.cells, 3, 5)
    np.testing.assert_array_equal(evaluation.returns, returns)
    np.testing.assert_array_equal(evaluation.lengths, lengths)
    assert evaluation.returns[-1].mean() > 2 * evaluation.returns[0].mean()  # longer poles last longer


def test_samples_are_drawn_within_the_bounds_from_the_seed() -> None:
    params = {"length": shmpool.Param(low=0.2, high=1.5), "masspole": shmpool.Param(low=0.05, high=0.5)}
    runs = [
        shmpool.evaluate(
            "CartPole-v1", lean_policy, samples=4, episodes=2, seed=seed, params=params, num_workers=2, progress=False
        )
        for seed in (1, np.int64(1), 2)  # numpy's ints are ints
    ]
    first, again, other = runs
    assert len(first.cells) == 4 and first.returns.shape == (4, 2) and not first.from_grid
    assert first.cells == again.cells and first.cells != other.cells
    np.testing.assert_array_equal(first.returns, again.returns)
    for cell in first.cells + other.cells:
        assert 0.2 <= cell["length"] <= 1.5 and 0.05 <= cell["masspole"] <= 0.5
    np.testing.assert_array_equal(first.returns, by_hand(first.cells, 2, 1)[0])


def test_max_episode_steps_ends_the_episodes_of_an_env_that_never_ends() -> None:
    """Pendulum without gymnasium's time limit never ends an episode: cut after 30 steps, each
    episode returns what 30 steps of a bare env, reset with its seed, return. One env runs them
    all, so each cut is followed by the next episode's reset, seed and cell."""
    from gymnasium.envs.classic_control.pendulum import PendulumEnv

    def still(observations: np.ndarray) -> np.ndarray:
        return np.zeros((len(observations), 1), dtype=np.float32)

    grid = {"g": [10.0, 4.0]}
    evaluation = shmpool.evaluate(
        PendulumEnv, still, grid=grid, episodes=2, max_episode_steps=30, seed=7, num_envs=1, progress=False
    )
    assert evaluation.lengths.tolist() == [[30, 30], [30, 30]]
    for i, g in enumerate(grid["g"]):
        for j in range(2):
            env = PendulumEnv(g=g)
            env.reset(seed=7 + 2 * i + j)
            expected = sum(float(env.step(np.zeros(1, np.float32))[1]) for _ in range(30))
            assert evaluation.returns[i, j] == pytest.approx(expected, rel=1e-12), (g, j)


def test_max_episode_steps_cuts_only_the_episodes_that_run_longer() -> None:
    """CartPole's own end comes first in some episodes of short poles, the cut at 20 steps in those
    of long ones: each episode is what the loop by hand gives with gymnasium's time limit at 20."""
    grid = {"length": [0.2, 2.0]}
    evaluation = shmpool.evaluate(
        "CartPole-v1", lean_policy, grid=grid, episodes=3, max_episode_steps=20, seed=3, num_envs=2, progress=False
    )
    cells = evaluation.cells
    returns, lengths = by_hand(cells, 3, 3, max_episode_steps=20)
    np.testing.assert_array_equal(evaluation.lengths, lengths)
    np.testing.assert_array_equal(evaluation.returns, returns)
    assert (lengths < 20).any() and (lengths[1] == 20).all()  # both kinds of end happened


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({}, ValueError, "give either grid= .* or samples="),
        ({"grid": GRID, "samples": 3}, ValueError, "not both"),
        ({"grid": {"length": []}}, ValueError, "non-empty list"),
        ({"grid": {"length": [0.5]}, "episodes": 0}, ValueError, "episodes must be >= 1, got 0"),
        ({"grid": {"length": [0.5]}, "episodes": True}, ValueError, "episodes must be an int, got True"),
        (
            {"samples": True, "params": {"length": shmpool.Param(low=0.1, high=2.0)}},
            ValueError,
            "samples must be an int",
        ),
        ({"grid": {"length": [0.5]}, "seed": None}, ValueError, "seed must be an int, got None"),
        ({"grid": {"length": [0.5]}, "seed": -3}, ValueError, "seed must be >= 0, got -3"),
        ({"grid": {"length": 0.5}}, ValueError, "non-empty list"),
        ({"grid": {"length": (value for value in [0.5])}}, ValueError, "non-empty list"),
        ({"grid": {"length": np.array(0.5)}}, ValueError, "non-empty list"),
        ({"grid": [("length", [0.5])]}, ValueError, "non-empty list"),
        ({"grid": {"length": [0.3, 0.3, 0.6]}}, ValueError, "grid gives length=0.3 twice"),
        ({"grid": {"length": [0.5]}, "max_episode_steps": 0}, ValueError, "max_episode_steps must be >= 1, got 0"),
        (
            {"grid": {"length": [0.5]}, "seed": 3, "num_workers": 1, "autoreset_mode": "SameStep"},
            TypeError,
            "evaluate sets",
        ),
        (
            {"grid": {"length": [5.0]}, "params": {"length": shmpool.Param(low=0.1, high=2.0)}},
            ValueError,
            r"grid value length=5.0 is outside the parameter's \[0.1, 2.0\]",
        ),
        ({"grid": {"mass": [1.0]}, "params": {"length": shmpool.Param()}}, KeyError, "grid names \\['mass'\\]"),
        ({"samples": 2}, ValueError, "pass params="),
        ({"grid": {"length": [0.5]}, "hooks": [shmpool.hooks.Perturb(0.1, every=5)]}, ValueError, "hooks"),
        (
            {
                "grid": {"length": [0.5]},
                "params": {"length": shmpool.Param(), "masscart": shmpool.Param(dist="uniform", low=0.5, high=2.0)},
            },
            ValueError,
            r"params\['masscart'\] \(dist='uniform'\)",
        ),
        ({"samples": 2, "params": {"length": shmpool.Param()}}, ValueError, "finite low and high; 'length'"),
        (  # an integer parameter would refuse the real draws once the pool runs
            {"samples": 2, "params": {"k": shmpool.Param(1, low=0, high=5, dtype="int64", bind=False)}},
            ValueError,
            "samples= draws real numbers; 'k' is int64",
        ),
        (  # table() would write its statistic over the cell's value
            {"grid": {"max": [0.5]}, "params": {"max": shmpool.Param(bind="length")}},
            ValueError,
            "named 'max' would be hidden by the column of that name in table",
        ),
    ],
)
def test_mistakes_are_refused_before_anything_runs(options: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        shmpool.evaluate("CartPole-v1", lean_policy, progress=False, **options)


def test_a_grid_key_the_env_lacks_is_refused_as_launch_refuses_it() -> None:
    with pytest.raises(Exception, match="lenght") as refused:
        shmpool.evaluate("CartPole-v1", lean_policy, grid={"lenght": [0.5]}, num_workers=1, progress=False)
    with pytest.raises(type(refused.value), match="lenght"):
        shmpool.launch("CartPole-v1", 1, num_workers=1, params={"lenght": shmpool.Param(None, bind="lenght")})


@needs("matplotlib")
def test_table_csv_and_plots(tmp_path: Path) -> None:
    import matplotlib.image

    evaluation = shmpool.evaluate(
        "CartPole-v1", lean_policy, grid=GRID, episodes=2, seed=0, num_workers=2, progress=True
    )
    table = evaluation.table()
    assert [(row["length"], row["masspole"]) for row in table] == [tuple(cell.values()) for cell in evaluation.cells]
    for row, returns in zip(table, evaluation.returns):
        assert (row["mean"], row["std"], row["min"], row["max"]) == (
            returns.mean(),
            returns.std(),
            returns.min(),
            returns.max(),
        )
    evaluation.to_csv(tmp_path / "grid.csv")
    with open(tmp_path / "grid.csv") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["length", "masspole", "mean", "std", "min", "max"]
    assert [float(row["mean"]) for row in rows] == [row["mean"] for row in table]
    evaluation.plot(tmp_path / "heatmap.png")
    image = matplotlib.image.imread(tmp_path / "heatmap.png")[..., :3]
    assert image.shape[0] > 300 and image.shape[1] > 400 and image.std() > 0.1  # drawn, not blank
    colours = {tuple(pixel) for pixel in (image * 255).astype(np.uint8).reshape(-1, 3)[::7].tolist()}
    assert len(colours) > 20  # the six cells' colours, the colour bar's ramp and the annotations
    one = shmpool.evaluate(
        "CartPole-v1", lean_policy, grid={"length": [0.3, 1.0]}, episodes=2, num_workers=1, progress=False
    )
    one.plot(tmp_path / "line.png")
    assert (tmp_path / "line.png").stat().st_size > 10_000
    fixed = shmpool.Evaluation([{"a": 1, "b": 2}, {"a": 1, "b": 3}], np.ones((2, 1)), np.ones((2, 1), dtype=np.int64))
    assert fixed.names == ["b"]  # a grid axis of one value does not vary: plot draws the other one
    fixed.plot(tmp_path / "fixed.png")
    three = shmpool.Evaluation([{"a": 1, "b": 2, "c": 3}], np.zeros((1, 1)), np.zeros((1, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="plot draws one or two parameters; these cells vary 3"):
        three.plot()


@pytest.mark.parametrize(
    ("policy", "error", "message"),
    [
        (
            lambda observations: np.zeros((len(observations), 2), np.int64),
            ValueError,
            r"shape \(4, 2\) for 4 observations",
        ),
        (lambda observations: np.zeros(len(observations)), TypeError, "dtype float64; Discrete\\(2\\)"),
    ],
)
def test_a_policy_returning_the_wrong_shape_or_dtype_is_named(policy: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        shmpool.evaluate("CartPole-v1", policy, grid={"length": [0.5]}, episodes=4, num_workers=1, progress=False)


def cheetah_policy(observations: np.ndarray) -> np.ndarray:
    """A deterministic gait from each observation alone."""
    return np.tanh(observations[:, 2:8]).astype(np.float32)


@needs("mujoco")
@pytest.mark.parametrize("engine", ["python", "mujoco"])
def test_halfcheetah_cells_of_mass_and_friction_equal_gymnasiums_by_hand(engine: str) -> None:
    import mujoco

    from shmpool import mujoco as smj

    params = {
        "mass": shmpool.Param(None, bind=smj.body_mass("torso")),
        "friction": shmpool.Param(None, bind=smj.geom_friction("floor")),
    }
    grid = {"mass": [4.0, 9.0], "friction": [0.3, 1.2]}
    evaluation = shmpool.evaluate(
        "HalfCheetah-v5",
        cheetah_policy,
        grid=grid,
        episodes=2,
        seed=3,
        params=params,
        engine=engine,
        num_workers=2,
        env_kwargs={"max_episode_steps": 40},
        progress=False,
    )
    for i, cell in enumerate(evaluation.cells):
        for j in range(2):
            env = gym.make("HalfCheetah-v5", max_episode_steps=40)
            model = env.unwrapped.model
            model.body("torso").mass[0] = cell["mass"]
            model.geom("floor").friction[0] = cell["friction"]
            mujoco.mj_setConst(model, mujoco.MjData(model))  # what body_mass does after each change
            observation, _ = env.reset(seed=3 + i * 2 + j)
            total, done = 0.0, False
            while not done:
                observation, reward, terminated, truncated, _ = env.step(cheetah_policy(observation[None])[0])
                total += reward
                done = terminated or truncated
            assert evaluation.returns[i, j] == total and evaluation.lengths[i, j] == 40
            env.close()
