"""``shmpool.draws``: every draw is a pure function of (seed, env, episode, parameter, step), the same
whether a parameter is drawn alone or with others in one grid (a reset draws all of them at once)."""

from __future__ import annotations

import helpers
import numpy as np

import shmpool
from shmpool import Param
from shmpool.draws import FEW_MIXES, AheadUniforms, derive_seed, draws, uniform01, uniform01_grid
from shmpool.params import ParamSpec, block_dtype, compile_specs

SPECS = compile_specs(
    {
        "mass": Param(dist="uniform", default={"low": 0.5, "high": 2.0}, low=0.0, high=3.0, bind=False),
        "offsets": Param(dist="normal", default={"mean": 0.0, "std": 1.0}, low=-5, high=5, shape=(3,), bind=False),
        "gains": Param(
            dist="loguniform", default={"low": 0.1, "high": 10.0}, low=0.01, high=100, shape=(2,), bind=False
        ),
        "plain": Param(1.0, low=0.0, high=2.0, bind=False),
    }
)
DRAWN = [spec for spec in SPECS if spec.dist]


ARGUMENTS = {"uniform": (0.5, 2.0), "loguniform": (0.1, 10.0), "normal": (0.0, 1.0)}


def arguments(spec: ParamSpec, rows: int, specs: list[ParamSpec] = SPECS) -> np.ndarray:
    """``rows`` records of the spec's distribution arguments (its fields in the params block)."""
    records = np.zeros(rows, dtype=block_dtype(specs)[spec.name])
    for field, value in zip(spec.arguments, ARGUMENTS[spec.dist]):  # type: ignore[index]
        records[field] = value
    return records


def test_a_parameter_draws_the_same_alone_or_with_others() -> None:
    env_ids, episodes = np.array([0, 3, 7, 7]), np.array([0, 5, 1, 2])
    for step in (0, np.array([1, 9, 4, 4])):
        together = draws(DRAWN, [arguments(spec, 4) for spec in DRAWN], 11, env_ids, episodes, step)
        for spec, values in zip(DRAWN, together):
            (alone,) = draws([spec], [arguments(spec, 4)], 11, env_ids, episodes, step)
            assert alone.tobytes() == values.tobytes(), spec.name
            assert values.shape == (4, *spec.shape) and values.dtype == spec.dtype
            assert (values >= spec.low).all() and (values <= spec.high).all()


def test_a_draw_depends_on_every_key_and_on_nothing_else() -> None:
    env_ids, episodes = np.array([2, 2, 5]), np.array([1, 1, 1])
    grid = uniform01_grid(3, env_ids, episodes, [0, 1, 2], 7, size=4, lanes=2)
    assert grid.shape == (3, 3, 2, 4) and (grid >= 0).all() and (grid < 1).all()
    assert np.array_equal(grid[0], grid[1])  # the same env and episode: the same draws
    for axis in range(3):  # env, parameter, lane: each changes every draw
        first, second = np.take(grid, 0, axis=axis), np.take(grid, -1, axis=axis)
        assert not np.isin(first, second).any(), f"axis {axis}"
    for changed in ({"seed": 4}, {"episodes": episodes + 1}, {"step": 8}):
        keys = {"seed": 3, "env_ids": env_ids, "episodes": episodes, "param": 1, "step": 7, "size": 4, **changed}
        assert not np.isin(uniform01(**keys), grid[:, 1, 0]).any(), changed
    one = uniform01(3, env_ids, episodes, 1, 7, 2, lane=1)
    assert one.tobytes() == grid[:, 1, 1, :2].copy().tobytes()  # fewer elements: the same first ones


def test_a_few_draws_equal_the_same_draws_among_many() -> None:
    """A reset of one env draws a few values, a reset of many a large grid, computed another way:
    every value is the same bits either way, for any keys (negative ids and parameters, large
    seeds and steps, a step per env)."""
    # Scrambles per grid (envs x (2 + params x (2 + lanes x (1 + size)))): one env's 32 and two envs'
    # 20 below take Python's path, 40 envs' numpy's.
    assert 32 <= FEW_MIXES < 40 * (2 + 1 * (2 + 1 * 2))
    rng = np.random.default_rng(5)
    env_ids, episodes = rng.integers(-(2**62), 10**6, 40), rng.integers(0, 10**9, 40)
    env_ids[:2] = -3, 0
    params = [-1, 0, 7]
    big_steps = rng.integers(0, 2**64, 40, dtype=np.uint64)
    for seed, step in ((0, 0), (2**64 + 5, 3), (-9, -1), (7, np.uint64(2**63 + 1)), (3, big_steps)):
        grid = uniform01_grid(seed, env_ids, episodes, params, step, size=3, lanes=2)
        for env in (0, 17, 39):
            one_step = step[env : env + 1] if isinstance(step, np.ndarray) else step
            few = uniform01_grid(seed, env_ids[env : env + 1], episodes[env : env + 1], params, one_step, 3, 2)
            assert few.tobytes() == grid[env : env + 1].tobytes(), (seed, env)
        two_steps = step if np.ndim(step) == 0 else step[:2]
        pair = uniform01_grid(seed, env_ids[:2], episodes[:2], params[1:], two_steps, size=1, lanes=1)
        assert pair.tobytes() == grid[:2, 1:, :1, :1].copy().tobytes()
    same_episode = uniform01_grid(4, env_ids[:2], np.array([6]), [2], 5, size=1, lanes=1)  # one for both envs
    assert same_episode.tobytes() == uniform01_grid(4, env_ids, np.full(40, 6), [2], 5, 1, 1)[:2].tobytes()


