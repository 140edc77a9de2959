"""The two_step scenario over seeds: per step the mean completion, fabric drops (the lab's
counters), TCP retransmissions and RTOs (the pacers' sensing) and OWD p99, and the ratios to
naive beside the seed product's (aware 0.92, aware + pacer 0.74).

    sudo .venv/bin/python benchmarks/two_step.py [--seeds 1,2,3] [--scenario two_step]

A seed changes the clocks' draws and ECMP's hash; the VMs and the job stay. Each run's
fidelity says whether the machine was saturated (timings then are not trustworthy).
"""
from __future__ import annotations

import argparse
import statistics

from mininet.log import setLogLevel

from contracts.results import validate
from session.scenario import load
from session.session import Session
from session.two_step import SEED_RATIOS, STEPS


def mean(xs: list) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--scenario", default="two_step", help="built-in name or YAML path")
    args = ap.parse_args()
    setLogLevel("error")
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        sc, topo = load(args.scenario)
        sc = sc.model_copy(update={"seed": seed})
        doc = validate(Session(sc, topo, args.scenario).run())
        runs.append(doc)
        print(f"seed {seed}: ratios {doc.two_step.ratios}, saturated "
              f"{doc.lab.fidelity.saturated}", flush=True)
    print(f"{'step':12s} {'completion s':>12s} {'/naive':>7s} {'drops':>7s} {'retrans':>8s} "
          f"{'RTOs':>5s} {'OWD p99 us':>10s}")
    by = {name: [next(s for s in d.two_step.steps if s.name == name) for d in runs]
          for name, *_ in STEPS}
    naive = mean([s.completion_s for s in by["naive"]])
    for name, steps in by.items():
        c = mean([s.completion_s for s in steps])
        print(f"{name:12s} {c:12.3f} {c / naive:7.3f} {mean([s.fabric_drops for s in steps]):7.0f} "
              f"{mean([s.retransmits for s in steps]):8.0f} {mean([s.rtos for s in steps]):5.1f} "
              f"{mean([s.owd_p99_us for s in steps]):10.0f}")
    print(f"seed product: {SEED_RATIOS}; saturated runs: "
          f"{sum(bool(d.lab.fidelity.saturated) for d in runs)}/{len(runs)}")


if __name__ == "__main__":
    main()
