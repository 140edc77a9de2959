"""The per-window solve: from one window's probe records to every VM's clock against the
reference VM, the NTP-style baseline and the one-way delays (steps 2, 3 and 5 of the
pipeline in ``agents.coordinator``). A pure function of the records and the previous
window's offsets: no threads, sockets or clocks.

1. Per unordered pair (A < B lexicographically): coded-pair purity (``estimate.pure_pairs``,
   guard band ``guard_ns``), then the Huygens envelope fit (``estimate.fit_pair``) and the
   NTP-style baseline (``estimate.ntp_pair``) on the very same pure probes. A pair needs
   ``MIN_PURE`` pure probes each way, and is dropped (``pairs_inconsistent``) when the fitted
   line leaves a direction a minimum delay below ``-INCONSISTENT_NS``: a clock step inside
   the window.
2. Network effect (``network.solve``): both fits are evaluated at the window's centre
   ``t_k`` (read on A's clock: ``t_k + theta_A``) and solved over the graph of pairs,
   weights ``1 / (residual_ns**2 + floor**2)``, twice (the second pass evaluates at the
   first pass's offsets). Only the VMs connected to the reference get an estimate.
3. OWD per ordered pair on all of the window's probes (pure or not) with the
   network-corrected relative clock (``owd.owd_stats``); asymmetry per pair
   (``owd.asymmetry_us``).

Source: Geng et al., "Exploiting a Natural Network Effect for Scalable, Fine-grained Clock
Synchronization", NSDI 2018 (coded probes, envelope fit, network effect); RFC 5905 for the
baseline.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from agents.estimate import PairFit, fit_pair, ntp_pair, pure_pairs
from agents.messages import OwdStats
from agents.network import NodeEstimate, solve
from agents.owd import asymmetry_us, owd_stats

__all__ = ["INCONSISTENT_NS", "MIN_PURE", "Records", "WindowResult", "solve_window"]

log = logging.getLogger("agents.window")

MIN_PURE = 4
"""Fewest pure probes per direction for a pair to be fitted in a window."""
INCONSISTENT_NS = 1000.0
"""A pair fit whose implied minimum one-way delay is below minus this (ns) is dropped."""


class Records(NamedTuple):
    """One direction's probes in one window, sorted by ``(pair_id, idx)``; shape (n,) int64
    each."""

    pair_id: np.ndarray
    """Coded pair of each probe."""
    tx_ns: np.ndarray
    """Send times on the sender's VM clock, ns."""
    rx_ns: np.ndarray
    """Receive times on the receiver's VM clock, ns."""


@dataclass
class WindowResult:
    """The result of one window ``k``.

    Attributes:
        k: window index (``t_ns = k * window_ns + window_ns // 2``).
        t_ns: the window's centre on the reference clock, ns.
        est: VM -> Huygens estimate against the reference (offset at ``t_ns``, ns; the
            window's own drift, ppm; sigmas).
        ntp: VM -> NTP-style estimate on the same probes.
        owd: ``"a->b"`` -> one-way delays of the window's probes.
        asym: ``"a|b"`` -> OWD asymmetry, us (``owd.asymmetry_us``).
        pairs: pairs fitted and connected to the reference.
        drift: VM -> served drift, ppm (the centred slope, set by the coordinator).
        ntp_drift: the same for the baseline.
    """

    k: int
    t_ns: int
    est: dict[str, NodeEstimate]
    ntp: dict[str, NodeEstimate]
    owd: dict[str, OwdStats]
    asym: dict[str, float]
    pairs: int
    drift: dict[str, float] = field(default_factory=dict)
    ntp_drift: dict[str, float] = field(default_factory=dict)


