"""Curricula that read finished episodes and write parameters: in-process, or from another process through
``shmpool.attach`` (``scripts/curriculum.py`` runs them that way).

Both take the records of ``episodes.read()`` and a parameter block (``pool.params`` or ``handle.params``) in
``update`` and return lines worth logging. ``state()`` (plain JSON data) and ``load(state)`` let a restarted
curriculum resume; ``state_dict()`` / ``load_state_dict()`` are the complete form, settings included, for checkpoints
taken with ``pool.state_dict()``: a curriculum restored from one continues exactly as the saved one would have.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .interfaces import ParamsAPI
from .options import count
from .params import ParamSpec


def scores(records: np.ndarray, metric: str) -> np.ndarray:
    """The score of each record: its return, or the named episode metric."""
    if metric == "return":
        return records["return"].astype(np.float64)
    names = records.dtype.names or ()
    if "metrics" not in names or metric not in (records.dtype["metrics"].names or ()):
        raise KeyError(
            f"no episode metric {metric!r}; declare it with launch(episode_metrics={{{metric!r}: 'info key'}})"
        )
    return records["metrics"][metric].astype(np.float64)


def _param_column(records: np.ndarray, name: str) -> np.ndarray | None:
    """Each record's applied value of parameter ``name``, or None when the records do not carry it."""
    names = records.dtype.names or ()
    if "params" not in names or name not in (records.dtype["params"].names or ()):
        return None
    return records["params"][name]


