"""Network-wide correction: loop surplus spread over edges, truth recovered from noisy edges."""
from __future__ import annotations

import math

import numpy as np
import pytest

from agents.clock import ClockSpec, Oscillator, Segment
from agents.estimate import fit_pair
from agents.network import NodeEstimate, solve

NS = 1_000_000_000
T0 = 1_800_000_000 * NS


def test_triangle_surplus_is_spread_equally():
    # a->b 100, b->c 200, a->c 330: the loop a->b->c->a sums to -30 ns / -0.3 ppm.
    edges = [("a", "b", 100.0, 1.0, 1.0), ("b", "c", 200.0, 2.0, 1.0),
             ("a", "c", 330.0, 3.3, 1.0)]
    est = solve(["a", "b", "c"], edges, "a")
    assert est["a"] == NodeEstimate(0.0, 0.0, 0.0, 0.0)
    assert est["b"].offset_ns == pytest.approx(110.0)
    assert est["c"].offset_ns == pytest.approx(320.0)
    assert est["b"].drift_ppm == pytest.approx(1.1)
    assert est["c"].drift_ppm == pytest.approx(3.2)
    # residuals +-10 on 1 dof: s2 = 300; inv(L_red) = [[2, 1], [1, 2]] / 3 -> var 200
    assert est["b"].offset_sigma_ns == pytest.approx(math.sqrt(200.0))
    assert est["c"].drift_sigma_ppm == pytest.approx(math.sqrt(0.02))
    # the corrected loop is consistent
    assert est["c"].offset_ns - est["b"].offset_ns == pytest.approx(210.0)


def test_weights_decide_where_the_surplus_goes():
    edges = [("a", "b", 100.0, 0.0, 1.0), ("b", "c", 200.0, 0.0, 1.0),
             ("a", "c", 330.0, 0.0, 1000.0)]
    est = solve(["a", "b", "c"], edges, "a")
    assert est["c"].offset_ns == pytest.approx(330.0, abs=0.05)   # trusted edge kept
    assert est["b"].offset_ns == pytest.approx(115.0, abs=0.05)   # the others share 30


def test_reversed_and_parallel_edges():
    one = solve(["a", "b"], [("a", "b", 50.0, 0.5, 1.0)], "a")
    rev = solve(["a", "b"], [("b", "a", -50.0, -0.5, 1.0)], "a")
    assert rev["b"].offset_ns == pytest.approx(one["b"].offset_ns)
    assert rev["b"].drift_ppm == pytest.approx(one["b"].drift_ppm)
    # a tree: the residuals carry no information about the error
    assert math.isnan(one["b"].offset_sigma_ns) and math.isnan(one["b"].drift_sigma_ppm)
    par = solve(["a", "b"], [("a", "b", 40.0, 0.0, 1.0), ("b", "a", -70.0, 0.0, 2.0)], "b")
    # b is the reference now: a - b = weighted mean of -40 and -70 -> -60
    assert par["a"].offset_ns == pytest.approx(-60.0)
    assert par["a"].offset_sigma_ns > 0


def test_unreachable_and_invalid_input_raise():
    with pytest.raises(ValueError, match="no edge path from reference 'a' to: c, d"):
        solve(["a", "b", "c", "d"], [("a", "b", 1.0, 0.0, 1.0), ("c", "d", 1.0, 0.0, 1.0)], "a")
    with pytest.raises(ValueError, match="reference 'z'"):
        solve(["a", "b"], [("a", "b", 1.0, 0.0, 1.0)], "z")
    with pytest.raises(ValueError, match="unknown node 'x'"):
        solve(["a", "b"], [("a", "x", 1.0, 0.0, 1.0)], "a")
    with pytest.raises(ValueError, match="self-loop"):
        solve(["a", "b"], [("a", "a", 1.0, 0.0, 1.0)], "a")
    with pytest.raises(ValueError, match="weight > 0"):
        solve(["a", "b"], [("a", "b", 1.0, 0.0, 0.0)], "a")
    with pytest.raises(ValueError, match="weight > 0"):
        solve(["a", "b"], [("a", "b", float("nan"), 0.0, 1.0)], "a")
    with pytest.raises(ValueError, match="duplicate"):
        solve(["a", "a"], [], "a")
    assert solve(["a"], [], "a") == {"a": NodeEstimate(0.0, 0.0, 0.0, 0.0)}


def _random_graph(rng, n=12, peers=4, sigma_ns=100.0, sigma_ppm=0.02, noisy_sigma=None):
    """Truth and noisy edges (each node probes `peers` random others, plus a ring)."""
    names = [f"vm{i:02d}" for i in range(n)]
    theta = rng.uniform(-1e7, 1e7, n)
    theta[0] = 0.0
    drift = rng.uniform(-50, 50, n)
    drift[0] = 0.0
    pairs = {(i, (i + 1) % n) for i in range(n)}
    for i in range(n):
        for j in rng.choice([k for k in range(n) if k != i], peers, replace=False):
            if (int(j), i) not in pairs:
                pairs.add((i, int(j)))
    edges, edge_err = [], []
    for i, j in sorted(pairs):
        s = sigma_ns if noisy_sigma is None or rng.random() > 0.3 else noisy_sigma
        e = rng.normal(0, s)
        edges.append((names[i], names[j], theta[j] - theta[i] + e,
                      drift[j] - drift[i] + rng.normal(0, sigma_ppm * s / sigma_ns), s))
        edge_err.append(e)
    return names, theta, drift, edges, np.array(edge_err)


