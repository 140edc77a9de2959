"""The pacer under incast, its kernel datapath beside its probe datapath and beside the baselines a
user would pick (CUBIC alone, BBR alone), in one lab per (senders, queue), rounds interleaved:
N senders on leaf1 each send the same bytes over TCP (workloads.bulk) to one VM on leaf2 at
once, behind its downlink's packet queue (``session.incast``: timed from the go).

    sudo .venv/bin/python benchmarks/pacer.py [--senders 2,4,8] [--queues 20,30,50]
        [--rounds 3] [--requests 1] [--arms bpf,probe,cubic,bbr] [--rate 5] [--bytes 300000]
        (arms: bpf, both, clamp, hold, ack, probe, cubic, bbr)

Arms: ``bpf`` (the pacer's defaults: OWD of every data segment in the kernel and the senders'
holds, T from 0: On-Ramp's rule, CUBIC), ``both`` (the receivers' window clamp and the holds
with T from the base OWD), ``clamp`` (the clamp alone), ``hold`` (the holds alone, T from the
base), ``ack`` (``both`` and the receivers' pure ACKs paced at 0.9 of their line, each counted
as a full segment), ``probe`` (the pacer's UDP probes and HTB switches, CUBIC),
``cubic`` and ``bbr`` (no pacer at all). Each round runs every arm once, in turn; a paced
arm's pacers start before its round (their clocks synchronized) and stop after it. A round is
``--requests`` incasts one after the other, each a sample (a request of ``--bytes`` per
sender: small requests and many samples make the p99 a request's, as in On-Ramp's incast
RPCs; the default, one bulk transfer per round, is issue 10's sweep).

Printed per (senders, queue, arm): completion median with its 95 % bootstrap interval and p99
over the samples (s), fabric and VM-link queue drops per sample (the lab's tc counters, the
truth; the coordinator's link left out: the agents' records), samples without a drop, the
senders' TCP retransmissions (their namespaces' RetransSegs: at least one per data segment
lost, so drops beyond them are other packets': the agents' probes, ACKs), holds, the
reaction time of the kernel datapath (the receiver's echo delay p99 + the echo's transit p99,
us), the segments whose window the receiver clamped and the pacers' CPU (fraction of a core,
the busiest pacer); then per cell and paced arm the ratio of its median completion to CUBIC's
and to BBR's with a 95 % bootstrap interval (scipy.stats.bootstrap) and a verdict (better,
worse, no difference at this N), and the ratio of the p99s. The table, and every sample, go to
``benchmarks/results/pacer.json`` (``pacer_requests.json`` with ``--requests`` above 1) with
the machine and the commit (``record.py``). Goals (issue 29): zero drops paced up to 8 senders
on 20-packet queues; incast completion p99 at least 2x better than CUBIC alone.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import psutil
from mininet.log import setLogLevel
from scipy import stats

from agents.tcpsense import parse_netstat
from lab import Lab
from lab.fidelity import FidelitySampler
from session.daemons import AgentMesh, AgentsSpec, PacerSpec
from session.edge import wait_synced
from session.incast import incast
from topo import LeafSpine

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record import record  # noqa: E402 - benchmarks/ is this script's directory

ARMS = {"bpf": ({"datapath": "bpf"}, "cubic"),
        "both": ({"datapath": "bpf", "window_clamp": True, "threshold_from": "base"}, "cubic"),
        "clamp": ({"datapath": "bpf", "hold": "none", "window_clamp": True}, "cubic"),
        "hold": ({"datapath": "bpf", "threshold_from": "base"}, "cubic"),
        "ack": ({"datapath": "bpf", "window_clamp": True, "threshold_from": "base",
                 "ack_pace": 0.9}, "cubic"),
        "probe": ({"datapath": "probe"}, "cubic"), "cubic": (None, "cubic"),
        "bbr": (None, "bbr")}
"""arm -> (the pacer's settings over the defaults, None: no pacer; the senders' congestion
control)."""


def interval(xs: list[float]) -> tuple[float, float] | None:
    """95 % bootstrap interval of the median of ``xs`` (None below 3 samples)."""
    if len(xs) < 3 or len(set(xs)) < 2:
        return None
    r = stats.bootstrap((np.asarray(xs),), np.median, confidence_level=0.95,
                        n_resamples=2000, method="percentile", random_state=0)
    return float(r.confidence_interval.low), float(r.confidence_interval.high)


def ratio(xs: list[float], ys: list[float]) -> dict:
    """median(xs) / median(ys) with a 95 % bootstrap interval and a verdict."""
    med = float(np.median(xs) / np.median(ys))
    if len(xs) < 3 or len(ys) < 3:
        return {"ratio": med, "ci": None, "verdict": "no difference at this N"}
    r = stats.bootstrap((np.asarray(xs), np.asarray(ys)),
                        lambda a, b, axis=-1: np.median(a, axis=axis) / np.median(b, axis=axis),
                        confidence_level=0.95, n_resamples=2000, method="percentile",
                        vectorized=True, random_state=0)
    lo, hi = float(r.confidence_interval.low), float(r.confidence_interval.high)
    verdict = "better" if hi < 1 else "worse" if lo > 1 else "no difference at this N"
    return {"ratio": med, "ci": [lo, hi], "verdict": verdict}


def retrans_segs(vms) -> int:
    """The VMs' TCP segments retransmitted so far (RetransSegs in each namespace)."""
    return sum(parse_netstat(vm.cmd("cat /proc/net/snmp"))["Tcp"]["RetransSegs"] for vm in vms)


