"""How a policy does across parameter values: ``evaluate`` runs it over a grid (or random samples)
of parameter cells, a fixed number of episodes each, and returns an ``Evaluation``.

Episode ``j`` of cell ``i`` starts with ``reset(seed=seed + i * episodes + j)`` on an env whose
parameters are cell ``i``'s, so the result depends on neither ``num_envs``, ``num_workers`` nor the
engine, and one episode can be replayed in a plain gymnasium env (for a policy that acts on each
observation alone).
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from .options import count
from .params import Param

#: Envs of an evaluation's pool when ``num_envs`` is not given: one per episode, at most this many.
MAX_DEFAULT_ENVS = 64

#: The statistics columns of ``Evaluation.table``, beside each cell's values.
_TABLE_COLUMNS = ("mean", "std", "min", "max")
#: Launch options that ``evaluate`` sets itself.
_SET_HERE = ("autoreset_mode", "params", "seed")
#: Launch options that draw random numbers of their own, per env and worker: an evaluation with
#: them would depend on ``num_envs`` and the engine.
_NOT_REPRODUCIBLE = ("hooks",)


@dataclass
class Evaluation:
    """The returns and lengths of every episode of every cell: ``returns[i, j]`` is episode ``j``
    of ``cells[i]``."""

    cells: list[dict[str, Any]]
    returns: np.ndarray  # (cells, episodes), float64
    lengths: np.ndarray  # (cells, episodes), int64
    from_grid: bool = True  # the cells are a grid's product (plot draws a heatmap), else samples

    @property
    def names(self) -> list[str]:
        """The parameters that vary across the cells, in the order given (every one when none does)."""
        given = list(self.cells[0]) if self.cells else []
        first = self.cells[0] if self.cells else {}
        varying = [name for name in given if any(not _same_value(cell[name], first[name]) for cell in self.cells)]
        return varying or given

    def table(self) -> list[dict[str, Any]]:
        """One row per cell: its values, then the mean, std, min and max return over its episodes."""
        return [
            {**cell, **{column: float(getattr(row, column)()) for column in _TABLE_COLUMNS}}
            for cell, row in zip(self.cells, self.returns)
        ]

    def to_csv(self, path: str | Path | IO[str]) -> None:
        """Writes ``table()`` as CSV, with a header row, to the file at ``path`` (or to an open text
        stream, such as ``sys.stdout``)."""
        rows = self.table()
        with nullcontext(path) if hasattr(path, "write") else open(path, "w", newline="") as file:  # type: ignore[arg-type]
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    def plot(
        self, path: str | Path | None = None, *, ax: Any = None, vmin: float | None = None, vmax: float | None = None
    ) -> Any:
        """Draws the mean return per cell and returns the matplotlib figure (saved to ``path`` if given):
        a heatmap for two parameters of a grid (cells annotated), a scatter for two of samples, and a
        line with a band of one std for one. ``ax``, ``vmin``, ``vmax``: draw into that axes, on that
        colour scale (side-by-side heatmaps share one). Needs matplotlib (the ``plot`` extra)."""
        import matplotlib

        if path is not None and ax is None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = self.names
        if len(names) not in (1, 2):
            raise ValueError(f"plot draws one or two parameters; these cells vary {len(names)}: {names}")
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 4.5))
        means = self.returns.mean(axis=1)
        if len(names) == 1:
            values = np.array([cell[names[0]] for cell in self.cells], dtype=np.float64)
            order = np.argsort(values, kind="stable")
            stds = self.returns.std(axis=1)
            ax.plot(values[order], means[order], marker="o")
            ax.fill_between(values[order], (means - stds)[order], (means + stds)[order], alpha=0.25)
            ax.set_xlabel(names[0])
            ax.set_ylabel("mean return")
        elif self.from_grid:
            rows, columns = (list(dict.fromkeys(cell[name] for cell in self.cells)) for name in names)
            grid = means.reshape(len(rows), len(columns))
            image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax)
            ax.set_xticks(range(len(columns)), [f"{value:g}" for value in columns])
            ax.set_yticks(range(len(rows)), [f"{value:g}" for value in rows])
            ax.set_xlabel(names[1])
            ax.set_ylabel(names[0])
            middle = ((grid.min() if vmin is None else vmin) + (grid.max() if vmax is None else vmax)) / 2
            for (row, column), mean in np.ndenumerate(grid):
                text = f"{mean:.0f}" if abs(mean) >= 10 else f"{mean:.2g}"
                ax.text(column, row, text, ha="center", va="center", color="black" if mean > middle else "white")
            ax.figure.colorbar(image, ax=ax, label="mean return")
        else:
            xs, ys = ([cell[name] for cell in self.cells] for name in names)
            points = ax.scatter(ys, xs, c=means, cmap="viridis", vmin=vmin, vmax=vmax)
            ax.set_xlabel(names[1])
            ax.set_ylabel(names[0])
            ax.figure.colorbar(points, ax=ax, label="mean return")
        if path is not None:
            ax.figure.savefig(path, dpi=120, bbox_inches="tight")
        return ax.figure


def evaluate(
    env: Any,
    policy: Callable[[Any], Any],
    *,
    grid: Mapping[str, Sequence[Any]] | None = None,
    samples: int | None = None,
    episodes: int = 10,
    max_episode_steps: int | None = None,
    seed: int = 0,
    params: Mapping[str, Param] | None = None,
    num_envs: int | None = None,
    launch: Callable[..., Any] | None = None,
    progress: bool = True,
    **launch_options: Any,
) -> Evaluation:
    """Runs ``policy`` for ``episodes`` episodes in each cell of parameter values; returns their returns and lengths.

    Args:
        env: What ``shmpool.launch`` takes: a registered id or an env factory.
        policy: Maps a batch of observations (one row per env) to a batch of actions.
        grid: Parameter name to a list of values; the cells are their product, in the order given.
        samples: Instead of a grid, this many cells drawn uniformly within each declared parameter's ``[low, high]``,
            from ``seed``.
        episodes: Episodes per cell; each runs to its end (a time limit truncates it as usual).
        max_episode_steps: Cut each episode after this many steps, as a time limit would; None: only the env's own
            limit. An env without one needs it, or an episode that never ends never returns.
        seed: Episode ``j`` of cell ``i`` resets with ``seed + i * episodes + j``.
        params: Declared as for ``launch``; None: each grid key is ``Param(None, bind=key)``, the env's own attribute
            (a key the env lacks is refused as ``launch`` refuses it).
        num_envs: Envs of the pool (default: one per episode, at most ``MAX_DEFAULT_ENVS``).
        launch: What starts the pool: ``shmpool.launch`` (default) or ``shmpool.ray.launch``.
        progress: Show a progress bar (with ``rich`` installed).
        **launch_options: Further options of ``launch`` (``num_workers``, ``engine``, ...).
    """
    seed = count("evaluate: seed", seed, 0)  # as gymnasium's reset takes it
    episodes = count("evaluate: episodes", episodes, 1)
    cells, from_grid, params = _cells(grid, samples, params, seed)
    if max_episode_steps is not None:
        max_episode_steps = count("evaluate: max_episode_steps", max_episode_steps, 1)
    given = sorted(set(_SET_HERE) & set(launch_options))
    if given:
        raise TypeError(f"evaluate sets {given} itself (each episode resets with its own seed and cell)")
    drawing = sorted(set(_NOT_REPRODUCIBLE) & set(launch_options)) + [
        f"params[{name!r}] (dist={spec.dist!r})" for name, spec in params.items() if spec.dist
    ]
    if drawing:
        raise ValueError(
            f"evaluate: {drawing} draw random numbers per env and worker, so the result would depend on "
            f"num_envs and the engine; give fixed values (a grid or samples) instead"
        )
    total = len(cells) * episodes
    num_envs = min(total, MAX_DEFAULT_ENVS) if num_envs is None else num_envs
    from gymnasium.vector import AutoresetMode

    from .pool import launch as launch_locally

    start_pool = launch_locally if launch is None else launch
    pool = start_pool(env, num_envs, params=params, autoreset_mode=AutoresetMode.DISABLED, **launch_options)
    with pool, _progress_bar(progress, total) as advance:
        returns, lengths = _run(pool, policy, cells, episodes, seed, max_episode_steps, advance)
    return Evaluation(cells, returns, lengths, from_grid)


def _cells(
    grid: Mapping[str, Sequence[Any]] | None, samples: int | None, params: Mapping[str, Param] | None, seed: int
) -> tuple[list[dict[str, Any]], bool, dict[str, Param]]:
    """The cells to evaluate, whether they are a grid, and the parameters to declare."""
    if (grid is None) == (samples is None):
        raise ValueError("evaluate: give either grid= (values per parameter) or samples= (how many cells), not both")
    if grid is not None:
        if not isinstance(grid, Mapping) or not grid or not all(map(_is_value_list, grid.values())):
            raise ValueError(
                f"evaluate: grid must map each parameter name to a non-empty list of values, got {grid!r:.200}"
            )
        _check_names(grid)
        declared = dict(params) if params is not None else {name: Param(None, bind=name) for name in grid}
        unknown = [name for name in grid if name not in declared]
        if unknown:
            raise KeyError(
                f"evaluate: grid names {unknown}, which params does not declare (it declares {list(declared)})"
            )
        for name, values in grid.items():
            given = list(values)
            for index, value in enumerate(given):
                _check_within(name, declared[name], value)
                if any(_same_value(value, earlier) for earlier in given[:index]):
                    raise ValueError(f"evaluate: grid gives {name}={value!r} twice; give each value once")
        names = list(grid)
        cells = [dict(zip(names, values)) for values in itertools.product(*(grid[name] for name in names))]
        return cells, True, declared
    samples = count("evaluate: samples", samples, 1)
    if not params:
        raise ValueError("evaluate: samples= draws within each declared parameter's [low, high]: pass params=")
    _check_names(params)
    rng = np.random.default_rng(seed)
    bounds = {}
    for name, spec in params.items():
        low, high = (np.asarray(bound, dtype=np.float64) for bound in (spec.low, spec.high))
        if spec.shape != () or spec.dist or low.shape != () or high.shape != () or not np.isfinite([low, high]).all():
            raise ValueError(f"evaluate: samples= needs scalar parameters with finite low and high; {name!r} is {spec}")
        if np.dtype(spec.dtype).kind != "f":  # the draws are real numbers: an integer one would be refused mid-run
            raise ValueError(f"evaluate: samples= draws real numbers; {name!r} is {spec.dtype}: give grid= its values")
        bounds[name] = (float(low), float(high))
    draws = {name: rng.uniform(low, high, samples) for name, (low, high) in bounds.items()}
    return [{name: float(draws[name][i]) for name in params} for i in range(samples)], False, dict(params)


def _check_names(names: Mapping[str, Any]) -> None:
    """Refuses a parameter named as a statistics column of ``Evaluation.table``, which would hide it."""
    hidden = [name for name in names if name in _TABLE_COLUMNS]
    if hidden:
        raise ValueError(
            f"evaluate: a parameter named {hidden[0]!r} would be hidden by the column of that name in table(); "
            f"declare it under another name, with Param(..., bind={hidden[0]!r})"
        )


def _is_value_list(values: Any) -> bool:
    """Whether ``values`` is a non-empty list (or tuple, or array) of a grid axis's values."""
    if isinstance(values, (str, bytes)) or (isinstance(values, np.ndarray) and values.ndim == 0):
        return False
    return hasattr(values, "__len__") and len(values) > 0


