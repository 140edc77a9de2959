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
* With the slope ``m`` predicted from the pair's earlier trusted windows (``RttFloors.predict``),
  each direction bounds the offset at ``t_ref``, taking each minimum one-way delay as ``F / 2``
  (the envelope fit's own assumption of equal minima): A -> B probes from above,
  ``c_f = min(rx_B - tx_A - m x) - F / 2``, B -> A probes from below,
  ``c_r = max(tx_B - rx_A - m x) + F / 2``. A direction with one probe through a free
  queue makes its bound exact; a queued one is off by its queue's least depth over the window.
* When ``c_f - c_r <= EXCESS_NS`` both directions had free probes (a queue that stood for a
  part of the window and tilted the fit): the offset is the centre. Otherwise the bound nearer
  to the offset predicted from the trusted windows is taken, when it lies within a quarter of
  the gap (the prediction only picks the free side; the value is the window's own probes'). A
  prediction near neither (queues both ways, a clock step) anchors nothing: the window's fit
  stands and the queued-VM rules of ``agents.window`` judge it.

An anchored pair gets the predicted drift and, as residual, the mean distance of the 5 probes
nearest to its bound(s). The trusted windows are the network solve's (``RttFloors.trust``):
each pair's clock as the difference of its VMs' estimates, so that a pair whose prediction
failed (a clock step, a daemon's slew) is set right through its VMs' pairs free of the queue.

Limits: the first floor needs the path free once (a queue standing from the agents' start is
its floor, and half its least depth stays in the offsets); a path whose minimum grows (a
longer route) reads as queued until ``ANCHOR_WINDOWS`` have passed, with both bounds moved by
half the growth; a VM every pair of which is queued and unpredicted (its clock slewed or
stepped hard while the queue stands, queues both ways) keeps the window's own fits, biased,
unless ``agents.window`` leaves it out; a clock whose frequency changes within a window (a
daemon's fast slew) is not a line, whatever the probes.

Sources: the minimum-delay filter of NTP (RFC 5905, section 10) and chrony's test of a
sample's delay against the least of its register (``maxdelaydevratio``, chrony.conf(5)); the
one-way lower envelope of S. Moon, P. Skelly, D. Towsley, "Estimation and removal of clock
skew from network delay measurements", INFOCOM 1999.
"""
from __future__ import annotations

from collections.abc import Callable

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


def anchor(p: Probes, fits: PairFits, rtt: np.ndarray, part_rtt: np.ndarray,
           floor: np.ndarray, predict: Callable[[np.ndarray, np.ndarray],
                                                tuple[np.ndarray, np.ndarray]]
           ) -> tuple[PairFits, np.ndarray, np.ndarray]:
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
    cand, pred_off, pred_drift = cand[known], pred_off[known], pred_drift[known]
    if not cand.size:
        return fits, anchored, queued
    half = 0.5 * floor[cand]
    m = pred_drift * 1e-6
    base = np.round(pred_off).astype(np.int64)  # integers first, as in agents.owd
    t_ref = fits.t_ref_ns[cand]
    fs = p.fwd_starts
    rs = p.rev_starts
    fsel = segments.ranges(fs[cand], fs[cand + 1])
    rsel = segments.ranges(rs[cand], rs[cand + 1])
    fst = segments.starts_of(fs[cand + 1] - fs[cand])
    rst = segments.starts_of(rs[cand + 1] - rs[cand])
    # each probe's bound on B - A at t_ref with the slope m, less the integer base
    up = ((p.fwd_rx[fsel] - p.fwd_tx[fsel] - segments.spread(base, fst)).astype(np.float64)
          - segments.spread(m, fst) * (p.fwd_tx[fsel] - segments.spread(t_ref, fst)))
    dn = ((p.rev_tx[rsel] - p.rev_rx[rsel] - segments.spread(base, rst)).astype(np.float64)
          - segments.spread(m, rst) * (p.rev_rx[rsel] - segments.spread(t_ref, rst)))
    c_f = np.minimum.reduceat(up, fst[:-1]) - half
    c_r = np.maximum.reduceat(dn, rst[:-1]) + half
    gap = c_f - c_r
    pred = pred_off - base
    d_f, d_r = np.abs(pred - c_f), np.abs(pred - c_r)
    both = gap <= EXCESS_NS
    pick = ~both & (np.minimum(d_f, d_r) <= _PICK_SHARE * gap)
    take_f = pick & (d_f < d_r)
    c = np.where(both, 0.5 * (c_f + c_r), np.where(take_f, c_f, c_r))
    ok = (both | pick) & (gap >= -EXCESS_NS)  # a negative gap: a clock step in the window
    # residual: mean distance of the probes nearest to the bound(s) used
    r_f = segments.head_mean(up - segments.spread(c_f + half, fst), fst, _RESID_K)
    r_r = segments.head_mean(segments.spread(c_r - half, rst) - dn, rst, _RESID_K)
    resid = np.where(both, 0.5 * (r_f + r_r), np.where(take_f, r_f, r_r))
    sel = cand[ok]
    anchored[sel] = True
    out = PairFits(*(a.copy() for a in fits))
    out.offset_ns[sel] = base[ok] + c[ok]
    out.drift_ppm[sel] = pred_drift[ok]
    out.residual_ns[sel] = np.maximum(resid[ok], 0.0)
    return out, anchored, queued
