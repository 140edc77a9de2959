"""PyTorch DDP (gloo) across two leaves: the bytes on each spine with the VMs' balancer daemon
(``balancer: ethereal``, fabric mode entropy) beside plain ECMP (the fabric's hash), the same
job with the same gloo devices, interleaved on one lab.

    sudo .venv/bin/python benchmarks/ddp_balancer.py [--rounds 5] [--iterations 40]
        [--devices 2] [--model mlp] [--hidden 256]

Per run: imbalance = max / mean of the bytes each spine carried (both leaf-spine links of the
spine, both directions, the lab's interface counters; 1.0 is even), and the job's
completion. Per arm the median with its 95 % interval, and ethereal / ecmp with its interval
and verdict (``session.stats``). Each run says whether the machine was saturated then.
"""
from __future__ import annotations

import argparse
import time

from mininet.log import setLogLevel
from record import record

from lab import Lab
from lab.fidelity import FidelitySampler
from session import jobs, stats
from session.lb import imbalance, per_spine, spine_bytes
from topo import LeafSpine
from workloads.config import DDP, JobConfig

ARMS = {"ethereal": ("entropy", "ethereal"), "ecmp": ("ecmp", "none")}
"""Arm -> (fabric mode, the job's balancer)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--devices", type=int, default=2, help="gloo devices (conns_per_peer)")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args()
    setLogLevel("error")
    topo = LeafSpine(spines=2, leaves=2, vms_per_leaf=2, host_bw=100, fabric_bw=100)
    samples: dict[str, dict[str, list]] = {a: {"imbalance": [], "completion_s": [],
                                               "saturated": [], "spines": []} for a in ARMS}
    with Lab(topo, name="bench_ddplb") as lab, FidelitySampler() as fid:
        vms = jobs.naive([v.name for v in lab.vms], 4)
        for r in range(args.rounds):
            order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
            for arm in order:
                mode, balancer = ARMS[arm]
                lab.set_fabric(mode)
                cfg = JobConfig(collective=DDP, model=args.model, hidden=args.hidden,
                                iterations=args.iterations, warmup=1,
                                conns_per_peer=args.devices, balancer=balancer, timeout_s=120)
                t0, before = time.time_ns(), spine_bytes(lab)
                e = jobs.run(lab, f"{arm}{r}", cfg, vms)
                spines = per_spine(before, spine_bytes(lab))
                s = samples[arm]
                ok = e["error"] is None
                s["imbalance"].append(imbalance(spines) if ok else None)
                s["completion_s"].append(e["completion_s"])
                s["saturated"].append(fid.saturated_between(t0, time.time_ns()))
                s["spines"].append(spines)
                print(f"round {r} {arm:9s} imbalance {s['imbalance'][-1]} completion "
                      f"{e['completion_s']} spines {spines} saturated {s['saturated'][-1]}"
                      + (f" error {e['error']}" if not ok else ""), flush=True)
    rows, comparisons = [], []
    for metric in ("imbalance", "completion_s"):
        c = stats.comparison("ddp_balancer", "ethereal", "ecmp", metric,
                             {a: samples[a][metric] for a in ARMS},
                             {a: [bool(x) for x in samples[a]["saturated"]] for a in ARMS})
        comparisons.append(c)
        for arm in ARMS:
            median, ci = stats.median_ci(samples[arm][metric])
            rows.append({"metric": metric, "arm": arm, "median": median, "ci95": ci,
                         "saturated_runs": sum(bool(x) for x in samples[arm]["saturated"])})
        rows.append({"metric": metric, "arm": "ethereal/ecmp", "median": c["ratio_median"],
                     "ci95": c["ratio_ci95"], "verdict": c["verdict"]})
    for row in rows:
        print(row)
    path = record("ddp_balancer", "DDP per-spine imbalance and completion: the VMs' balancer "
                  "daemon (ethereal) against ECMP", ["metric", "arm", "median", "ci95",
                                                    "verdict", "saturated_runs"], rows,
                  note=f"{args.rounds} rounds, {args.iterations} iterations, {args.devices} "
                  f"gloo devices, model {args.model} hidden {args.hidden}; 4 VMs on 2 leaves, "
                  "2 spines, 100 Mbit/s links", data={"samples": samples,
                                                     "comparisons": comparisons})
    print(path)


if __name__ == "__main__":
    main()
