"""The agents in real labs: `nslab run quickstart` end to end (sync, OWD, collocation, the
naive vs collocation-aware job), and the agents' robustness on a real fabric (fuzzed probes
from a VM, a paused VM, a spine link down and up).

Measured here (2 cores, software timestamps, quickstart when it had 8 VMs on 4 hosts, the
coordinator in vm1 and jobs of 8 iterations; load and a link down on the timeline and the
jobs' traffic at the end), five runs: offset |error| p50 0.03-0.05 us, p99 0.26-5 us (once
1316 us: the TCP flow's queue stood through a window); drift p99 0.04-0.11 ppm; collocation
equal to the truth 7-8 s after the agents started; naive AllReduce 1.8-2.0 s vs
collocation-aware 1.3 s. The tolerances below leave room for a loaded CI machine.
"""
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from pyroute2 import netns
from scapy.packet import fuzz

from agents.probe import NslabProbe, node_id
from lab.lab import lab_netns
from session import scoring
from session.daemons import AGENT_PORT, AgentMesh, AgentsSpec
from topo import LeafSpine

NSLAB = [sys.executable, "-m", "cli.main"]


def test_quickstart_end_to_end(tmp_path):
    out = tmp_path / "q.json"
    r = subprocess.run([*NSLAB, "run", "quickstart", "--json", str(out)], capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    sync = doc["sync"]
    assert sync["offset_error_us"]["n"] > 50
    assert sync["offset_error_us"]["p50"] < 2.0, sync
    assert sync["drift_error_ppm"]["p50"] < 0.5, sync
    # no p99 bound: the TCP flow at 6-10 s sometimes keeps vm1's queue full for a whole
    # window, which biases every two-way estimate (1.3 ms seen, as for the NTP-style one);
    # from converged_s on, every window is within 10 us, the jobs' windows included
    assert sync["converged_s"] is not None and sync["converged_s"] < 15, sync
    col = doc["collocation"]
    assert col["precision"] == 1.0 and col["recall"] == 1.0, col
    assert col["detected_after_s"] is not None
    assert len(doc["owd_us"]["pairs"]) == 8 * 7
    # the latest window holds the jobs' traffic: a probe may wait behind a full queue of
    # 100 packets (12.1 ms at 100 Mbit/s) on each of its 2-4 shaped hops; the floor is us
    for pair, o in doc["owd_us"]["pairs"].items():
        assert 0 < o["min_us"] < 100 and o["min_us"] <= o["p50_us"] <= o["p99_us"] < 50_000, \
            (pair, o)
    naive, aware = doc["jobs"]
    assert naive["verified"] and aware["verified"], doc["jobs"]
    assert naive["placement"]["shared_host_ranks"] == 4
    cmp = doc["placement_comparison"]
    assert cmp["aware_avoided_shared_hosts"] is True, cmp
    assert cmp["aware_s"] < cmp["naive_s"], cmp
    cost = doc["agents"]
    assert 0 < cost["agent_cpu_core"]["p50"] <= cost["agent_cpu_core"]["max"] < 1, cost
    # 7 peers x 20 pairs/s x 2 probes x 98 bytes x 8 = 220 kbit/s per agent, and a little
    # more for the follow-ups of peers that probe back
    assert 150e3 < cost["probe_bit_s"]["p50"] < 400e3, cost
    assert doc["teardown"]["clean"] is True
    assert lab_netns("quickstart") == []
    for section in ("clock sync vs truth", "collocation:", "collocation-aware placement"):
        assert section in r.stdout
    check_report_series(doc, tmp_path)


def check_report_series(doc: dict, tmp_path) -> None:
    """The series behind nslab report's plots, against the statistics and the load of the
    same run, and the report made from them."""
    sync = doc["sync"]
    series = sync["series"]
    vms = {v["name"] for v in doc["lab"]["vms"]}
    assert set(series["offset_error_us"]) == vms - {sync["reference"]}
    assert len(series["t_s"]) == sync["windows"]
    scored = [abs(e) for errs in series["offset_error_us"].values() for e in errs[1:]
              if e is not None]  # the statistics leave the first window out
    assert len(scored) == sync["offset_error_us"]["n"]
    assert max(scored) == sync["offset_error_us"]["max"]
    for job in doc["jobs"]:
        assert len(job["iteration_times_s"]) == job["iterations"]
        assert max(job["iteration_times_s"]) == pytest.approx(job["iteration_s"]["max"],
                                                              abs=1e-6)
    # the load's TCP flow into vm1 (quickstart: vm5 -> vm1, 6-10 s) seen twice: iperf3's
    # goodput at the receiver, and vm1's downlink (from its host) utilization from its
    # qdisc's counters (Ethernet headers counted: TCP goodput tops out at 95.6 % of the rate),
    # over the flow's busiest run of samples as long as its steady part: on a loaded machine
    # iperf3 started seconds late (seen: 0.0 from 7 to 10 s)
    flow = doc["load"][0]
    fid = doc["lab"]["fidelity"]["series"]
    into = f"{doc['truth']['placements'][flow['dst']]}->{flow['dst']}"  # its host's vswitch
    util = [(t, u or 0.0) for t, u in zip(fid["t_s"], fid["links"][into],
                                          strict=True)
            if flow["at_s"] <= t <= flow["at_s"] + flow["duration_s"] + 8]
    step = (fid["t_s"][-1] - fid["t_s"][0]) / max(len(fid["t_s"]) - 1, 1)
    n = max(int((flow["duration_s"] - 1) / step), 2)
    assert len(util) >= n, fid
    busiest = max(sum(u for _, u in util[i:i + n]) / n for i in range(len(util) - n + 1))
    assert abs(busiest * 100 * 0.956 - flow["mbit"]) < 20, (util, flow)
    out = tmp_path / "q.html"
    assert subprocess.run([*NSLAB, "report", str(tmp_path / "q.json"), "--html", str(out)],
                          capture_output=True, timeout=60).returncode == 0
    html = out.read_text()
    for key in ("timeline", "clock_error", "owd", "iterations", "links", "cpu"):
        assert f'id="fig-{key}"' in html


def send_from(vm, dst: tuple[str, int], datagrams: list[bytes]) -> None:
    """Send UDP datagrams from inside ``vm``'s network namespace."""
    netns.pushns(vm.netns)
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    finally:
        netns.popns()
    with s:
        for d in datagrams:
            s.sendto(d, dst)


def wait_for(mesh, cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    st = None
    while time.monotonic() < deadline:
        dead = {k: p.returncode for k, p in mesh.procs.items() if p.poll() is not None}
        assert not dead, f"daemons exited: {dead}"
        st = mesh.state()
        if st is not None and cond(st):
            return st
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}; last state: "
                f"{st and st.model_dump_json(include={'windows', 'collocation', 'counters'})}")