def one_round(lab, mesh, senders, rx, arm: str, spec: PacerSpec, args) -> list[dict]:
    """One round of ``arm``, ``args.requests`` incasts of ``args.bytes`` per sender, a sample
    each: its pacers started (and synchronized) first if it has any."""
    update, cc = ARMS[arm]
    datapath = None if update is None else update["datapath"]
    out = {"holds": None, "react_us": None, "cpu": None, "clamped": None}
    if datapath is not None:
        started = mesh.start_pacers(senders + [rx], "pace", spec.model_copy(update=update))
        wait_synced(mesh, [s.name for s in senders], 60.0, started)
        procs = {k: psutil.Process(p.pid) for k, p in mesh.procs.items() if k.startswith("pacer-")}
        cpu0 = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}
    t0 = time.monotonic()
    samples = []
    for _ in range(args.requests):
        r0 = retrans_segs(senders)
        completion, where = incast(lab, senders, rx, args.bytes, cc)
        coord = {k: v for k, v in where.items() if mesh.coordinator.name in k.split("-")}
        samples.append({"completion_s": completion,
                        "drops": sum(where.values()) - sum(coord.values()), "where": where,
                        "retrans": retrans_segs(senders) - r0})
    if datapath is not None:
        time.sleep(1.2)  # a report after the round
        wall = time.monotonic() - t0
        out["cpu"] = max((sum(p.cpu_times()[:2]) - cpu0[k]) / wall for k, p in procs.items())
        st = mesh.state()
        mesh.stop_pacers()
        reps = [st.pacers[s.name] for s in senders if st and s.name in st.pacers]
        dests = [r.dests[rx.name] for r in reps if rx.name in r.dests]
        back = st.pacers.get(rx.name) if st else None
        echo = max((back.dests[s.name].echo_us_p99 or 0 for s in senders
                    if back and s.name in back.dests), default=0)
        out.update(holds=sum(d.holds for d in dests),
                   clamped=sum(back.dests[s.name].clamped for s in senders
                               if back and s.name in back.dests),
                   react_us=(echo + max((d.react_us_p99 or 0 for d in dests), default=0))
                   if datapath == "bpf" else max((d.react_us_p99 or 0 for d in dests),
                                                 default=0))
    return [x | out for x in samples]


def cell(args, n: int, q: int) -> dict:
    """Every arm's rounds in one lab of ``n`` senders and ``q``-packet queues."""
    per = max(n, 2)  # leaf2: the receiver first, the coordinator last, in no flow
    topo = LeafSpine(spines=1, leaves=2, vms_per_leaf=per, host_bw=args.rate, fabric_bw=1000,
                     host_queue=q)
    k = 20.0 / args.rate  # time dilation: the defaults are for 20 Mbit/s-scaled links
    base = PacerSpec()
    spec = PacerSpec(threshold_us=base.threshold_us * k, max_hold_us=base.max_hold_us * k,
                     probe_us=base.probe_us * k)
    samples: dict[str, list[dict]] = {a: [] for a in args.arms}
    with Lab(topo, name="bench_pace") as lab, FidelitySampler() as fid:
        mesh = AgentMesh(lab, AgentsSpec(enabled=True, coordinator=f"vm{2 * per}"))
        mesh.start()
        try:
            time.sleep(8)  # clock sync converges
            senders, rx = [lab[f"vm{i}"] for i in range(1, n + 1)], lab[f"vm{per + 1}"]
            for _ in range(args.rounds):
                for arm in args.arms:
                    samples[arm] += one_round(lab, mesh, senders, rx, arm, spec, args)
        finally:
            mesh.stop()
        return {"senders": n, "queue": q, "samples": samples, "fidelity": fid.summary()}