def solve_window(k: int, records: dict[tuple[str, str], Records], ref: str,
                 offsets_ns: dict[str, float], *, window_ns: int, guard_ns: float = 20_000.0,
                 weight_floor_ns: float = 100.0,
                 counts: Counter[str] | None = None) -> WindowResult | None:
    """Solve window ``k``.

    Args:
        k: window index on the reference clock (centre ``k * window_ns + window_ns // 2``).
        records: ``(src, dst)`` -> the window's probes src -> dst.
        ref: the reference VM.
        offsets_ns: VM -> its offset to ``ref`` (ns) from the previous windows, to read the
            centre on each VM's clock in the first pass (missing: 0).
        window_ns: window length, ns.
        guard_ns: coded-pair guard band, ns.
        weight_floor_ns: floor added to the fits' residuals in the solve weights, ns.
        counts: diagnostics are added here (``pairs_too_few_pure``, ``pair_fit_failures``,
            ``pairs_inconsistent``, ``ntp_fit_failures``, ``windows_without_reference``,
            ``solve_failures``).

    Returns:
        The window's estimates, or None when no fitted pair connects ``ref`` to another VM
        (or the solve failed).
    """
    counts = Counter() if counts is None else counts
    t_k = k * window_ns + window_ns // 2
    fits = _fit_pairs(k, records, guard_ns, counts)
    if not fits:
        return None
    nodes = _component(ref, list(fits))
    if len(nodes) < 2:
        counts["windows_without_reference"] += 1
        return None
    pairs = {ab: f for ab, f in fits.items() if ab[0] in nodes}
    floor2 = weight_floor_ns ** 2

    def edges(which: int, theta: dict[str, float]) -> list:
        out = []
        for (a, b), f in pairs.items():
            fit = f[which]
            if fit is None:
                continue
            t_a = t_k + int(round(theta.get(a, 0.0)))
            out.append((a, b, fit.offset_at(t_a), fit.drift_ppm,
                        1.0 / (fit.residual_ns ** 2 + floor2)))
        return out

    names = sorted(nodes)
    try:
        est = solve(names, edges(0, offsets_ns), ref)
        theta = {v: e.offset_ns for v, e in est.items()}
        est = solve(names, edges(0, theta), ref)
        theta = {v: e.offset_ns for v, e in est.items()}
    except ValueError as e:  # non-finite fits: skip the window, keep running
        log.warning("window %d: solve failed: %s", k, e)
        counts["solve_failures"] += 1
        return None
    ntp_edges = edges(1, theta)
    ntp_nodes = sorted(_component(ref, [(a, b) for a, b, *_ in ntp_edges]))
    try:
        ntp = solve(ntp_nodes, [e for e in ntp_edges if e[0] in ntp_nodes], ref) \
            if len(ntp_nodes) > 1 else {}
    except ValueError as e:
        log.warning("window %d: NTP solve failed: %s", k, e)
        counts["solve_failures"] += 1
        ntp = {}
    owd = {}
    for (src, dst), rec in sorted(records.items()):
        if src in est and dst in est:
            owd[f"{src}->{dst}"] = owd_stats(
                rec.tx_ns, rec.rx_ns, est[dst].offset_ns - est[src].offset_ns,
                est[dst].drift_ppm - est[src].drift_ppm, t_k + int(round(est[src].offset_ns)))
    return WindowResult(k, t_k, est, ntp, owd, asymmetry_us(owd), len(pairs))


def _fit_pairs(k: int, records: dict[tuple[str, str], Records], guard_ns: float,
               counts: Counter[str]) -> dict[tuple[str, str], tuple[PairFit, PairFit | None]]:
    """``(a, b)`` (a < b) -> (Huygens fit, NTP-style fit or None) of every pair probed both
    ways with enough pure probes (step 1)."""
    fits = {}
    for (a, b), fwd in records.items():
        rev = records.get((b, a))
        if a > b or rev is None:
            continue
        fm = pure_pairs(fwd.tx_ns, fwd.rx_ns, fwd.pair_id, guard_ns)
        rm = pure_pairs(rev.tx_ns, rev.rx_ns, rev.pair_id, guard_ns)
        if fm.sum() < MIN_PURE or rm.sum() < MIN_PURE:
            counts["pairs_too_few_pure"] += 1
            continue
        probes = (fwd.tx_ns[fm], fwd.rx_ns[fm], rev.tx_ns[rm], rev.rx_ns[rm])
        try:
            h = fit_pair(*probes)
        except ValueError as e:
            log.debug("window %d pair %s|%s: %s", k, a, b, e)
            counts["pair_fit_failures"] += 1
            continue
        if _min_delay_ns(h, *probes) < -INCONSISTENT_NS:
            # no line leaves both directions a non-negative delay: a clock step or a bad
            # timestamp inside the window
            counts["pairs_inconsistent"] += 1
            continue
        try:
            # RFC 5905's clock filter keeps 1 sample in 8; fewer in a sparse window
            n = ntp_pair(*probes, filter_n=max(1, min(8, int(fm.sum()) // 4)))
        except ValueError:
            n = None
            counts["ntp_fit_failures"] += 1
        fits[(a, b)] = (h, n)
    return fits


def _min_delay_ns(fit: PairFit, ftx, frx, rtx, rrx) -> float:
    """The smaller of the two directions' minimum one-way delays implied by ``fit`` (ns)."""
    base = round(fit.offset_ns)  # remove the integer part before float, as in agents.owd
    fwd = (frx - ftx - base).astype(np.float64) - (fit.offset_at(ftx) - base)
    rev = (rrx - rtx + base).astype(np.float64) + (fit.offset_at(rrx) - base)
    return float(min(fwd.min(), rev.min()))


def _component(ref: str, pairs: list[tuple[str, str]]) -> set[str]:
    """The VMs connected to ``ref`` through ``pairs``."""
    adj: dict[str, set[str]] = {}
    for a, b in pairs:
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    seen, todo = {ref}, [ref]
    while todo:
        u = todo.pop()
        for v in adj.get(u, ()):
            if v not in seen:
                seen.add(v)
                todo.append(v)
    return seen
