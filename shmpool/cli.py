"""The ``shmpool`` command: list pools on this machine and remove the ones whose owner died."""

from __future__ import annotations

import argparse
import sys

from .registry import list_pools, sweep_stale


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="shmpool", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("ls", help="list this user's pools (live and stale)")
    commands.add_parser("gc", help="remove shared memory left by pools whose owner process is dead")
    arguments = parser.parse_args(argv)
    if arguments.command == "ls":
        records = list_pools()
        if not records:
            print("no pools")
        for record in records:
            meta = record.meta
            print(
                f"{record.name:<32} owner {record.owner_pid:<8} {'alive' if record.alive else 'stale':<6} "
                f"{meta.get('env', '?')} x{meta.get('num_envs', '?')} on {meta.get('num_workers', '?')} workers"
            )
    elif arguments.command == "gc":
        removed = sweep_stale()
        print("\n".join(f"removed {name}" for name in removed) if removed else "nothing to remove")
    return 0


if __name__ == "__main__":
    sys.exit(main())
