"""Splitting a topology across servers: placement, cut links, NIC budgets (pure data)."""
import pytest

from topo import LeafSpine
from topo.split import Server, SplitError, split

A, B = Server("a", "192.0.2.1"), Server("b", "192.0.2.2", ssh="root@192.0.2.2")


def test_one_server_cuts_nothing():
    s = split(LeafSpine(spines=2, leaves=2, vms_per_leaf=2), [A])
    assert s.cut == () and set(s.server_of.values()) == {"a"}


def test_each_tier_is_dealt_evenly_and_vms_follow_their_leaf():
    t = LeafSpine(spines=2, leaves=2, vms_per_leaf=2, fabric_bw=100)
    s = split(t, [A, B])
    assert [s.server_of[n] for n in ("leaf1", "leaf2", "spine1", "spine2")] == list("abab")
    assert s.nodes_on("a") == ["leaf1", "spine1", "vm1", "vm2"]
    assert [s.server_of[v] for v in ("vm1", "vm2", "vm3", "vm4")] == list("aabb")
    # leaf1-spine2 and leaf2-spine1 cross; nothing else
    assert {(c.node_a, c.node_b) for c in s.cut} == {("leaf1", "spine2"), ("leaf2", "spine1")}
    assert [c.index for c in s.cut] == [0, 1]
    assert s.cut[0].bw == 100 and "ip" in s.cut[0].opts["params1"]
    assert s.nic_load("a") == s.nic_load("b") == 200


def test_explicit_placement_overrides_and_moves_the_vms():
    s = split(LeafSpine(spines=2, leaves=2, vms_per_leaf=1, fabric_bw=10), [A, B],
              {"leaf1": "b", "spine1": "b"})
    assert s.server_of["vm1"] == "b" and s.server_of["leaf1"] == "b"


def test_a_cut_vm_link_unknown_names_and_unshaped_links_are_errors():
    t = LeafSpine(spines=2, leaves=2, vms_per_leaf=1, fabric_bw=10)
    with pytest.raises(SplitError) as e:
        split(t, [A, B], {"vm1": "b"})
    assert e.value.problems == ["link vm1-leaf1 would cross servers b and a: a VM or host stays "
                                "on its router's server; move vm1 with it"]
    with pytest.raises(SplitError) as e:
        split(t, [A, B], {"vm9": "b", "leaf1": "c"})
    assert len(e.value.problems) == 2 and "no such server 'c'" in str(e.value)
    with pytest.raises(SplitError, match="leaf1-spine2 crosses servers a and b unshaped"):
        split(LeafSpine(spines=2, leaves=2, vms_per_leaf=1), [A, B])
    with pytest.raises(SplitError, match="names unique"):
        split(t, [A, A])


def test_nic_budget_is_checked_per_server_before_anything_is_built():
    t = LeafSpine(spines=2, leaves=2, vms_per_leaf=1, fabric_bw=600)
    small = Server("b", "192.0.2.2", ssh="root@192.0.2.2", nic_mbit=1000)
    with pytest.raises(SplitError) as e:
        split(t, [A, small])
    (msg,) = e.value.problems
    assert msg.startswith("server b: its cut links need 1200 Mbit/s, its NIC has 1000")
    assert "leaf1-spine2 (600)" in msg and "leaf2-spine1 (600)" in msg
    ok = split(t, [A, Server("b", "192.0.2.2", nic_mbit=1200)])
    assert ok.nic_load("b") == 1200


def test_super_spines_are_dealt_as_their_own_tier():
    t = LeafSpine(spines=2, leaves=2, vms_per_leaf=1, pods=2, superspines=2,
                  fabric_bw=10, super_bw=10)
    s = split(t, [A, B, Server("c", "192.0.2.3")])
    assert [s.server_of[f"super{i}"] for i in (1, 2)] == ["a", "b"]
    assert sorted(s.server_of[f"leaf{i}"] for i in range(1, 5)) == list("aabc")
    assert all(s.server_of[f"vm{i}"] == s.server_of[f"leaf{i}"] for i in range(1, 5))


SCENARIO = """name: split
topology: {spines: 2, leaves: 2, vms_per_leaf: 1, fabric_bw: 600}
servers:
  - {address: 10.0.0.1, name: a}
  - {address: 10.0.0.2, name: b, nic_mbit: 1000}
server_placement: {spine9: a, spine1: c}
"""


def test_physical_hosts_stay_with_their_leaf_and_their_vms_with_them():
    t = LeafSpine(spines=2, leaves=2, vms_per_leaf=2, vms_per_host=2, fabric_bw=100,
                  hosts={"nic_bw": 100})
    s = split(t, [A, B])
    hosts = [n for n in t.switches() if t.nodeInfo(n).get("role") == "host"]
    assert len(hosts) == 2
    for h in hosts:
        (leaf,) = [n for n in t.g[h] if t.nodeInfo(n).get("role") == "leaf"]
        vms = [n for n in t.g[h] if not t.isSwitch(n)]
        assert {s.server_of[n] for n in (h, *vms)} == {s.server_of[leaf]}
    assert {(c.node_a, c.node_b) for c in s.cut} == {("leaf1", "spine2"), ("leaf2", "spine1")}
    with pytest.raises(SplitError, match=f"link {hosts[0]}-leaf1 would cross"):
        split(t, [A, B], {hosts[0]: "b"})


def test_a_scenario_checks_its_servers_when_it_loads(tmp_path):
    from lab.errors import ScenarioError
    from session.scenario import load
    from session.session import make_lab

    path = tmp_path / "split.yaml"
    path.write_text(SCENARIO)
    with pytest.raises(ScenarioError) as e:
        load(str(path))
    assert [(x.path, x.message) for x in e.value.errors] == [
        ("servers[1].ssh", "a server after the first is reached over SSH"),
        ("server_placement", "spine9: no such node"),
        ("server_placement", "spine1: no such server 'c' (servers: a, b)")]
    path.write_text(SCENARIO.replace("name: b,", "name: b, ssh: root@10.0.0.2,")
                    .replace("spine9: a, spine1: c", "spine1: a"))
    with pytest.raises(ScenarioError, match="server b: its cut links need 1200 Mbit/s"):
        load(str(path))
    path.write_text(path.read_text().replace("fabric_bw: 600", "fabric_bw: 400"))
    sc, topo = load(str(path))
    assert [s.server().name for s in sc.servers] == ["a", "b"]
    lab = make_lab(sc, topo)  # nothing is built before start
    assert lab.split.server_of["leaf2"] == "b" and len(lab.split.cut) == 2
