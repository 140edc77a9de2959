"""Collocation: per-VM bandwidth against the number of busy VMs on one physical host, with the
host's NIC shaped (on) and unshaped (off), side by side in one run.

    sudo .venv/bin/python benchmarks/collocation.py [--vnic 50] [--nic 100] [--seconds 4]
                                                    [--reps 1]

Two labs run at once: one leaf-spine with two hosts of four VMs each (vm1-vm4 on phys1,
vm5-vm8 on phys2, one host per leaf), every vNIC ``--vnic`` Mbit/s; in one the hosts' NICs
are ``--nic`` Mbit/s, in the other unshaped (the host layer without ``nic_bw``). For n = 1..4
busy VMs, vm1..vmn each send one TCP flow (iperf3) to vm5..vm(4+n) at once; each row is one
lab's n, the rows of both labs interleaved per n and per repetition. Rates are scaled down
from a cloud's (a 2-core machine forwards a few hundred Mbit/s through the lab's hops).
TCP goodput tops out at 0.956 of a rate (HTB counts Ethernet headers). The table goes to
``benchmarks/results/collocation.json`` with the machine and the commit (``record``), every
row's samples and fidelity in its data.
"""
from __future__ import annotations

import argparse
import time

from mininet.log import setLogLevel
from record import record  # benchmarks/: on sys.path when run as a script

from lab import Lab
from lab.fidelity import FidelitySampler
from session.load import Flow, LoadRunner
from topo import LeafSpine


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
    table = [{"NIC": r["nic"], "busy VMs": r["n"],
              "per VM Mbit/s": ", ".join(f"{m:.1f}" if m is not None else "error"
                                         for m in r["mbit"]),
              "sum Mbit/s": r["sum_mbit"], "saturated": r["saturated"]} for r in rows]
    record("collocation", f"Per-VM bandwidth against busy VMs on one host (vNICs {args.vnic:g}"
           f" Mbit/s, host NIC {args.nic:g} Mbit/s or unshaped)", list(table[0]), table,
           note="TCP goodput tops out at 0.956 of a rate (HTB counts Ethernet headers).",
           data={"rows": rows, "seconds": args.seconds})

if __name__ == "__main__":
    main()
