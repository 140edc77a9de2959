"""Pacer off/on under incast: N senders on leaf1 each send the same bytes over TCP
(workloads.bulk: a sender is done when the receiver has its bytes) to
one VM on leaf2 at once, behind its downlink's packet queue; the same rounds with the pacers
in ``sense`` mode (measuring only: the baseline, plain CUBIC/BBR as configured) and in
``pace`` mode, On-Ramp's hold as published (``onramp``: the sample's OWD - T) and the pacer's
default (``pace``: the OWD extrapolated to now, a hold lasting until a sample sent during
it comes back below T, and a probe without echo for T + the longest hold holding too:
agents/gate.py) and the same with the release spread (``spread``: a per-VM draw of up to the
hold's largest excess later, so that held senders do not release together), side by side in
one lab per (senders, queue): the senders on leaf1, the receiver first on leaf2 and the
coordinator last there, in no flow (leaves of at least 2 VMs). The senders start together
(``session.incast``'s start barrier: the round is timed from the go, not from their Python
start).

    sudo .venv/bin/python benchmarks/pacer.py [--senders 4] [--queues 50] [--rounds 2]
                                              [--rate 5] [--cc cubic] [--probe-us P] [--before REF]

With ``--before REF`` a row ``pace@REF`` follows, the pacers of REF's tree in the same lab
(theirs on their PYTHONPATH, the lab and the rest this tree's): the pacer before and after a
change of it, side by side in one run.

Printed per row: completion (s, all senders done), fabric and VM-link queue drops (the lab's tc
counters: the truth) but those on the coordinator's link (``coord``: the agents' records, 0.4
Mbit/s from each agent, overflow a 5 Mbit/s downlink at 16 VMs), the pacers' own probes among
them (``probes``: lost), TCP retransmitted
segments and RTOs (the pacers' sensing), the senders' OWD p99 toward the receiver (us), holds,
the pacers' reaction delay (an echo's arrival to its hold applied, p99 of the slowest sender,
us) and the part of it before the pacer's loop handled the echo (``wake``: waiting for a CPU),
the pacers' CPU (fraction of a core), whether the machine was saturated, and the drops per link
("a-b", both ends); after each lab, its fidelity line (``report.text.fidelity_line``: which
cores and links the CPU limited).
Goal (issue 10): zero drops with the pacer on, completion not worse.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import psutil
from mininet.log import setLogLevel

from contracts.results.lab import Fidelity, fidelity_line
from lab import Lab
from lab.fidelity import FidelitySampler
from session.daemons import AgentMesh, AgentsSpec, PacerSpec
from session.edge import wait_synced
from session.incast import incast
from topo import LeafSpine

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_cost import checkout, pythonpath  # noqa: E402 - benchmarks/ is this script's directory


def run_mode(lab, mesh, senders, rx, mode: str, spec: PacerSpec, rounds: int, nbytes: int,
             cc: str | None, tree: str | None = None):
    with pythonpath(tree):
        started = mesh.start_pacers(senders + [rx], mode, spec)
    # else the first round runs ungated, or with the last row's pacers' reports
    wait_synced(mesh, [s.name for s in senders], 60.0, started)
    cpu0 = {k: psutil.Process(p.pid).cpu_times() for k, p in mesh.procs.items()
            if k.startswith("pacer-")}
    t0 = time.monotonic()
    res = [incast(lab, senders, rx, nbytes, cc) for _ in range(rounds)]
    time.sleep(1.5)
    st = mesh.state()
    wall = time.monotonic() - t0
    cpu = max((sum(psutil.Process(mesh.procs[k].pid).cpu_times()[:2]) - sum(c[:2])) / wall
              for k, c in cpu0.items())
    mesh.stop_pacers()
    reps = [st.pacers[s.name] for s in senders if st and s.name in st.pacers]
    owd = [r.dests[rx.name].owd_us_p99 for r in reps if rx.name in r.dests
           and r.dests[rx.name].owd_us_p99 is not None]
    where: dict[str, int] = {}
    for _, d in res:
        for k, v in d.items():
            where[k] = where.get(k, 0) + v
    coord = {k: v for k, v in where.items() if mesh.coordinator.name in k.split("-")}
    return {"completion_s": sum(t for t, _ in res) / rounds,
            "drops": sum(where.values()) - sum(coord.values()), "coord": sum(coord.values()),
            "where": where,
            "retrans": sum(r.net.retrans_segs for r in reps),
            "rtos": sum(r.net.timeouts for r in reps),
            "owd_p99_us": max(owd) if owd else None,
            "holds": sum(r.dests[rx.name].holds for r in reps if rx.name in r.dests),
            "probes_lost": sum(r.dests[rx.name].probes_lost for r in reps if rx.name in r.dests),
            "react_us": max((r.dests[rx.name].react_us_p99 or 0 for r in reps
                             if rx.name in r.dests), default=0),
            "wake_us": max((r.dests[rx.name].wake_us_p99 or 0 for r in reps
                            if rx.name in r.dests), default=0),
            "cpu": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--senders", default="4", help="senders per row, comma separated")
    ap.add_argument("--queues", default="50", help="downlink queue limits, packets")
    ap.add_argument("--rate", type=float, default=5.0,
                    help="VM link rate, Mbit/s (time dilation: T, the hold and the probe period "
                         "default to the pacer's defaults x 20 / this)")
    ap.add_argument("--bytes", type=int, default=500_000, help="per sender per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threshold-us", type=float, default=None)
    ap.add_argument("--max-hold-us", type=float, default=None)
    ap.add_argument("--probe-us", type=float, default=None)
    ap.add_argument("--cc", default="cubic", help="the senders' TCP congestion control "
                    "(empty: the VMs' default)")
    ap.add_argument("--before", default=None, help="also run REF's pacers (row pace@REF)")
    args = ap.parse_args()
    base, k = PacerSpec(), 20.0 / args.rate
    for name in ("threshold_us", "max_hold_us", "probe_us"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(base, name) * k)
    with tempfile.TemporaryDirectory() as tmp:
        before = checkout(args.before, tmp) if args.before else None
        if before and os.path.exists(os.path.join(before, "agents", "native", "pacer.c")):
            subprocess.run(["make", "-s", "-C", os.path.join(before, "agents", "native")],
                           check=True)  # REF's compiled loop (a checkout has no build)
        sweep(args, before)


def sweep(args, before: str | None) -> None:
    """Every (senders, queue) row group of the module doc."""
    setLogLevel("error")
    print(f"{'senders':>7s} {'queue':>5s} {'mode':>11s} {'compl s':>7s} {'drops':>6s} "
          f"{'coord':>5s} "
          f"{'probes':>6s} {'retrans':>7s} {'RTOs':>4s} {'OWD p99 us':>10s} {'holds':>5s} "
          f"{'react us':>8s} {'wake us':>7s} {'CPU':>5s} "
          f"{'saturated':>9s} drops per link")
    for n in (int(x) for x in args.senders.split(",")):
        for q in (int(x) for x in args.queues.split(",")):
            per = max(n, 2)  # leaf2: the receiver first, the coordinator last
            topo = LeafSpine(spines=1, leaves=2, vms_per_leaf=per, host_bw=args.rate,
                             fabric_bw=1000, host_queue=q)
            with Lab(topo, name="bench_pace") as lab, FidelitySampler() as fid:
                # the coordinator on leaf2's last VM, in no flow: the agents' records (about
                # 0.4 Mbit/s from each of 15 agents at 8 senders) overflowed vm1's 5 Mbit/s
                # downlink, the first sender's, when it ran there
                mesh = AgentMesh(lab, AgentsSpec(enabled=True, coordinator=f"vm{2 * per}"))
                mesh.start()
                try:
                    time.sleep(8)  # clock sync converges
                    senders = [lab[f"vm{i}"] for i in range(1, n + 1)]
                    rx = lab[f"vm{per + 1}"]
                    spec = PacerSpec(threshold_us=args.threshold_us,
                                     max_hold_us=args.max_hold_us, probe_us=args.probe_us)
                    onramp = spec.model_copy(update={"predict": False, "fresh": False})
                    spread = spec.model_copy(update={"spread": True})
                    rows = [("sense", "sense", spec, None), ("onramp", "pace", onramp, None),
                            ("pace", "pace", spec, None), ("spread", "pace", spread, None)]
                    if before:
                        rows.append((f"pace@{args.before}", "pace", spec, before))
                    for label, mode, s, tree in rows:
                        r = run_mode(lab, mesh, senders, rx, mode, s, args.rounds,
                                     args.bytes, args.cc, tree)
                        owd = f"{r['owd_p99_us']:10.0f}" if r["owd_p99_us"] else f"{'-':>10s}"
                        print(f"{n:7d} {q:5d} {label:>11s} {r['completion_s']:7.3f} "
                              f"{r['drops']:6d} {r['coord']:5d} {r['probes_lost']:6d} "
                              f"{r['retrans']:7d} "
                              f"{r['rtos']:4d} {owd} "
                              f"{r['holds']:5d} {r['react_us']:8.0f} {r['wake_us']:7.0f} "
                              f"{r['cpu']:5.2f} "
                              f"{fid.summary()['saturated']!s:>9s} {r['where']}", flush=True)
                finally:
                    mesh.stop()
                print("  " + fidelity_line(Fidelity.model_validate(fid.summary())), flush=True)


if __name__ == "__main__":
    main()
