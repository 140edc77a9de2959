"""Pairs behind a queue that stands for whole windows (agents.anchor) on synthetic probes
with known clocks: the coordinator's offsets against the truth, and the NTP-style baseline on
the same probes beside them."""
import math

import numpy as np
import pytest
from synthetic import T0_NS, S, simulate
from test_coordinator import _three_hosts, errors

from agents.coordinator import Coordinator

LEAF1, LEAF2 = ("vm1", "vm2", "vm3"), ("vm4", "vm5", "vm6")


def varying(t_s: float) -> float:
    """A queue that stands and never drains: 0.5 to 3.5 ms over 23 s, ns."""
    return 2e6 + 1.5e6 * math.sin(2 * math.pi * t_s / 23.0)


@pytest.mark.parametrize("where", ["reference_inbound", "leaf_cut"])
def test_a_slowly_varying_standing_queue_does_not_bias_the_offsets(where):
    # every probe into the reference vm1 (or from one leaf to the other) waits in a queue of
    # 0.5-3.5 ms for 60 s: every pair through it is biased alike, which the network solve
    # cannot see; the free direction, against the floor learnt in the first 6 s, can
    specs = _three_hosts()
    if where == "reference_inbound":
        queue = {(v, "vm1"): varying for v in specs if v != "vm1"}
    else:
        queue = {(a, b): varying for a in LEAF2 for b in LEAF1}
    coord = Coordinator(window_s=2.0)
    simulate(coord, specs, 6)
    simulate(coord, specs, 60, hello=False, start_s=6, seed=2, standing_ns=queue)
    st = coord.state()
    assert len(st.history) >= 30
    errs = np.array(errors(st, specs)[1:])  # max over VMs per window: huygens, drift, NTP
    assert errs[:, 0].max() < 1_000, errs[:, 0]                     # ns
    assert np.percentile(errs[:, 0], 99) * 10 < np.percentile(errs[:, 2], 99)
    assert st.counters["pairs_anchored"] >= 100 and not st.counters.get("vms_queued")


def test_a_floor_learnt_once_the_queue_drains():
    # the queue into vm1 stands from the agents' start: the floor is the queue's, nothing
    # can be seen. Once it drains for a window the floor is learnt, what was trusted before
    # is forgotten, and the offsets stay right while it stands again
    specs = _three_hosts()
    queue = {(v, "vm1"): varying for v in specs if v != "vm1"}
    coord = Coordinator(window_s=2.0)
    simulate(coord, specs, 20, standing_ns=queue)
    simulate(coord, specs, 3, hello=False, start_s=20, seed=2)
    simulate(coord, specs, 40, hello=False, start_s=23, seed=3, standing_ns=queue)
    st = coord.state()
    errs = errors(st, specs)
    t_s = [(h.t_ns - T0_NS) / S for h in st.history]  # the reference clock is 3 ms ahead
    before = [e[0] for e, t in zip(errs, t_s, strict=True) if t < 20]
    after = [e[0] for e, t in zip(errs, t_s, strict=True) if t > 24]
    assert min(before) > 100_000, before   # biased by the queue: the truth is not in the probes
    assert len(after) >= 18 and max(after) < 1_000, after


@pytest.mark.parametrize("change", ["step", "frequency"])
def test_a_clock_changed_behind_the_queue_is_recovered_through_the_network(change):
    # the queues into vm1 and from leaf 2 to leaf 1 stand for 60 s; at 31 s vm4's clock
    # steps 3 ms (ptp4l's first step), or vm2's frequency moves 300 ppm (a daemon's slew):
    # their queued pairs' predictions no longer hold, but their pairs free of the queue
    # (vm4-vm6, vm2-vm3) carry them through the solve, whose clocks the pairs trust next
    specs = _three_hosts()
    if change == "step":
        specs["vm4"].append(T0_NS + 31 * S, step_ns=3e6)
    else:
        specs["vm2"].append(T0_NS + 31 * S, corr_ppm=300.0)
    queue = {(a, b): varying for a in LEAF2 for b in LEAF1}
    queue |= {(v, "vm1"): varying for v in specs if v != "vm1"}
    coord = Coordinator(window_s=2.0)
    simulate(coord, specs, 6)
    simulate(coord, specs, 60, hello=False, start_s=6, seed=2, standing_ns=queue)
    st = coord.state()
    errs = [e[0] for e in errors(st, specs)[1:]]
    assert max(errs) < 2_000, errs
    assert sum(len(h.vms) < 6 for h in st.history) <= 1, [sorted(h.vms) for h in st.history]
