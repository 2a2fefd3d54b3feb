"""An external curriculum: attaches to a running pool by name and steers its parameters from the
episodes it finishes, until the pool goes away.

    python scripts/curriculum.py --pool NAME --algo adr --low-threshold 100 --high-threshold 400
    python scripts/curriculum.py --pool NAME --algo threshold --param length --step 0.05 --target 300
    python scripts/curriculum.py --ray NAME --algo adr ...    # a cluster pool (shmpool.ray), every node

``threshold`` moves one parameter by ``--step`` whenever the mean score of the last ``--window``
episodes reaches ``--target``. ``adr`` is Automatic Domain Randomization (OpenAI, 2019) over the
pool's ``dist="uniform"`` parameters (or those named with ``--param``). The state is saved to
``--state`` after every change and at exit, and loaded from it at start, so a restarted curriculum
resumes where it was.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import _settings

import shmpool
from shmpool.curricula import ADR, Threshold


@dataclass
class Settings:
    """What the curriculum does."""

    algo: Literal["threshold", "adr"]
    """which curriculum."""
    pool: str | None = None
    """the name of the pool to attach to (a pool of this machine)."""
    ray: str | None = None
    """instead of --pool: the name of a cluster pool (shmpool.ray.launch) to attach to, from any machine
    of its Ray cluster: the curriculum then steers every node's envs."""
    ray_address: str = "auto"
    """the Ray cluster to connect to, for --ray."""
    param: list[str] = field(default_factory=list)
    """parameter(s) to steer (repeatable)."""
    metric: str = "return"
    """'return' or the name of an episode metric."""
    state: str | None = None
    """JSON file to save the state to and resume from."""
    poll: float = 0.05
    """seconds between reads of new episodes."""
    log_every: float = 1.0
    """seconds between status lines."""
    attach_timeout: float = 30.0
    """seconds to wait for the pool to appear."""
    step: float = 0.0
    """how much to move the parameter each time."""
    target: float = 0.0
    """the mean score that triggers a move."""
    window: int = 20
    """episodes averaged."""
    delta: float = 0.05
    """boundary step, as a fraction of the hard range."""
    p_boundary: float = 0.5
    """probability that an episode tests a boundary."""
    buffer: int = 10
    """boundary episodes averaged before a decision."""
    low_threshold: float = 0.0
    """narrow a boundary at or below this mean."""
    high_threshold: float = 0.0
    """widen a boundary at or above this mean."""
    seed: int = 0
    """seed of the boundary choices."""


#: The options of each algorithm, listed under its own heading by --help.
GROUPS = {
    "threshold": ["step", "target", "window"],
    "adr": ["delta", "p_boundary", "buffer", "low_threshold", "high_threshold", "seed"],
}


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Reads Settings from the command line."""
    return _settings.parse(Settings, argv, description=__doc__, groups=GROUPS)


def build(settings: Settings) -> Threshold | ADR:
    """The curriculum the settings ask for, resumed from the state file when there is one."""
    if settings.algo == "threshold":
        if len(settings.param) != 1:
            raise SystemExit("--algo threshold needs exactly one --param")
        curriculum: Threshold | ADR = Threshold(
            settings.param[0],
            step=settings.step,
            target=settings.target,
            window=settings.window,
            metric=settings.metric,
        )
    else:
        curriculum = ADR(
            settings.param or None,
            delta=settings.delta,
            p_boundary=settings.p_boundary,
            buffer=settings.buffer,
            low_threshold=settings.low_threshold,
            high_threshold=settings.high_threshold,
            metric=settings.metric,
            seed=settings.seed,
        )
    if settings.state and Path(settings.state).exists():
        try:
            curriculum.load(json.loads(Path(settings.state).read_text()))
        except ValueError as exc:  # another curriculum's or parameter's state (or not JSON)
            raise SystemExit(f"curriculum: cannot resume from {settings.state}: {exc}") from exc
        print(f"resumed from {settings.state}", flush=True)
    return curriculum


def save(settings: Settings, curriculum: Threshold | ADR) -> None:
    """Writes the state file atomically (a reader never sees half of it)."""
    if settings.state:
        temporary = f"{settings.state}.tmp{os.getpid()}"
        Path(temporary).write_text(json.dumps(curriculum.state()))
        os.replace(temporary, settings.state)


def main(argv: list[str] | None = None) -> int:
    """Runs the curriculum until the pool closes; returns the exit status."""
    settings = parse_settings(argv)
    if (settings.pool is None) == (settings.ray is None):
        raise SystemExit("curriculum: give the pool to attach to: --pool NAME, or --ray NAME for a Ray cluster pool")
    curriculum = build(settings)
    try:
        if settings.ray is not None:
            from shmpool.ray import attach as attach_cluster  # needs Ray: imported only here

            handle: Any = attach_cluster(settings.ray, address=settings.ray_address, wait=settings.attach_timeout)
        else:
            handle = shmpool.attach(settings.pool, wait=settings.attach_timeout)
    except shmpool.ShmpoolError as exc:
        print(f"curriculum: {exc}", file=sys.stderr)
        return 1
    seen, last_log = 0, time.monotonic()
    with handle:
        print(f"attached to {handle!r}", flush=True)
        try:
            while handle.alive:
                records = handle.episodes.read()
                seen += len(records)
                lines: list[str] = []
                try:
                    if len(records):
                        curriculum.update(records, handle.params, lines)
                finally:  # the moves made before the pool closed midway are reported too
                    for line in lines:
                        print(line, flush=True)
                if lines or (len(records) and seen == len(records)):  # every change, and once at the start
                    save(settings, curriculum)
                if time.monotonic() - last_log >= settings.log_every:
                    last_log = time.monotonic()
                    ranges = getattr(curriculum, "ranges", None) or {curriculum.param: curriculum.value}  # type: ignore[union-attr]
                    print(f"episodes {seen}  lost {handle.episodes.lost}  {json.dumps(ranges)}", flush=True)
                time.sleep(settings.poll)
        except shmpool.PoolClosedError:
            pass
        except shmpool.ShmpoolError as exc:  # a cluster's node failed: its envs report nothing more
            print(f"curriculum: {exc}", file=sys.stderr)
            return 1
        finally:
            save(settings, curriculum)
    print("the pool has gone away; curriculum stops", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
