"""``nslab run [SCENARIO] [--json PATH] [--html OUT] [--pcap DIR] [--servers LIST]``: run a
scenario end to end and print its report."""
from __future__ import annotations

import argparse
import json
import sys

from contracts import results
from lab.capabilities import require_root
from report import text
from session.scenario import DEFAULT, ServerSpec, builtin_names, load, resolve
from session.session import Session
from topo.split import SplitError, split


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a scenario and print its report",
                       description="Build the scenario's lab, play its fault timeline, tear it "
                                   "down and report. SCENARIO is a built-in name "
                                   f"({', '.join(builtin_names())}) or a YAML file.")
    p.add_argument("scenario", nargs="?", default=DEFAULT, help=f"default: {DEFAULT}")
    p.add_argument("--json", metavar="PATH", help="write the results document "
                   f"({results.SCHEMA}) to PATH ('-' for stdout)")
    p.add_argument("--html", metavar="OUT", help="also write the HTML report with plots to OUT "
                   "(nslab report RESULTS.json --html OUT)")
    p.add_argument("--name", help="lab name (default: the scenario's name)")
    p.add_argument("--repeat", metavar="N", type=int, help="run every compared arm N times, "
                   "interleaved (default: the scenario's repeat, 1); each comparison gets "
                   "medians, a 95 %% interval and a verdict"),
    p.add_argument("--pcap", metavar="DIR", help="record packets with tcpdump into DIR, one "
                   "pcap per interface, on any server of a split lab (brought back here at "
                   "the end; agents' probes: tools/wireshark/nslab_probe.lua)")
    p.add_argument("--capture", metavar="TARGETS", type=lambda s: [t for t in s.split(",") if t],
                   help="with --pcap: comma-separated VMs and links a-b to record "
                   "(e.g. vm1,leaf1-spine1; default: every VM)")
    p.add_argument("--pcap-filter", metavar="EXPR", help="with --pcap: a tcpdump capture filter, "
                   "e.g. 'udp port 7701' (the agents' probes)")
    add_server_args(p)
    p.add_argument("--check", action="store_true",
                   help="only validate the scenario (no root needed): every problem, one line "
                        "each with its file, line and field; build nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=main)


def add_server_args(p) -> None:
    """``--servers LIST`` and ``--ssh-option ARG`` (``nslab run``, ``nslab up``)."""
    p.add_argument("--servers", metavar="LIST", type=servers_arg,
                   help="split the lab across servers (docs/multi-server.md), replacing the "
                   "scenario's servers: comma-separated, first this machine's address on the "
                   "servers' network, then each other server as [USER@]ADDRESS, its SSH "
                   "target (user root by default), e.g. 10.0.0.1,10.0.0.2; servers are named "
                   "by address in server_placement")
    p.add_argument("--ssh-option", metavar="ARG", action="append", default=[],
                   help="with --servers or the scenario's servers: an extra ssh argument for "
                   "every remote server, repeatable (e.g. --ssh-option=-i --ssh-option=KEY)")


def with_servers(sc, topo, args, command: str):
    """The scenario with ``--servers`` in place of its servers, or None after printing why
    the topology cannot be split across them (``topo.split.SplitError``)."""
    if not args.servers:
        return sc
    sc = sc.model_copy(update={"servers": args.servers})
    try:
        split(topo, [s.server() for s in sc.servers], sc.server_placement)
    except SplitError as e:
        print(f"nslab {command}: --servers: {e}", file=sys.stderr)
        return None
    return sc


def servers_arg(text: str) -> list[ServerSpec]:
    """``--servers``: the first item is this machine's address, the others [USER@]ADDRESS
    SSH targets (root by default).

    Raises:
        argparse.ArgumentTypeError: fewer than two servers.
    """
    items = [t.strip() for t in text.split(",") if t.strip()]
    if len(items) < 2:
        raise argparse.ArgumentTypeError("give this machine's address and at least one other "
                                         "server, comma-separated")
    return [ServerSpec(address=items[0])] + [
        ServerSpec(address=t.rpartition("@")[2], ssh=t if "@" in t else f"root@{t}")
        for t in items[1:]]


def progress_printer(quiet: bool):
    return (lambda msg: None) if quiet else (lambda msg: print(f"  .. {msg}", file=sys.stderr,
                                                               flush=True))


def main(args) -> int:
    sc, topo = load(args.scenario)
    if args.repeat is not None:
        if args.repeat < 1:
            print("nslab run: --repeat must be >= 1", file=sys.stderr)
            return 2
        sc = sc.model_copy(update={"repeat": args.repeat})
    sc = with_servers(sc, topo, args, "run")
    if sc is None:
        return 2
    if args.check:
        print(f"{resolve(args.scenario)}: valid ({len(topo.hosts())} VMs, "
              f"{len(topo.links())} links, {len(sc.faults)} faults)")
        return 0
    if (args.capture or args.pcap_filter) and not args.pcap:
        print("nslab run: --capture and --pcap-filter need --pcap DIR", file=sys.stderr)
        return 2
    require_root()
    progress = progress_printer(args.quiet)
    capture = {"directory": args.pcap, "targets": args.capture,
               "bpf": args.pcap_filter} if args.pcap else None
    session = Session(sc, topo, str(resolve(args.scenario)), args.name, capture=capture,
                      progress=progress, ssh_options=args.ssh_option)
    session.subscribe(lambda ev: progress(f"{ev.t_s:6.2f} s  {ev.describe()}"))
    doc = session.run()
    if args.json == "-":
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print(text.report(doc))
        if args.json:
            results.write(doc, args.json)
            print(f"  results: {args.json}")
        if args.html:
            from report import page  # plotly is imported only here
            page.write(doc, args.html)
            print(f"  report: {args.html}")
        if session.capture is not None:
            for path, n in session.capture.packets.items():
                print(f"  capture: {path} ({n} packets)")
    return 0 if doc["teardown"]["clean"] else 1
