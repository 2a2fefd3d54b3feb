"""The command line (``python -m shmpool``, ``shmpool.cli``): ls, show, set, watch and gc against live
pools, and the input it refuses before doing anything."""

from __future__ import annotations

import time

import helpers
import pytest

import shmpool
from shmpool import Param


@pytest.mark.parametrize("engine", helpers.ENGINES)
def test_cli_show_set_watch_against_a_live_pool(engine: str, pool_name: str) -> None:
    params = {"length": Param(low=0.1, high=2.0), "masscart": Param(dist="uniform", low=0.5, high=2.0, when="reset")}
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name, params=params, seed=0, engine=engine) as pool:
        pool.reset()
        for _ in range(100):
            pool.step(pool.action_space.sample())
        listing = helpers.shmpool_cli("ls")
        assert listing.returncode == 0 and pool_name in listing.stdout and "alive" in listing.stdout
        shown = helpers.shmpool_cli("show", pool_name)
        assert shown.returncode == 0, shown.stderr
        assert "length (param)" in shown.stdout and "{low=0.5, high=2}" in shown.stdout
        assert len([line for line in shown.stdout.splitlines() if line[:1].isdigit()]) == 4  # one row per env
        written = helpers.shmpool_cli("set", pool_name, "length=0.8", "masscart.high=1.5", "--envs", "1:3")
        assert written.returncode == 0, written.stderr
        assert pool.params["length"].tolist() == [0.5, 0.8, 0.8, 0.5]
        assert pool.params["masscart"]["high"].tolist() == [2.0, 1.5, 1.5, 2.0]
        typo = helpers.shmpool_cli("set", pool_name, "lenght=0.8")
        assert typo.returncode == 2
        assert typo.stderr.startswith("shmpool set: no parameter 'lenght' (did you mean 'length'?)"), typo.stderr
        refused = helpers.shmpool_cli("set", pool_name, "length=9")
        assert refused.returncode == 2 and "params['length'][0] = 9.0 rejected: outside [0.1, 2.0]" in refused.stderr
        ordered = helpers.shmpool_cli("set", pool_name, "length=0.3,0.2", "--envs", "3,1")
        assert ordered.returncode == 0 and pool.params["length"].tolist() == [0.5, 0.2, 0.8, 0.3]
        beyond = helpers.shmpool_cli("set", pool_name, "length=0.3", "--envs", "0:9")
        assert beyond.returncode == 2 and "--envs 0:9 is outside the pool's 4 envs" in beyond.stderr
        watched = helpers.shmpool_cli("watch", pool_name, "--count", "2", "--interval", "0.1")
        assert watched.returncode == 0 and watched.stdout.count("env steps/s") == 2 and "masscart" in watched.stdout
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name) as pool:
        nothing = helpers.shmpool_cli("set", pool_name, "length=0.3")
        assert nothing.returncode == 2 and "was launched without params" in nothing.stderr


def test_cli_set_refuses_an_env_selection_that_is_empty_negative_or_past_the_end(pool_name: str) -> None:
    """An --envs that selects nothing (``3:1``) or names an id outside the pool (``-1``, which numpy
    would count from the end) is an error naming the --envs value and the valid ids: nothing is
    written, rather than a "wrote" that wrote nothing or a write to the wrong env."""
    params = {"length": Param(low=0.1, high=2.0)}
    with shmpool.launch("CartPole-v1", 4, num_workers=1, name=pool_name, params=params, seed=0) as pool:
        refusals = {
            "3:1": "--envs 3:1 selects no env, so nothing would be written",
            "2:2": "--envs 2:2 selects no env",
            "-1": "--envs -1 is outside the pool's 4 envs: [-1]",
            "=-1:": "--envs -1: is outside the pool's 4 envs",  # a leading "-" must follow "=" for argparse
            "1,-2": "--envs 1,-2 is outside the pool's 4 envs: [-2]",
            "4": "--envs 4 is outside the pool's 4 envs: [4]",
            "x": "--envs x is not a range START:STOP, an id or a comma list of ids",
        }
        valid = "valid: ids 0 to 3, ranges START:STOP with 0 <= START < STOP <= 4"
        for envs, message in refusals.items():
            option = ["--envs" + envs] if envs.startswith("=") else ["--envs", envs]
            refused = helpers.shmpool_cli("set", pool_name, "length=0.3", *option)
            assert refused.returncode == 2, (envs, refused.stdout, refused.stderr)
            assert message in refused.stderr and valid in refused.stderr, envs
            assert "wrote" not in refused.stdout, envs
        assert pool.params["length"].tolist() == [0.5] * 4  # nothing was written
        written = helpers.shmpool_cli("set", pool_name, "length=0.3", "--envs", "2:")
        assert written.returncode == 0 and "wrote" in written.stdout, written.stderr
        assert pool.params["length"].tolist() == [0.5, 0.5, 0.3, 0.3]
    helped = helpers.shmpool_cli("set", "--help")
    text = " ".join(helped.stdout.split())  # argparse wraps the help to the terminal's width
    assert helped.returncode == 0 and "A range START:STOP is the ids START to STOP-1" in text and "negative id" in text


def test_cli_refuses_bad_numbers_before_doing_anything(pool_name: str) -> None:
    """Counts and intervals out of range, and a distribution's argument for a plain parameter, are
    refused at once, naming the argument and the value (a negative interval once failed only after
    the first refresh, and ``set length.low=1`` said "dtype object")."""
    params = {"length": Param(low=0.1, high=2.0)}
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params):
        refusals = {
            ("watch", "--interval", "-1"): "argument --interval: must be a number of seconds in (0, 86400], got -1",
            ("watch", "--interval", "nan"): "argument --interval: must be a number of seconds in (0, 86400], got nan",
            (
                "watch",
                "--interval",
                "1e300",
            ): "argument --interval: must be a number of seconds in (0, 86400], got 1e300",
            ("watch", "--count", "0"): "argument --count: must be at least 1, got 0",
            ("show", "--recent", "-3"): "argument --recent: must be at least 1, got -3",
            ("set", "length.low=1"): "params['length'] is not a distribution, so it takes a value, not the "
            "arguments {'low': 1.0}",
        }
        for (command, *arguments), message in refusals.items():
            started = time.monotonic()
            refused = helpers.shmpool_cli(command, pool_name, *arguments)
            assert refused.returncode == 2 and message in refused.stderr, (arguments, refused.stderr)
            assert refused.stdout == "" and time.monotonic() - started < 20
        for arguments, message in {  # once tracebacks
            ("length=1", "length.low=0.6"): "length is given both a value and distribution arguments (length.ARG)",
            ("length=abc",): "length takes a number (or numbers, comma-separated), got 'abc'",
        }.items():
            refused = helpers.shmpool_cli("set", pool_name, *arguments)
            assert refused.returncode == 1 and refused.stderr.strip() == f"shmpool set: {message}", refused.stderr


def test_every_command_and_argument_explains_itself_without_markup() -> None:
    from shmpool.cli import COMMANDS

    top = helpers.shmpool_cli("--help")
    assert top.returncode == 0 and "`" not in top.stdout
    for command in COMMANDS:
        helped = helpers.shmpool_cli(command, "--help")
        assert helped.returncode == 0 and "`" not in helped.stdout
        assert COMMANDS[command] in " ".join(helped.stdout.split())  # its description, under the usage line
        arguments = [
            line for line in helped.stdout.splitlines() if line.startswith("  ") and not line.startswith("   ")
        ]
        for line in arguments:  # each argument's line, or the next, says what it is
            assert len(line.split()) > 1 or line.strip() == "-h, --help", f"{command}: {line!r} has no help"
