"""The clock-daemon matrix (the built-in ``clock_daemons`` scenario) repeated, idle and under a
TCP flow into the reference VM, runs interleaved: per case and estimator the median of each
run's p50/p99 offset error with its 95 % interval, and the ratio of the agent's p99 to each
daemon's with its interval and verdict (``session.stats``), and each daemon's convergence
time. The daemons' errors are their clients' achieved clocks minus the
reference's (from the truth); the agent's and the NTP-style baseline's are their estimates
against the truth (``sync.series``), measured on the same lab at the same time, over the
same period (the windows from the daemons' warm-up on). The agent's rows cover every VM but
the reference (the leaf behind the reference's queue, and the other leaf behind the
leaf-to-leaf path), a daemon's only its client VM: the rows ``nslab agent, VM`` score the
agent's estimates on one daemon's VM alone, and each daemon is compared with the agent on its
own VM; the NTP-style baseline with the agent over every VM.

    sudo .venv/bin/python benchmarks/clock_daemons.py [--runs 3] [--duration 180]

Records its table in ``benchmarks/results/clock_daemons.json`` (``record``: machine,
commit; the docs' benchmarks page), every run's rows and the medians and ratios as its data.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

# benchmarks/record.py: benchmarks/ is on sys.path
from record import fmt, median_columns, record, show

from session.scenario import load
from session.session import Session
from session.stats import median_ci, ratio_ci, verdict

CASES = ("idle", "load")


def run_case(name: str, case: str, duration_s: float, warmup_s: float) -> dict:
    """One run of the scenario: {estimator: {p50, p99 (us), converged_s}}."""
    sc, topo = load("clock_daemons")
    flows = [f.model_copy(update={"duration_s": duration_s}) for f in sc.load]
    sc = sc.model_copy(update={"name": name, "duration_s": duration_s,
                               "load": flows if case == "load" else [],
                               "clock_daemons": sc.clock_daemons.model_copy(
                                   update={"warmup_s": warmup_s})})
    doc = Session(sc, topo, "clock_daemons").run()
    sync = doc["sync"]
    up = next(e["t_s"] for e in doc["truth"]["faults"] if e["kind"] == "clock_daemons_up")
    series = sync["series"]
    out = {"nslab agent": {**after(series, "offset_error_us", up + warmup_s),
                           "converged_s": sync["converged_s"]},
           "NTP-style": {**after(series, "baseline_ntp_offset_error_us", up + warmup_s),
                         "converged_s": None}}
    for vm in sc.clock_daemons.clients:  # the agent on each daemon's own VM
        out[f"nslab agent, {vm}"] = {**after(series, "offset_error_us", up + warmup_s, [vm]),
                                     "converged_s": None, "vm": vm}
    out["fidelity"] = {"saturated": doc["lab"]["fidelity"]["saturated"],
                       "saturated_share": doc["lab"]["fidelity"]["saturated_share"]}
    for r in sync["clock_daemons"]["rows"]:
        e = r["offset_error_us"]
        out[r["daemon"]] = {"p50": e["p50"], "p99": e["p99"], "converged_s": r["converged_s"],
                            "synced_log": r["synced_log"], "vm": r["vm"]}
    return out


def after(series: dict, key: str, t0_s: float, vms: list[str] | None = None) -> dict:
    """p50/p99 of |error| (us) of the series' windows centred at ``t0_s`` (s after bring-up)
    or later, over every VM's (``vms``: only theirs): the agents' estimates scored over the
    daemons' scoring period."""
    errs = [abs(e) for vm, v in series[key].items() if vms is None or vm in vms
            for t, e in zip(series["t_s"], v, strict=True) if t >= t0_s and e is not None]
    if not errs:
        return {"p50": None, "p99": None}
    return {"p50": round(float(np.percentile(errs, 50)), 3),
            "p99": round(float(np.percentile(errs, 99)), 3)}


def summarize(runs: list[dict]) -> dict:
    """Per case: each estimator's median p50/p99/converged_s with intervals, and the agent's
    p99 against each other estimator's (ratio, interval, verdict): against a daemon, the
    agent's on that daemon's VM (its row ``"nslab agent, vm2"``); against the NTP-style
    baseline, over every VM."""
    out = {}
    for case in CASES:
        rows = [r["rows"] for r in runs if r["case"] == case]
        ests = [e for e in rows[0] if e != "fidelity"] if rows else []
        med = {est: {k: dict(zip(("median", "ci"), median_ci([r[est][k] for r in rows]),
                                 strict=True))
                     for k in ("p50", "p99", "converged_s")} for est in ests}
        ratios = {}
        for est in [e for e in ests if not e.startswith("nslab agent")]:
            mine = f"nslab agent, {rows[0][est].get('vm')}"  # the agent on the same VM
            agent = [r[mine if mine in r else "nslab agent"]["p99"] for r in rows]
            ratio, ci, n = ratio_ci(agent, [r[est]["p99"] for r in rows])
            ratios[est] = {"ratio": ratio, "ci": ci, "n": n, "verdict": verdict(ci)}
        out[case] = {"medians": med, "agent_p99_over": ratios}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=180.0, help="run time of each lab, s")
    ap.add_argument("--warmup", type=float, default=60.0, help="s left out of the errors")
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        for case in CASES:
            t0 = time.time()
            rows = run_case(f"clk_bd{i}{case[0]}", case, args.duration, args.warmup)
            runs.append({"run": i, "case": case, "rows": rows,
                         "wall_s": round(time.time() - t0, 1)})
            print(i, case, {k: (v.get("p99"), v.get("converged_s")) for k, v in rows.items()},
                  flush=True)
    summary = summarize(runs)
    cols = ["case", "estimator", "p50 us", "p99 us", "p99 95 % interval", "converged s",
            "agent p99 / this"]
    rows = []
    for case, s in summary.items():
        for est, m in s["medians"].items():
            r = s["agent_p99_over"].get(est)
            rows.append({**median_columns(case, est, m),
                         "converged s": fmt(m["converged_s"]["median"]),
                         "agent p99 / this": f"{fmt(r['ratio'])} ({r['verdict']})" if r else ""})
    saturated = sum(r["rows"]["fidelity"]["saturated"] for r in runs)
    path = record("clock_daemons", "Clock daemons in VMs beside the agent, idle and under a "
                  "TCP flow into the reference (medians of the runs)", cols, rows,
                  note=f"{args.runs} runs per case, {args.duration:.0f} s each, scored after "
                  f"{args.warmup:.0f} s; {saturated} of {len(runs)} runs on a saturated machine "
                  "(results' fidelity). Daemons: their clocks against the reference's; agent "
                  "and NTP-style: their estimates against the truth.",
                  data={"args": vars(args), "runs": runs, "summary": summary})
    show(cols, rows, path)


if __name__ == "__main__":
    main()
