"""A lab split across two servers emulated as namespaces (tests/integration/servers.py): the
same code path as two real machines (SSH to the second, commands here on the first)."""
import json
import os
import re
import subprocess
import time

from servers import emulated_servers

from lab.clean import clean
from lab.names import netns_name, state_dir
from lab.server_clock import measure_all, sync_bound_us
from lab.servers import Servers
from lab.tunnel import VXLAN_OVERHEAD, VxlanLink
from topo import LeafSpine
from topo.split import split

LAB, DC, RATE = "t32", "t32dc", 50


def lab_namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.startswith(netns_name(LAB, ""))]


def iperf3(servers, netns, server_ip, *args):
    """Mbit/s of TCP for 3 s from leaf1 (first server) to spine1 (second server, its iperf3
    server started over SSH); ``-R``: the other way."""
    srv = servers["s2"].popen(["ip", "netns", "exec", netns["spine1"], "iperf3", "-s", "-1"])
    try:
        for _ in range(50):
            r = subprocess.run(["ip", "netns", "exec", netns["leaf1"], "iperf3", "-c",
                                server_ip, "-t", "3", "-O", "1", "-J", *args],
                               capture_output=True, text=True)
            doc = json.loads(r.stdout)
            if "error" not in doc:
                return doc["end"]["sum_received"]["bits_per_second"] / 1e6
            time.sleep(0.1)  # the server is still starting on the other side of SSH
    finally:
        if srv.poll() is None:
            srv.kill()  # the SSH client; teardown ends what runs in the namespace by PID
        srv.wait()
    raise AssertionError(doc["error"])


def test_a_cut_link_is_a_shaped_vxlan_tunnel_and_teardown_and_clean_reach_every_server():
    with emulated_servers(DC) as (hosts, ssh_options):
        placed = split(LeafSpine(spines=1, leaves=1, vms_per_leaf=1, fabric_bw=RATE), hosts,
                       {"spine1": "s2"})
        (cut,) = placed.cut
        servers = Servers(LAB, hosts, ssh_options)
        try:
            servers.check()
            # the servers share this machine's clock: offset within the exchange's round trip
            clocks = measure_all(servers)
            assert [c.server for c in clocks] == ["s1", "s2"]
            s2 = clocks[1]
            assert abs(s2.offset_us) <= s2.rtt_us / 2 + 1 and s2.rtt_us < 20_000, s2
            assert sync_bound_us(clocks) == abs(s2.offset_us) + s2.rtt_us / 2
            netns = {n: servers.add_netns(placed.server_of[n], n) for n in ("leaf1", "spine1")}
            link = VxlanLink(LAB, cut, servers, netns)
            link.up()
            assert link.mtu == 1500 - VXLAN_OVERHEAD
            ip_b = cut.opts["params2"]["ip"].split("/")[0]
            for node, srv, ifname, _ in link.ends:
                shell = servers[srv]
                show = shell.run(["ip", "-n", netns[node], "-d", "link", "show", ifname])
                assert f"vxlan id {link.vni} " in show and f"mtu {link.mtu} " in show
                # its socket lives in the server's namespace, the device in the router's
                assert re.search(r"link-netns nslab-t32dc-s[12]", show)
                assert f"rate {RATE}Mbit" in shell.run(["tc", "-n", netns[node], "class",
                                                        "show", "dev", ifname])
            ping = ["ip", "netns", "exec", netns["leaf1"], "ping", "-c", "2", "-i", "0.2",
                    "-W", "1", ip_b]
            assert subprocess.run(ping, capture_output=True).returncode == 0
            # each direction is shaped at its sending end, in its router's namespace
            for direction in ((), ("-R",)):
                rate = iperf3(servers, netns, ip_b, *direction)
                assert 0.9 * RATE <= rate <= 1.02 * RATE, (direction, rate)
            link.set_up(False)
            assert subprocess.run(ping, capture_output=True).returncode != 0
            link.set_up(True)
            assert subprocess.run(ping, capture_output=True).returncode == 0
        finally:
            servers.teardown()
        assert lab_namespaces() == [] and not os.path.exists(state_dir(LAB))
        # a crash: namespaces and a process left on both servers, then nslab clean
        servers = Servers(LAB, hosts, ssh_options)
        servers.check()
        for node, srv in (("leaf1", "s1"), ("spine1", "s2")):
            ns = servers.add_netns(srv, node)
            servers[srv].run(["sh", "-c", f"ip netns exec {ns} sleep 600 >/dev/null 2>&1 &"])
        servers.close()
        assert len(lab_namespaces()) == 2
        done = clean(LAB)
        assert "netns nslab-t32-spine1 on s2" in done, done
        assert lab_namespaces() == [] and not os.path.exists(state_dir(LAB))
