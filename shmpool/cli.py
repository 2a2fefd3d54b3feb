"""The ``shmpool`` command: find pools on this machine, look at them, change their parameters.

shmpool ls                       this user's pools (stale ones, and ones of unknown liveness, marked)
shmpool show NAME                parameters, applied values and recent episodes per env
shmpool set NAME length=0.8 [--envs 0:8]   a validated write (masscart.low=0.5 for a dist) to envs
                                 0 to 7: --envs takes START:STOP (STOP excluded), an id, or ids 3,1
shmpool watch NAME               a live view: steps/s, returns, parameter ranges
shmpool gc                       remove shared memory left by pools whose owner is dead
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import numpy as np

from .errors import ShmpoolError
from .registry import list_pools, sweep_stale


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def table(header: list[str], rows: list[list[Any]]) -> str:
    """Left-aligned columns wide enough for their contents."""
    cells = [[str(c) for c in header]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        return f"{value:.4g}"
    return str(value)


def _state(alive: bool | None) -> str:
    if alive is None:
        return "unknown (owner in another pid namespace; never removed from here)"
    return "alive" if alive else "stale (owner dead; shmpool gc removes it)"


def _meta_text(meta: dict[str, Any], key: str) -> str:
    """A table value from a segment's metadata, which any process of this user could have written."""
    value = meta.get(key, "?")
    text = value if isinstance(value, str) else json.dumps(value) if _plain(value) else "?"
    # One short printable line: a crafted name must not break the table or the terminal.
    return "".join(c if c.isprintable() else "?" for c in text[:40])


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float))


def _age_text(meta: dict[str, Any]) -> str:
    created = meta.get("created")
    if not isinstance(created, (int, float)) or isinstance(created, bool) or not math.isfinite(created):
        return "?"
    return _age(max(0.0, time.time() - created))


def command_ls() -> int:
    """Prints every pool of this user."""
    records = list_pools()
    if not records:
        print("no pools")
        return 0
    rows = []
    for record in records:
        meta = record.meta
        rows.append(
            [
                record.name,
                record.owner_pid,
                _state(record.alive),
                _meta_text(meta, "env"),
                _meta_text(meta, "num_envs"),
                _meta_text(meta, "num_workers"),
                record.steps_per_second,
                record.global_step,
                _age_text(meta),
            ]
        )
    print(table(["name", "owner", "state", "env", "envs", "workers", "steps/s", "step", "age"], rows))
    return 0


def _param_text(params: Any, name: str, env: int) -> str:
    value = params[name][env]
    if value.dtype.names:
        return "{" + ", ".join(f"{k}={_cell(value[k])}" for k in value.dtype.names) + "}"
    return _cell(value) if np.ndim(value) == 0 else str(np.round(value, 4).tolist())


def command_show(name: str, recent: int) -> int:
    """Prints a pool's parameters, applied values and recent episodes per env."""
    from .handle import attach

    with attach(name) as handle:
        stats = handle.stats
        print(
            f"{handle!r}  step {stats.global_step}  {stats.steps_per_second} steps/s  "
            f"{stats.episodes} episodes  workers {stats.workers}  refusals {stats.refusals}"
        )
        episodes = handle.episodes.recent(recent * handle.num_envs)
        names = list(handle.param_specs)
        header = ["env"] + [f"{n} (param)" for n in names] + [f"{n} (applied)" for n in names]
        header += [f"mean return (last {recent})", "episodes"]
        rows = []
        for env in range(handle.num_envs):
            mine = episodes[episodes["env_id"] == env][-recent:]
            row: list[Any] = [env]
            row += [_param_text(handle.params, n, env) for n in names]
            row += [_param_text(handle.applied, n, env) for n in names]
            row += [float(mine["return"].mean()) if len(mine) else "-", len(mine)]
            rows.append(row)
        print(table(header, rows))
    return 0


#: What ``--envs`` takes, for ``shmpool set --help`` (argparse formats help with %: none here).
ENVS_HELP = (
    "the envs to write (default: all). A range START:STOP is the ids START to STOP-1, as in Python "
    "(0:8; a side left out is the first or the end: 2: or :4); an id is one env (3); a comma list "
    "(3,1) gives a value list's items to those envs in that order (length=0.3,0.2). Ids run from 0 "
    "to num_envs-1: a negative id, an id past the end and a range that selects no env (3:1) are errors."
)


def _parse_envs(text: str | None, num_envs: int) -> slice | list[int] | None:
    """The env ids that ``--envs`` names (see ``ENVS_HELP``; None: every env), or a ``ValueError``
    naming the text and the valid ids. A negative id is refused, not counted from the end as numpy
    would (``--envs -1`` is likelier a typo than a wish for the last env), and so is a selection of
    no env, which would write nothing (issue #24)."""
    if text is None:
        return None
    valid = f"valid: ids 0 to {num_envs - 1}, ranges START:STOP with 0 <= START < STOP <= {num_envs}"
    try:
        if ":" in text:
            start, _, stop = text.partition(":")
            first = int(start) if start.strip() else 0
            end = int(stop) if stop.strip() else num_envs
            ids = None
        else:
            ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--envs {text} is not a range START:STOP, an id or a comma list of ids ({valid})") from None
    if ids is None:
        if not (0 <= first <= num_envs and 0 <= end <= num_envs):
            raise ValueError(f"--envs {text} is outside the pool's {num_envs} envs ({valid})")
        if first >= end:
            raise ValueError(f"--envs {text} selects no env, so nothing would be written ({valid})")
        return slice(first, end)
    outside = [env_id for env_id in ids if not 0 <= env_id < num_envs]
    if outside:
        raise ValueError(f"--envs {text} is outside the pool's {num_envs} envs: {outside} ({valid})")
    return ids


