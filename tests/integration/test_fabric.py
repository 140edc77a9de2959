"""Fabric modes with real TCP: packet spraying spreads one flow over every spine (binomial
tolerance), DSCP entropy pins a flow to one spine, a host discovers those paths by TTL probes,
and both modes survive a link failure."""
import json
import math
import sys

from traffic import iperf3

from lab.observe import link_states
from topo import LeafSpine

SPINES = 4


def topo():
    # queue limits turn GSO off, so the unit a router sprays is one MTU-sized packet
    return LeafSpine(spines=SPINES, leaves=2, vms_per_leaf=1, host_bw=200, fabric_bw=200,
                     host_queue=200, fabric_queue=200)


def uplink_bytes(lab):
    """leaf1 -> spine bytes, by spine, from the lab's counters."""
    return {s.b: s.tx_bytes[0] for s in link_states(lab) if s.a == "leaf1"}


def flow_bytes(lab, *args):
    before = uplink_bytes(lab)
    iperf3(lab["vm1"], lab["vm2"], "-n", "3M", *args)
    after = uplink_bytes(lab)
    return {k: after[k] - before[k] for k in after}


def assert_binomial(delta, spines):
    """Every spine in ``spines`` got a share 1/len(spines) of the packets within 4.5 sigma
    (packets counted as bytes / 1514, the wire size of a full segment); the others none."""
    total = sum(delta.values())
    n, p = total / 1514, 1 / len(spines)
    sigma = math.sqrt(p * (1 - p) / n)
    for spine, got in delta.items():
        if spine in spines:
            assert abs(got / total - p) < 4.5 * sigma, (delta, sigma)
        else:
            assert got < 0.001 * total, delta


def test_spray_spreads_one_flow_over_every_spine_and_around_a_down_link(nslab_lab):
    lab = nslab_lab(topo(), name="lb_spray", fabric="spray")
    assert_binomial(flow_bytes(lab), {f"spine{k}" for k in range(1, SPINES + 1)})
    lab.faults.link_down("leaf1", "spine2")
    assert_binomial(flow_bytes(lab), {"spine1", "spine3", "spine4"})


def test_entropy_pins_a_flow_to_the_spine_its_dscp_names(nslab_lab):
    lab = nslab_lab(topo(), name="lb_entropy", fabric="entropy")
    chosen = {}
    for k in range(1, SPINES + 1):
        delta = flow_bytes(lab, "-S", str(k << 2))  # IP_TOS = DSCP << 2
        spine, most = max(delta.items(), key=lambda kv: kv[1])
        assert most > 0.999 * sum(delta.values()), (k, delta)
        chosen[k] = spine
    assert len(set(chosen.values())) == SPINES, chosen  # every DSCP its own spine
    # the host finds the same paths by itself: the spine's address answers at TTL 2
    out = lab["vm1"].cmd(f"{sys.executable} -m workloads.lb.paths 10.2.1.2 --dscp 1 2 3 4 "
                         "--timeout 0.5")
    hops = {int(k): v for k, v in json.loads(out).items()}
    for k, spine in chosen.items():
        toward_leaf1 = [i for i in lab[spine].intfList() if i.link and "leaf1" in
                        (i.link.intf1.node.name, i.link.intf2.node.name)][0]
        assert hops[k][1] == toward_leaf1.IP() and hops[k][-1] == "10.2.1.2", (k, hops)
    lab.faults.link_down("leaf1", chosen[1])  # slot 1 is dead: DSCP 1 is pinned to slot 2
    delta = flow_bytes(lab, "-S", "4")
    assert delta[chosen[2]] > 0.999 * sum(delta.values()), delta
