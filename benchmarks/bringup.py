"""Bring-up and teardown of leaf-spine labs: nslab against plain Mininet building the same
graph (nodes in namespaces, TCLink/HTB links at the same rates), measured side by side in one
run; each case runs in a fresh process so its peak memory (ru_maxrss) is its own.

    sudo .venv/bin/python benchmarks/bringup.py [--repeat 3] [--sizes 2x4x4,4x8x4]
    sudo .venv/bin/python benchmarks/bringup.py --repeat 1 --sizes 4x16x16   # 256 VMs

Prints the ratio nslab / Mininet (goal: <= 1.25; issue 14: <= 1 at 256 VMs, 4x16x16) and
whether 4x8x4 came up in < 3 s.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from record import record


def build_case(variant: str, spines: int, leaves: int, vms: int) -> dict:
    from mininet.link import TCLink
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.node import Node

    from topo import LeafSpine

    setLogLevel("error")
    topo = LeafSpine(spines=spines, leaves=leaves, vms_per_leaf=vms, host_bw=100, fabric_bw=100,
                     vms_per_host=2)
    from lab import Lab  # imports are not bring-up time

    t0 = time.perf_counter()
    if variant == "nslab":
        lab = Lab(topo, name="bench")
        lab.start()
        up = time.perf_counter() - t0
        t1 = time.perf_counter()
        lab.stop()
        assert not lab.leftovers, lab.leftovers
    else:
        class NsRouter(Node):  # plain Mininet needs a start(); OVS is not available here
            def start(self, controllers):
                self.cmd("sysctl -qw net.ipv4.ip_forward=1")

            def stop(self, deleteIntfs=False):
                pass

        net = Mininet(topo=topo, switch=lambda name, **p: NsRouter(name, inNamespace=True),
                      link=TCLink, controller=None, build=False)
        net.build()
        net.start()
        up = time.perf_counter() - t0
        t1 = time.perf_counter()
        net.stop()
    down = time.perf_counter() - t1
    return {"up_s": up, "down_s": down,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run(variant: str, size: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--case", variant, size], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="2x4x4,4x8x4", help="SPINESxLEAVESxVMS_PER_LEAF,...")
    ap.add_argument("--case", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        variant, size = args.case
        print(json.dumps(build_case(variant, *map(int, size.split("x")))))
        return
    print(f"{'size':8s} {'nodes':>5s} {'variant':8s} {'up s':>7s} {'down s':>7s} {'peak MB':>8s}")
    rows = []
    for size in args.sizes.split(","):
        s, lf, v = map(int, size.split("x"))
        nodes = s + lf + lf * v
        med = {}
        for variant in ("mininet", "nslab"):  # interleaved repeats: same machine state
            runs = [run(variant, size) for _ in range(args.repeat)]
            med[variant] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            m = med[variant]
            print(f"{size:8s} {nodes:5d} {variant:8s} {m['up_s']:7.2f} {m['down_s']:7.2f} "
                  f"{m['peak_rss_mb']:8.1f}")
            rows.append({"size": size, "nodes": nodes, "builder": variant,
                         "bring-up s": round(m["up_s"], 2), "teardown s": round(m["down_s"], 2),
                         "peak MB": round(m["peak_rss_mb"], 1)})
        r_up = med["nslab"]["up_s"] / med["mininet"]["up_s"]
        r_down = med["nslab"]["down_s"] / med["mininet"]["down_s"]
        goal = "<= 1" if lf * v >= 256 else "<= 1.25"
        print(f"{size:8s} ratio nslab/mininet: bring-up {r_up:.2f} (goal {goal}), "
              f"teardown {r_down:.2f}")
        if size == "4x8x4":
            print(f"4x8x4 bring-up {med['nslab']['up_s']:.2f} s (goal < 3 s)")
        rows[-1]["nslab / mininet"] = f"{r_up:.2f} up, {r_down:.2f} down"
    record("bringup", "Bring-up and teardown: nslab against plain Mininet, same graphs",
           ["size", "nodes", "builder", "bring-up s", "teardown s", "peak MB",
            "nslab / mininet"],
           rows, f"size SPINESxLEAVESxVMS_PER_LEAF; medians of {args.repeat} interleaved runs; "
           "Mininet with TCLink and Linux routers, no controller or switches.")


if __name__ == "__main__":
    main()