def command_set(name: str, assignments: list[str], envs: str | None) -> int:
    """Validated write of ``PARAM=VALUE`` (``PARAM.ARG=VALUE`` for a distribution's argument)."""
    from .handle import attach

    values: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep:
            raise SystemExit(f"shmpool set: expected PARAM=VALUE, got {assignment!r}")
        try:
            number: Any = [float(v) for v in text.split(",")] if "," in text else float(text)
        except ValueError:
            raise SystemExit(f"shmpool set: {key} takes a number (or numbers, comma-separated), got {text!r}") from None
        param, dot, argument = key.partition(".")
        if param in values and isinstance(values[param], dict) != bool(dot):
            raise SystemExit(f"shmpool set: {param} is given both a value and distribution arguments ({param}.ARG)")
        if dot:
            values.setdefault(param, {})[argument] = number
        else:
            values[param] = number
    with attach(name) as handle:
        ids = _parse_envs(envs, handle.num_envs)
        try:
            params = handle.params
        except AttributeError as exc:  # a pool launched without params: said as an error, not a traceback
            raise ValueError(str(exc)) from None
        params.write(ids, **values)
        print(f"wrote {values} to envs {envs or 'all'} of {name}")
    return 0


def command_watch(name: str, interval: float, count: int | None) -> int:
    """A refreshing view of a pool until it closes (or ``count`` refreshes)."""
    from .errors import PoolClosedError
    from .handle import attach

    with attach(name) as handle:
        shown = 0
        while handle.alive and (count is None or shown < count):
            try:
                stats = handle.stats
                records = handle.episodes.read()
                applied = handle.applied.copy() if handle.param_specs else None
            except PoolClosedError:
                break
            lines = [
                f"{handle!r}",
                f"step {stats.global_step}   {stats.steps_per_second:,} env steps/s   {stats.episodes} episodes   "
                f"workers {' '.join(stats.workers)}   lost records {handle.episodes.lost}",
            ]
            if len(records):
                lines.append(
                    f"last {interval:g}s: {len(records)} episodes, return mean {records['return'].mean():.4g} "
                    f"min {records['return'].min():.4g} max {records['return'].max():.4g}"
                )
            else:
                lines.append(f"last {interval:g}s: no episodes finished")
            if applied is not None:
                rows = [
                    [n, float(np.min(applied[n])), float(np.mean(applied[n])), float(np.max(applied[n]))]
                    for n in handle.param_specs
                ]
                lines.append(table(["param", "min", "mean", "max"], rows))
            print(("\033[2J\033[H" if sys.stdout.isatty() else "") + "\n".join(lines), flush=True)
            shown += 1
            time.sleep(interval)
    return 0


def _positive_int(text: str) -> int:
    """An argument that must be an int >= 1 (argparse's ``type``)."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


#: The longest interval the CLI takes (a day).
MAX_SECONDS = 86_400.0


def _positive_seconds(text: str) -> float:
    """An argument that must be a finite number of seconds > 0 (argparse's ``type``)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < seconds <= MAX_SECONDS:  # more than a day would overflow the sleep, and is a typo anyway
        raise argparse.ArgumentTypeError(f"must be a number of seconds in (0, {MAX_SECONDS:g}], got {text}")
    return seconds


#: What ``shmpool --help`` says above its commands (the module docstring without its markup).
DESCRIPTION = (__doc__ or "").replace("``", "")  # no docstring under python -OO
#: Each command's one line, shown in the command list and atop its own --help.
COMMANDS = {
    "ls": "list this user's pools (live, stale, or unknown: owner in another pid namespace)",
    "show": "a pool's parameters, applied values and recent episodes per env",
    "set": "write parameters: PARAM=VALUE or PARAM.ARG=VALUE (validated)",
    "watch": "a live view of a pool: steps/s, returns, parameter ranges",
    "gc": "remove shared memory left by pools whose owner process is dead",
}
NAME_HELP = "the pool's name, as shmpool ls lists it"


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="shmpool", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {name: commands.add_parser(name, help=line, description=line) for name, line in COMMANDS.items()}
    show = parsers["show"]
    show.add_argument("name", help=NAME_HELP)
    show.add_argument("--recent", type=_positive_int, default=10, help="episodes per env to average")
    setter = parsers["set"]
    setter.add_argument("name", help=NAME_HELP)
    setter.add_argument(
        "assignments",
        nargs="+",
        metavar="PARAM=VALUE",
        help="a value for every env in --envs, a comma list of one per env (length=0.3,0.2), or a "
        "distribution's argument (masscart.low=0.5)",
    )
    setter.add_argument("--envs", metavar="IDS", help=ENVS_HELP)
    watch = parsers["watch"]
    watch.add_argument("name", help=NAME_HELP)
    watch.add_argument("--interval", type=_positive_seconds, default=1.0, help="seconds between refreshes")
    watch.add_argument("--count", type=_positive_int, help="stop after this many refreshes")
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "ls":
            return command_ls()
        if arguments.command == "show":
            return command_show(arguments.name, arguments.recent)
        if arguments.command == "set":
            return command_set(arguments.name, arguments.assignments, arguments.envs)
        if arguments.command == "watch":
            return command_watch(arguments.name, arguments.interval, arguments.count)
        removed = sweep_stale()
        print("\n".join(f"removed {name}" for name in removed) if removed else "nothing to remove")
        return 0
    except (ShmpoolError, ValueError, KeyError, PermissionError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # a KeyError's str() adds quotes
        print(f"shmpool {arguments.command}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
