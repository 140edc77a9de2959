"""The lb_compare scenario over seeds: ECMP, packet spraying, REPS and Ethereal on AllToAll,
halving-doubling and ring AllReduce, symmetric, with a leaf-spine link down mid-job and with
one at a quarter rate; per cell the mean completion ratio to ECMP (and its range over seeds),
the mean imbalance (leaf-spine bytes max/mean), retransmissions and reordering, and the
paper's claim beside them (Ethereal up to 30 % below spraying, 40 % below REPS).

    sudo .venv/bin/python benchmarks/lb.py [--seeds 1,2] [--oversubscription 1,2]
        [--vms-per-leaf 2] [--host-bw 100] [--collectives all_to_all,halving_doubling,ring]
        [--cases symmetric,link_down,degraded] [--bytes 8000000] [--iterations 2]

``--host-bw`` sets the VM links' rate, Mbit/s (the leaf-spine links follow from the
oversubscription): the ranks' Python transport costs CPU per byte, so at 100 Mbit/s the 2-core
machine this was written on saturates; 50 keeps it out of the way.

A seed changes ECMP's hash (``fib_multipath_hash_seed``), the spraying draws and REPS's
exploring. Every run's fidelity line says whether the machine was saturated (timings then are
not trustworthy).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from mininet.log import setLogLevel

from contracts.results import validate
from contracts.results.lab import fidelity_line
from session.lb import PAPER
from session.scenario import load
from session.session import Session
from session.topology import build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--oversubscription", default="1")
    ap.add_argument("--vms-per-leaf", type=int, default=2)
    ap.add_argument("--host-bw", type=float, default=100.0, help="VM link rate, Mbit/s")
    ap.add_argument("--collectives", default="all_to_all,halving_doubling,ring")
    ap.add_argument("--cases", default="symmetric,link_down,degraded")
    ap.add_argument("--bytes", type=int, default=8_000_000)
    ap.add_argument("--iterations", type=int, default=2)
    args = ap.parse_args()
    setLogLevel("error")
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        sc, _ = load("lb_compare")
        spec = sc.lb.model_copy(update={
            "oversubscription": [float(x) for x in args.oversubscription.split(",")],
            "collectives": args.collectives.split(","), "cases": args.cases.split(","),
            "bytes": args.bytes, "iterations": args.iterations})
        topology = sc.topology.model_copy(update={"vms_per_leaf": args.vms_per_leaf,
                                                 "host_bw": args.host_bw})
        sc = sc.model_copy(update={"seed": seed, "lb": spec, "topology": topology})
        topo, problems = build(sc.topology, sc.placement, seed, Path("."))
        assert topo is not None, problems
        doc = validate(Session(sc, topo, "lb_compare").run())
        print(f"seed {seed}: {fidelity_line(doc.lab.fidelity)}", flush=True)
        runs += doc.lb.runs
    cells: dict[tuple, dict[str, list]] = {}
    for r in runs:
        cells.setdefault((r.oversubscription, r.collective, r.case), {}).setdefault(
            r.mode, []).append(r)
    print(f"{'over':>4s} {'collective':16s} {'case':9s} {'mode':8s} {'s':>7s} {'/ecmp':>6s} "
          f"{'range':>11s} {'imbal':>5s} {'retx':>6s} {'reord':>6s} finished")
    for (over, collective, case), modes in cells.items():
        ecmp = [r.completion_s if r.finished else None for r in modes.get("ecmp", [])]
        for mode, rs in modes.items():  # rs[i] and ecmp[i]: the same seed
            ratios = [r.completion_s / e for r, e in zip(rs, ecmp, strict=False)
                      if r.finished and e]
            done = [r.completion_s for r in rs if r.finished]
            rng = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
            print(f"{over:4g} {collective:16s} {case:9s} {mode:8s} "
                  f"{statistics.mean(done) if done else float('nan'):7.3f} "
                  f"{statistics.mean(ratios) if ratios else float('nan'):6.2f} {rng:>11s} "
                  f"{statistics.mean(r.imbalance or 0 for r in rs):5.2f} "
                  f"{statistics.mean(r.retransmits or 0 for r in rs):6.0f} "
                  f"{statistics.mean(r.reordering or 0 for r in rs):6.0f} "
                  f"{sum(r.finished for r in rs)}/{len(rs)}", flush=True)
    print(f"paper (Astra-Sim, 1:1 fabrics): Ethereal at best {PAPER['ethereal_vs_spray']} of "
          f"spraying's completion and {PAPER['ethereal_vs_reps']} of REPS's")


if __name__ == "__main__":
    main()
