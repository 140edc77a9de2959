"""A Snapshot of a topology without a lab, for the TUI's layout tests at sizes no recording
has (32 VMs: 8 leaves, 4 spines): the nodes, links, VMs and hosts of ``topo.LeafSpine``, with
seeded link loads and one-way delays that grow with the hops (2 us per hop + noise), the
agents' groups equal to the truth."""
from __future__ import annotations

import random

from agents.owd import natural_key
from lab.observe import TIERS
from topo import LeafSpine
from tui.backend import GroupView, LinkView, NodeView, Snapshot, VMView


def leafspine_snapshot(spines: int, leaves: int, vms_per_leaf: int, vms_per_host: int = 2,
                       seed: int = 1, hosts: dict | None = None) -> Snapshot:
    """``hosts``: the host layer's options (``topo.hosts``), None for none."""
    topo = LeafSpine(spines=spines, leaves=leaves, vms_per_leaf=vms_per_leaf, host_bw=100,
                     fabric_bw=100, vms_per_host=vms_per_host, hosts=hosts)
    rng = random.Random(seed)
    tier = {n: TIERS[topo.nodeInfo(n).get("role", "vm")] for n in topo.nodes()}
    vms = sorted((n for n in topo.nodes() if tier[n] == 0), key=natural_key)
    info = {v: topo.nodeInfo(v) for v in vms}
    snap = Snapshot(time_s=12.0, scenario=f"synthetic {len(vms)} VMs", lab="syn",
                    state="running", agents="running", reference=vms[0])
    snap.nodes = [NodeView(n, topo.nodeInfo(n).get("role", "vm"), tier[n]) for n in topo.nodes()]
    for a, b in topo.links():
        a, b = (a, b) if tier[a] <= tier[b] else (b, a)
        u = rng.random()
        snap.links.append(LinkView(a, b, utilization=round(u, 3), mbit=round(u * 100, 1),
                                   bw_mbit=100.0, tx_bytes=rng.randrange(10**8),
                                   queue_pkts=rng.randrange(50)))
    for v in vms:
        err = rng.gauss(0, 2)
        snap.vms.append(VMView(v, info[v]["phys"], info[v]["leaf"], cpu_pct=rng.uniform(0, 60),
                               offset_ms=rng.uniform(-10, 10), drift_ppm=rng.uniform(-50, 50),
                               est_offset_ms=0.0, err_offset_us=round(err, 2),
                               err_drift_ppm=round(rng.gauss(0, 0.3), 3)))
    hosts: dict[str, list[str]] = {}
    for v in vms:
        hosts.setdefault(info[v]["phys"], []).append(v)
    snap.hosts = sorted(hosts, key=natural_key)
    snap.truth_groups = [hosts[h] for h in snap.hosts]
    snap.groups = [GroupView(list(g), 0.9) for g in snap.truth_groups]
    for a in vms:
        for b in vms:
            if a != b:
                hops = 2 if info[a]["leaf"] == info[b]["leaf"] else 4
                snap.owd_us[f"{a}->{b}"] = round(hops * 2 + 20 + rng.uniform(0, 60), 1)
    return snap
