"""The pacer in a real lab: it senses real TCP, measures OWD on the synchronized clocks, holds
nothing while the OWD stays below T, and what it adds to the guest's interface is the guest's
only (python -m agents pacer, started in VMs as a tenant would), on its kernel datapath (the
default) and on its probe datapath."""
import time

import pytest
from traffic import iperf3

from session.daemons import AgentMesh, AgentsSpec, PacerSpec
from session.edge import wait_synced
from topo import LeafSpine


def test_probe_pacer_senses_tcp_and_holds_nothing_below_threshold(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=1, leaves=2, vms_per_leaf=1, host_bw=100, host_queue=30),
                    name="pace_idle")
    mesh = AgentMesh(lab, AgentsSpec(enabled=True))
    mesh.start()
    try:
        vm1, vm2 = lab["vm1"], lab["vm2"]
        mesh.start_pacers([vm1, vm2], "pace", PacerSpec(threshold_us=2000, datapath="probe"))
        # the guest's own qdisc: the pacer's HTB on vm1-eth0; the vNIC emulation is at leaf1
        for _ in range(50):
            if "htb 1:" in vm1.cmd("tc qdisc show dev vm1-eth0"):
                break
            time.sleep(0.1)
        assert "htb 1:" in vm1.cmd("tc qdisc show dev vm1-eth0")
        # the pacer takes OWD samples once it has the agents' clock estimates: the flow waits
        # for them (on a fresh machine the first windows came after a 6 s flow had ended)
        st = wait_synced(mesh, ["vm1"], 40.0)
        # a flow at a tenth of the link rate builds no queue: OWD ~ base, far below T
        doc = iperf3(vm1, vm2, "-b", "10M", "-t", "6")
        assert doc["end"]["sum_received"]["bits_per_second"] > 8e6
        time.sleep(1.5)  # one more report after the flow
        p = mesh.state().pacers["vm1"]
        assert p.mode == "pace" and p.datapath == "probe" and p.synced
        assert p.status == "pacing"
        d = p.dests["vm2"]
        assert d.owd_samples > 100, d
        assert 0 < d.owd_us_p50 < d.owd_us_p99 < 2000
        # below T: holds only on the rare samples above it (a prober descheduled between its
        # timestamp and its send on a loaded machine reads one late), or on the rare probes
        # whose echo was late (T + the longest hold: the receiver's pacer waiting for a CPU),
        # never otherwise; such a hold ends at the next fresh sample below T
        assert d.above_threshold <= 0.01 * d.owd_samples, d
        assert d.overdue_holds <= 0.01 * d.probes_sent, d
        assert d.holds <= d.above_threshold + d.overdue_holds, d
        assert d.held_ms <= 50.0 * d.holds, d          # 10 x the longest hold in one piece
        assert st.vms["vm1"].offset_ns is not None
    finally:
        mesh.stop()
    # a stopped pacer removes its qdisc: the interface is as it found it
    assert "htb" not in vm1.cmd("tc qdisc show dev vm1-eth0")


HOLD_PROBE = r"""
import json, socket, sys, time
from pyroute2 import IPRoute
from agents.hold import Holder

ifname, dst = sys.argv[1], sys.argv[2]
ipr = IPRoute()
idx = ipr.link_lookup(ifname=ifname)[0]

def tbf_bytes():
    return {m["handle"] >> 16: m.get_attr("TCA_STATS2").get_attr("TCA_STATS_BASIC")["bytes"]
            for m in ipr.get_qdiscs(idx) if m.get_attr("TCA_KIND") == "tbf"}

h = Holder(ifname, 100, probe_port=9999)
h.prepare(dst)
print("ready", flush=True)
time.sleep(1.0)                                  # the flow is running
h.hold(dst)
time.sleep(0.05)                                 # what was already allowed leaves
b0 = tbf_bytes(); time.sleep(0.3); b1 = tbf_bytes()
h.release(dst)
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"kick", (dst, 9999))
time.sleep(0.02); b2 = tbf_bytes()
h.close()
print(json.dumps({"held": sum(b1.values()) - sum(b0.values()),
                  "released": sum(b2.values()) - sum(b1.values())}), flush=True)
"""


def test_hold_stops_a_destination_and_release_resumes_it_at_once(nslab_lab):
    """agents.hold on a real interface: a held destination sends at most one packet plus
    64 kbit/s, nothing is dropped, and a release lets its queue go within milliseconds."""
    import json
    import sys

    lab = nslab_lab(LeafSpine(spines=1, leaves=1, vms_per_leaf=2, host_bw=100), name="pace_hold")
    vm1, vm2 = lab["vm1"], lab["vm2"]
    bulk = [sys.executable, "-m", "workloads.bulk"]
    rx = vm2.popen(bulk + ["recv", "5301"])
    probe = vm1.popen([sys.executable, "-c", HOLD_PROBE, "vm1-eth0", vm2.IP()], text=True)
    assert probe.stdout.readline().strip() == "ready"
    tx = vm1.popen(bulk + ["send", vm2.IP(), "5301", "40000000"])
    out, _ = probe.communicate(timeout=30)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["held"] <= 1600 + 64_000 / 8 * 0.3 + 1600, r      # one packet, 64 kbit/s, slack
    assert r["released"] >= 20 * 1448, r                       # >= 20 packets in 20 ms
    tx.kill()
    rx.kill()
    for p in (tx, rx):
        p.wait(timeout=10)


