"""Fabric modes without root: path slots across failures, the nftables and ip lines each mode
installs, and the clear error for a mode this kernel cannot provide."""
import pytest

from lab.capabilities import Capability
from lab.errors import CapabilityError
from lab.fabric import mark_commands, require_fabric, rule_commands, table_commands
from topo import LeafSpine
from topo.routing import ecmp_routes, path_slots

DOWN = {frozenset(("leaf1", "spine2"))}


def slots(down=frozenset()):
    t = LeafSpine(spines=3, leaves=2, vms_per_leaf=1)
    return path_slots(ecmp_routes(t)["leaf1"], ecmp_routes(t, set(down))["leaf1"])


def test_slots_keep_their_numbers_when_a_link_fails():
    (prefix, healthy), = slots()
    assert prefix == "10.2.0.0/16" and [k for k, _ in healthy] == [1, 2, 3]
    (_, alive), = slots(DOWN)
    assert alive == [healthy[0], healthy[2]]  # slot 3 is still the same next hop


def test_single_hop_routes_have_no_slots():
    t = LeafSpine(spines=3, leaves=2, vms_per_leaf=1)
    assert path_slots(ecmp_routes(t)["spine1"], ecmp_routes(t)["spine1"]) == []


def test_spray_marks_a_random_alive_slot_and_entropy_the_dscp_slot():
    rule = mark_commands("spray", slots(DOWN), 3)[-1]
    assert rule.endswith("ip daddr 10.2.0.0/16 meta mark set numgen random mod 2 "
                         "map { 0 : 1, 1 : 3 }")
    rule = mark_commands("entropy", slots(DOWN), 3)[-1]
    # the dead slot 2's DSCP is pinned to an alive slot, never hashed
    assert rule.endswith("ip daddr 10.2.0.0/16 meta mark set ip dscp map "
                         "{ 1 : 1, 2 : 3, 3 : 3 }")


def test_one_path_left_is_not_sprayed():
    (prefix, alive), = slots()
    lines = mark_commands("spray", [(prefix, alive[:1])], 3)
    assert not [x for x in lines if "numgen" in x]


def test_tables_hold_each_slot_through_its_hop_only():
    (prefix, alive), = slots(DOWN)
    lines = table_commands([(prefix, alive)], 3)
    assert lines[:3] == ["route flush table 101", "route flush table 102",
                         "route flush table 103"]
    assert lines[3:] == [f"route replace {prefix} via {alive[0][1]} table 101",
                         f"route replace {prefix} via {alive[1][1]} table 103"]
    assert rule_commands(2) == ["rule add pref 1001 fwmark 1 lookup 101",
                                "rule add pref 1002 fwmark 2 lookup 102"]


def caps(ok: bool):
    return {name: Capability(name, ok, "seen" if ok else "nft: Error: Could not process rule",
                             "fabric modes") for name in ("policy_routing", "nft_mark")}


def test_a_mode_the_kernel_cannot_provide_is_a_clear_error():
    require_fabric("ecmp", caps(False))
    require_fabric("spray", caps(True))
    with pytest.raises(CapabilityError, match=r"fabric mode spray needs policy_routing "
                                              r"\(nft: Error.*; nft_mark"):
        require_fabric("spray", caps(False))
    with pytest.raises(ValueError, match="unknown fabric mode 'hash'; modes: ecmp, spray, "
                                         "entropy"):
        require_fabric("hash", caps(True))


def test_lab_refuses_an_unknown_mode_at_once():
    from lab import Lab
    with pytest.raises(ValueError, match="unknown fabric mode 'hash'"):
        Lab(LeafSpine(spines=2, leaves=2, vms_per_leaf=1), name="lb_bad", fabric="hash")
