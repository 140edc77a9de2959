"""The agents' clock sync, collocation detection and cost, against the truth, in real labs;
and the coordinator's solve time on synthetic reports of larger clusters.

    sudo .venv/bin/python benchmarks/sync.py [--cases idle,sym70,...,solve] [--seconds 30]
                                             [--rate 20] [--before REF]

With ``--before REF`` every lab case runs twice in a row, with this tree's agents and with
REF's (rows ``CASE@REF``), the lab and scoring being this tree's: accuracy, collocation and
agent CPU before and after a change of the agents, side by side in one run.

Cases (each a real lab with the agents, except ``solve``):

* ``idle``: 8 VMs on 4 hosts under 2 leaves and 2 spines, no traffic but the probes.
* ``sym70`` / ``asym70``: 8 VMs under 2 leaves and one spine (so every inter-leaf probe
  crosses the loaded spine links); UDP iperf3 flows fill 70 % of the 100 Mbit/s spine links
  in both directions (sym) or leaf1 -> leaf2 only (asym). iperf3 sends in bursts: most
  probes still find the queue empty, so the NTP-style baseline, whose clock filter keeps the
  lowest-delay sample (RFC 5905), is hardly biased.
* ``asymtcp``: one TCP flow vm5 -> vm1 (as in quickstart): queueing in one direction,
  which biases the NTP-style estimate; the Huygens envelopes find the floor in the windows
  where the queue drains at least once (not in all: run to run the p99 varies).
* ``standing``: four TCP flows leaf1 -> leaf2 keep the spine link's queue full: every probe
  across that cut waits, so every cross-leaf pair (and every loop) carries the same bias of
  half the standing queue, and the two directions' OWDs look equal. No two-way method can
  see that from timestamps alone: the limit of every estimate here, shown, not hidden.
* ``colloc32``: 32 VMs on 8 hosts (4 leaves), phys1 and phys2 with base drifts only 0.05 ppm
  apart; 10 pairs/s to 8 peers per agent (2 cores cannot carry 32 agents at 20 pairs/s to
  16 peers without saturating); when the agents' groups first equal the truth.
* ``solve``: ``Coordinator.step`` time per window for ``--solve-vms`` VMs (default 32, 128
  and 256) with 16 peers each, fed by ``tests/synthetic.py`` (no network, no lab; making the
  reports takes longer than solving them: minutes at 256 VMs).

Goals (issue 3): idle p99 |offset error| <= 2 us, drift <= 0.05 ppm, converged <= 10 s;
70 % load p99 <= 10 us, and >= 10x better than the NTP-style baseline when the load is
asymmetric; collocation precision and recall 1.0 within 30 s; agent CPU <= 3 % of a core.
The figures are printed, not asserted; ``fidelity`` says whether the machine was saturated.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import yaml
from mininet.log import setLogLevel

from agents.clock import ClockSpec, Oscillator, Segment
from agents.coordinator import Coordinator
from session.scenario import load
from session.session import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from agent_cost import checkout, pythonpath  # noqa: E402 - benchmarks/ is this script's directory
from synthetic import T0_NS, simulate  # noqa: E402 - tests/ is on sys.path from here on


def scenario(name: str, seconds: float, rate: float, **extra) -> dict:
    doc = {"name": name, "seed": 11, "duration_s": seconds,
           "topology": {"spines": 2, "leaves": 2, "vms_per_leaf": 4, "host_bw": 100,
                        "fabric_bw": 100, "host_queue": 100, "fabric_queue": 100},
           "placement": {"vms_per_host": 2}, "hosts": {"cpu_cores": 0.5},
           "agents": {"enabled": True, "rate": rate, "window_s": 2}}
    for key, value in extra.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return doc


def loaded(name: str, seconds: float, rate: float, pairs: list[tuple[str, str]],
           udp_mbit: float | None) -> dict:
    """Flows ``(src, dst)`` for the whole run after 1 s: UDP at ``udp_mbit`` each, or TCP
    (None) as fast as it goes."""
    kind = {"udp": True, "bw": udp_mbit} if udp_mbit else {}
    load = [{"src": a, "dst": b, "at_s": 1, "duration_s": seconds - 1, **kind}
            for a, b in pairs]
    return scenario(name, seconds, rate, topology={"spines": 1}, load=load)


UP = [(f"vm{i}", f"vm{i + 4}") for i in range(1, 5)]  # leaf1 -> leaf2
DOWN = [(b, a) for a, b in UP]

CASES = {
    "idle": lambda s, r: scenario("bench_idle", s, r),
    "sym70": lambda s, r: loaded("bench_sym", s, r, UP + DOWN, 17.5),
    "asym70": lambda s, r: loaded("bench_asym", s, r, UP, 17.5),
    "asymtcp": lambda s, r: loaded("bench_tcp", s, r, [("vm5", "vm1")], None),
    "standing": lambda s, r: loaded("bench_stand", s, r, UP, None),
    "colloc32": lambda s, r: scenario(
        "bench_col", max(s, 40), min(r, 10),
        topology={"leaves": 4, "vms_per_leaf": 8}, placement={"vms_per_host": 4},
        agents={"max_peers": 8}, hosts={"cpu_cores": 0.5},
        clocks={"host_drift_ppm": {"phys1": 12.0, "phys2": 12.05}}),
}


def run_lab(doc: dict, agents_tree: str | None = None) -> dict:
    """Run the scenario ``doc``; with ``agents_tree``, the daemons in its VMs (agents and
    coordinator) come from that tree (their PYTHONPATH and working directory: ``python -m``
    imports from the working directory first), the lab from this one."""
    with pythonpath(agents_tree), tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"{doc['name']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        sc, topo = load(str(path))
        return Session(sc, topo, str(path)).run()


def row(case: str, res: dict) -> str:
    sync, col, cost = res.get("sync", {}), res.get("collocation", {}), res.get("agents", {})
    ours = sync.get("offset_error_us", {})
    ntp = sync.get("baseline_ntp", {}).get("offset_error_us", {})
    gain = (ntp["p99"] / ours["p99"]) if ours.get("p99") and ntp.get("p99") else float("nan")
    fid = res["lab"]["fidelity"]
    cpu = cost.get("agent_cpu_core", {})
    return (f"{case:16s} {len(res['lab']['vms']):3d} {ours.get('p50', 0):8.3f} "
            f"{ours.get('p99', 0):8.3f} {sync.get('drift_error_ppm', {}).get('p99', 0):8.4f} "
            f"{ntp.get('p99', 0):9.3f} {gain:6.1f} {sync.get('converged_s')!s:>6s} "
            f"{col.get('precision')!s:>5s} {col.get('recall')!s:>5s} "
            f"{col.get('detected_after_s')!s:>6s} {cpu.get('p50') or 0:6.1%} "
            f"{(cost.get('probe_bit_s', {}).get('p50') or 0) / 1e3:7.1f} "
            f"{cost.get('agent_rss_mb', {}).get('p50') or 0:5.1f} "
            f"{fid['cpu_busy']['p50']:5.0%} {fid['saturated']!s:>5s}")


def solve_time(vms: int, peers: int, seconds: float, rate: float) -> tuple[float, float, int]:
    """Median and max ``Coordinator.step`` CPU time (ms, this thread: a loaded machine does not
    inflate it) per closed window, and windows closed,
    for ``vms`` VMs on ``vms // 4`` hosts, each probing ``peers`` random peers (and probed
    back, as the agents do)."""
    rng = random.Random(1)
    hosts = [Oscillator(T0_NS, rng.uniform(-50, 50), ((0.1, rng.uniform(20, 200), 0.0),))
             for _ in range(max(vms // 4, 1))]
    specs = {f"vm{i + 1}": ClockSpec(f"vm{i + 1}", [Segment(T0_NS, rng.uniform(-1e7, 1e7),
                                                            f"h{i // 4}", hosts[i // 4])])
             for i in range(vms)}
    names = sorted(specs)
    graph: dict[str, set[str]] = {v: set() for v in names}
    for v in names:
        for p in rng.sample([n for n in names if n != v], min(peers, vms - 1)):
            graph[v].add(p)
            graph[p].add(v)
    coord = Coordinator(window_s=2.0)
    times: list[float] = []
    step = coord.step

    def timed() -> int:
        t = time.thread_time()
        closed = step()
        if closed:
            times.append((time.thread_time() - t) * 1e3 / closed)
        return closed

    coord.step = timed
    simulate(coord, specs, seconds, rate=rate, peers=graph)
    times.sort()
    return (times[len(times) // 2], times[-1], len(times)) if times else (0.0, 0.0, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--cases", default=",".join([*CASES, "solve"]))
    ap.add_argument("--seconds", type=float, default=30.0, help="run time of each lab, s")
    ap.add_argument("--rate", type=float, default=20.0, help="probe pairs/s per peer")
    ap.add_argument("--drift-windows", default=None,
                    help="comma-separated odd counts: run each lab case once per count "
                         "(agents.drift_windows), side by side (default: the default only)")
    ap.add_argument("--solve-vms", default="32,128,256", help="cluster sizes of ``solve``")
    ap.add_argument("--before", default=None,
                    help="git ref: run each lab case also with that commit's agents and "
                         "coordinator, alternating, side by side (e.g. 6c96ee9, the last "
                         "agent with its datagram path in Python)")
    args = ap.parse_args()
    setLogLevel("error")
    cases = args.cases.split(",")
    labs = [c for c in cases if c in CASES]
    if labs:
        print(f"{'case':16s} {'VMs':>3s} {'off p50':>8s} {'off p99':>8s} {'drift99':>8s} "
              f"{'NTP p99':>9s} {'gain':>6s} {'conv s':>6s} {'prec':>5s} {'recall':>5s} "
              f"{'det s':>6s} {'cpu/ag':>6s} {'kbit/s':>7s} {'MiB':>5s} {'busy':>5s} {'sat':>5s}")
        print("                 (offsets |error| us, drift |error| ppm; gain = NTP p99 / "
              "nslab p99; cpu/ag = share of one core per agent; MiB = agent RSS)")
    counts = [int(w) for w in args.drift_windows.split(",")] if args.drift_windows else [None]
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"": None, **({f"@{args.before}": checkout(args.before, tmp)}
                              if args.before else {})}
        for case in labs:
            for w in counts:
                for tag, tree in trees.items():
                    doc = CASES[case](args.seconds, args.rate)
                    if w is not None:
                        doc["agents"] = {**doc["agents"], "drift_windows": w}
                    name = (case if w is None else f"{case}/d{w}") + tag
                    print(row(name, run_lab(doc, tree)), flush=True)
    if "solve" in cases:
        for vms in map(int, args.solve_vms.split(",")):
            p50, worst, n = solve_time(vms, 16, 12.0, args.rate)
            print(f"solve     {vms:3d} VMs, 16 peers each: Coordinator.step p50 {p50:.1f} ms, "
                  f"max {worst:.1f} ms per window ({n} windows; goal <= 500 ms at 256 VMs)",
                  flush=True)


if __name__ == "__main__":
    main()
