"""CASSINI in the lab over seeds: per job set and mode, mean and p99 iteration time against
fair sharing, and whether the compatibility score ranks the sets as their gains.

    sudo .venv/bin/python benchmarks/cassini.py [--seeds 1,2,3] [--scenario cassini]

Ratios are fair / mode (> 1: the mode is faster than fair sharing), measured side by side in
one run per seed. The paper (Rajasekaran et al., NSDI 2024) reports up to 1.6x better average
and 2.5x better tail iteration time on a 24-server testbed.
"""
from __future__ import annotations

import argparse
import statistics

from mininet.log import setLogLevel

from session.scenario import load, resolve
from session.session import Session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--scenario", default="cassini", help="a scenario with a cassini section")
    args = ap.parse_args()
    setLogLevel("error")
    print(f"{'seed':>4s} {'set':>14s} {'score':>6s} {'unshift':>7s} {'mode':>15s} "
          f"{'mean s':>7s} {'p99 s':>7s} {'mean x':>6s} {'p99 x':>6s}")
    gains: dict[tuple[str, str], list[float]] = {}
    ranks = []
    for seed in (int(s) for s in args.seeds.split(",")):
        sc, topo = load(args.scenario)
        sc = sc.model_copy(update={"seed": seed})
        doc = Session(sc, topo, str(resolve(args.scenario))).run()
        section = doc.get("cassini") or {"sets": [], "score_ranks_gains": None}
        ranks.append(section["score_ranks_gains"])
        for s in section["sets"]:
            fair = s["modes"].get("fair") or {}
            for mode, m in s["modes"].items():
                mean, p99 = m.get("mean_iteration_s"), m.get("p99_iteration_s")
                if mean is None or not fair.get("mean_iteration_s"):
                    print(f"{seed:4d} {s['name']:>14s} {mode:>15s} {m.get('error')}")
                    continue
                gm, gp = fair["mean_iteration_s"] / mean, fair["p99_iteration_s"] / p99
                gains.setdefault((s["name"], mode), []).append(gm)
                print(f"{seed:4d} {s['name']:>14s} {s['score']:6.3f} {s['unshifted_score']:7.3f}"
                      f" {mode:>15s} {mean:7.3f} {p99:7.3f} {gm:6.2f} {gp:6.2f}")
    for (name, mode), g in gains.items():
        if mode != "fair":
            print(f"median fair/{mode} mean ratio, {name}: {statistics.median(g):.2f}")
    print(f"scores ranked the sets' gains: {ranks}")


if __name__ == "__main__":
    main()
