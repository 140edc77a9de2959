"""Ethereal on the kernel fabric: a host discovers the paths to another leaf by TTL probes,
assigns its equal flows with Ethereal's rule (3 flows over 4 spines: every flow cut in
quarters), and the lab's counters show equal bytes on every spine link."""
import json
import sys

from lab.observe import link_states
from topo import LeafSpine
from workloads.lb.ethereal import assign
from workloads.lb.paths import distinct_paths

FLOW_BYTES = 1_200_000
"""Per flow (4 pieces of 300 kB). Sent with workloads.bulk, which ends when the receiver has
every byte: iperf3 -n ends when the bytes are written, and the bytes left in the socket
buffers never crossed the fabric (seen: one spine at 0.79-0.83 of the mean in half the runs)."""


def uplink_bytes(lab):
    return {s.b: s.tx_bytes[0] for s in link_states(lab) if s.a == "leaf1"}


def test_ethereal_assignment_puts_equal_bytes_on_every_spine(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=4, leaves=2, vms_per_leaf=4, host_bw=200, fabric_bw=200,
                              host_queue=200, fabric_queue=200), name="lb_ether", fabric="entropy")
    src, dsts = lab["vm1"], [lab["vm5"], lab["vm6"], lab["vm7"]]
    out = src.cmd(f"{sys.executable} -m workloads.lb.paths {dsts[0].IP()} --dscp 1 2 3 4 "
                  "--timeout 0.5")
    paths = distinct_paths({int(k): v for k, v in json.loads(out).items()})
    assert len(paths) == 4, out
    pieces = assign(len(dsts), paths)
    assert {p.parts for p in pieces} == {4}
    bulk = [sys.executable, "-m", "workloads.bulk"]
    servers = [dsts[p.flow].popen(bulk + ["recv", str(5301 + i)], text=True)
               for i, p in enumerate(pieces)]
    before = uplink_bytes(lab)
    clients = [src.popen(bulk + ["send", dsts[p.flow].IP(), str(5301 + i),
                                 str(p.share(FLOW_BYTES)[1]), "--dscp", str(p.path)], text=True)
               for i, p in enumerate(pieces)]
    try:
        received = [json.loads(srv.communicate(timeout=60)[0]) for srv in servers]
        assert [c.wait(timeout=60) for c in clients] == [0] * len(clients)
    finally:
        for proc in clients + servers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert [r["bytes"] for r in received] == [p.share(FLOW_BYTES)[1] for p in pieces]
    after = uplink_bytes(lab)
    sent = {k: after[k] - before[k] for k in after}
    mean = sum(sent.values()) / len(sent)
    assert 0.90 < min(sent.values()) / mean and max(sent.values()) / mean < 1.10, sent
