"""A lab split across two servers emulated as namespaces (tests/integration/servers.py): the
same code path as two real machines (SSH to the second, commands here on the first), built by
the ``Lab`` and run end to end by ``nslab run --servers``.

A 2-leaf, 2-spine lab with leaf1 and spine1 on s1 (here) and leaf2 and spine2 on s2 (over
SSH): the links leaf1-spine2 and leaf2-spine1 are VXLAN tunnels, so every path between the
two leaves' VMs crosses one. The servers share this machine's clock, so the agents (in the
``nslab run`` test) are scored against one truth (the bound between the servers' truths is 0;
what the SSH exchange measures is only bounded by its round trip).
"""
import json
import os
import re
import subprocess
import sys

import pytest
from scapy.layers.inet import ICMP
from scapy.utils import rdpcap
from servers import emulated_servers

from lab.capture import Capture
from lab.clean import clean
from lab.lab import Lab
from lab.names import netns_name, state_dir
from lab.server_cgroups import RemoteCgroups
from lab.servers import Servers
from lab.tunnel import VXLAN_OVERHEAD
from lab.wait import wait_until
from topo import LeafSpine

LAB, DC, RATE = "t32", "t32dc", 50


def lab_namespaces(lab: str = LAB):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.startswith(netns_name(lab, ""))]