def test_the_uniforms_drawn_ahead_are_those_of_a_grid_per_draw() -> None:
    """Draws of a few envs take their uniforms from grids drawn ahead, along episodes (a reset's) or
    along an episode's steps: whichever envs draw together, and wherever an env's episode or step
    goes (on, back, far ahead, a new episode), each draw's uniforms are the bits of a grid drawn
    for it alone."""
    env_ids = np.array([-2, 0, 5, 9, 40])
    rng = np.random.default_rng(3)
    big = compile_specs({"field": Param(dist="uniform", default={"low": 0.0, "high": 1.0}, shape=(40, 20), bind=False)})
    for specs, along_steps in ((DRAWN, False), (DRAWN, True), (big, False), (big, True)):  # big: none held
        params, (size, lanes) = [spec.index for spec in specs], ((3, 2) if specs is DRAWN else (800, 1))
        ahead = AheadUniforms(13, env_ids, specs, along_steps)
        episodes, steps = np.zeros(len(env_ids), dtype=np.int64), np.zeros(len(env_ids), dtype=np.int64)
        for draw in range(300):
            rows = np.flatnonzero(rng.random(len(env_ids)) < 0.4)
            moved = steps if along_steps else episodes
            if draw % 37 == 36:  # now and then an env moves anywhere (a restored checkpoint's counts)
                moved[rows] = rng.integers(0, 10**12, len(rows))
            elif draw % 11 == 10:  # or back
                moved[rows] = np.maximum(moved[rows] - 3, 0)
            else:
                moved[rows] += 1
            if along_steps and draw % 7 == 6:  # a new episode, its steps from 1 again
                episodes[rows[:1]] += 1
                steps[rows[:1]] = 1
            at = steps[rows] if along_steps else 0
            expected = uniform01_grid(13, env_ids[rows], episodes[rows], params, at, size, lanes)
            got = ahead.take(rows, episodes[rows], steps[rows]) if along_steps else ahead.take(rows, episodes[rows])
            assert got.tobytes() == expected.tobytes(), (along_steps, draw)


def test_a_pool_draws_by_each_envs_episode_and_step(pool_name: str) -> None:
    """What a pool applies is ``draws`` keyed by each env's episode (a reset's draw, at step 0) and by
    its step in the episode (a ``when="step"`` draw): the keys its uniforms drawn ahead are taken by."""
    declared = {
        "mass": Param(dist="uniform", default={"low": 0.5, "high": 2.0}, low=0.0, high=3.0, when="reset", bind=False),
        "offsets": Param(dist="normal", default={"mean": 0.0, "std": 1.0}, low=-5, high=5, shape=(3,), bind=False),
    }
    specs = compile_specs(declared)
    num_envs, episode, length = 4, 0, 0
    with shmpool.launch(
        helpers.CountingEnv, num_envs, num_workers=2, params=declared, seed=7, env_kwargs={"length": 3}, name=pool_name
    ) as pool:
        pool.reset(seed=0)
        for t in range(12):
            for spec, step in zip(specs, (0, length)):  # the mass at the episode's reset, the offsets now
                records = arguments(spec, num_envs, specs)
                (expected,) = draws([spec], [records], 7, np.arange(num_envs), np.full(num_envs, episode), step)
                assert pool.applied[spec.name].tobytes() == expected.tobytes(), (t, spec.name)
            pool.step(np.zeros(num_envs, dtype=np.int64))
            episode, length = (episode + 1, 0) if length == 3 else (episode, length + 1)  # ended: reset now


def test_a_derived_seed_is_a_reproducible_31_bit_int() -> None:
    seeds = {derive_seed(9, env, episode) for env in range(5) for episode in range(5)}
    assert len(seeds) == 25 and all(0 <= seed < 2**31 for seed in seeds)
    assert derive_seed(9, 1, 2) == derive_seed(9, 1, 2) != derive_seed(10, 1, 2)