class Threshold:
    """Moves one parameter by ``step`` each time the mean score of the last ``window`` episodes
    reaches ``target``: the classic "make it harder once the agent copes" curriculum.

    A negative ``step`` lowers the parameter. The value never leaves the parameter's hard bounds.
    Once it has written a value, it judges only the episodes whose record shows that value (the
    parameter's applied value at the episode's end): episodes still running at the old value when it
    moved do not move it again. If the pool's value changes under it (another writer, a checkpoint
    loaded), it goes on from the pool's value.
    """

    def __init__(self, param: str, *, step: float, target: float, window: int = 20, metric: str = "return") -> None:
        if not isinstance(param, str):
            raise TypeError(f"Threshold(param=...) takes a parameter's name, got {param!r:.80}")
        _check_metric("Threshold", metric)
        if not (np.isfinite(step) and np.isfinite(target)):
            raise ValueError(f"Threshold needs a finite step and target, got step={step!r}, target={target!r}")
        self.param, self.step, self.target, self.metric = param, float(step), float(target), metric
        self.window = count("Threshold(window=...)", window, 1)
        self.value: float | None = None
        self._recent: deque[float] = deque(maxlen=self.window)
        self.changes = 0
        self._reapply = False
        self._by_value = False  # whether it judges episodes by their value: once it has written or adopted one

    def update(self, records: np.ndarray, params: ParamsAPI, log: list[str] | None = None) -> list[str]:
        """Feeds finished episodes; moves the parameter when the window's mean reaches the target.
        Returns a line per move, appended to ``log`` if given (the caller keeps the lines of the
        moves made before an error, such as the pool closing midway)."""
        spec = params.specs.get(self.param)
        if spec is None or spec.dist or spec.shape:
            raise KeyError(f"Threshold needs a plain scalar parameter; the pool has {params.names}")
        if self._reapply:  # resumed from a state: the pool (maybe a new one) takes its value first
            params.write(None, **{self.param: self.value})
            self._by_value = True
        else:
            column = params[self.param]
            if self.value is None:
                self.value = float(column[0])
            elif not (column == column.dtype.type(self.value)).any():
                # Another writer (or a pool restored from a checkpoint) changed it: go on from its
                # value, judged by the episodes run at it.
                self.value = float(column[0])
                self._recent.clear()
                self._by_value = True
        self._reapply = False
        assert self.value is not None  # read or resumed above
        log = [] if log is None else log
        ran_at = _param_column(records, self.param)
        for index, score in enumerate(scores(records, self.metric)):
            if self._by_value and ran_at is not None and ran_at[index] != ran_at.dtype.type(self.value):
                continue  # an episode that ended at another value than the one written last
            self._recent.append(float(score))
            if len(self._recent) == self.window and np.mean(self._recent) >= self.target:
                new = float(np.clip(self.value + self.step, spec.low, spec.high))
                # Compared as the block stores them (to a float32 parameter, 0.8 + 0.3 and the bound 1.1
                # are one number): at a bound nothing moves and nothing is logged; a step finer than the
                # dtype holds adds up until the stored value moves.
                before, after = _as_stored(spec, self.value), _as_stored(spec, new)
                if after != before:
                    # Written first: if the write fails, nothing here changed and the same scores
                    # move it at the next update.
                    params.write(None, **{self.param: new})
                    self._by_value = True
                    mean = np.mean(self._recent)
                    log.append(f"{self.param}: {before:g} -> {after:g} (mean {self.metric} {mean:.3g})")
                    self.changes += 1
                self.value = new
                self._recent.clear()
        return log

    def state(self) -> dict[str, Any]:
        """Plain data to resume from."""
        return {
            "algo": "threshold",
            "param": self.param,
            "value": self.value,
            "recent": list(self._recent),
            "changes": self.changes,
        }

    def load(self, state: dict[str, Any]) -> None:
        """Resumes from ``state()``; the next ``update`` writes the value to the pool first. Raises
        ``ValueError`` for the state of another curriculum or parameter."""
        _check_algo(state, "threshold", settings=False)
        if state["param"] != self.param:
            raise ValueError(f"this state moves {state['param']!r}, this Threshold moves {self.param!r}")
        self.value = state["value"]
        self._recent = deque(state["recent"], maxlen=self.window)
        self.changes = state["changes"]
        self._reapply = self.value is not None

    def state_dict(self) -> dict[str, Any]:
        """Everything it depends on, settings included, as plain JSON data."""
        settings = {"step": self.step, "target": self.target, "window": self.window, "metric": self.metric}
        return {**self.state(), "settings": settings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a ``state_dict`` (its settings too); it then continues as the saved one would.

        Raises ``ValueError`` for the state of another curriculum or parameter.
        """
        _check_algo(state, "threshold")
        self.load(state)  # checks the parameter before anything changes
        settings = state["settings"]
        self.step, self.target, self.metric = float(settings["step"]), float(settings["target"]), settings["metric"]
        self.window = int(settings["window"])
        self._recent = deque(state["recent"], maxlen=self.window)


class ADR:
    """Automatic Domain Randomization (OpenAI et al., "Solving Rubik's Cube with a Robot Hand", 2019).

    Each ``dist="uniform"`` parameter has a range that starts at its nominal value (the middle of its initial
    ``low``/``high``). With probability ``p_boundary`` an env's next episode pins one parameter to one boundary of its
    range (the others are drawn from their ranges); the score of such an episode goes into that boundary's buffer. When
    a buffer holds ``buffer`` scores: a mean of at least ``high_threshold`` widens that boundary by ``delta`` (a
    fraction of the parameter's hard range), at most ``low_threshold`` narrows it (never past the nominal value), and
    the buffer empties. Ranges never pass the hard bounds.
    """

    def __init__(
        self,
        params: Sequence[str] | None = None,
        *,
        delta: float = 0.05,
        p_boundary: float = 0.5,
        buffer: int = 10,
        low_threshold: float,
        high_threshold: float,
        metric: str = "return",
        seed: int = 0,
    ) -> None:
        if isinstance(params, str):
            raise TypeError(f"ADR(params=...) takes a list of names, got the one name {params!r} (use [{params!r}])")
        _check_metric("ADR", metric)
        if not (0 <= p_boundary <= 1 and 0 < delta < np.inf and low_threshold <= high_threshold):
            raise ValueError(
                "ADR needs 0 <= p_boundary <= 1, a finite delta > 0 and low_threshold <= high_threshold (no NaN); "
                f"got p_boundary={p_boundary!r}, delta={delta!r}, thresholds {low_threshold!r} and {high_threshold!r}"
            )
        self.names = list(params) if params else None
        self.delta, self.p_boundary, self.buffer = delta, p_boundary, count("ADR(buffer=...)", buffer, 1)
        self.low_threshold, self.high_threshold, self.metric = low_threshold, high_threshold, metric
        self.ranges: dict[str, list[float]] = {}
        self.nominal: dict[str, float] = {}
        self.buffers: dict[str, list[float]] = {}  # "param:low" / "param:high" -> scores
        self.pinned: dict[int, tuple[str, str, float, int]] = {}  # env -> (param, side, value, records waited)
        self._random = random.Random(seed)
        self._hard: dict[str, tuple[float, float]] = {}  # name -> the parameter's hard bounds
        self._started = False

    # -- setup -------------------------------------------------------------------------------------

    def _start(self, params: ParamsAPI) -> None:
        names = self.names or [name for name, spec in params.specs.items() if spec.dist == "uniform"]
        for name in names:
            spec = params.specs.get(name)
            if spec is None or spec.dist != "uniform" or spec.shape:
                raise KeyError(f"ADR needs scalar dist='uniform' parameters; {name!r} is not one of {params.names}")
            if not (np.isfinite(spec.low) and np.isfinite(spec.high)):
                raise ValueError(
                    f"ADR moves a boundary by delta times the parameter's hard range: {name!r} needs finite "
                    f"bounds (Param(low=..., high=...)), has [{spec.low}, {spec.high}]"
                )
            if name not in self.ranges:
                nominal = (float(params[name]["low"][0]) + float(params[name]["high"][0])) / 2
                self.nominal[name] = middle = self._stored(params, name, nominal)
                self.ranges[name] = [middle, middle]
            for side in ("low", "high"):
                self.buffers.setdefault(f"{name}:{side}", [])
        self.names = names
        self._hard = {name: (float(params.specs[name].low), float(params.specs[name].high)) for name in names}
        params.write(None, **self._unpinned())
        self._started = True

    def _stored(self, params: ParamsAPI, name: str, value: float) -> float:
        """``value`` as the block stores it (a float32 parameter rounds it): a pinned episode is
        recognised by its record's value, which is the stored one."""
        return float(params[name]["low"].dtype.type(value))

    def _unpinned(self) -> dict[str, dict[str, float]]:
        return {name: {"low": low, "high": high} for name, (low, high) in self.ranges.items()}

    # -- the loop ----------------------------------------------------------------------------------

    def update(self, records: np.ndarray, params: ParamsAPI, log: list[str] | None = None) -> list[str]:
        """Feeds finished episodes: scores boundary episodes, moves boundaries, assigns next episodes.
        Returns a line per move, appended to ``log`` if given (the caller keeps the lines of the
        moves made before an error, such as the pool closing midway)."""
        if not self._started:
            self._start(params)
        log = [] if log is None else log
        changed = False
        for record, score in zip(records, scores(records, self.metric)):
            env_id = int(record["env_id"])
            pin = self.pinned.get(env_id)
            if pin is not None:
                name, side, value, waited = pin
                if float(record["params"][name]) == value:
                    if self.ranges[name][_SIDE[side]] == value:  # the boundary has not moved since
                        changed |= self._score(name, side, float(score), log, params)
                elif waited == 0:
                    # The env was already in its next episode when the pin was written: the pin
                    # applies to the episode after this one.
                    self.pinned[env_id] = (name, side, value, 1)
                    continue
            self._assign(env_id, params)
        if changed:
            free = [env for env in range(len(params)) if env not in self.pinned]
            if free:
                params.write(free, **self._unpinned())
        return log

    def _score(self, name: str, side: str, score: float, log: list[str], params: ParamsAPI) -> bool:
        buffer = self.buffers[f"{name}:{side}"]
        buffer.append(score)
        if len(buffer) < self.buffer:
            return False
        mean = float(np.mean(buffer))
        buffer.clear()
        low, high = self.ranges[name]
        step = self.delta * (self._hard[name][1] - self._hard[name][0])
        nominal = self.nominal[name]
        if mean >= self.high_threshold:
            low, high = (
                (max(low - step, self._hard[name][0]), high)
                if side == "low"
                else (low, min(high + step, self._hard[name][1]))
            )
        elif mean <= self.low_threshold:
            low, high = (min(low + step, nominal), high) if side == "low" else (low, max(high - step, nominal))
        else:
            return False
        low, high = self._stored(params, name, low), self._stored(params, name, high)
        if [low, high] == self.ranges[name]:
            return False
        log.append(
            f"{name}: [{self.ranges[name][0]:.4g}, {self.ranges[name][1]:.4g}] -> [{low:.4g}, {high:.4g}] "
            f"({side} boundary, mean {self.metric} {mean:.3g})"
        )
        self.ranges[name] = [low, high]
        return True

    def _assign(self, env_id: int, params: ParamsAPI) -> None:
        values = self._unpinned()
        self.pinned.pop(env_id, None)
        if self.names and self._random.random() < self.p_boundary:
            name = self._random.choice(self.names)
            side = self._random.choice(("low", "high"))
            value = self.ranges[name][_SIDE[side]]
            values[name] = {"low": value, "high": value}
            self.pinned[env_id] = (name, side, value, 0)
        params.write(env_id, **values)

    # -- persistence -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Plain data to resume from: ranges, nominal values, buffers, the random state."""
        version, internal, gauss = self._random.getstate()
        return {
            "algo": "adr",
            "ranges": self.ranges,
            "nominal": self.nominal,
            "buffers": self.buffers,
            "random": [version, list(internal), gauss],
        }

    def load(self, state: dict[str, Any]) -> None:
        """Resumes from ``state()`` (the pinned envs start afresh). Raises ``ValueError`` for the state
        of another curriculum, or of other parameters than those named at construction."""
        _check_algo(state, "adr", settings=False)
        if self.names is not None and state["ranges"] and set(state["ranges"]) != set(self.names):
            raise ValueError(f"this state steers {sorted(state['ranges'])}, this ADR steers {sorted(self.names)}")
        self.pinned = {}
        self.ranges = {name: [float(v) for v in bounds] for name, bounds in state["ranges"].items()}
        self.nominal = {name: float(v) for name, v in state["nominal"].items()}
        self.buffers = {key: [float(v) for v in values] for key, values in state["buffers"].items()}
        version, internal, gauss = state["random"]
        self._random.setstate((version, tuple(internal), gauss))
        self._started = False

    def state_dict(self) -> dict[str, Any]:
        """Everything it depends on, as plain JSON data: ``state`` plus the pinned envs, the hard
        bounds, the parameters it steers and its settings."""
        settings = {
            "delta": float(self.delta),
            "p_boundary": float(self.p_boundary),
            "buffer": int(self.buffer),
            "low_threshold": float(self.low_threshold),
            "high_threshold": float(self.high_threshold),
            "metric": self.metric,
        }
        return {
            **copy.deepcopy(self.state()),  # state() shares its lists with the live curriculum
            "settings": settings,
            "names": None if self.names is None else list(self.names),
            "started": self._started,
            "hard": {name: list(bounds) for name, bounds in self._hard.items()},
            # JSON keys are text: env ids go in the rows.
            "pinned": [[env, *pin] for env, pin in self.pinned.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a ``state_dict`` (its settings too): pinned envs stay pinned, and it then
        continues as the saved one would. Raises ``ValueError`` for another curriculum's state."""
        _check_algo(state, "adr")
        settings = state["settings"]
        self.delta, self.p_boundary = float(settings["delta"]), float(settings["p_boundary"])
        self.buffer, self.metric = int(settings["buffer"]), settings["metric"]
        self.low_threshold, self.high_threshold = float(settings["low_threshold"]), float(settings["high_threshold"])
        self.names = None  # the state's names replace this ADR's
        self.load(state)
        self.names = None if state["names"] is None else list(state["names"])
        self._hard = {name: (float(low), float(high)) for name, (low, high) in state["hard"].items()}
        self.pinned = {
            int(env): (str(name), str(side), float(value), int(waited))
            for env, name, side, value, waited in state["pinned"]
        }
        self._started = bool(state["started"])


_SIDE = {"low": 0, "high": 1}


def _as_stored(spec: ParamSpec, value: float) -> float:
    """``value`` as the block stores a float parameter's (a float32 one rounds it); other values as they are
    (an integer parameter refuses a value that is not whole, rather than rounding it)."""
    return float(spec.dtype.type(value)) if spec.dtype.kind == "f" else value


def _check_algo(state: Any, algo: str, *, settings: bool = True) -> None:
    """Raises ``ValueError`` unless ``state`` is a ``state_dict()`` (or with ``settings=False``, a
    ``state()``) of the curriculum ``algo``."""
    if not isinstance(state, dict) or state.get("algo") != algo or (settings and "settings" not in state):
        found = state.get("algo") if isinstance(state, dict) else type(state).__name__
        kind = "state_dict()" if settings else "state()"
        hint = "; load() takes the older state()" if settings else ""
        raise ValueError(f"not a {kind} of {algo!r} (algo {found!r}){hint}")


def _check_metric(curriculum: str, metric: Any) -> None:
    """Raises for a metric that is not a name."""
    if not isinstance(metric, str):
        raise TypeError(f"{curriculum}(metric=...) takes 'return' or an episode metric's name, got {metric!r:.80}")
