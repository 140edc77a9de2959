"""Which VMs a job gets: naive vs collocation-aware (from detected groups), scored by truth."""
import pytest

from lab.errors import LabError
from session.jobs import collocation_aware, naive, shared_host_ranks
from session.scoring import placement_comparison

PHYS = {"vm1": "p1", "vm2": "p1", "vm3": "p2", "vm4": "p2", "vm5": "p3", "vm6": "p3",
        "vm10": "p4"}


def test_naive_takes_the_first_vms_in_natural_order():
    assert naive(list(PHYS), 3) == ["vm1", "vm2", "vm3"]
    assert naive(["vm10", "vm2", "vm1"], 3) == ["vm1", "vm2", "vm10"]


def test_aware_spreads_over_groups_then_doubles_up():
    groups = [["vm2", "vm1"], ["vm3", "vm4"], ["vm5", "vm6"], ["vm10"]]
    picks = collocation_aware(groups, 4)
    assert picks == ["vm1", "vm3", "vm5", "vm10"]
    assert shared_host_ranks(picks, PHYS) == 0
    assert collocation_aware(groups, 6) == ["vm1", "vm3", "vm5", "vm10", "vm2", "vm4"]
    with pytest.raises(LabError, match="only 7 VMs"):
        collocation_aware(groups, 8)


def test_shared_host_ranks_counts_every_rank_on_a_shared_host():
    assert shared_host_ranks(["vm1", "vm2", "vm3"], PHYS) == 2
    assert shared_host_ranks(["vm1", "vm3", "vm5"], PHYS) == 0


def test_placement_comparison_needs_both_policies():
    naive_e = {"completion_s": 2.0, "placement": {"policy": "naive", "shared_host_ranks": 4}}
    aware_e = {"completion_s": 1.5, "placement": {"policy": "collocation_aware",
                                                  "shared_host_ranks": 0}}
    cmp_ = placement_comparison([naive_e, aware_e])
    assert cmp_["ratio"] == 0.75 and cmp_["aware_avoided_shared_hosts"] is True
    assert placement_comparison([naive_e]) is None
