"""Ethereal on the kernel fabric: a host discovers the paths to another leaf by TTL probes,
assigns its equal flows with Ethereal's rule (3 flows over 4 spines: every flow cut in
quarters), and the lab's counters show equal bytes on every spine link."""
import json
import sys
import time

from lab.observe import link_states
from topo import LeafSpine
from workloads.lb.ethereal import assign
from workloads.lb.paths import distinct_paths

FLOW_BYTES = 1_200_000
"""Per flow; a multiple of 4 x the iperf3 write size (-l 10000), so no piece overshoots (iperf3
sends whole writes: with its default 128 KiB writes a 300 kB piece became up to 393 kB)."""


def uplink_bytes(lab):
    return {s.b: s.tx_bytes[0] for s in link_states(lab) if s.a == "leaf1"}


def test_ethereal_assignment_puts_equal_bytes_on_every_spine(make_lab):
    lab = make_lab(LeafSpine(spines=4, leaves=2, vms_per_leaf=4, host_bw=200, fabric_bw=200,
                             host_queue=200, fabric_queue=200), "lb_ether", fabric="entropy")
    src, dsts = lab["vm1"], [lab["vm5"], lab["vm6"], lab["vm7"]]
    out = src.cmd(f"{sys.executable} -m workloads.lb.paths {dsts[0].IP()} --dscp 1 2 3 4 "
                  "--timeout 0.5")
    paths = distinct_paths({int(k): v for k, v in json.loads(out).items()})
    assert len(paths) == 4, out
    pieces = assign(len(dsts), paths)
    assert {p.parts for p in pieces} == {4}
    servers = [dsts[p.flow].popen(["iperf3", "-s", "-1", "-p", str(5301 + i)])
               for i, p in enumerate(pieces)]
    time.sleep(0.5)
    before = uplink_bytes(lab)
    clients = [src.popen(["iperf3", "-c", dsts[p.flow].IP(), "-p", str(5301 + i), "-n",
                          str(p.share(FLOW_BYTES)[1]), "-l", "10000", "-S", str(p.path << 2)])
               for i, p in enumerate(pieces)]
    try:
        assert [c.wait(timeout=60) for c in clients] == [0] * len(clients)
    finally:
        for proc in clients + servers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    after = uplink_bytes(lab)
    sent = {k: after[k] - before[k] for k in after}
    mean = sum(sent.values()) / len(sent)
    assert 0.90 < min(sent.values()) / mean and max(sent.values()) / mean < 1.10, sent
