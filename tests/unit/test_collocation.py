"""Collocation grouping on synthetic drift series of known placement, and the pairwise
precision/recall arithmetic.

Series follow the lab's oscillator model (``lab.clocks`` draws the same: base drift uniform in
+-50 ppm, wander = 3 cosines of total amplitude 0.2 ppm, periods 20-200 s): one sample per 2 s
window, drift of each VM against VM ``vm00`` (whose own series is exactly 0), plus white
estimation noise. Error rates quoted in comments were measured over 100 seeds per case.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from agents.collocation import Group, group, precision_recall


def _host_freqs(rng, n_hosts, t_s, wander_ppm=0.2, close_ppm=0.05):
    """(n_hosts, n_windows) frequency errors y_h, ppm; host 1's base is host 0's + close_ppm."""
    base = rng.uniform(-50, 50, n_hosts)
    base[1] = base[0] + close_ppm
    ys = []
    for h in range(n_hosts):
        amp = rng.dirichlet(np.ones(3)) * wander_ppm
        per, ph = rng.uniform(20, 200, 3), rng.uniform(0, 2 * np.pi, 3)
        ys.append(base[h] + sum(a * np.cos(2 * np.pi * t_s / p + f)
                                for a, p, f in zip(amp, per, ph, strict=True)))
    return np.array(ys)


def _series(seed, n_hosts=8, per_host=4, n_windows=15, sigma=0.02, **kw):
    rng = np.random.default_rng(seed)
    t_s = rng.uniform(0, 1000) + 2.0 * (np.arange(n_windows) + 0.5)
    y = _host_freqs(rng, n_hosts, t_s, **kw)
    out, truth = {}, []
    for h in range(n_hosts):
        truth.append([])
        for k in range(per_host):
            v = f"vm{h * per_host + k:02d}"
            truth[-1].append(v)
            noise = 0.0 if v == "vm00" else rng.normal(0, sigma, n_windows)
            out[v] = y[h] - y[0] + noise
    return out, truth


def _score(groups: list[Group], truth):
    return precision_recall([g.members for g in groups], truth)


def test_32_vms_8_hosts_in_30_s_with_two_hosts_0p05_ppm_apart():
    # 15 windows of 2 s, noise 0.02 ppm per sample. Over 100 other seeds: exact in 99, the
    # two close hosts merged in 1 (at 60 windows: exact in 100); group confidence median 0.94.
    # With 0.05 ppm noise, 10 of 100 merge the close hosts at 30 s.
    for seed in range(3):
        s, truth = _series(seed)
        groups = group(s, 0.02)
        assert [g.members for g in groups] == truth
        assert _score(groups, truth) == (1.0, 1.0)
        assert all(0.0 <= g.confidence <= 1.0 for g in groups)
        assert np.mean([g.confidence for g in groups]) > 0.6


def test_equal_base_drift_is_split_by_the_wander_alone():
    # Hosts 0 and 1 have the same base drift; only their wanders differ. Over 100 seeds: exact
    # in 100 at 60 windows (2 min), in 97 at 15 windows (30 s, 8 hosts). Without wander they
    # are one oscillator as far as any clock can tell, and must merge: the test can fail both
    # ways.
    for seed in range(3):
        s, truth = _series(seed, n_hosts=4, n_windows=60, close_ppm=0.0)
        assert [g.members for g in group(s, 0.02)] == truth
        s, truth = _series(seed, n_hosts=4, n_windows=60, close_ppm=0.0, wander_ppm=0.0)
        merged = [truth[0] + truth[1], truth[2], truth[3]]
        assert [g.members for g in group(s, 0.02)] == merged


def test_missing_windows_and_a_late_vm():
    s, truth = _series(4, n_windows=40)
    rng = np.random.default_rng(9)
    for v in s:
        s[v][rng.random(40) < 0.2] = np.nan
    s["vm13"][:25] = np.nan       # joined late: 15 windows at most
    assert [g.members for g in group(s, 0.02)] == truth


def test_vm_without_data_is_an_uncertain_singleton():
    s, truth = _series(5, n_hosts=3, n_windows=20)
    s["vm05"][:] = np.nan
    s["vm05"][3] = 0.1            # fewer than MIN_WINDOWS shared windows with anyone
    groups = group(s, 0.02)
    lonely = [g for g in groups if g.members == ["vm05"]]
    assert lonely and lonely[0].confidence == pytest.approx(0.5)
    assert _score(groups, truth) == (1.0, pytest.approx(15 / 18))   # vm05's 3 pairs missed


def test_underestimated_sigma_is_corrected_from_the_data():
    # The caller claims 0.004 ppm while the noise is 0.02: without the noise floor every VM
    # would be a singleton.
    s, truth = _series(6)
    assert [g.members for g in group(s, 0.004)] == truth


def test_overestimated_sigma_merges_close_hosts():
    # With 0.2 ppm claimed, 0.05 ppm apart over 30 s is within the noise: hosts 0 and 1 merge
    # (documented behaviour), the others stay apart.
    s, truth = _series(7)
    got = [g.members for g in group(s, 0.2)]
    assert truth[0] + truth[1] in got
    assert all(t in got for t in truth[2:])


def test_confidence_grows_with_windows():
    short = [g.confidence for seed in range(4) for g in group(*_series(seed, n_windows=5)[:1],
                                                              0.02)]
    long = [g.confidence for seed in range(4) for g in group(*_series(seed, n_windows=60)[:1],
                                                             0.02)]
    assert np.mean(long) > 0.95
    assert np.mean(long) > np.mean(short) + 0.2


def test_trivial_inputs_and_errors():
    assert group({}, 0.02) == []
    assert group({"a": np.zeros(5)}, 0.02) == [Group(["a"], 1.0)]
    with pytest.raises(ValueError, match="differ in length"):
        group({"a": np.zeros(5), "b": np.zeros(6)}, 0.02)
    with pytest.raises(ValueError, match="sigma_ppm"):
        group({"a": np.zeros(5)}, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        group({"a": np.zeros(5)}, 0.02, alpha=1.0)
    with pytest.raises(ValueError, match="1-D"):
        group({"a": np.zeros((2, 5))}, 0.02)


# ---------------------------------------------------------------- precision / recall

def test_precision_recall_on_known_cases():
    # predicted pairs {ab, ac, bc}, true pairs {ab, cd}: one hit
    assert precision_recall([["a", "b", "c"], ["d"]], [["a", "b"], ["c", "d"]]) == \
        pytest.approx((1 / 3, 1 / 2))
    assert precision_recall([["b", "a"], ["c", "d"]], [["a", "b"], ["d", "c"]]) == (1.0, 1.0)
    # no predicted pair: precision 1 by definition, everything missed
    assert precision_recall([["a"], ["b"]], [["a", "b"]]) == (1.0, 0.0)
    # no true pair: recall 1 by definition, every predicted pair wrong
    assert precision_recall([["a", "b"]], [["a"], ["b"]]) == (0.0, 1.0)
    assert precision_recall([], []) == (1.0, 1.0)
    # a VM missing from one side counts as a singleton there
    assert precision_recall([["a", "b", "c"]], [["a", "b"]]) == pytest.approx((1 / 3, 1.0))


def test_precision_recall_rejects_a_vm_in_two_groups():
    with pytest.raises(ValueError, match="'a' appears in more than one group"):
        precision_recall([["a", "b"], ["a"]], [["a", "b"]])
    with pytest.raises(ValueError, match="truth"):
        precision_recall([["a"]], [["a", "b"], ["b"]])


def test_precision_recall_large_case_by_counting():
    # 3 true hosts of 4; prediction splits one host 2+2 and merges two others.
    truth = [[f"h{h}v{k}" for k in range(4)] for h in range(3)]
    pred = [truth[0][:2], truth[0][2:], truth[1] + truth[2]]
    p, r = precision_recall(pred, truth)
    # predicted pairs: 1 + 1 + C(8,2)=28 -> 30; hits: 1 + 1 + 6 + 6 = 14; true pairs: 18
    assert (p, r) == pytest.approx((14 / 30, 14 / 18))
    assert not math.isnan(p)


def _with_offsets(seed, n_windows=15, drift_sigma=0.2, offset_sigma_ns=100.0):
    """Drift series with the lab's noise (0.2 ppm per window, software timestamps) and the
    offsets those clocks integrate to (2 s windows, ns) with ``offset_sigma_ns`` of noise."""
    rng = np.random.default_rng(seed)
    t_s = rng.uniform(0, 1000) + 2.0 * (np.arange(n_windows) + 0.5)
    y = _host_freqs(rng, 8, t_s)
    drifts, offsets = {"vm00": np.zeros(n_windows)}, {"vm00": np.zeros(n_windows)}
    truth = [[f"vm{h * 4 + k:02d}" for k in range(4)] for h in range(8)]
    for h, members in enumerate(truth):
        rel = y[h] - y[0]
        ramp = np.cumsum(rel) * 2.0 * 1e3  # ppm over 2 s windows -> ns
        for v in members[1 if h == 0 else 0:]:  # vm00 is the reference
            drifts[v] = rel + rng.normal(0, drift_sigma, n_windows)
            offsets[v] = rng.uniform(-1e7, 1e7) + ramp + rng.normal(0, offset_sigma_ns,
                                                                    n_windows)
    return drifts, offsets, truth


def test_offsets_split_hosts_0p05_ppm_apart_that_noisy_drifts_merge():
    # 0.05 ppm is 0.1 us of offset per 2 s window: over 15 windows the offset difference of
    # the two close hosts walks 1.5 us away from its start, against 0.1 us of noise. Drifts
    # alone, at 0.2 ppm of noise per window, cannot tell them apart in 30 s.
    merged = 0
    for seed in range(5):
        d, o, truth = _with_offsets(seed)
        merged += [g.members for g in group(d, 0.2)] != truth
        got = group(d, 0.2, offset_series=o, offset_sigma_ns=100.0)
        assert [g.members for g in got] == truth, seed
    assert merged >= 4


def test_offset_outliers_are_clipped_and_gaps_are_tolerated():
    d, o, truth = _with_offsets(3, n_windows=30)
    o["vm05"][20] += 50_000.0  # one window 50 us off (a queue on its path)
    o["vm06"][:12] = np.nan    # a VM whose earlier offsets were dropped (a clock step)
    assert [g.members for g in group(d, 0.2, offset_series=o)] == truth
    with pytest.raises(ValueError, match="offset series"):
        group(d, 0.2, offset_series={v: s[:-1] for v, s in o.items()})


def test_components_change_nothing_but_the_work(monkeypatch):
    # The greedy merges run per component of VMs that cannot merge across (drift ranges far
    # apart): the same groups, and confidences to rounding (the tests' matrix products run
    # on other batches of rows), as one greedy over all VMs, on
    # hosts far apart and close (0.05 ppm, 0), with missing windows, a late VM and offsets.
    from agents import collocation
    cases = []
    for seed in range(6):
        s, _ = _series(seed, n_hosts=10, per_host=3, n_windows=(8, 20, 40)[seed % 3],
                       close_ppm=(0.05, 0.0)[seed % 2])
        rng = np.random.default_rng(seed)
        for v in list(s)[1::4]:
            s[v] = np.where(rng.random(s[v].size) < 0.3, np.nan, s[v])
        s["late"] = np.r_[np.full(s["vm01"].size - 3, np.nan), s["vm01"][-3:]]
        offsets = {v: np.cumsum(np.nan_to_num(x)) * 2000 + rng.normal(0, 100, x.size)
                   for v, x in s.items()}
        cases += [((s, 0.02), {}), ((s, 0.02), {"offset_series": offsets,
                                                "offset_sigma_ns": 150.0})]
    split = [collocation.components(*_singles(s, 0.02)) for (s, _), _ in cases]
    # hosts far apart are components of their own (fewer where missing windows move the
    # common mode by a host's drift)
    assert max(c.max() for c in split) >= 8, [c.max() for c in split]
    got = [collocation.group(*a, **kw) for a, kw in cases]
    monkeypatch.setattr(collocation, "components", lambda single, nv, s2, alpha:
                        np.zeros(nv, dtype=int))
    want = [collocation.group(*a, **kw) for a, kw in cases]
    assert [[g.members for g in gs] for gs in got] == [[g.members for g in gs] for gs in want]
    assert [g.confidence for gs in got for g in gs] == pytest.approx(
        [g.confidence for gs in want for g in gs], rel=1e-12, abs=1e-15)


def _singles(s, sigma):
    """``components``' arguments for series ``s``: one VM per row, s2 = sigma**2."""
    from agents.colloc_stats import Cluster, Stack, row_nanmedian
    x = np.vstack([s[v] for v in sorted(s)])
    fin = np.isfinite(x)
    common = row_nanmedian(x.T)
    rows = Stack.of([Cluster([i], np.where(fin[i], x[i], 0.0), fin[i] * 1.0,
                               np.zeros(x.shape[1]), np.zeros(x.shape[1]))
                      for i in range(len(x))], common)
    return rows, len(x), sigma ** 2, 1e-5
