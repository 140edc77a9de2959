"""``nslab``: entry point. Errors become exit codes in one place: 0 ok, 1 lab error,
2 usage error or not root; ``--traceback`` shows the real exception. A command's module is
imported only when that command runs (or for ``--help``): ``nslab schema`` and ``nslab report``
load neither Mininet nor pyroute2."""
from __future__ import annotations

import argparse
import importlib
import sys

from cli import version
from lab.errors import LabError, NotRootError

COMMANDS = {"run": "cli.run", "up": "cli.up", "exec": "cli.exec_", "doctor": "cli.doctor",
            "clean": "cli.clean", "schema": "cli.schema", "report": "cli.report",
            "tui": "cli.tui", "exercise": "cli.exercise"}
"""Command -> its module (``add_parser(sub)`` registers it, ``args.func`` runs it)."""


def parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; ``only``: register that command alone (its module alone imported)."""
    p = argparse.ArgumentParser(
        prog="nslab",
        description="Emulate a tenant's cloud cluster for distributed training on one Linux "
                    "machine: VMs in network namespaces with drifting clocks, on physical hosts "
                    "(cgroups), on a leaf-spine fabric of Linux routers with shaped links.",
        epilog="Most commands need root. Start with 'sudo nslab doctor', then 'sudo nslab run'.")
    p.add_argument("--traceback", action="store_true", help="show the full error traceback")
    p.add_argument("--version", action="version", version=f"nslab {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only in (None, name):
            importlib.import_module(module).add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = parser(command if command in COMMANDS else None).parse_args(argv)
    try:
        return args.func(args)
    except NotRootError as e:
        if args.traceback:
            raise
        print(f"nslab: {e}", file=sys.stderr)
        return 2
    except LabError as e:
        if args.traceback:
            raise
        print(f"nslab: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("nslab: interrupted; the lab was torn down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
