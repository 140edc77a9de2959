"""The coordinator's CPU per window and its accuracy, this tree against another commit's
coordinator, side by side in one run, on the same synthetic agent reports with known clocks
(no lab, no root, no network).

    .venv/bin/python benchmarks/coordinator.py [--before 6c96ee9] [--vms 128,256]
                                               [--seconds 24] [--rate 20] [--peers 16]
                                               [--rounds 1]

The feed: ``--vms`` VMs on ``vms // 4`` physical hosts (base drifts uniform in +-50 ppm, a
0.1 ppm wander of period 20-200 s, offsets +-10 ms), each probing ``--peers`` random peers
at ``--rate`` coded pairs/s and probed back by them (as the agents do; pair ids numbered per
sender in send order from a random start, as an agent numbers them), with the delay model
of ``tests/synthetic.py`` (20 us minimum, exponential queueing, 20 % impure pairs); each VM's
report every 0.5 s as the JSON line an agent sends. It is made once per size, vectorised, and
written to temporary files in both forms of the records: JSON rows (``nslab.report/1``) and
packed (``nslab.report/2``); each coordinator then reads, in its own process (the tree on
``PYTHONPATH``), the form its own tree's agents send (packed when its ``contracts.messages`` has
``pack_records``) exactly as its report listener does: ``parse_message`` per line,
``ingest``, and ``step`` after every 0.5 s of reports.

Printed per size and coordinator (with ``--rounds N``, the trees run in turn N times and
the run of least CPU of each is shown: on a shared machine others' load only adds to it):
the process's CPU time (s, all threads) per closed window,
split into parse (JSON -> messages), ingest and step (the window pipeline; in this tree it
also puts the reports' records in windows, which ingest did before); the largest step;
accuracy against the truth (``session.scoring``, first window left out, drift over final
windows): offset |error| p50/p99 (us), drift |error| p99 (ppm), the NTP-style baseline's
offset p99, collocation precision/recall against the true hosts and the window from which
the groups stayed exact; then this/before ratios, and how far this tree's estimates are from
the other's (max |difference| of offsets, ns, and drifts, ppm, over every window and VM).
A run of a few dozen seconds gives collocation only a few windows of series; the
coordinator keeps ``series_windows`` (150) and its grouping costs grow with them. So a
second table times ``collocation.group`` alone, in each tree, on 150 windows of drift and
offset series made from the same clocks' truth plus noise (0.02 ppm, 100 ns): CPU s per
call and whether both trees' groups are the same and the truth.
Goal (issue 14): at most 0.5 s of coordinator CPU per 2 s window at 256 VMs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from agent_cost import checkout  # noqa: E402 - benchmarks/ is on sys.path from here on

S = 1_000_000_000
T0_NS = 1_800_000_000 * S
PAIR_GAP_NS = 15_000      # tests/synthetic.py's model
DMIN_NS = 20_000
QUEUE_NS = 500.0
JITTER_NS = 300.0
CHUNK_S = 0.5
WINDOW_S = 2.0


def clocks(vms: int, seed: int):
    """``(specs, phys)``: every VM's clock (one segment) and its physical host."""
    from agents.clock import ClockSpec, Oscillator, Segment
    rng = np.random.default_rng(seed)
    hosts = [Oscillator(T0_NS, float(rng.uniform(-50, 50)),
                        ((0.1, float(rng.uniform(20, 200)), float(rng.uniform(0, 6.28))),))
             for _ in range(max(vms // 4, 1))]
    specs, phys = {}, {}
    for i in range(vms):
        name, h = f"vm{i + 1}", i // 4
        specs[name] = ClockSpec(name, [Segment(T0_NS, float(rng.uniform(-1e7, 1e7)), f"h{h}",
                                               hosts[h])])
        phys[name] = f"h{h}"
    return specs, phys


def _vm_ns(spec, true_ns: np.ndarray) -> np.ndarray:
    """``spec.to_vm_ns`` for an array of true times (one segment; the same formula)."""
    seg = spec.segments[0]
    osc = seg.oscillator

    def phase(t):
        dt_ns = (t - osc.epoch_ns).astype(np.float64)
        acc = osc.base_ppm * dt_ns
        for a, p, ph in osc.wander:
            acc = acc + a * p / (2 * np.pi) * (np.sin(2 * np.pi * dt_ns / 1e9 / p + ph)
                                               - np.sin(ph)) * 1e9
        return acc * 1e-6
    off = seg.offset_ns + phase(true_ns) - phase(np.array([seg.start_ns]))[0]
    return true_ns + np.round(off).astype(np.int64)


def make_feed(path: str, vms: int, seconds: float, rate: float, peers: int, seed: int):
    """Write the feed twice, ``path + ".json"`` with the records as JSON rows
    (``nslab.report/1``) and ``path + ".packed"`` packed (``nslab.report/2``, what the agents
    send): hellos, then per chunk one report line per VM and a blank line; returns
    ``(specs, phys, records)``."""
    from contracts.messages import pack_records
    specs, phys = clocks(vms, seed)
    names = sorted(specs)
    rng = np.random.default_rng(seed + 1)
    graph = {v: set() for v in names}
    for v in names:
        for p in rng.choice([n for n in names if n != v], min(peers, vms - 1), replace=False):
            graph[v].add(str(p))
            graph[str(p)].add(v)
    n_pairs = int(seconds * rate)
    n_chunks = int(seconds / CHUNK_S)
    per_rx: dict[str, list] = {v: [] for v in names}   # per receiver: (src, chunk, rows)
    total = 0
    for src in names:
        dsts = sorted(graph[src])
        first = T0_NS + (rng.uniform(0, 1 / rate, len(dsts)) * S).astype(np.int64)
        # pair ids as an agent numbers its pairs: one counter over all its peers, in send
        # order, from a random start (agents/native/probeio.c, pair_seq)
        sends = (first[:, None] + np.arange(n_pairs) * int(S / rate)).ravel()
        pids = np.empty(sends.size, np.int64)
        pids[np.argsort(sends, kind="stable")] = (int(rng.integers(0, 2 ** 32))
                                                   + np.arange(sends.size)) % 2 ** 32
        for i, dst in enumerate(dsts):
            ts = sends[i * n_pairs:(i + 1) * n_pairs]
            common = rng.exponential(QUEUE_NS, n_pairs)
            tx = np.stack([ts, ts + PAIR_GAP_NS], axis=1)
            q = common[:, None] + rng.exponential(JITTER_NS, (n_pairs, 2))
            q[:, 1] += np.where(rng.random(n_pairs) < 0.2, rng.exponential(QUEUE_NS, n_pairs), 0)
            rx = tx + DMIN_NS + q.astype(np.int64)
            pid = pids[i * n_pairs:(i + 1) * n_pairs]
            rows = np.stack([np.repeat(pid, 2), np.tile([0, 1], n_pairs),
                             _vm_ns(specs[src], tx.ravel()), _vm_ns(specs[dst], rx.ravel())],
                            axis=1)
            chunk = ((ts - T0_NS) // int(CHUNK_S * S)).repeat(2)
            per_rx[dst].append((src, chunk, rows))
            total += rows.shape[0]
    with open(path + ".json", "w") as fj, open(path + ".packed", "w") as fp:
        for v in names:
            hello = {"type": "hello", "name": v, "ip": "127.0.0.1", "rate": rate,
                     "report_s": CHUNK_S, "start_ns": specs[v].to_vm_ns(T0_NS), "peers": names}
            fj.write(json.dumps({**hello, "schema": "nslab.report/1"}) + "\n")
            fp.write(json.dumps({**hello, "schema": "nslab.report/2"}) + "\n")
        for f in (fj, fp):
            f.write("\n")
        for c in range(n_chunks):
            stop = T0_NS + int((c + 1) * CHUNK_S * S)
            for v in names:
                rx = {src: rows[chunk == c] for src, chunk, rows in per_rx[v]}
                line = {"type": "report", "name": v, "t_ns": specs[v].to_vm_ns(stop),
                        "stats": {}}
                fj.write(json.dumps({**line, "rx": {s: r.tolist() for s, r in rx.items()}},
                                    separators=(",", ":")) + "\n")
                fp.write(json.dumps({**line, "rx_packed": pack_records(
                    {s: r.ravel().tolist() for s, r in rx.items()}).model_dump(mode="json")},
                    separators=(",", ":")) + "\n")
            for f in (fj, fp):
                f.write("\n")
    return specs, phys, total


def worker(path: str) -> None:
    """Feed the coordinator on ``PYTHONPATH`` from ``path`` (``.packed`` when its tree reads
    packed records, else ``.json``); print a JSON summary."""
    from agents.coordinator import Coordinator
    from contracts import messages
    from contracts.messages import parse_message
    path += ".packed" if hasattr(messages, "pack_records") else ".json"
    try:  # as the tree's coordinator daemon starts (agents/__main__.py), when it does
        from agents.heap import settle
        settle()
    except ImportError:
        pass
    coord = Coordinator(window_s=WINDOW_S)
    cpu = {"parse": 0.0, "ingest": 0.0, "step": 0.0}
    steps, groups_ok = [], []
    lines: list[bytes] = []
    with open(path, "rb") as f:
        for line in f:
            if line != b"\n":
                lines.append(line)
                continue
            t0 = time.process_time()
            msgs = [parse_message(x) for x in lines]
            t1 = time.process_time()
            for m in msgs:
                coord.ingest(m)
            t2 = time.process_time()
            closed = coord.step()
            t3 = time.process_time()
            lines = []
            cpu["parse"] += t1 - t0
            cpu["ingest"] += t2 - t1
            cpu["step"] += t3 - t2
            if closed:
                steps.append((t3 - t2) / closed)
                groups_ok.append((coord.latest.k, [g.members for g in coord.groups]))
    state = coord.state()
    print(json.dumps({"cpu": cpu, "windows": len(state.history), "step_max": max(steps),
                      "form": path.rsplit(".", 1)[1], "groups": groups_ok,
                      "state": state.model_dump(mode="json")}))


def group_worker(vms: int, windows: int, seed: int) -> None:
    """Time ``collocation.group`` of the tree on ``PYTHONPATH`` on ``windows`` windows of
    series of ``clocks(vms, seed)``; print a JSON summary."""
    from agents.collocation import group
    specs, _ = clocks(vms, seed)
    rng = np.random.default_rng(seed + 2)
    ref = specs["vm1"]
    t = [T0_NS + int((i + 0.5) * WINDOW_S * S) for i in range(windows)]
    drift = {v: np.array([sp.frequency_ppm(x) - ref.frequency_ppm(x) for x in t])
             + rng.normal(0, 0.02, windows) for v, sp in specs.items()}
    offset = {v: np.array([sp.offset_at(x) - ref.offset_at(x) for x in t])
              + rng.normal(0, 100, windows) for v, sp in specs.items()}
    t0 = time.process_time()
    groups = group(drift, 0.02, offset_series=offset, offset_sigma_ns=150.0)
    print(json.dumps({"cpu": time.process_time() - t0,
                      "groups": [[g.members, g.confidence] for g in groups]}))


def run(tree: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, __file__, "--worker", *args], env=env, check=True,
                         capture_output=True, text=True, cwd=tree).stdout
    return json.loads(out)


def score(res: dict, specs: dict, phys: dict) -> dict:
    from agents.collocation import precision_recall
    from contracts.messages import CoordinatorState
    from session.scoring import sync_section, truth_groups
    st = CoordinatorState.model_validate(res["state"])
    sync = sync_section(st.history, specs, st.reference, T0_NS, skip_windows=1,
                        window_s=WINDOW_S, provisional_windows=st.drift_windows // 2)
    truth = truth_groups(phys)
    exact_from = None
    for k, groups in res["groups"]:
        if precision_recall(groups, truth) == (1.0, 1.0):
            exact_from = k if exact_from is None else exact_from
        else:
            exact_from = None
    p, r = precision_recall([g.members for g in st.collocation.groups], truth)
    return {"sync": sync, "precision": p, "recall": r, "exact_from": exact_from, "state": st}


def differences(a, b) -> tuple[float, float]:
    """Max |offset| (ns) and |drift| (ppm) difference of two states' common estimates."""
    hb = {h.t_ns: h.vms for h in b.history}
    do = dd = 0.0
    for h in a.history:
        for v, e in h.vms.items():
            o = hb.get(h.t_ns, {}).get(v)
            if o is None or e.offset_ns is None or o.offset_ns is None:
                continue
            do = max(do, abs(e.offset_ns - o.offset_ns))
            dd = max(dd, abs(e.drift_ppm - o.drift_ppm))
    return do, dd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--before", default="6c96ee9", help="git ref of the coordinator to compare")
    ap.add_argument("--vms", default="128,256", help="cluster sizes")
    ap.add_argument("--seconds", type=float, default=24.0, help="reports of this long, s")
    ap.add_argument("--rate", type=float, default=20.0, help="coded pairs/s per peer")
    ap.add_argument("--peers", type=int, default=16, help="random peers each VM probes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each coordinator, in turn; the one of least CPU is shown")
    ap.add_argument("--series", type=int, default=150,
                    help="windows of series for the collocation table (0: no table)")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker) if len(args.worker) == 1 else group_worker(
            *map(int, args.worker))
        return
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": checkout(args.before, tmp), "this": str(REPO)}
        print(f"{'VMs':>4s} {'coordinator':12s} {'form':>6s} {'records':>8s} {'win':>4s} "
              f"{'parse':>6s} "
              f"{'ingest':>6s} {'step':>6s} {'total':>6s} {'stepmax':>7s} {'off50':>6s} "
              f"{'off99':>6s} {'drift99':>7s} {'ntp99':>6s} {'prec':>5s} {'rec':>5s} "
              f"{'exact':>5s}")
        print("     (CPU s per 2 s window; form: the records as JSON rows or packed; offsets "
              "|error| us, drift ppm; exact: first window from which the groups stayed the "
              "truth)")
        for vms in map(int, args.vms.split(",")):
            feed = os.path.join(tmp, f"feed{vms}")
            specs, phys, n = make_feed(feed, vms, args.seconds, args.rate, args.peers,
                                       args.seed)
            rows = {}
            runs = {label: [] for label in trees}
            for _ in range(args.rounds):  # the trees in turn, round after round
                for label, tree in trees.items():
                    runs[label].append(run(tree, feed))
            for label in trees:
                # the least disturbed run: the machine's other load only adds CPU time
                res = min(runs[label], key=lambda r: sum(r["cpu"].values()))
                sc = score(res, specs, phys)
                cpu = {k: v / res["windows"] for k, v in res["cpu"].items()}
                cpu["total"] = sum(cpu.values())
                rows[label] = (cpu, res, sc)
                sy = sc["sync"]
                first_k = sc["state"].history[0].t_ns // int(WINDOW_S * S) if \
                    sc["state"].history else 0
                exact = "-" if sc["exact_from"] is None else str(sc["exact_from"] - first_k)
                name = label + " " + (args.before if label == "before" else "tree")
                print(f"{vms:4d} {name:12s} {res['form']:>6s} {n:8d} {res['windows']:4d} "
                      f"{cpu['parse']:6.3f} {cpu['ingest']:6.3f} "
                      f"{cpu['step']:6.3f} {cpu['total']:6.3f} {res['step_max']:7.3f} "
                      f"{sy['offset_error_us']['p50']:6.3f} {sy['offset_error_us']['p99']:6.3f} "
                      f"{sy['drift_error_ppm']['p99']:7.4f} "
                      f"{sy['baseline_ntp']['offset_error_us']['p99']:6.3f} "
                      f"{sc['precision']:5.2f} {sc['recall']:5.2f} {exact:>5s}", flush=True)
            (cb, _, sb), (ct, _, st) = rows["before"], rows["this"]
            do, dd = differences(st["state"], sb["state"])
            off = (st["sync"]["offset_error_us"]["p99"]
                   / sb["sync"]["offset_error_us"]["p99"])
            drift = (st["sync"]["drift_error_ppm"]["p99"]
                     / sb["sync"]["drift_error_ppm"]["p99"])
            print(f"{vms:4d} this/before  CPU parse {ct['parse'] / cb['parse']:.2f}, ingest "
                  f"{ct['ingest'] / cb['ingest']:.2f}, step {ct['step'] / cb['step']:.2f}, "
                  f"total {ct['total'] / cb['total']:.2f}; offset p99 {off:.2f}, drift p99 "
                  f"{drift:.2f}"
                  f"; estimates differ by at most {do:.3g} ns, {dd:.3g} ppm", flush=True)
        if args.series:
            from agents.collocation import precision_recall
            from session.scoring import truth_groups
            print(f"\ncollocation.group on {args.series} windows of series (CPU s per call)")
            for vms in map(int, args.vms.split(",")):
                res = {label: min((run(tree, str(vms), str(args.series), str(args.seed))
                                   for _ in range(args.rounds)), key=lambda r: r["cpu"])
                       for label, tree in trees.items()}
                truth = truth_groups(clocks(vms, args.seed)[1])
                same = [g for g, _ in res["this"]["groups"]] == \
                    [g for g, _ in res["before"]["groups"]]
                conf = max(abs(a[1] - b[1]) for a, b in zip(
                    res["this"]["groups"], res["before"]["groups"], strict=False))
                pr = precision_recall([g for g, _ in res["this"]["groups"]], truth)
                print(f"{vms:4d} VMs: before {res['before']['cpu']:.3f} s, this "
                      f"{res['this']['cpu']:.3f} s (ratio "
                      f"{res['this']['cpu'] / res['before']['cpu']:.2f}); same groups {same}, "
                      f"confidences differ by {conf:.2g}; precision/recall {pr}", flush=True)


if __name__ == "__main__":
    main()
