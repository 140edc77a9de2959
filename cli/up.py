"""``nslab up SCENARIO [--servers LIST]``: build a scenario's lab (on one machine or split
across servers) and keep it up with Mininet's CLI."""
from __future__ import annotations

from mininet.cli import CLI

from cli.run import add_server_args, progress_printer, with_servers
from lab.capabilities import require_root
from session.scenario import DEFAULT, load
from session.session import make_lab


def add_parser(sub) -> None:
    p = sub.add_parser("up", help="build a lab and open Mininet's CLI in it",
                       description="Build the scenario's lab (its fault timeline is not played) "
                                   "and open Mininet's CLI: 'vm1 ping vm2', 'leaf1 ip route', "
                                   "'pingall'. From another shell: 'nslab exec LAB VM -- CMD'. "
                                   "Exiting the CLI tears the lab down.")
    p.add_argument("scenario", nargs="?", default=DEFAULT)
    p.add_argument("--name", help="lab name (default: the scenario's name)")
    add_server_args(p)
    p.set_defaults(func=main)


def main(args) -> int:
    require_root()
    sc, topo = load(args.scenario)
    sc = with_servers(sc, topo, args, "up")
    if sc is None:
        return 2
    with make_lab(sc, topo, args.name, progress_printer(False), args.ssh_option) as lab:
        print(f"lab {lab.name} is up: {', '.join(v.name for v in lab.vms)}")
        CLI(lab.net)
    return 0
