"""chrony against nslab's agent on the same lab (the built-in ``chrony`` scenario): offset
error p50/p99 idle and under load, side by side in one run per case. chrony's error is its
clients' achieved clock minus the server's (from the truth); the agent's and the NTP-style
baseline's are their estimates against the truth (``sync``).

    sudo .venv/bin/python benchmarks/chrony.py [--duration 60]

Under load: a TCP iperf3 flow from each client's leaf to the server's side (vm3 -> vm1) for the
whole run, so chrony's and the agents' probes queue behind it.
"""
from __future__ import annotations

import argparse

from session.load import Flow
from session.scenario import load
from session.session import Session


def run_case(name: str, duration_s: float, flows: list[Flow]) -> dict:
    sc, topo = load("chrony")
    sc = sc.model_copy(update={"name": f"clk_b{name}", "duration_s": duration_s,
                               "load": flows})
    return Session(sc, topo, "chrony").run()["sync"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60.0)
    args = ap.parse_args()
    cases = {"idle": [], "load": [Flow(src="vm3", dst="vm1", duration_s=args.duration,
                                        parallel=2)]}
    print(f"{'case':6s} {'estimator':12s} {'p50 us':>9s} {'p99 us':>9s} {'max us':>9s}")
    for name, flows in cases.items():
        sync = run_case(name, args.duration, flows)
        for label, errs in (("chrony", sync["chrony"]), ("nslab agent", sync),
                            ("NTP-style", sync["baseline_ntp"])):
            e = errs["offset_error_us"]
            print(f"{name:6s} {label:12s} {e['p50']:9.2f} {e['p99']:9.2f} {e['max']:9.2f}")
        print(f"{name:6s} chrony converged within {sync['chrony']['converged_us']} us after "
              f"{sync['chrony']['converged_s']} s")


if __name__ == "__main__":
    main()
