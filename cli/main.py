"""``nslab``: entry point. Errors become exit codes in one place: 0 ok, 1 lab error,
2 usage error or not root; ``--traceback`` shows the real exception."""
from __future__ import annotations

import argparse
import sys

from cli import clean, doctor, exec_, exercise, report, run, schema, tui, up, version
from lab.errors import LabError, NotRootError

COMMANDS = (run, up, exec_, doctor, clean, schema, report, tui, exercise)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nslab",
        description="Emulate a tenant's cloud cluster for distributed training on one Linux "
                    "machine: VMs in network namespaces with drifting clocks, on physical hosts "
                    "(cgroups), on a leaf-spine fabric of Linux routers with shaped links.",
        epilog="Most commands need root. Start with 'sudo nslab doctor', then 'sudo nslab run'.")
    p.add_argument("--traceback", action="store_true", help="show the full error traceback")
    p.add_argument("--version", action="version", version=f"nslab {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for mod in COMMANDS:
        mod.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
