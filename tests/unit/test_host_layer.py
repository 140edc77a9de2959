"""The host layer as data (``topo.hosts``, ``topo.routing.host_routes``) and in scenarios:
each physical host a node between its VMs and its leaf, its NIC the host-leaf link."""
import textwrap

import pytest

from lab.errors import ScenarioError
from session.scenario import load
from topo import LeafSpine
from topo.hosts import HostNic, host_nics, rewire
from topo.routing import HOST_ROLE, lab_routes


def two_hosts_per_leaf(**hosts):
    """leaf1: vm1, vm2 on phys1 and vm3, vm4 on phys2; leaf2 the same with phys3, phys4."""
    return LeafSpine(spines=1, leaves=2, vms_per_leaf=4, vms_per_host=2, host_bw=50,
                     hosts=hosts)


def link_info(topo, a, b):
    (info,) = [i for x, y, i in topo.links(withInfo=True) if {x, y} == {a, b}]
    return info


def test_vms_link_to_their_host_and_the_host_to_its_leaf():
    t = two_hosts_per_leaf(nic_bw=100, nic_queue=30, overrides={"phys2": {"nic_bw": 40}})
    assert t.nodeInfo("phys1") == {"role": HOST_ROLE, "leaf": "leaf1", "isSwitch": True}
    assert not [1 for a, b in t.links() if {a, b} & {"vm1"} and {a, b} & {"leaf1"}]
    vnic = link_info(t, "vm1", "phys1")
    assert vnic["bw"] == 50 and vnic["params2"] == {"ip": "10.1.1.1/24"}  # the gateway
    assert link_info(t, "phys1", "leaf1")["bw"] == 100
    assert link_info(t, "phys1", "leaf1")["max_queue_size"] == 30
    assert link_info(t, "phys2", "leaf1")["bw"] == 40  # the override
    assert link_info(t, "phys2", "leaf1")["max_queue_size"] == 30
    assert "phys1" not in LeafSpine(spines=1, leaves=1, vms_per_leaf=2).nodes()


def test_vswitch_delay_is_the_hosts_end_of_each_vnic():
    t = two_hosts_per_leaf(vswitch_delay_us=20)
    assert link_info(t, "vm1", "phys1")["params2"] == {"ip": "10.1.1.1/24", "delay": "20us"}
    assert "bw" not in link_info(t, "phys1", "leaf1")  # no nic_bw: the NIC is unshaped


@pytest.mark.parametrize("options, message", [
    ({"overrides": {"phys9": {"nic_bw": 1}}}, "overrides for hosts without VMs"),
    ({"nic_speed": 1}, "unknown keys"),
    ({"nic_bw": 0}, "nic_bw must be > 0"),
    ({"nic_queue": 0}, "nic_queue must be >= 1"),
])
def test_bad_host_layer_options_are_errors(options, message):
    with pytest.raises(ValueError, match=message):
        host_nics({"vm1": "phys1"}, {"vm1": "leaf1"}, options)


def test_a_host_name_must_fit_an_interface_name():
    with pytest.raises(ValueError, match="at most 8 characters"):
        host_nics({"vm1": "rack1-host1"}, {"vm1": "leaf1"}, {})
    assert host_nics({"vm1": "phys1"}, {"vm1": "leaf1"}, {"nic_bw": 5}) == {
        "phys1": HostNic(nic_bw=5)}


def test_leaves_route_each_vm_subnet_to_its_host_now():
    t = two_hosts_per_leaf(nic_bw=100)
    phys = {vm: t.nodeInfo(vm)["phys"] for vm in t.hosts()}
    routes = lab_routes(t, phys)
    nic1 = link_info(t, "phys1", "leaf1")["params1"]["ip"].split("/")[0]
    nic2 = link_info(t, "phys2", "leaf1")["params1"]["ip"].split("/")[0]
    leaf1 = dict(routes["leaf1"])
    assert leaf1["10.1.1.0/24"] == [nic1] and leaf1["10.1.3.0/24"] == [nic2]
    assert leaf1["10.2.0.0/16"]  # the fabric's routes stay
    leaf_side = link_info(t, "phys1", "leaf1")["params2"]["ip"].split("/")[0]
    assert routes["phys1"] == [("10.0.0.0/8", [leaf_side])]
    moved = dict(lab_routes(t, {**phys, "vm1": "phys2"})["leaf1"])
    assert moved["10.1.1.0/24"] == [nic2]  # a migration moves the route
    down = lab_routes(t, phys, {frozenset(("phys1", "leaf1"))})
    assert "10.1.1.0/24" not in dict(down["leaf1"]) and "phys1" not in down


def test_rewire_moves_a_vms_link_to_its_new_host():
    t = two_hosts_per_leaf()
    rewire(t, "vm1", "phys1", "phys2")
    assert t.nodeInfo("vm1")["phys"] == "phys2"
    assert link_info(t, "vm1", "phys2")["params2"] == {"ip": "10.1.1.1/24"}
    assert not [1 for a, b in t.links() if {a, b} == {"vm1", "phys1"}]
    with pytest.raises(ValueError, match="no link between vm1 and phys1"):
        rewire(t, "vm1", "phys1", "phys2")


SCENARIO = """
name: t
topology: {spines: 1, leaves: 2, vms_per_leaf: 2, host_bw: 50}
placement: {vms_per_host: 2}
"""


def test_scenario_hosts_section_builds_the_host_layer(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO + textwrap.dedent("""
        hosts: {cpu_cores: 0.5, nic_bw: 100, nic_queue: 40,
                overrides: {phys2: {nic_bw: 30, cpu_cores: 0.25}}}
        """))
    sc, topo = load(str(path))
    assert link_info(topo, "phys2", "leaf2")["bw"] == 30
    from session.session import make_lab
    assert make_lab(sc, topo).host_cpu == {"phys2": {"cpu_cores": 0.25}}
    path.write_text(SCENARIO + "hosts: {cpu_cores: 0.5}\n")
    assert "phys1" not in load(str(path))[1].nodes()  # no NIC field: no host layer
    path.write_text(SCENARIO + "hosts: {vswitch: true}\n")
    assert "bw" not in link_info(load(str(path))[1], "phys1", "leaf1")


def test_custom_topologies_have_no_host_layer(tmp_path):
    from pathlib import Path
    topos = Path(__file__).parent / "data" / "scenario_errors" / "custom_topos.py"
    path = tmp_path / "s.yaml"
    path.write_text(f"name: t\ntopology: {{kind: custom, file: {topos}, name: star, "
                    "args: {n: 2}}\nhosts: {nic_bw: 10}\n")
    with pytest.raises(ScenarioError) as exc:
        load(str(path))
    assert "needs topology kind leafspine" in {e.path: e.message
                                               for e in exc.value.errors}["hosts"]