def iperf3_mbit(lab, src: str, dst: str) -> float:
    """Mbit/s received by ``dst``'s iperf3 server (started on its server) from ``src`` in 3 s
    of TCP (the first second left out)."""
    server = lab[dst].popen(["iperf3", "-s", "-1"])
    try:
        assert wait_until(lambda: ":5201 " in lab[dst].cmd("ss -ltnH"), 10, 0.1)
        out, _ = lab[src].popen(["iperf3", "-c", lab[dst].IP(), "-t", "3", "-O", "1",
                                 "-J"]).communicate(timeout=30)
        doc = json.loads(out)
        assert "error" not in doc, doc["error"]
        return doc["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        server.kill()
        server.wait(timeout=10)


def tc_show(end, what: str) -> str:
    """``tc what show`` of the interface emulating link end ``end``, on its server."""
    node = end.shaper_node
    return node.on.run(["tc", "-n", node.netns, what, "show", "dev", end.shaper_name])


def cross_pings_ok(lab) -> bool:
    """Every VM under leaf1 (s1) pings every VM under leaf2 (s2)."""
    return all(lab[a].cmd(f"ping -c 2 -i 0.2 -W 1 -q {lab[b].IP()}").count(" 0% packet loss")
               for a in ("vm1", "vm2") for b in ("vm3", "vm4"))


@pytest.fixture(scope="module")
def dc():
    """The two emulated servers, this thread inside the first."""
    with emulated_servers(DC) as servers:
        yield servers


def test_a_lab_split_across_two_servers_pings_carries_tcp_reroutes_and_cleans_up(dc, tmp_path):
    topo = LeafSpine(spines=2, leaves=2, vms_per_leaf=2, host_bw=100, fabric_bw=RATE)
    hosts, ssh_options = dc
    lab = Lab(topo, name=LAB, seed=3, servers=hosts, ssh_options=ssh_options,
              cpu_cores=1.0)
    try:
        lab.start()
        assert {n: lab.split.server_of[n] for n in ("leaf1", "spine1", "leaf2", "spine2")} \
            == {"leaf1": "s1", "spine1": "s1", "leaf2": "s2", "spine2": "s2"}
        assert set(lab.tunnels) == {frozenset(("leaf1", "spine2")),
                                    frozenset(("leaf2", "spine1"))}
        assert [lab[v].remote for v in ("vm1", "vm2", "vm3", "vm4")] == [False] * 2 + [True] * 2
        assert [c.server for c in lab.server_clocks] == ["s1", "s2"]
        for link in lab.tunnels.values():
            assert link.mtu == 1500 - VXLAN_OVERHEAD
            for end in link.ends:
                show = end.node.on.run(["ip", "-n", end.node.netns, "-d", "link", "show",
                                        end.name])
                assert f"vxlan id {link.vni} " in show and f"mtu {link.mtu} " in show
                # its socket lives in the server's namespace, the device in the router's
                srv = end.node.on.server.name
                assert re.search(rf"link-netns {netns_name(DC, srv)}\b", show)
                assert f"rate {RATE}Mbit" in tc_show(end, "class")
        # a remote VM's processes: in its namespace there, in its host's cgroup there
        # (the server's own top cgroup), on its VM clock, without CAP_SYS_TIME (bit 25
        # of the bounding set)
        env = lab["vm3"].cmd("echo $NSLAB_CLOCK; grep -c :/nslab-t32-s2/phys3/vm3$ "
                             "/proc/self/cgroup; grep CapBnd /proc/self/status")
        clock, cgroups, _, bounding = env.split()
        assert clock == lab["vm3"].clock_path and "server-s2" in clock
        assert int(cgroups) >= 1, env
        assert not int(bounding, 16) & (1 << 25), env

        assert cross_pings_ok(lab)
        # TCP from s1 to s2 through a tunnel (every path crosses one); VMs keep MTU 1500
        # and learn the tunnel's from the routers (path MTU discovery)
        rate = iperf3_mbit(lab, "vm1", "vm3")
        assert 0.9 * RATE <= rate <= 1.02 * RATE, rate
        assert f"mtu {1500 - VXLAN_OVERHEAD}" in lab["vm1"].cmd(f"ip route get "
                                                               f"{lab['vm3'].IP()}")

        route = "ip route show 10.2.0.0/16"
        assert lab["leaf1"].cmd(route).count("nexthop via") == 2
        lab.faults.link_down("leaf1", "spine2")
        assert "state DOWN" in lab["leaf1"].cmd("ip link show leaf1-vx0")
        assert "nexthop" not in lab["leaf1"].cmd(route)  # one path left: via spine1
        assert "leaf1-eth3" in lab["leaf1"].cmd(route)
        assert cross_pings_ok(lab)
        lab.faults.link_up("leaf1", "spine2")
        assert lab["leaf1"].cmd(route).count("nexthop via") == 2

        # rate and queue changes on the remote server: a VM's link there (leaf2's end and
        # the IFB emulating vm3's vNIC, both in leaf2 on s2) and both ends of a cut link
        lab.faults.rate("leaf2", "vm3", 40)
        lab.faults.rate("leaf2", "spine1", 30)
        lab.faults.queue("leaf2", "spine1", 60)
        ends = [*lab.faults.ends("leaf2", "vm3"), *lab.faults.ends("leaf2", "spine1")]
        assert sorted(e.shaper_node.on.server.name for e in ends) == ["s1"] + ["s2"] * 3
        for end, mbit in zip(ends, (40, 40, 30, 30), strict=True):
            assert f"rate {mbit}Mbit" in tc_show(end, "class"), end.shaper_name
        assert all("limit 60" in tc_show(end, "qdisc") for end in ends[2:])

        # a capture of a VM on s2: tcpdump there, its pcap brought back here at stop
        cap = Capture(lab, str(tmp_path / "pcaps"), ["vm3"], bpf="icmp")
        cap.start()
        assert " 0% packet loss" in lab["vm1"].cmd(f"ping -c 3 -i 0.2 {lab['vm3'].IP()}")
        pcap = cap.stop()["vm3.pcap"]
        echoes = [p[ICMP].type for p in rdpcap(pcap)]
        assert echoes.count(8) == echoes.count(0) == 3, echoes  # requests in, replies out
        assert cap.packets[pcap] == 6

        # VM faults on the remote server: a CPU hog there, a pause (its cgroup frozen there,
        # its vNIC silenced), then both undone
        ping = f"ping -c 1 -W 1 {lab['vm3'].IP()}"
        lab.faults.cpu_hog("vm4")
        hog = lab.faults.hogs["vm4"]
        assert lab.cgroups.pids(lab.phys["vm4"], "vm4") != []
        lab.faults.pause("vm3")
        assert " 100% packet loss" in lab["vm1"].cmd(ping)
        lab.faults.resume("vm3")
        assert " 0% packet loss" in lab["vm1"].cmd(ping)
        lab.faults.cpu_hog("vm4", enable=False)
        assert hog.returncode is not None

        # s2's clock measured during the run too: one clock here, so each sample's offset is
        # within half its round trip (plus the 1 us of $EPOCHREALTIME)
        series = lab.server_clocks[1].series
        assert len(series) >= 2 and 0 < series[0].t_s < series[-1].t_s, series
        assert all(abs(s.offset_us) <= s.rtt_us / 2 + 1 for s in series), series
        assert lab.server_sync_us >= max(abs(s.offset_us) + s.rtt_us / 2 for s in series)
    finally:
        lab.stop()
    assert lab.leftovers == [], lab.leftovers
    assert lab_namespaces() == [] and not os.path.exists(state_dir(LAB))

    # a crash: namespaces and a process left on both servers, a cgroup on s2, then
    # nslab clean
    servers = Servers(LAB, hosts, ssh_options)
    servers.check()
    for node, srv in (("leaf1", "s1"), ("spine1", "s2")):
        ns = servers.add_netns(srv, node)
        servers[srv].run(["sh", "-c", f"ip netns exec {ns} sleep 600 >/dev/null 2>&1 &"])
    RemoteCgroups(servers["s2"], LAB).create_host("phys9")
    servers.close()
    assert len(lab_namespaces()) == 2
    done = clean(LAB)
    assert "netns nslab-t32-spine1 on s2" in done, done
    assert any(d.startswith("cgroup ") and d.endswith("/nslab-t32-s2 on s2")
               for d in done), done
    assert lab_namespaces() == [] and not os.path.exists(state_dir(LAB))


SCENARIO = """name: t32run
description: a lab split across two servers; vm1 runs the agents' coordinator
seed: 3
duration_s: 16
topology: {kind: leafspine, spines: 2, leaves: 2, vms_per_leaf: 2, host_bw: 100,
           fabric_bw: FABRIC_BW}
hosts: {cpu_cores: 0.5}
agents: {enabled: true, rate: 20, window_s: 2, drift_windows: 3}
load:
  - {src: vm1, dst: vm3, at_s: 1, duration_s: 3}
faults:
  - {at_s: 6, kind: link_down, link: [leaf1, spine2]}
  - {at_s: 8, kind: link_up, link: [leaf1, spine2]}
""".replace("FABRIC_BW", str(RATE))


def test_nslab_run_with_servers_runs_a_scenario_across_them(dc, tmp_path):
    hosts, ssh_options = dc
    path, out = tmp_path / "split.yaml", tmp_path / "split.json"
    path.write_text(SCENARIO)
    # nslab runs on the first server: in its network namespace (nsenter keeps /sys)
    r = subprocess.run(["nsenter", f"--net=/run/netns/{netns_name(DC, 's1')}", sys.executable,
                        "-m", "cli.main", "run", str(path), "--json", str(out), "--servers",
                        f"{hosts[0].address},{hosts[1].ssh}",
                        *(f"--ssh-option={o}" for o in ssh_options)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert [c["server"] for c in doc["truth"]["servers"]] == [h.address for h in hosts]
    assert doc["truth"]["server_sync_us"] > 0
    assert len(doc["truth"]["servers"][1]["series"]) >= 3  # every 2 s of the 16 s run
    assert "scores across servers good to" in r.stdout
    (load,) = doc["load"]  # vm1 (first server) to vm3 (second): through a tunnel
    assert load["error"] is None and load["mbit"] >= 0.9 * RATE, load
    assert [(e["kind"], e["target"]) for e in doc["truth"]["faults"]
            if e["kind"].startswith("link")] == [("link_down", "leaf1-spine2"),
                                                 ("link_up", "leaf1-spine2")]
    # every VM synced across the servers, within the bounds of test_agents' lab on one
    # server (the same loaded-CI margins); the servers share one clock: one truth
    sync = doc["sync"]
    vms = {f"vm{i}" for i in range(1, 5)} - {sync["reference"]}
    assert set(sync["series"]["offset_error_us"]) == vms, sync
    assert sync["offset_error_us"]["n"] >= 3 * 3, sync
    assert sync["offset_error_us"]["p99"] < 20.0, sync
    assert sync["drift_error_ppm"]["p99"] < 2.5, sync
    assert doc["lab"]["fidelity"]["queues_error"] is None
    assert doc["teardown"]["clean"] is True
    assert lab_namespaces("t32run") == []