SYN_PROBE = r"""
import socket, sys, time
from agents.gate import GateConfig
from agents.pacerio import Engine

udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 7703))
e = Engine(udp, 7703, ["127.0.0.2", "127.0.0.3"], False, GateConfig(), 0.002, None)
e.watch_syn(socket.if_nametoindex("lo"), 0.3)
e.start()
time.sleep(0.2)
idle = e.stats(0)[0].sent
srv = socket.socket(); srv.bind(("127.0.0.2", 5555)); srv.listen()
cli = socket.create_connection(("127.0.0.2", 5555))
time.sleep(0.1)
soon = e.stats(0)[0].sent
time.sleep(0.4)
late = e.stats(0)[0].sent
time.sleep(0.3)
print(idle, soon, late, e.stats(0)[0].sent, e.stats(1)[0].sent)
e.close()
"""


def test_a_syn_starts_probing_its_destination_for_active_s():
    """The native loop's SYN watch (a packet socket with a BPF filter) in a namespace of its
    own: nothing is probed before a connection; a SYN to 127.0.0.2 starts probes to it at once
    (no pacer answers: 2 unanswered, then one per sample age bound) and only to it, and they
    stop ``active_s`` (0.3 s) later."""
    import subprocess
    import sys

    out = subprocess.run(["unshare", "-n", "sh", "-c", f'ip link set lo up && exec '
                          f'"{sys.executable}" -c "$0"', SYN_PROBE], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    idle, soon, late, later, other = map(int, out.split())
    assert idle == 0 and other == 0, out
    assert soon >= 2, out
    assert later == late, out


ACK_PACED = {"window_clamp": True, "threshold_from": "base", "ack_pace": 0.9}
"""The receivers' window clamp, T from the base OWD and their pure ACKs paced at 0.9 of the
line (docs/how-it-works/pacer-datapath.md): what keeps 8 senders' incast drop-free."""


@pytest.mark.parametrize("n, extra", [(4, {}), (8, ACK_PACED)], ids=["4-senders", "8-senders"])
def test_paced_incast_drops_nothing(nslab_lab, n, extra):
    """Issue 10's incast on a shallower queue: ``n`` VMs send 300 kB each at once (CUBIC, one
    go) to one more behind its 5 Mbit/s, 20-packet downlink, first with the pacers measuring
    only, then with them holding on their kernel datapath (T 2 ms, holds <= 20 ms: the
    defaults x 4, time dilation as in benchmarks/pacer.py; 8 senders with ``ACK_PACED`` too).
    Unpaced, the queue overflows; paced, no packet is dropped on any link (the lab's tc
    counters: the truth; the coordinator's VM is a sender, its control traffic on its link),
    and the round takes at most 1.4 x as long. The paced round is judged only when the
    machine was not saturated while it ran (then the test is skipped, saying what it
    measured): the echoes ride on ACKs that wait for a CPU like everything else."""
    from lab.fidelity import FidelitySampler
    from session.incast import incast

    lab = nslab_lab(LeafSpine(spines=1, leaves=1, vms_per_leaf=n + 1, host_bw=5, host_queue=20),
                    name="pace_incast")
    mesh = AgentMesh(lab, AgentsSpec(enabled=True))
    mesh.start()
    senders, rx = [lab[f"vm{i}"] for i in range(1, n + 1)], lab[f"vm{n + 1}"]
    names = [s.name for s in senders]
    spec = PacerSpec(threshold_us=2000, max_hold_us=20000, probe_us=2000, **extra)
    rounds = {}
    try:
        for mode in ("sense", "pace"):
            started = mesh.start_pacers(senders + [rx], mode, spec)
            wait_synced(mesh, names, 60.0, started)  # the new pacers gate (or measure)
            with FidelitySampler() as fid:          # the round itself, not the pacers' start
                rounds[mode] = incast(lab, senders, rx, 300_000, "cubic")
            if mode == "pace":  # its datapath is in the kernel, its echoes acknowledged at once
                assert mesh.state().pacers["vm2"].datapath == "bpf"
                assert "quickack 1" in senders[1].cmd("ip route show dev vm2-eth0")
            mesh.stop_pacers()
    finally:
        mesh.stop()
    # stopped pacers leave the guests' interfaces and routes as they found them
    assert "clsact" not in senders[1].cmd("tc qdisc show dev vm2-eth0")
    assert "quickack" not in senders[1].cmd("ip route show dev vm2-eth0")
    (t_off, off), (t_on, on) = rounds["sense"], rounds["pace"]
    assert sum(off.values()) > 0, rounds            # an incast that overflows unpaced
    fid = fid.summary()                             # the paced round's
    if fid["saturated"] and (on or t_on > 1.4 * t_off):
        pytest.skip(f"the machine was saturated in the paced round (all cores >= 90 % busy "
                    f"in {fid['saturated_share']:.0%} of it): paced {on or 'no drops'} in "
                    f"{t_on:.2f} s, unpaced {off} in {t_off:.2f} s")
    assert on == {}, (rounds, fid["saturated_share"])  # paced: no drop anywhere
    assert t_on <= 1.4 * t_off, rounds
