"""Load-balancer logic with known truth: Ethereal's split rule and REPS's entropy buffer on
synthetic events."""
import random
from collections import Counter
from fractions import Fraction

import pytest

from workloads.lb.ethereal import FailedPaths, Piece, assign
from workloads.lb.reps import Reps


def path_load(pieces):
    """Flows' worth of bytes per path."""
    load = Counter()
    for p in pieces:
        load[p.path] += Fraction(1, p.parts)
    return load


@pytest.mark.parametrize("n", range(0, 13))
@pytest.mark.parametrize("s", [1, 2, 3, 4, 6])
def test_every_path_carries_n_over_s_flows_worth(n, s):
    pieces = assign(n, list(range(10, 10 + s)))
    load = path_load(pieces)
    assert all(load[p] == Fraction(n, s) for p in range(10, 10 + s)), load
    per_flow = Counter()
    for p in pieces:
        per_flow[p.flow] += Fraction(1, p.parts)
    assert per_flow == Counter({f: 1 for f in range(n)})  # every flow sent exactly once


def test_split_rule_of_the_paper():
    # n = 6, s = 4: flows 0-3 whole, r = 2 leftovers cut into 4 / gcd(2, 4) = 2 halves
    pieces = assign(6, [1, 2, 3, 4])
    assert pieces[:4] == [Piece(f, 0, 1, f + 1) for f in range(4)]
    assert pieces[4:] == [Piece(4, 0, 2, 1), Piece(4, 1, 2, 2), Piece(5, 0, 2, 3),
                          Piece(5, 1, 2, 4)]
    # n = 3, s = 4: gcd 1, every flow in 4 quarters
    assert {p.parts for p in assign(3, [1, 2, 3, 4])} == {4}


def test_pieces_cover_the_flow_bytes():
    cuts = [Piece(0, k, 3, 1).share(10) for k in range(3)]
    assert cuts == [(0, 4), (4, 3), (7, 3)]


def test_assign_rejects_bad_input():
    with pytest.raises(ValueError, match="no path"):
        assign(3, [])
    with pytest.raises(ValueError, match="negative"):
        assign(-1, [1])


def test_a_failed_path_is_avoided_until_its_reset_time():
    failed = FailedPaths(reset_s=2.0)
    failed.mark(2, "leaf2", now_s=10.0)
    assert failed.healthy([1, 2, 3], "leaf2", 11.0) == [1, 3]
    assert failed.healthy([1, 2, 3], "leaf3", 11.0) == [1, 2, 3]  # per destination leaf
    assert failed.healthy([1, 2, 3], "leaf2", 12.0) == [1, 2, 3]
    assert path_load(assign(4, failed.healthy([1, 2, 3], "leaf2", 11.0))) == \
        {1: 2, 3: 2}  # re-split over the healthy ones


def test_reps_explores_then_recycles_clean_entropies_once():
    reps = Reps([1, 2, 3, 4], explore=4, rng=random.Random(1))
    sent = [reps.next() for _ in range(4)]  # exploring: random
    for e in sent:
        reps.ack(e, clean=e != 3)  # path 3 is congested: marked
    clean = [e for e in sent if e != 3]
    assert [reps.next() for _ in clean] == clean  # oldest first, each used once
    assert not reps.ring
    reps.ack(2, clean=True)
    assert reps.next() == 2


def test_reps_ring_holds_at_most_eight():
    reps = Reps([1, 2], explore=0)
    for k in range(10):
        reps.ack(1 + k % 2, clean=True)
    assert len(reps.ring) == 8


def test_reps_freezes_on_timeout_and_explores_after_a_clean_ack():
    reps = Reps([1, 2, 3, 4], explore=3, rng=random.Random(2))
    for _ in range(3):
        reps.next()
    reps.ack(2, clean=True)
    reps.ack(4, clean=True)
    reps.timeout()
    assert [reps.next() for _ in range(5)] == [2, 4, 2, 4, 2]  # cycled, not consumed
    reps.ack(4, clean=True)  # a clean ACK ends the freeze
    assert not reps.frozen and reps.explore_left == 3
    with pytest.raises(ValueError):
        Reps([])


def test_trace_reads_the_answer_from_the_error_queue():
    from workloads.lb.paths import probe, trace
    # nothing listens on the probe port: the destination answers port unreachable
    assert trace("127.0.0.1", dscp=3) == ["127.0.0.1"]
    assert probe("127.0.0.1", ttl=1, sport=0) == ("127.0.0.1", True)


def test_distinct_paths_keep_one_entropy_per_spine():
    from workloads.lb.paths import distinct_paths
    hops = {1: ["a", "s1", "l2"], 2: ["a", "s2", "l2"], 3: ["a", "s1", "l2"], 4: ["a", None],
            5: ["a"]}
    assert distinct_paths(hops) == [1, 2]