def test_agents_survive_fuzz_pause_and_link_failure(nslab_lab):
    topo = LeafSpine(spines=2, leaves=2, vms_per_leaf=2, host_bw=100, vms_per_host=2)
    lab = nslab_lab(topo, name="it_agents", seed=5, cpu_cores=1.0)
    mesh = AgentMesh(lab, AgentsSpec(enabled=True, rate=20, window_s=2.0))
    mesh.start()
    try:
        truth = scoring.truth_groups(lab.phys)

        def groups(st):
            return sorted(sorted(g.members) for g in st.collocation.groups)

        # drift is scored as the session scores it: once final (the coordinator revises a
        # window's drift until its centred span of drift_windows has closed)
        st = wait_for(mesh, lambda s: s.windows >= 3 + s.drift_windows // 2
                      and groups(s) == truth, 50,
                      "3 final windows and the true collocation groups")
        sync = scoring.sync_section(st.history, lab.clocks.specs, st.reference,
                                    mesh.started_ns, provisional_windows=st.drift_windows // 2)
        assert sync["offset_error_us"]["p99"] < 20.0, sync
        # a sanity bound, not the accuracy goal (benchmarks/sync.py: 0.02-0.05 ppm idle): the
        # clocks drift by tens of ppm, and a machine loaded by other labs (load average 6-7)
        # read 1.4-1.6 ppm here
        assert sync["drift_error_ppm"]["p99"] < 2.5, sync

        # fuzzed, truncated and random datagrams from vm4 to vm1's agent
        fuzzed = [bytes(fuzz(NslabProbe(src=node_id("vm4"), dst=node_id("vm1"))))
                  for _ in range(100)] + [os.urandom(n) for n in range(40)]
        before = sum(st.vms["vm1"].rejects.values())
        send_from(lab["vm4"], (lab["vm1"].IP(), AGENT_PORT), fuzzed)

        # vm3 paused for 5 s, a spine link down for 4 s
        lab.faults.pause("vm3")
        lab.faults.link_down("leaf1", "spine1")
        time.sleep(4)
        lab.faults.link_up("leaf1", "spine1")
        time.sleep(1)
        lab.faults.resume("vm3")
        t_ref = st.t_ns
        st = wait_for(mesh, lambda s: s.t_ns > t_ref + 14e9
                      and "vm3" in s.history[-1].vms
                      and sum(s.vms["vm1"].rejects.values()) >= before + len(fuzzed) - 3,
                      40, "vm3 back in a window and the fuzz counted")
        assert all(p.poll() is None for p in mesh.procs.values())
        rejected = sum(st.vms["vm1"].rejects.values()) - before
        assert rejected >= len(fuzzed) - 3, st.vms["vm1"].rejects  # a fuzz may pass
        last = scoring.sync_section(st.history[-2:], lab.clocks.specs, st.reference,
                                    mesh.started_ns, skip_windows=0)
        assert last["offset_error_us"]["max"] < 20.0, last
        assert groups(st) == truth
    finally:
        mesh.stop()
