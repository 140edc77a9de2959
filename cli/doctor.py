"""``nslab doctor``: what this kernel and machine support, and what a missing piece disables."""
from __future__ import annotations

import json

from lab.capabilities import as_json, probe


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="report what this kernel and machine support",
                       description="Probe root, netem, nftables, packet marks, policy routing, "
                                   "cgroups, multipath hashing, "
                                   "mnexec, iperf3 and tcpdump; say what each missing one "
                                   "disables. Exit 0 when a lab can be built.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=main)


def main(args) -> int:
    caps = probe()
    if args.json:
        print(json.dumps(as_json(caps), indent=1))
    else:
        for c in caps.values():
            mark = "ok  " if c.ok else "MISS"
            line = f"{mark} {c.name:20s} {c.detail}"
            if not c.ok:
                line += f"\n     {'':20s} disables: {c.disables}"
            print(line)
    return 0 if caps["mnexec"].ok and caps["cgroups"].ok else 1
