"""One-way delay statistics from a clock fit, on synthetic probes of known delay."""
from __future__ import annotations

import math

import numpy as np
import pytest

from agents.clock import ClockSpec, Oscillator, Segment
from agents.estimate import PairFit, fit_pair
from agents.owd import asymmetry_us, natural_key, owd_stats
from contracts.messages import OwdStats

NS = 1_000_000_000
T0 = 1_800_000_000 * NS


def _clock(name, base_ppm, offset_ns, wander_ppm=0.0, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.ones(3)) * wander_ppm
    osc = Oscillator(T0 - 100 * NS, base_ppm, tuple(
        (float(a), float(rng.uniform(20, 200)), float(rng.uniform(0, 2 * math.pi))) for a in w))
    return ClockSpec(name, [Segment(T0 - 10 * NS, offset_ns, "h-" + name, osc)])


def _send(src, dst, delays_ns, rng):
    send = T0 + np.sort(rng.uniform(0, 2 * NS, delays_ns.size)).astype(np.int64)
    arrive = send + np.rint(delays_ns).astype(np.int64)
    return (np.array([src.to_vm_ns(int(t)) for t in send], dtype=np.int64),
            np.array([dst.to_vm_ns(int(t)) for t in arrive], dtype=np.int64))


def _true_fit(a, b, true_ns):
    ya = a.frequency_ppm(true_ns) * 1e-6
    yb = b.frequency_ppm(true_ns) * 1e-6
    return PairFit(b.offset_at(true_ns) - a.offset_at(true_ns), (yb - ya) / (1 + ya) * 1e6,
                   a.to_vm_ns(true_ns), 0, 0, 0.0)


def test_constant_delay_is_exact_at_ns_timestamps():
    # 8 us every probe, clocks 19 ms apart and 90 ppm apart, readings ~1.8e18 ns: only the
    # integer rounding of readings is left (float64 on raw timestamps would cost ~256 ns).
    a = _clock("a", -45.0, 9_500_000.4)
    b = _clock("b", 45.0, -9_500_000.7)
    tx, rx = _send(a, b, np.full(300, 8000.0), np.random.default_rng(1))
    f = _true_fit(a, b, T0 + NS)
    st = owd_stats(tx, rx, f.offset_ns, f.drift_ppm, f.t_ref_ns)
    assert st.n == 300
    for k in ("min_us", "p50_us", "p99_us"):
        assert getattr(st, k) == pytest.approx(8.0, abs=0.003), k


def test_percentiles_match_the_true_delays():
    rng = np.random.default_rng(2)
    a = _clock("a", 12.0, 1_234_567.0, wander_ppm=0.2, seed=3)
    b = _clock("b", -31.0, -7_654_321.0, wander_ppm=0.2, seed=4)
    d = 7000 + rng.exponential(2000, 2000)
    hit = rng.random(d.size) < 0.2
    d[hit] += rng.uniform(0, 50_000, int(hit.sum()))
    tx, rx = _send(a, b, d, rng)
    f = _true_fit(a, b, T0 + NS)
    st = owd_stats(tx, rx, f.offset_ns, f.drift_ppm, f.t_ref_ns)
    # the line ignores the wander's curvature over 2 s (< 0.04 us here)
    assert st.min_us == pytest.approx(d.min() / 1e3, abs=0.05)
    assert st.p50_us == pytest.approx(np.percentile(d, 50) / 1e3, abs=0.05)
    assert st.p99_us == pytest.approx(np.percentile(d, 99) / 1e3, abs=0.05)


def test_asymmetry_of_a_congested_direction_with_estimated_fits():
    # A->B: 60% of probes queued by 20-60 us; B->A idle. Estimated with fit_pair, B->A stats
    # through the inverse fit. True p50 difference ~ +20 us.
    rng = np.random.default_rng(5)
    a = _clock("a", 20.0, 3_000_000.0, wander_ppm=0.2, seed=6)
    b = _clock("b", -25.0, -2_000_000.0, wander_ppm=0.2, seed=7)
    d_ab = 7000 + rng.exponential(1000, 400)
    hit = rng.random(400) < 0.6
    d_ab[hit] += rng.uniform(20_000, 60_000, int(hit.sum()))
    d_ba = 7000 + rng.exponential(1000, 400)
    ftx, frx = _send(a, b, d_ab, rng)
    rtx, rrx = _send(b, a, d_ba, rng)
    f = fit_pair(ftx, frx, rtx, rrx)
    ab = owd_stats(ftx, frx, f.offset_ns, f.drift_ppm, f.t_ref_ns)
    inv = f.inverse()
    ba = owd_stats(rtx, rrx, inv.offset_ns, inv.drift_ppm, inv.t_ref_ns)
    true_asym = (np.median(d_ab) - np.median(d_ba)) / 1e3
    assert true_asym > 15
    assert asymmetry_us({"a->b": ab, "b->a": ba}) == {
        "a|b": pytest.approx(true_asym, abs=0.1)}
    # Huygens equalises the minimum delays by construction: both see ~7 us
    assert ab.min_us == pytest.approx(ba.min_us, abs=0.01)
    assert ab.min_us == pytest.approx(min(d_ab.min(), d_ba.min()) / 1e3, abs=0.1)
    assert ab.p99_us > 60 > ba.p99_us


def test_asymmetry_key_is_in_natural_order_and_signed_from_its_first_vm():
    """vm2 -> vm10 is the slow direction (30 us against 10 us): the key is "vm2|vm10" (vm2
    before vm10, though "vm10" < "vm2" as strings) and the value owd(vm2->vm10) -
    owd(vm10->vm2) = +20 us, whichever order the directions come in."""
    slow, fast = OwdStats(p50_us=30.0, n=5), OwdStats(p50_us=10.0, n=5)
    for owd in ({"vm2->vm10": slow, "vm10->vm2": fast}, {"vm10->vm2": fast, "vm2->vm10": slow}):
        assert asymmetry_us(owd) == {"vm2|vm10": pytest.approx(20.0)}
    assert asymmetry_us({"vm10->vm2": slow, "vm2->vm10": fast}) == {
        "vm2|vm10": pytest.approx(-20.0)}
    # one direction only, or one without a median: no asymmetry
    assert asymmetry_us({"vm2->vm10": slow}) == {}
    assert asymmetry_us({"vm2->vm10": slow, "vm10->vm2": OwdStats()}) == {}
    names = ["vm10", "vm2", "vm1", "a", "vm02", "vm2b", "leaf1vm3", "leaf1vm12"]
    assert sorted(names, key=natural_key) == ["a", "leaf1vm3", "leaf1vm12", "vm1", "vm02",
                                              "vm2", "vm2b", "vm10"]
    assert list(asymmetry_us({f"{a}->{b}": slow for a in ("vm10", "vm9", "vm1")
                              for b in ("vm10", "vm9", "vm1") if a != b})) == [
        "vm1|vm9", "vm1|vm10", "vm9|vm10"]


def test_empty_and_invalid_input():
    empty = np.array([], dtype=np.int64)
    st = owd_stats(empty, empty, 0.0, 0.0, T0)
    assert st == OwdStats(min_us=None, p50_us=None, p99_us=None, n=0)
    one = np.array([T0], dtype=np.int64)
    with pytest.raises(ValueError, match="differ in length"):
        owd_stats(one, empty, 0.0, 0.0, T0)
    with pytest.raises(ValueError, match="integer ns"):
        owd_stats(one.astype(float), one, 0.0, 0.0, T0)
    with pytest.raises(ValueError, match="non-finite"):
        owd_stats(one, one, float("nan"), 0.0, T0)
