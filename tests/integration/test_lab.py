"""Bring-up, reachability, isolation and teardown of real labs."""
import subprocess

from mininet.topo import SingleSwitchTopo

from topo import LeafSpine


def test_all_pairs_reach_each_other(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=2, leaves=2, vms_per_leaf=2), name="it_reach")
    assert lab.pingAll() == 0.0
    routes = lab["leaf1"].cmd("ip route show 10.2.0.0/16")
    assert routes.count("nexthop via") == 2  # ECMP over both spines


def test_namespaces_are_named_with_the_lab_prefix(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=1, leaves=1, vms_per_leaf=2), name="it_names")
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for node in ("vm1", "vm2", "leaf1", "spine1"):
        assert f"nslab-it_names-{node}" in names
    out = subprocess.run(["ip", "netns", "exec", "nslab-it_names-vm1", "ip", "-o", "-4", "addr"],
                         capture_output=True, text=True).stdout
    assert "10.1.1.2/24" in out
    # no route out of the lab: only lab prefixes and the default via the leaf
    assert "default via 10.1.1.1" in lab["vm1"].cmd("ip route")


def test_two_labs_side_by_side_do_not_interfere(nslab_lab):
    a = nslab_lab(LeafSpine(spines=1, leaves=2, vms_per_leaf=1), name="it_a")
    b = nslab_lab(LeafSpine(spines=1, leaves=2, vms_per_leaf=1), name="it_b")
    assert a.pingAll() == 0.0 and b.pingAll() == 0.0
    a.faults.link_down("leaf1", "spine1")
    assert "100% packet loss" in a["vm1"].cmd("ping -c1 -W1 10.2.1.2")
    assert " 0% packet loss" in b["vm1"].cmd("ping -c1 -W1 10.2.1.2")


def test_a_reader_after_teardown_does_not_recreate_namespaces():
    """A netlink read that comes late (a TUI poll on a new thread while the lab is torn
    down) fails; pyroute2's pushns would re-create the namespace (seen: a TUI test left its
    four routers' namespaces behind)."""
    import threading

    import pytest

    from lab.lab import Lab, lab_netns
    lab = Lab(LeafSpine(spines=1, leaves=1, vms_per_leaf=1), name="it_late")
    try:
        lab.start()
        leaf = lab["leaf1"]
    finally:
        lab.stop()
    got = []
    t = threading.Thread(target=lambda: got.append(_try(lambda: leaf.ipr)))
    t.start()
    t.join()
    assert isinstance(got[0], FileNotFoundError), got
    assert lab_netns("it_late") == []
    with pytest.raises(FileNotFoundError):
        leaf.sysctl("net.ipv4.ip_forward=1")


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e


def test_plain_mininet_topology_runs_on_bridges(nslab_lab):
    lab = nslab_lab(SingleSwitchTopo(k=3), name="it_plain")
    assert lab.pingAll() == 0.0
    assert "br0" in lab["s1"].cmd("ip -o link show type bridge")


def test_three_tier_fabric_with_pods(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=2, leaves=2, vms_per_leaf=1, pods=2, superspines=2),
                    name="it_pods")
    assert lab.pingAll() == 0.0
    # vm1 (pod 1) -> vm4 (pod 2): leaf, spine, super-spine, spine, leaf = 5 router hops
    assert "ttl=59" in lab["vm1"].cmd("ping -c1 -W1 10.4.1.2")


def test_cgroup_v2_without_cpu_controller_gives_a_clear_error():
    """This machine's cgroup2 hierarchy has no cpu controller: v2 must say so."""
    import pytest

    from lab.cgroups import Cgroups
    from lab.errors import CapabilityError
    cg = Cgroups("it_v2", mode="v2")
    try:
        with pytest.raises(CapabilityError, match="'cpu' is not enabled"):
            cg.create_host("phys1", cpu_cores=1.0)
    finally:
        cg.destroy()
    assert cg.exists() == []


def test_reserve_weighs_the_lab_above_other_processes():
    """``Cgroups.reserve``: the lab's top cgroup weighs 100 default processes (v1
    ``cpu.shares`` 102400), its hosts keep their quota; destroy removes it all."""
    from lab.cgroups import Cgroups
    cg = Cgroups("it_reserve")
    try:
        cg.create_host("phys1", cpu_cores=0.25)
        cg.reserve()
        top = cg._ctl("cpu")
        with open(f"{top}/cpu.shares" if cg.mode == "v1" else f"{top}/cpu.weight") as f:
            assert int(f.read()) == (102_400 if cg.mode == "v1" else 10_000)
        with open(f"{top}/phys1/cpu.cfs_quota_us" if cg.mode == "v1"
                  else f"{top}/phys1/cpu.max") as f:
            assert f.read().split()[0] == "2500"
    finally:
        cg.destroy()
    assert cg.exists() == []