def summary(c: dict) -> dict:
    """Per arm: completion median, interval and p99, drops; per paced arm and baseline: the
    ratio of medians (``ratio``) and of p99s."""
    out = {}
    for arm, xs in c["samples"].items():
        t = [x["completion_s"] for x in xs]
        out[arm] = {"median_s": float(np.median(t)), "ci_s": interval(t),
                    "p99_s": float(np.percentile(t, 99)), "drops": [x["drops"] for x in xs],
                    "zero_drop_rounds": sum(x["drops"] == 0 for x in xs),
                    "retrans": [x["retrans"] for x in xs]}
    for arm in (a for a in c["samples"] if ARMS[a][0] is not None):
        xs = [x["completion_s"] for x in c["samples"][arm]]
        for base in ("cubic", "bbr"):
            if base in c["samples"]:
                ys = [x["completion_s"] for x in c["samples"][base]]
                out[f"{arm}/{base}"] = ratio(xs, ys) | {
                    "p99_ratio": float(np.percentile(xs, 99) / np.percentile(ys, 99))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--senders", default="2,4,8", help="senders per cell, comma separated")
    ap.add_argument("--queues", default="20,30,50", help="downlink queue limits, packets")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", default="bpf,probe,cubic,bbr",
                    help=f"comma separated, of {', '.join(ARMS)}")
    ap.add_argument("--rate", type=float, default=5.0,
                    help="VM link rate, Mbit/s (T, the longest hold and the probe period are "
                         "the pacer's defaults x 20 / this: time dilation)")
    ap.add_argument("--bytes", type=int, default=300_000, help="per sender per request")
    ap.add_argument("--requests", type=int, default=1,
                    help="incast requests per round, one after the other, a sample each")
    args = ap.parse_args()
    args.arms = args.arms.split(",")
    if unknown := set(args.arms) - set(ARMS):
        ap.error(f"unknown arms {sorted(unknown)}")
    setLogLevel("error")
    cells, rows = [], []
    print(f"{'senders':>7s} {'queue':>5s} {'arm':>6s} {'median s':>8s} {'95% CI':>15s} "
          f"{'p99 s':>6s} {'drops/sample':>16s} {'0-drop':>6s} {'retrans/sample':>16s} "
          f"{'holds':>5s} {'react us':>8s} {'clamped':>7s} {'CPU':>5s}")
    for n in (int(x) for x in args.senders.split(",")):
        for q in (int(x) for x in args.queues.split(",")):
            c = cell(args, n, q)
            c["summary"] = s = summary(c)
            cells.append(c)
            for arm in args.arms:
                a, xs = s[arm], c["samples"][arm]
                ci = f"[{a['ci_s'][0]:.2f}, {a['ci_s'][1]:.2f}]" if a["ci_s"] else "-"

                def med(key, xs=xs):
                    v = [x[key] for x in xs if x[key] is not None]
                    return f"{np.median(v):.0f}" if v else "-"
                cpu = [x["cpu"] for x in xs if x["cpu"] is not None]
                rows.append({"senders": n, "queue": q, "arm": arm,
                             "median s": round(a["median_s"], 2), "95% CI": ci,
                             "p99 s": round(a["p99_s"], 2), "drops/round": a["drops"],
                             "0-drop rounds": f"{a['zero_drop_rounds']}/{len(xs)}",
                             "retrans": a["retrans"],
                             "reaction us": med("react_us")})
                print(f"{n:7d} {q:5d} {arm:>6s} {a['median_s']:8.2f} {ci:>15s} "
                      f"{a['p99_s']:6.2f} {str(a['drops']):>16s} "
                      f"{a['zero_drop_rounds']:>3d}/{len(xs):<2d} {str(a['retrans']):>16s} "
                      f"{med('holds'):>5s} {med('react_us'):>8s} {med('clamped'):>7s} "
                      f"{(f'{max(cpu):.3f}' if cpu else '-'):>5s}", flush=True)
            for key in (k for k in s if "/" in k):
                r = s[key]
                ci = f"[{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]" if r["ci"] else "-"
                print(f"{'':20s}{key}: {r['ratio']:.2f} {ci} {r['verdict']}; "
                      f"p99 {r['p99_ratio']:.2f}")
            print(f"{'':20s}saturated: {c['fidelity']['saturated']} "
                  f"({c['fidelity'].get('saturated_share', 0):.0%} of the cell)", flush=True)
    record("pacer" if args.requests == 1 else "pacer_requests", "Incast: the pacer's kernel "
           "datapath beside its probe datapath, CUBIC and BBR",
           ["senders", "queue", "arm", "median s", "95% CI", "p99 s", "drops/round",
            "0-drop rounds", "retrans", "reaction us"], rows,
           note="rounds interleaved in one lab per cell; drops: the lab's tc counters",
           data={"cells": [{k: v for k, v in c.items() if k != "fidelity"} | {
               "saturated": c["fidelity"]["saturated"]} for c in cells]})


if __name__ == "__main__":
    main()
