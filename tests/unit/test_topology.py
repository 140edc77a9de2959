"""Leaf-spine topology math, placement and ECMP routes (pure data, no root)."""
import pytest

from topo import LeafSpine, place
from topo.routing import ecmp_routes, routers


def roles(topo):
    out = {}
    for n in topo.nodes():
        out.setdefault(topo.nodeInfo(n).get("role"), []).append(n)
    return out


def test_two_tier_counts_and_addressing():
    t = LeafSpine(spines=4, leaves=8, vms_per_leaf=4)
    r = roles(t)
    assert (len(r["spine"]), len(r["leaf"]), len(r["vm"])) == (4, 8, 32)
    assert len(t.links()) == 8 * 4 + 8 * 4
    info = t.nodeInfo("vm6")  # leaf2, 2nd VM
    assert (info["ip"], info["defaultRoute"], info["leaf"]) == ("10.2.2.2/24", "via 10.2.2.1",
                                                                "leaf2")
    assert t.nodeInfo("leaf3")["subnets"] == ["10.3.0.0/16"]


def test_rates_and_queues_land_on_the_right_links():
    t = LeafSpine(spines=2, leaves=1, vms_per_leaf=2, host_bw=100, fabric_bw=50,
                  host_queue=20, fabric_queue=30, link_opts={"loss": 1})
    for a, b, info in t.links(withInfo=True):
        fabric = "spine" in a + b
        assert info["bw"] == (50 if fabric else 100)
        assert info["max_queue_size"] == (30 if fabric else 20)
        assert info["loss"] == 1


def test_pods_add_a_superspine_tier():
    t = LeafSpine(spines=2, leaves=2, vms_per_leaf=1, pods=3, superspines=2)
    r = roles(t)
    assert (len(r["spine"]), len(r["leaf"]), len(r["superspine"])) == (6, 6, 2)
    assert len(routers(t)) == 14


def test_ecmp_routes_use_every_spine():
    t = LeafSpine(spines=3, leaves=2, vms_per_leaf=1)
    routes = dict(ecmp_routes(t)["leaf1"])
    assert list(routes) == ["10.2.0.0/16"]
    assert len(routes["10.2.0.0/16"]) == 3
    assert all(len(h) == 1 for _, h in ecmp_routes(t)["spine1"])


def test_ecmp_across_pods_goes_up_and_down():
    t = LeafSpine(spines=2, leaves=1, vms_per_leaf=1, pods=2, superspines=2)
    leaf1 = dict(ecmp_routes(t)["leaf1"])
    spine1 = dict(ecmp_routes(t)["spine1"])
    assert len(leaf1["10.2.0.0/16"]) == 2  # both spines of pod 1
    assert len(spine1["10.2.0.0/16"]) == 2  # both super-spines


def test_down_link_is_routed_around():
    t = LeafSpine(spines=2, leaves=2, vms_per_leaf=1)
    routes = ecmp_routes(t, down={frozenset(("leaf1", "spine1"))})
    assert len(dict(routes["leaf1"])["10.2.0.0/16"]) == 1
    assert len(dict(routes["leaf2"])["10.1.0.0/16"]) == 1  # remote leaf avoids spine1 too
    assert "10.1.0.0/16" not in dict(routes["spine1"])


LEAF = {f"vm{i}": ("leaf1" if i <= 4 else "leaf2") for i in range(1, 9)}
VMS = list(LEAF)


def test_packed_spread_random_keep_hosts_behind_one_leaf():
    packed = place(VMS, LEAF, 2, "packed")
    assert packed["vm1"] == packed["vm2"] != packed["vm3"]
    spread = place(VMS, LEAF, 2, "spread")
    assert spread["vm1"] == spread["vm3"] != spread["vm2"]
    for strategy in ("packed", "spread", "random"):
        p = place(VMS, LEAF, 2, strategy, seed=3)
        for host in set(p.values()):
            members = [vm for vm in VMS if p[vm] == host]
            assert len(members) <= 2
            assert len({LEAF[vm] for vm in members}) == 1
    assert place(VMS, LEAF, 2, "random", seed=3) == place(VMS, LEAF, 2, "random", seed=3)
    assert place(VMS, LEAF, 2, "random", seed=3) != place(VMS, LEAF, 2, "random", seed=4)


@pytest.mark.parametrize("mapping, message", [
    ({vm: "h1" for vm in VMS[:4]}, "without a host"),
    ({**{vm: "h1" for vm in VMS[:4]}, **{vm: "h2" for vm in VMS[4:]}}, "capacity"),
    ({**{vm: f"h{i}" for i, vm in enumerate(VMS)}, "vm1": "h5"}, "one leaf"),
])
def test_explicit_placement_errors(mapping, message):
    with pytest.raises(ValueError, match=message):
        place(VMS, LEAF, 2, "explicit", explicit=mapping)


def test_bad_counts_raise():
    with pytest.raises(ValueError):
        LeafSpine(spines=0)
