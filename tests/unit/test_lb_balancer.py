"""The balancers inside the collective transport: routes read from traceroute hops,
Ethereal's per-step split and failure rule, REPS's clean signal, and real collectives over
loopback meshes steered by each balancer (the frames reassemble whatever connection they
took)."""
import threading
import time
from collections import Counter

import pytest
from test_collectives import run_case

from workloads.lb.balancer import Ethereal, Even, RepsLb, Routes, make, routes_from_hops

SPINES = {1: "10.0.1.1", 2: "10.0.2.1", 3: "10.0.3.1", 4: "10.0.3.1"}  # DSCP 4 = spine 3


def remote(dst, leaf_side):
    """Hops towards ``dst`` in another leaf per DSCP: own leaf, a spine, the far leaf."""
    return {d: ["10.1.0.1", SPINES[d], f"{leaf_side}.{d}", dst] for d in SPINES}


def test_routes_tell_the_own_leaf_the_far_leaves_and_distinct_paths():
    hops = {1: {d: ["10.1.0.1", "10.1.1.3"] for d in SPINES},
            2: remote("10.2.1.2", "10.2.9"), 3: remote("10.2.1.3", "10.2.9"),
            4: remote("10.3.1.2", "10.3.9")}
    r = routes_from_hops(hops, 4)
    assert r.leaf[1] is None and r.paths[1] == [0]
    assert r.leaf[2] == r.leaf[3] != r.leaf[4]
    assert r.paths[2] == [0, 1, 2]  # DSCP 4 takes spine 3 again: one path per spine


def two_leaves(world, paths):
    """Ranks 0..world/2-1 in one leaf, the rest in another, ``paths`` connections apart."""
    def routes(rank):
        mine = rank < world // 2
        r = Routes()
        for p in range(world):
            if p != rank:
                same = (p < world // 2) == mine
                r.leaf[p] = None if same else ("far" if mine else "near",)
                r.paths[p] = [0] if same else list(range(paths))
        return r
    return routes


def bytes_per_conn(segments):
    out = Counter()
    for segs in segments:
        for c, a, b in segs:
            out[c] += b - a
    return out


def test_ethereal_puts_equal_bytes_on_every_healthy_path_and_sends_local_peers_direct():
    eth = Ethereal(two_leaves(8, 4)(1), 4, rank=1)
    sends = [(p, 1_000_003) for p in range(8) if p != 1]  # an AllToAll step of rank 1
    segs = eth.split(sends, now_s=0.0)
    for (peer, n), s in zip(sends, segs, strict=True):
        assert sorted((a, b) for _, a, b in s)[0][0] == 0 and sum(b - a for _, a, b in s) == n
        if peer < 4:
            assert len(s) == 1 and s[0][0] == 0  # same leaf: whole, direct
    far = bytes_per_conn(s for (p, _), s in zip(sends, segs, strict=True) if p >= 4)
    assert max(far.values()) - min(far.values()) <= 4 and len(far) == 4, far
    # a retransmission timeout on path 2 towards the far leaf: it is left out until reset
    moved_to = eth.timeout(5, 2, now_s=10.0)
    assert moved_to in (0, 1, 3)
    far = bytes_per_conn(s for (p, _), s in zip(sends, eth.split(sends, 10.1), strict=True)
                         if p >= 4)
    assert set(far) == {0, 1, 3} and max(far.values()) - min(far.values()) <= 4, far
    assert set(bytes_per_conn(eth.split(sends, 10.0 + eth.failed.reset_s))) == {0, 1, 2, 3}
    assert eth.stats()["failed_marks"] == 1 and eth.stats()["moves"] == 1


def test_ethereal_re_probes_and_balances_over_the_spines_left():
    """A link down remapped by the fabric: entropy values 1 and 2 (connections 0 and 1) now
    reach one spine. A timeout wakes the re-probe; every peer of that leaf gets the paths
    found, and a probe that went unanswered changes nothing."""
    answers = iter([[0, 2, 3], None])
    probed = []
    woken = threading.Event()

    def reprobe(peer):
        probed.append(peer)
        woken.set()
        return next(answers, None)

    eth = Ethereal(two_leaves(8, 4)(1), 4, rank=1, reprobe=reprobe, reprobe_s=3600)
    eth.timeout(5, 1, now_s=0.0)
    deadline = time.monotonic() + 5
    while eth.path_changes == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    sends = [(p, 1_000_003) for p in range(4, 8)]
    far = bytes_per_conn(eth.split(sends, now_s=eth.failed.reset_s))  # the mark is over
    assert set(far) == {0, 2, 3} and max(far.values()) - min(far.values()) <= 4, far
    assert probed == [4] and eth.stats()["path_changes"] == 1
    now = eth.failed.reset_s
    assert sorted(eth.reroute(5, 1, now)) == [0, 2, 3]  # its unsent frames dealt over these
    assert eth.reroute(5, 0, now) is None and eth.reroute(2, 1, now) is None  # kept; own leaf
    woken.clear()
    eth.timeout(5, 2, now_s=0.0)
    assert woken.wait(5) and all(eth.routes.paths[p] == [0, 2, 3] for p in range(4, 8))


def test_ethereal_rotates_the_round_robin_by_rank():
    firsts = {Ethereal(two_leaves(8, 4)(r), 4, rank=r).split([(6, 10)], 0.0)[0][0][0]
              for r in range(4)}
    assert firsts == {0, 1, 2, 3}  # ranks of one leaf start on different spines


def test_reps_recycles_clean_acks_and_freezes_on_a_timeout():
    routes = Routes(leaf={1: ("far",)}, paths={1: [0, 1, 2, 3]})
    reps = RepsLb(routes, 4, seed=3)
    ring = reps.ring(1)
    for _ in range(ring.explore):
        reps.pick(1)
    reps.acked(1, 2, retransmitted=False, rtt_us=300, min_rtt_us=100)    # clean
    reps.acked(1, 3, retransmitted=True, rtt_us=300, min_rtt_us=100)     # a retransmission
    reps.acked(1, 1, retransmitted=False, rtt_us=5000, min_rtt_us=100)   # queued: marked
    assert list(ring.ring) == [2] and (reps.clean, reps.marked) == (1, 2)
    assert reps.pick(1) == 2
    assert reps.timeout(1, 2, 0.0) == -1 and ring.frozen


def test_make_rejects_an_unknown_balancer():
    assert isinstance(make("none", 0, ["127.0.0.1"], 2), Even)
    with pytest.raises(ValueError, match="unknown balancer"):
        make("flowlet", 0, ["127.0.0.1", "127.0.0.1"], 2)


@pytest.mark.parametrize("kind", ["ethereal", "reps"])
@pytest.mark.parametrize("collective", ["all_to_all", "all_reduce", "all_gather"])
def test_collectives_verify_when_a_balancer_steers_the_frames(kind, collective):
    routes = two_leaves(4, 3)
    bal = ((lambda r: Ethereal(routes(r), 3, r)) if kind == "ethereal"
           else (lambda r: RepsLb(routes(r), 3, seed=r)))
    for count in (1, 1001, 300_007):  # 300_007 floats: several 64 KiB frames per message
        run_case(4, collective, count, "float32", "sum", 0, conns=3, balancer=bal)