def _same_value(first: Any, second: Any) -> bool:
    """Whether two grid values are the same numbers (scalars or arrays)."""
    try:
        return bool(np.array_equal(np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)))
    except (TypeError, ValueError):  # not numbers: _check_within refuses them
        return False


def _check_within(name: str, spec: Param, value: Any) -> None:
    """Refuses a grid value that the parameter's bounds would refuse mid-run."""
    if spec.dist:
        raise ValueError(f"evaluate: {name!r} is a distribution (dist={spec.dist!r}); a grid sets plain values")
    array = np.asarray(value, dtype=np.float64)
    low = -np.inf if spec.low is None else np.asarray(spec.low, dtype=np.float64)
    high = np.inf if spec.high is None else np.asarray(spec.high, dtype=np.float64)
    if not (np.all(array >= low) and np.all(array <= high)):
        raise ValueError(f"evaluate: grid value {name}={value!r} is outside the parameter's [{spec.low}, {spec.high}]")


def _run(
    pool: Any,
    policy: Callable[[Any], Any],
    cells: list[dict[str, Any]],
    episodes: int,
    seed: int,
    max_episode_steps: int | None,
    advance: Callable[[], None],
) -> tuple[np.ndarray, np.ndarray]:
    """Runs every episode on ``pool`` (autoreset DISABLED): each env takes the next episode when its
    own ends, or after ``max_episode_steps``; an env with none left keeps running unrecorded
    episodes until the last one ends."""
    num_envs, total = pool.num_envs, len(cells) * episodes
    returns = np.zeros(total, dtype=np.float64)
    lengths = np.zeros(total, dtype=np.int64)
    episode_of = np.full(num_envs, -1, dtype=np.int64)  # -1: no episode left for this env
    running_return = np.zeros(num_envs, dtype=np.float64)
    running_length = np.zeros(num_envs, dtype=np.int64)
    next_episode, recorded = 0, 0
    names = list(cells[0])

    def start(env_ids: np.ndarray) -> Any:
        nonlocal next_episode
        assigned = []
        seeds: list[int | None] = [None] * num_envs
        for env_id in env_ids.tolist():
            if next_episode < total:
                episode_of[env_id], seeds[env_id] = next_episode, seed + next_episode
                assigned.append(env_id)
                next_episode += 1
            else:
                episode_of[env_id] = -1
        if assigned:
            chosen = [cells[episode_of[env_id] // episodes] for env_id in assigned]
            pool.params.write(assigned, **{name: np.array([cell[name] for cell in chosen]) for name in names})
        running_return[env_ids], running_length[env_ids] = 0.0, 0
        mask = np.zeros(num_envs, dtype=np.bool_)
        mask[env_ids] = True
        return pool.reset(seed=seeds, options={"reset_mask": mask})[0]

    observations = start(np.arange(num_envs))
    check_actions = _ActionsCheck(pool.single_action_space, num_envs)
    while recorded < total:
        actions = check_actions(policy(observations))
        observations, rewards, terminations, truncations, _ = pool.step(actions)
        running_return += rewards
        running_length += 1
        ends = terminations | truncations
        if max_episode_steps is not None:
            ends |= running_length >= max_episode_steps
        ended = np.flatnonzero(ends)
        if not len(ended):
            continue
        for env_id in ended.tolist():
            episode = episode_of[env_id]
            if episode >= 0:
                returns[episode], lengths[episode] = running_return[env_id], running_length[env_id]
                recorded += 1
                advance()
        if recorded < total:
            observations = start(ended)
    return returns.reshape(len(cells), episodes), lengths.reshape(len(cells), episodes)


class _ActionsCheck:
    """Refuses a policy's output of the wrong shape or kind before it reaches the pool, naming both."""

    def __init__(self, space: Any, num_envs: int) -> None:
        from gymnasium import spaces

        self._space = space
        # Dict and Tuple spaces have no one shape: the pool's own check covers their parts
        self._shape = (num_envs, *space.shape) if space.shape is not None else None
        self._integral = isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary))

    def __call__(self, actions: Any) -> Any:
        if self._shape is None:
            return actions
        array = np.asarray(actions)
        if array.shape != self._shape:
            raise ValueError(
                f"evaluate: the policy returned actions of shape {array.shape} for {self._shape[0]} observations; "
                f"{self._space} needs shape {self._shape}"
            )
        if array.dtype.kind not in ("biu" if self._integral else "biuf"):
            raise TypeError(
                f"evaluate: the policy returned actions of dtype {array.dtype}; {self._space} needs numbers of its kind"
            )
        return actions


@contextmanager
def _progress_bar(enabled: bool, total: int) -> Iterator[Callable[[], None]]:
    """A rich progress bar over the episodes while ``evaluate`` runs (nothing without rich or when
    turned off); it gives the call that counts one episode done."""
    Progress: Any = None
    if enabled:
        with suppress(ImportError):
            from rich.progress import Progress
    if Progress is None:
        yield lambda: None
        return
    progress = Progress(transient=True)
    progress.start()
    try:
        task = progress.add_task("evaluating", total=total)
        yield lambda: progress.advance(task)
    finally:
        progress.stop()
