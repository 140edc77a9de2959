"""``nslab doctor``: what this kernel and machine support, what a missing piece disables and
what brings it; it says what its probe creates and that it removed it."""
from __future__ import annotations

import json
import os
import sys

import cli
from agents import bpf
from cli import version
from lab import native
from lab.capabilities import (
    QDISCS,
    Capability,
    as_json,
    probe,
    probe_left,
    probe_namespace,
    probe_plan,
    require_root,
)
from session import chrony, clockd


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="report what this kernel and machine support",
                       description="Probe root, the qdiscs "
                                   f"{', '.join(QDISCS)}, nftables, packet marks, policy "
                                   "routing, cgroups (v1 or v2), multipath hashing, mnexec, "
                                   "iperf3, tcpdump, chronyd, ntpd and ptp4l, and build the "
                                   "compiled parts (the VM clock preload, the agents' datagram "
                                   "path, the "
                                   "pacer's loop and its BPF datapath) into nslab's cache, load "
                                   "the BPF datapath (which hold: edt with sch_fq, else "
                                   "refuse); say where each piece "
                                   "came from, what each missing one disables and the command "
                                   "or package that brings it. The "
                                   "probe creates a namespace nslab-probe-PID with a veth pair "
                                   "in it and removes it; both are printed. Exit 0 when a lab "
                                   "can be built.")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output on stdout (what is created and removed goes "
                        "to stderr)")
    p.set_defaults(func=main)


def pacer_capability(fq: bool) -> Capability:
    """The pacer's kernel datapath (``agents.bpf.probe``) and how it would hold: ``edt`` with
    sch_fq, else ``refuse`` (``agents/bpfpacer.py``)."""
    ok, detail = bpf.probe()
    hold = "hold edt (sch_fq)" if fq else "hold refuse (no sch_fq)"
    return Capability("pacer_datapath", ok, f"{detail}; {hold}" if ok else detail,
                      "the pacer's kernel datapath (pacers run datapath probe instead)",
                      "" if ok else "make setup (clang, libbpf-dev) on a kernel with "
                      "CONFIG_BPF_SYSCALL and CONFIG_NET_CLS_BPF")


def main(args) -> int:
    require_root()
    say = (lambda text: print(text, file=sys.stderr)) if args.json else print
    say(f"nslab doctor: {probe_plan()}")
    caps = {"nslab": installed(), **probe(), **native.capabilities(),
            "chronyd": chrony.capability(), **clockd.capabilities()}
    say("nslab doctor: loads the pacer's BPF object with its maps in a bpffs mounted at "
        "/tmp/nslab-bpf-*, then unmounts and removes it")
    caps["pacer_datapath"] = pacer_capability(caps["fq"].ok)
    if probe_left():
        say(f"nslab doctor: {probe_namespace()} is still there: "
            f"ip netns delete {probe_namespace()}")
    else:
        say(f"nslab doctor: removed {probe_namespace()} and everything in it")
    if args.json:
        print(json.dumps(as_json(caps), indent=1))
    else:
        for c in caps.values():
            print(f"{'ok  ' if c.ok else 'MISS'} {c.name:20s} {c.detail}")
            if not c.ok:
                print(f"     {'':20s} disables: {c.disables}\n     {'':20s} fix: {c.fix}")
    return 0 if caps["mnexec"].ok and caps["cgroups"].ok and caps["vmclock"].ok else 1


def installed() -> Capability:
    """The nslab package itself: its version and where it is imported from (a checkout's
    editable install or a virtual environment's site-packages)."""
    where = os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__)))
    return Capability("nslab", True, f"{version()} from {where}", "everything")
