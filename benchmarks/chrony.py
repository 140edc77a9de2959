"""chrony against nslab's agent on the same lab (the built-in ``chrony`` scenario), repeated:
offset error idle, under a TCP flow into the NTP server's VM and under incast into it, runs
interleaved. chrony's error is its clients' achieved clocks minus the server's (from the
truth); the agent's and the NTP-style baseline's are their estimates against the truth
(``sync.series``), scored like with like: over chrony's clients (every VM but the server, the
agents' reference too) and over chrony's scoring period (the windows centred after its
warm-up), pooled and VM by VM.

Per case: each estimator's median p50/p99 over the runs with its 95 % interval, and the
agent's p99 over chrony's and over the NTP-style baseline's, as the ratio of the medians
(Welch's t on the logs, ``session.stats.ratio_ci``) and paired run by run (the median of the
runs' ratios, Student's t on their logs: ``session.stats.median_ci``), each with its verdict.

    sudo .venv/bin/python benchmarks/chrony.py [--runs 3] [--duration 60] [--cases load incast]

Load: ``load``, one TCP iperf3 flow vm3 -> vm1 (two streams) for the whole run; ``incast``,
one from each client (vm2, vm3, vm4) into vm1 at once. Records its table in
``benchmarks/results/chrony.json`` (``record``: machine, commit; the docs' benchmarks page).
"""
from __future__ import annotations

import argparse
import time

from clock_daemons import after  # benchmarks/ is on sys.path
from record import fmt, median_columns, record, show

from session.load import Flow
from session.scenario import load
from session.session import Session
from session.stats import median_ci, ratio_ci, verdict

CASES = ("idle", "load", "incast")
CLIENTS = ("vm2", "vm3", "vm4")


def flows(case: str, duration_s: float) -> list[Flow]:
    """The case's TCP load into the server vm1."""
    if case == "load":
        return [Flow(src="vm3", dst="vm1", duration_s=duration_s, parallel=2)]
    if case == "incast":
        return [Flow(src=vm, dst="vm1", duration_s=duration_s) for vm in CLIENTS]
    return []


def run_case(name: str, case: str, duration_s: float) -> dict:
    """One run: {estimator: {p50, p99 (us)}} pooled over chrony's clients and per client
    (``"chrony, vm2"``, ``"nslab agent, vm2"``), and the run's fidelity."""
    sc, topo = load("chrony")
    sc = sc.model_copy(update={"name": name, "duration_s": duration_s,
                               "load": flows(case, duration_s)})
    doc = Session(sc, topo, "chrony").run()
    sync = doc["sync"]
    chrony = sync["chrony"]
    assert sync["reference"] == chrony["server"], (sync["reference"], chrony["server"])
    up = next(e["t_s"] for e in doc["truth"]["faults"] if e["kind"] == "chrony_up")
    t0 = up + sc.chrony.warmup_s
    series = sync["series"]
    vms = sorted(chrony["by_vm"])
    out = {"chrony": _p(chrony["offset_error_us"]),
           "nslab agent": after(series, "offset_error_us", t0, vms),
           "NTP-style": after(series, "baseline_ntp_offset_error_us", t0, vms)}
    for vm in vms:
        out[f"chrony, {vm}"] = _p(chrony["by_vm"][vm])
        out[f"nslab agent, {vm}"] = after(series, "offset_error_us", t0, [vm])
    out["fidelity"] = {"saturated": doc["lab"]["fidelity"]["saturated"],
                       "saturated_share": doc["lab"]["fidelity"]["saturated_share"],
                       "load": [{k: f.get(k) for k in ("src", "dst", "mbit", "retransmits")}
                                for f in doc.get("load", [])]}
    return out


def _p(stats: dict) -> dict:
    return {"p50": stats["p50"], "p99": stats["p99"]}


def compare(arm: list[float | None], base: list[float | None]) -> dict:
    """``arm`` over ``base`` (p99s of the same runs): ratio of medians (Welch) and paired."""
    ratio, ci, n = ratio_ci(arm, base)
    pairs = [a / b for a, b in zip(arm, base, strict=True) if a and b]
    paired, pci = median_ci(pairs)
    return {"ratio": ratio, "ci": ci, "n": n, "verdict": verdict(ci),
            "paired": paired, "paired_ci": pci, "paired_verdict": verdict(pci),
            "runs": [round(x, 4) for x in pairs]}


def summarize(runs: list[dict], cases: list[str]) -> dict:
    """Per case: each estimator's median p50/p99 with intervals; the agent's p99 over
    chrony's (pooled, and on each client) and over the NTP-style baseline's."""
    out = {}
    for case in cases:
        rows = [r["rows"] for r in runs if r["case"] == case]
        ests = [e for e in rows[0] if e != "fidelity"]
        med = {est: {k: dict(zip(("median", "ci"), median_ci([r[est][k] for r in rows]),
                                 strict=True)) for k in ("p50", "p99")} for est in ests}
        over = {"chrony": compare([r["nslab agent"]["p99"] for r in rows],
                                  [r["chrony"]["p99"] for r in rows]),
                "NTP-style": compare([r["nslab agent"]["p99"] for r in rows],
                                     [r["NTP-style"]["p99"] for r in rows])}
        for est in ests:
            if est.startswith("chrony, "):
                vm = est.split(", ")[1]
                over[est] = compare([r[f"nslab agent, {vm}"]["p99"] for r in rows],
                                    [r[est]["p99"] for r in rows])
        out[case] = {"medians": med, "agent_p99_over": over,
                     "saturated": sum(r["fidelity"]["saturated"] for r in rows)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=60.0, help="run time of each lab, s")
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        for case in args.cases:
            t0 = time.time()
            rows = run_case(f"clk_b{i}{case[:2]}", case, args.duration)
            runs.append({"run": i, "case": case, "rows": rows,
                         "wall_s": round(time.time() - t0, 1)})
            print(i, case, {k: v.get("p99") for k, v in rows.items() if k != "fidelity"},
                  rows["fidelity"], flush=True)
    summary = summarize(runs, args.cases)
    cols = ["case", "estimator", "p50 us", "p99 us", "p99 95 % interval",
            "agent p99 / this (Welch)", "paired (run by run)"]
    rows = []
    for case, s in summary.items():
        for est, m in s["medians"].items():
            r = s["agent_p99_over"].get(est)
            rows.append({**median_columns(case, est, m),
                         "agent p99 / this (Welch)":
                             f"{fmt(r['ratio'])} [{fmt(r['ci'][0])}, {fmt(r['ci'][1])}] "
                             f"({r['verdict']})" if r else "",
                         "paired (run by run)":
                             f"{fmt(r['paired'])} [{fmt(r['paired_ci'][0])}, "
                             f"{fmt(r['paired_ci'][1])}] ({r['paired_verdict']})" if r else ""})
    saturated = sum(s["saturated"] for s in summary.values())
    path = record("chrony", "chrony against the agent on the chrony scenario, idle, under a "
                  "TCP flow into the NTP server's VM and under incast into it (medians of the "
                  "runs)", cols, rows,
                  note=f"{args.runs} runs per case, {args.duration:.0f} s each; chrony, agent "
                  "and NTP-style scored over chrony's clients after its warm-up; "
                  f"{saturated} of {len(runs)} runs on a saturated machine (results' "
                  "fidelity). chrony: its clients' clocks against the server's; agent and "
                  "NTP-style: their estimates against the truth.",
                  data={"args": vars(args), "runs": runs, "summary": summary})
    show(cols, rows, path)


if __name__ == "__main__":
    main()
