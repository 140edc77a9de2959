"""Load balancers side by side on a kernel fabric: an AllToAll step between two leaves as
equal TCP flows (workloads.bulk), under per-flow ECMP, packet spraying and Ethereal
(entropy fabric, paths discovered by the hosts), symmetric, with a leaf-spine link down, and
with one at half rate.

    sudo .venv/bin/python benchmarks/lb.py [--seeds 1,2,3] [--bytes 2000000] [--bw 100]

Every VM of leaf1 sends --bytes to every VM of leaf2 (4 x 4 flows, 4 spines, links at --bw
Mbit/s: 1:1). The step completes when the last flow is received. Printed per mode and case:
completion s (mean over seeds), its ratio to ECMP's, the byte imbalance over leaf1's spine
links (max / mean; 1.0 is perfect) and TCP retransmissions. The seed changes the ECMP hash
(fib_multipath_hash_seed) and the spraying draws. REPS is not run: its buffer
(workloads.lb.reps) needs per-send entropy inside the transport, which is not wired yet.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from mininet.log import setLogLevel

from lab import Lab
from lab.observe import link_states
from topo import LeafSpine
from workloads.lb.ethereal import assign
from workloads.lb.paths import distinct_paths

MODES = {"ecmp": "ecmp", "spray": "spray", "ethereal": "entropy"}
"""Balancer -> fabric mode it runs on."""
CASES = ("symmetric", "link_down", "degraded")


def plan(lab: Lab, balancer: str, nbytes: int) -> list[tuple[str, str, int, int]]:
    """(src, dst, bytes, dscp) of every flow of the step. Ethereal: each source discovers its
    paths to leaf2 by TTL probes and assigns its flows with Ethereal's rule."""
    srcs, dsts = ["vm1", "vm2", "vm3", "vm4"], ["vm5", "vm6", "vm7", "vm8"]
    if balancer != "ethereal":
        return [(s, d, nbytes, 0) for s in srcs for d in dsts]
    flows = []
    for s in srcs:
        out = lab[s].cmd(f"{sys.executable} -m workloads.lb.paths {lab['vm5'].IP()} "
                         "--dscp 1 2 3 4 --timeout 0.5")
        paths = distinct_paths({int(k): v for k, v in json.loads(out).items()})
        for p in assign(len(dsts), paths):
            flows.append((s, dsts[p.flow], p.share(nbytes)[1], p.path))
    return flows


def uplink_bytes(lab: Lab) -> dict[str, int]:
    """Bytes leaf1 sent on each of its spine links that are up."""
    return {s.b: s.tx_bytes[0] for s in link_states(lab) if s.a == "leaf1" and s.up}


def step(lab: Lab, flows: list[tuple[str, str, int, int]]) -> dict:
    """Run the flows at once (workloads.bulk: a flow ends when its receiver has every
    byte); completion s, imbalance over the links that are up, retransmits."""
    bulk = [sys.executable, "-m", "workloads.bulk"]
    servers = [lab[d].popen(bulk + ["recv", str(5401 + i)], text=True)
               for i, (_, d, _, _) in enumerate(flows)]
    before = uplink_bytes(lab)
    t0 = time.perf_counter()
    clients = [lab[s].popen(bulk + ["send", lab[d].IP(), str(5401 + i), str(n), "--dscp",
                                    str(dscp), "--timeout", "300"], text=True)
               for i, (s, d, n, dscp) in enumerate(flows)]
    outs = [c.communicate(timeout=300)[0] for c in clients]
    done = time.perf_counter() - t0
    for srv in servers:
        srv.kill()
        srv.wait()
    after = uplink_bytes(lab)
    up = [after[k] - before[k] for k in after]
    finished = all(c.returncode == 0 for c in clients)
    return {"completion_s": done if finished else None, "finished": finished,
            "imbalance": max(up) / (sum(up) / len(up)),
            "retransmits": sum(json.loads(o)["retransmits"] for o in outs if o.strip())}


def run(balancer: str, case: str, seed: int, nbytes: int, bw: float) -> dict:
    topo = LeafSpine(spines=4, leaves=2, vms_per_leaf=4, host_bw=bw, fabric_bw=bw,
                     host_queue=100, fabric_queue=100)
    with Lab(topo, name="bench_lb", seed=seed, fabric=MODES[balancer]) as lab:
        if case == "link_down":
            lab.faults.link_down("leaf1", "spine1")
        elif case == "degraded":
            lab.faults.rate("leaf1", "spine1", bw / 2)
        lab.pingAll(timeout="1")
        return step(lab, plan(lab, balancer, nbytes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--bytes", type=int, default=2_000_000, help="per flow")
    ap.add_argument("--bw", type=float, default=100.0, help="every link, Mbit/s")
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    setLogLevel("error")
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{'case':10s} {'balancer':9s} {'completion s':>12s} {'/ecmp':>6s} "
          f"{'imbalance':>9s} {'retx':>6s} finished")
    for case in args.cases.split(","):
        ecmp = None
        for balancer in MODES:
            rs = [run(balancer, case, s, args.bytes, args.bw) for s in seeds]
            ok = [r["completion_s"] for r in rs if r["finished"]]
            mean = statistics.mean(ok) if ok else float("nan")
            ecmp = mean if balancer == "ecmp" else ecmp
            print(f"{case:10s} {balancer:9s} {mean:12.3f} {mean / ecmp:6.2f} "
                  f"{statistics.mean(r['imbalance'] for r in rs):9.2f} "
                  f"{statistics.mean(r['retransmits'] for r in rs):6.0f} "
                  f"{sum(r['finished'] for r in rs)}/{len(rs)}", flush=True)


if __name__ == "__main__":
    main()