def test_noisy_graph_recovers_truth_with_calibrated_sigmas():
    # 12 nodes, each probing 4 random peers, edge noise 100 ns / 0.02 ppm. Measured over 40
    # seeds: node offset error RMS 55 ns, max 146 ns (one edge alone: RMS 100 ns); RMS of
    # error/sigma 1.14 (offsets) and 0.98 (drifts).
    errs, z_off, z_drift = [], [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        names, theta, drift, edges, _ = _random_graph(rng)
        est = solve(names, [(a, b, o, d, 1.0) for a, b, o, d, _ in edges], names[0])
        for k, v in enumerate(names[1:], start=1):
            e = est[v]
            errs.append(e.offset_ns - theta[k])
            z_off.append((e.offset_ns - theta[k]) / e.offset_sigma_ns)
            z_drift.append((e.drift_ppm - drift[k]) / e.drift_sigma_ppm)
    rms = float(np.sqrt(np.mean(np.square(errs))))
    assert rms < 65                      # one edge alone: 100
    assert np.abs(errs).max() < 250
    for z in (z_off, z_drift):
        assert 0.75 < float(np.sqrt(np.mean(np.square(z)))) < 1.3


def test_weights_from_edge_quality_beat_equal_weights():
    # 30% of edges are 10x noisier; weighting by 1/sigma^2 must clearly beat equal weights.
    # Measured over 40 seeds: RMS 54 ns weighted, 270 ns equal.
    err_w, err_eq = [], []
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        names, theta, _, edges, _ = _random_graph(rng, noisy_sigma=1000.0)
        ew = solve(names, [(a, b, o, d, 1.0 / s ** 2) for a, b, o, d, s in edges], names[0])
        eq = solve(names, [(a, b, o, d, 1.0) for a, b, o, d, _ in edges], names[0])
        err_w += [ew[v].offset_ns - theta[k] for k, v in enumerate(names)]
        err_eq += [eq[v].offset_ns - theta[k] for k, v in enumerate(names)]
    assert np.sqrt(np.mean(np.square(err_w))) < 0.5 * np.sqrt(np.mean(np.square(err_eq)))


# ------------------------------------------------ end to end: probes -> pair fits -> solve

def _clock(rng, name):
    w = rng.dirichlet(np.ones(3)) * 0.2
    osc = Oscillator(T0 - 100 * NS, float(rng.uniform(-50, 50)), tuple(
        (float(a), float(rng.uniform(20, 200)), float(rng.uniform(0, 2 * math.pi))) for a in w))
    return ClockSpec(name, [Segment(T0 - 10 * NS, float(rng.uniform(-1e7, 1e7)), "h", osc)])


def _one_way(rng, src, dst, n=200, qfrac=0.0):
    send = T0 + np.sort(rng.uniform(0, 2 * NS, n)).astype(np.int64)
    d = 7000 + rng.exponential(1000, n)
    hit = rng.random(n) < qfrac
    d[hit] += 20000 * (rng.pareto(1.5, int(hit.sum())) + 1)
    arrive = send + np.rint(d).astype(np.int64)
    return (np.array([src.to_vm_ns(int(t)) for t in send], dtype=np.int64),
            np.array([dst.to_vm_ns(int(t)) for t in arrive], dtype=np.int64))


def test_end_to_end_mesh_of_four_vms():
    # Full mesh of 4 VMs, 2 s of probes, one congested direction per pair; every pair fit is
    # evaluated at one true instant (read on its A's clock), then solved against vm0.
    # Measured over 20 seeds: |offset err| max 17 ns (RMS 7), |drift err| max 0.034 ppm,
    # offset sigmas 1-13 ns.
    rng = np.random.default_rng(21)
    vms = [_clock(rng, f"vm{i}") for i in range(4)]
    t_mid = T0 + NS
    edges = []
    for i in range(4):
        for j in range(i + 1, 4):
            a, b = vms[i], vms[j]
            ftx, frx = _one_way(rng, a, b, qfrac=0.5)
            rtx, rrx = _one_way(rng, b, a, qfrac=0.05)
            f = fit_pair(ftx, frx, rtx, rrx, a.to_vm_ns(t_mid))
            edges.append((a.vm, b.vm, f.offset_ns, f.drift_ppm,
                          1.0 / (f.residual_ns ** 2 + 10.0 ** 2)))
    est = solve([v.vm for v in vms], edges, "vm0")
    ref = vms[0]
    y_ref = ref.frequency_ppm(t_mid) * 1e-6
    for v in vms[1:]:
        true_off = v.offset_at(t_mid) - ref.offset_at(t_mid)
        true_drift = (v.frequency_ppm(t_mid) * 1e-6 - y_ref) / (1 + y_ref) * 1e6
        e = est[v.vm]
        assert abs(e.offset_ns - true_off) < 60, v.vm
        assert abs(e.drift_ppm - true_drift) < 0.07, v.vm
        assert 0 < e.offset_sigma_ns < 50
