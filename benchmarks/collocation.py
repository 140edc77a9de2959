"""Collocation: per-VM bandwidth against the number of busy VMs on one physical host, with the
host's NIC shaped (on) and unshaped (off), side by side in one run.

    sudo .venv/bin/python benchmarks/collocation.py [--vnic 50] [--nic 100] [--seconds 4]
                                                    [--reps 1] [--json PATH]

Two labs run at once: one leaf-spine with two hosts of four VMs each (vm1-vm4 on phys1,
vm5-vm8 on phys2, one host per leaf), every vNIC ``--vnic`` Mbit/s; in one the hosts' NICs
are ``--nic`` Mbit/s, in the other unshaped (the host layer without ``nic_bw``). For n = 1..4
busy VMs, vm1..vmn each send one TCP flow (iperf3) to vm5..vm(4+n) at once; each row is one
lab's n, the rows of both labs interleaved per n and per repetition. Rates are scaled down
from a cloud's (a 2-core machine forwards a few hundred Mbit/s through the lab's hops).
TCP goodput tops out at 0.956 of a rate (HTB counts Ethernet headers). The JSON has every
sample, the machine (CPU model, cores, kernel, cgroup version), the commit and the fidelity
of every measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

from mininet.log import setLogLevel

from lab import Lab
from lab.capabilities import cgroup_mode
from lab.fidelity import FidelitySampler
from session.load import Flow, LoadRunner
from topo import LeafSpine


def machine() -> dict:
    """CPU model, cores, kernel and cgroup version of this machine."""
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                  if line.startswith("model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "kernel": platform.release(),
            "cgroup": cgroup_mode()[0]}


def commit() -> str | None:
    """The checkout's commit; None outside one (an offline bundle's copy)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(["git", "rev-parse", "--show-toplevel", "--short", "HEAD"],
                       capture_output=True, text=True, cwd=root)
    lines = r.stdout.split()
    return lines[1] if len(lines) == 2 and os.path.samefile(lines[0], root) else None


def measure(lab: Lab, n: int, seconds: float) -> dict:
    """n VMs of phys1 send to n VMs of phys2 at once; their goodputs, Mbit/s."""
    start = lab.now_s() + 0.5
    flows = [Flow(src=f"vm{i}", dst=f"vm{i + 4}", at_s=start, duration_s=seconds,
                  port=5301 + i) for i in range(1, n + 1)]
    runner = LoadRunner(lab, flows)
    with FidelitySampler() as fid:
        runner.start()
        done = runner.join(seconds + 30)
    rates = [d.get("mbit") for d in done]
    return {"n": n, "mbit": rates, "sum_mbit": round(sum(r or 0 for r in rates), 3),
            "errors": [d["error"] for d in done if "error" in d],
            "saturated": fid.summary()["saturated"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vnic", type=float, default=50, help="every vNIC, Mbit/s")
    ap.add_argument("--nic", type=float, default=100, help="the host NIC when on, Mbit/s")
    ap.add_argument("--seconds", type=float, default=4, help="each measurement, s")
    ap.add_argument("--reps", type=int, default=1, help="repetitions of the whole sweep")
    ap.add_argument("--json", help="write every sample here")
    args = ap.parse_args()
    setLogLevel("error")
    topo = {arm: LeafSpine(spines=1, leaves=2, vms_per_leaf=4, vms_per_host=4,
                           host_bw=args.vnic, hosts={"nic_bw": args.nic} if arm == "on" else {})
            for arm in ("on", "off")}
    rows = []
    print(f"{'NIC':>4s} {'busy VMs':>8s} {'per VM Mbit/s':>26s} {'sum':>7s} {'saturated':>9s}")
    with Lab(topo["on"], name="bench_nic_on") as on, Lab(topo["off"], name="bench_nic_off") as off:
        for rep in range(args.reps):
            for n in range(1, 5):
                for arm, lab in (("on", on), ("off", off)):
                    row = {"rep": rep, "nic": arm, **measure(lab, n, args.seconds)}
                    rows.append(row)
                    per_vm = " ".join(f"{r:6.1f}" if r is not None else "   err"
                                      for r in row["mbit"])
                    print(f"{arm:>4s} {n:8d} {per_vm:>26s} {row['sum_mbit']:7.1f} "
                          f"{row['saturated']!s:>9s}", flush=True)
                    time.sleep(0.5)
    doc = {"benchmark": "collocation", "machine": machine(), "commit": commit(),
           "vnic_mbit": args.vnic, "nic_mbit": args.nic, "seconds": args.seconds,
           "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
