"""Pairs behind a queue that stands for a window, re-anchored on the direction it left free.

A queue that stands on one direction of a pair (the reference's inbound link loaded by a flow,
the leaf-to-leaf path) delays every probe that way by its depth q. The envelope fit
(``estimate.fit_many``) then halves q into the pair's offset, and since every pair through that
link is biased alike the network solve cannot see it; a queue that varies over the window also
tilts the fitted drift. Probes the other way, and the pair's minimum round trip learnt while
the path was free, still fix the clock:

* The floor ``F`` of a pair is its least minimum round trip over ``ANCHOR_WINDOWS`` windows
  (``RttFloors.floor`` with that span). A window whose minimum round trip stands more than
  ``EXCESS_NS`` above ``F``, or that is so in all but fewer than ``PARTS // 4`` of its parts,
  is queued for the pair.
* With a slope ``m``, each direction bounds the offset at ``t_ref``, taking each minimum
  one-way delay as ``F / 2`` (the envelope fit's own assumption of equal minima): A -> B
  probes from above, ``c_f = min(rx_B - tx_A - m x) - F / 2``, B -> A probes from below,
  ``c_r = max(tx_B - rx_A - m x) + F / 2``. A direction with one probe through a free queue
  makes its bound exact; a queued one is off by its queue's least depth over the window.
  ``m`` is the slope predicted from the pair's earlier trusted windows (``RttFloors.predict``)
  or the window's own fitted one, whichever leaves one direction's delays tightest about it
  (the least median distance of a side's ``x -> bound`` values from their least: a free
  direction's delays stand on a line, a queued one's spread).
* When ``c_f - c_r <= EXCESS_NS`` both directions had free probes (a queue that stood for a
  part of the window and tilted the fit): the offset is the centre. Otherwise one side is
  taken as free. With a prediction: the bound nearer to the predicted offset, when it lies
  within a quarter of the gap, unless the spreads say the other side is the free one.
  Without (no trusted window yet: a queue that stood from the agents' start and drained once,
  which set the floor): the side whose delays' spread is at most a quarter of the other's,
  which exceeds ``EXCESS_NS``. Its value is the least of its probes within ``near_ns`` of
  ``t_ref`` (a slope that is off, or a clock a daemon slews within the window, bends the far
  probes' bounds; the window's least where none is near). A prediction near neither bound
  (queues both ways, a clock step), spreads that disagree with it, or neither anchors
  nothing: the window's fit stands and the queued-VM rules of ``agents.window`` judge it.

An anchored pair gets the slope ``m`` and, as residual, the mean distance of the 5 probes
nearest to its bound(s) combined with ``F / 2`` (``hypot``): the split of the floor between
the directions is assumed, not measured, so a pair whose floor a queue inflated weighs less in
the network solve than one whose path was once free. The trusted windows are the network
solve's (``RttFloors.trust``): each pair's clock as the difference of its VMs' estimates, so
that a pair whose prediction failed (a clock step, a daemon's slew) is set right through its
VMs' pairs free of the queue.

Limits: the first floor needs the path free once (the agents' start-up burst,
``AgentConfig.burst_s``, gets pairs through before a queue that stands up soon after; a queue
standing before the agents' first probes is the floor, and half its least depth stays in the
offsets, as in chrony's register); a path
whose minimum grows (a longer route) reads as queued until ``ANCHOR_WINDOWS`` have passed,
with both bounds moved by half the growth; a VM every pair of which is queued and not
anchored is left out by ``agents.window``; a queue that stands still (no spread) is told from
a free path only by the floor.

Sources: the minimum-delay filter of NTP (RFC 5905, section 10) and chrony's test of a
sample's delay against the least of its register (``maxdelaydevratio``, chrony.conf(5)); the
one-way lower envelope of S. Moon, P. Skelly, D. Towsley, "Estimation and removal of clock
skew from network delay measurements", INFOCOM 1999.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from agents import segments
from agents.estimate import PairFits, Probes

__all__ = ["ANCHOR_WINDOWS", "EXCESS_NS", "anchor"]

ANCHOR_WINDOWS = 64
"""Windows (128 s at 2 s) over which a pair's floor is its least minimum round trip, and its
trusted windows are kept for the prediction."""
EXCESS_NS = 10_000.0
"""A pair's minimum round trip (of its window, or of a part) this far above its floor (ns)
marks the window queued for it."""
_PICK_SHARE = 0.25   # the prediction must lie within this share of the gap of one bound
_RESID_K = 5         # probes nearest to a bound that give an anchored pair's residual
_SPREAD_RATIO = 4.0  # a side is free when its delays' spread is this much under the other's


def anchor(p: Probes, fits: PairFits, rtt: np.ndarray, part_rtt: np.ndarray,
           floor: np.ndarray, predict: Callable[[np.ndarray, np.ndarray],
                                                tuple[np.ndarray, np.ndarray]],
           near_ns: float = np.inf) -> tuple[PairFits, np.ndarray, np.ndarray]:
    """Re-anchor the pairs queued in their window (module doc).

    Args:
        p: the window's pure probes, one segment per pair (``estimate.Probes``).
        fits: their envelope fits (``estimate.fit_many``), one per pair.
        rtt: shape (pairs,), each pair's minimum round trip in the window, ns.
        part_rtt: shape (pairs, parts), its minimum round trip in each part (inf: none), ns.
        floor: shape (pairs,), its floor ``F``, ns (NaN: none yet).
        predict: ``predict(i, t_ns)``: for the pairs ``i`` (indices) B - A predicted at
            their A-clock instants ``t_ns`` (ns) and its slope (ppm), arrays, NaN for a pair
            without trusted windows (``RttFloors.predict``); asked only for queued pairs.
        near_ns: a free side's value is the least of its probes within this of ``t_ref``
            (ns; default: all of the window's).

    Returns:
        ``(fits, anchored, queued)``: the fits with the anchored pairs' offset, drift and
        residual replaced; masks, shape (pairs,), of the anchored pairs and of the pairs
        queued in the window (anchored or not).
    """
    has = np.isfinite(floor)
    over = np.isfinite(part_rtt) & ((part_rtt - np.where(has, floor, 0.0)[:, None])
                                    > EXCESS_NS)
    free = np.isfinite(part_rtt) & ~over
    parts = part_rtt.shape[1] if part_rtt.ndim == 2 else 0
    queued = has & (((rtt - floor) > EXCESS_NS)
                    | (over.any(axis=1) & (free.sum(axis=1) < parts // 4)))
    anchored = np.zeros(rtt.size, dtype=bool)
    cand = np.flatnonzero(queued)
    if not cand.size:
        return fits, anchored, queued
    pred_off, pred_drift = predict(cand, fits.t_ref_ns[cand])
    known = np.isfinite(pred_off) & np.isfinite(pred_drift)
    drift = np.where(known, pred_drift, fits.drift_ppm[cand])  # none: the window's own fit
    half = 0.5 * floor[cand]
    base = np.round(np.where(known, pred_off, fits.offset_ns[cand])).astype(np.int64)
    t_ref = fits.t_ref_ns[cand]
    # the slope (predicted, or the window's fit) under which a side's delays stand tightest
    sides = [_sides(p, cand, base, d, t_ref, near_ns) for d in (drift, fits.drift_ppm[cand])]
    second = np.minimum(sides[1].s_f, sides[1].s_r) < np.minimum(sides[0].s_f, sides[0].s_r)
    sd = _Sides(*(np.where(second, b_, a_) for a_, b_ in zip(*sides, strict=True)))
    drift = np.where(second, fits.drift_ppm[cand], drift)
    c_f, c_r = sd.least_f - half, half - sd.least_r  # the window's bounds: which side is free
    gap = c_f - c_r
    # the side whose delays stand near their least while the other's spread: free
    free_f = (sd.s_r > EXCESS_NS) & (_SPREAD_RATIO * sd.s_f <= sd.s_r)
    free_r = (sd.s_f > EXCESS_NS) & (_SPREAD_RATIO * sd.s_r <= sd.s_f)
    pred = pred_off - base
    d_f, d_r = np.abs(pred - c_f), np.abs(pred - c_r)
    both = gap <= EXCESS_NS
    guess = ~both & known & (np.minimum(d_f, d_r) <= _PICK_SHARE * gap)  # the prediction
    seen = ~both & (free_f | free_r)
    guess_f = guess & (d_f < d_r)
    # the prediction picks; the spreads where there is none, and veto it where they disagree
    pick = np.where(known, guess & ~(seen & (free_f != guess_f)), seen)
    take_f = np.where(known, guess_f, free_f)
    n_f, n_r = sd.near_f - half, half - sd.near_r  # a free side's bound near t_ref: the value
    c = np.where(both, 0.5 * (c_f + c_r), np.where(take_f, n_f, n_r))
    ok = (both | pick) & (gap >= -EXCESS_NS)  # a negative gap: a clock step in the window
    resid = np.where(both, 0.5 * (sd.r_f + sd.r_r), np.where(take_f, sd.r_f, sd.r_r))
    sel = cand[ok]
    anchored[sel] = True
    out = PairFits(*(a.copy() for a in fits))
    out.offset_ns[sel] = base[ok] + c[ok]
    out.drift_ppm[sel] = drift[ok]
    out.residual_ns[sel] = np.hypot(np.maximum(resid[ok], 0.0), half[ok])
    return out, anchored, queued


def _bounds(v: np.ndarray, x_ns: np.ndarray, starts: np.ndarray, near_ns: float
            ) -> tuple[np.ndarray, np.ndarray]:
    """Per segment the least of ``v`` among its entries within ``near_ns`` of the reference
    instant (``x_ns``: their A-clock times less it; of all of them where none is), and the
    least of all of them."""
    least = np.minimum.reduceat(v, starts[:-1])
    near = np.minimum.reduceat(np.where(np.abs(x_ns) <= near_ns, v, np.inf), starts[:-1])
    return np.where(np.isfinite(near), near, least), least


def _median(v: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per segment the median of ``v``."""
    return segments.percentile(segments.sorted_values(v, starts, segments.ids(starts)),
                               starts, 50.0)


class _Sides(NamedTuple):
    """Per candidate pair, under one slope: each side's bound near t_ref and over the window
    (the least of ``up``, of ``-dn``), its delays' spread (median less least) and the mean
    distance of its ``_RESID_K`` probes nearest to its bound."""

    near_f: np.ndarray
    least_f: np.ndarray
    near_r: np.ndarray
    least_r: np.ndarray
    s_f: np.ndarray
    s_r: np.ndarray
    r_f: np.ndarray
    r_r: np.ndarray


def _sides(p: Probes, cand: np.ndarray, base: np.ndarray, drift_ppm: np.ndarray,
           t_ref: np.ndarray, near_ns: float) -> _Sides:
    """``_Sides`` of the pairs ``cand`` of ``p`` with B - A taken as ``base`` (ns) at
    ``t_ref`` and slope ``drift_ppm``."""
    m = drift_ppm * 1e-6
    fs, rs = p.fwd_starts, p.rev_starts
    fsel = segments.ranges(fs[cand], fs[cand + 1])
    rsel = segments.ranges(rs[cand], rs[cand + 1])
    fst = segments.starts_of(fs[cand + 1] - fs[cand])
    rst = segments.starts_of(rs[cand + 1] - rs[cand])
    # each probe's bound on B - A at t_ref with the slope m, less the integer base: A -> B
    # from above (up), B -> A from below (dn, negated: both sides' least is their bound)
    xf = p.fwd_tx[fsel] - segments.spread(t_ref, fst)
    xr = p.rev_rx[rsel] - segments.spread(t_ref, rst)
    up = ((p.fwd_rx[fsel] - p.fwd_tx[fsel] - segments.spread(base, fst)).astype(np.float64)
          - segments.spread(m, fst) * xf)
    dn = -((p.rev_tx[rsel] - p.rev_rx[rsel] - segments.spread(base, rst)).astype(np.float64)
           - segments.spread(m, rst) * xr)
    near_f, least_f = _bounds(up, xf, fst, near_ns)
    near_r, least_r = _bounds(dn, xr, rst, near_ns)
    r_f = segments.head_mean(up - segments.spread(least_f, fst), fst, _RESID_K)
    r_r = segments.head_mean(dn - segments.spread(least_r, rst), rst, _RESID_K)
    return _Sides(near_f, least_f, near_r, least_r, _median(up, fst) - least_f,
                  _median(dn, rst) - least_r, r_f, r_r)
