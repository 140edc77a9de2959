"""Naive vs collocation-aware job placement over several seeds: the completion ratio, and
whether the agents' groups (not the truth) led to a choice that avoided shared hosts.

    sudo .venv/bin/python benchmarks/placement.py [--seeds 1,2,3] [--scenario quickstart]

Each seed redraws the clocks (and so what the agents must detect); the job and the cluster
stay the same.
"""
from __future__ import annotations

import argparse
import statistics

from mininet.log import setLogLevel
from record import record

from session.scenario import load, resolve
from session.session import Session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--scenario", default="quickstart",
                    help="a scenario with a naive and a collocation_aware job")
    args = ap.parse_args()
    setLogLevel("error")
    print(f"{'seed':>4s} {'naive s':>8s} {'aware s':>8s} {'ratio':>6s} {'avoided':>7s} "
          f"{'precision':>9s} {'recall':>6s} {'sync p99 us':>11s} {'NTP p99 us':>10s}")
    ratios, rows = [], []
    for seed in (int(s) for s in args.seeds.split(",")):
        sc, topo = load(args.scenario)
        sc = sc.model_copy(update={"seed": seed})
        doc = Session(sc, topo, str(resolve(args.scenario))).run()
        cmp_ = doc.get("placement_comparison") or {}
        col, sync = doc.get("collocation", {}), doc.get("sync", {})
        ntp = sync.get("baseline_ntp", {})
        if cmp_:
            ratios.append(cmp_["ratio"])
        nan = float("nan")
        print(f"{seed:4d} {cmp_.get('naive_s', nan):8.3f} {cmp_.get('aware_s', nan):8.3f} "
              f"{cmp_.get('ratio', nan):6.3f} {cmp_.get('aware_avoided_shared_hosts')!s:>7s} "
              f"{col.get('precision', nan):9.3f} {col.get('recall', nan):6.3f} "
              f"{sync.get('offset_error_us', {}).get('p99') or nan:11.2f} "
              f"{ntp.get('offset_error_us', {}).get('p99') or nan:10.2f}")
        rows.append({"seed": seed, "naive s": cmp_.get("naive_s"), "aware s": cmp_.get("aware_s"),
                     "aware / naive": cmp_.get("ratio"),
                     "avoided shared hosts": cmp_.get("aware_avoided_shared_hosts"),
                     "precision": col.get("precision"), "recall": col.get("recall"),
                     "sync p99 us": sync.get("offset_error_us", {}).get("p99"),
                     "NTP-style p99 us": ntp.get("offset_error_us", {}).get("p99"),
                     "saturated": (doc["lab"].get("fidelity") or {}).get("saturated")})
    if ratios:
        print(f"median aware/naive completion ratio: {statistics.median(ratios):.3f} "
              f"(< 1 means collocation-aware placement was faster)")
    record("placement", "Placement: naive against collocation-aware, over seeds", list(rows[0]),
           rows, f"scenario {args.scenario}; each seed redraws the clocks the agents must "
           "read; the aware job is placed from the agents' groups, not the truth. Median "
           "aware / naive: " + (f"{statistics.median(ratios):.3f}" if ratios else "none") + ".")


if __name__ == "__main__":
    main()
