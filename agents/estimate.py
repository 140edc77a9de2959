"""Per-pair clock estimation from probe timestamps: Huygens coded probes and the max-margin
envelope fit, beside an NTP-style baseline on the very same probes.

Conventions (all functions):
    * Timestamps are int64 nanoseconds. ``tx``/``rx`` of a probe are read on the sender's /
      receiver's clock. Absolute values (~1.8e18 ns) are never converted to float: every
      computation first subtracts an integer reference, then works in float64 on differences.
    * For a pair (A, B) the relative clock is ``clock_B - clock_A = offset_ns +
      drift_ppm * 1e-6 * (t - t_ref_ns)`` with ``t`` read on A's clock. ``drift_ppm`` is thus
      the slope against A's clock, ``(y_B - y_A) / (1 + y_A)`` for fractional frequency errors
      ``y``; it differs from ``y_B - y_A`` by at most ~0.005 ppm at +-50 ppm base drifts.
    * fwd probes go A -> B (tx on A, rx on B), rev probes go B -> A (tx on B, rx on A).

Source: Y. Geng, S. Liu, Z. Yin, A. Naik, B. Prabhakar, M. Rosenblum, A. Vahdat, "Exploiting a
Natural Network Effect for Scalable, Fine-grained Clock Synchronization", NSDI 2018 (coded
probes; the SVM fit of the region between the two directions' probes). The baseline follows the
NTP on-wire offset and clock filter of RFC 5905 (sections 8 and 10).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from agents import segments

__all__ = ["MAX_DRIFT_PPM", "MIN_PROBES", "PairFit", "PairFits", "Probes", "fit_many", "fit_pair",
           "line_fits", "ntp_many", "ntp_pair", "pure_pairs"]

MIN_PROBES = 2
"""Fewest probes per direction that ``fit_pair`` and ``ntp_pair`` accept."""

MAX_DRIFT_PPM = 1000.0
"""Largest relative drift |B - A| the envelope fit searches, ppm (crystals: +-50 ppm each)."""

_NS_PER_S = 1_000_000_000
_PPM_NS_PER_S = 1e3  # 1 ppm == 1e3 ns of drift per second
_ENVELOPE_K = 5      # probes per direction that ``PairFit.residual_ns`` averages


@dataclass
class PairFit:
    """Clock of B relative to A over one window.

    ``clock_B - clock_A = offset_ns + drift_ppm * 1e-6 * (t - t_ref_ns)``, ``t`` on A's clock.

    Attributes:
        offset_ns: B - A at ``t_ref_ns``, ns.
        drift_ppm: slope of B - A against A's clock, ppm (1 ppm = 1 us/s).
        t_ref_ns: reference instant on A's clock, ns.
        n_fwd: A -> B probes used.
        n_rev: B -> A probes used.
        residual_ns: a scale of the fit's error, ns (see ``fit_pair`` / ``ntp_pair``); use it
            to weight edges of the network solve, e.g. ``1 / (residual_ns**2 + floor**2)``.
    """

    offset_ns: float
    drift_ppm: float
    t_ref_ns: int
    n_fwd: int
    n_rev: int
    residual_ns: float

    def offset_at(self, t_ns: int | np.ndarray) -> float | np.ndarray:
        """B - A in ns at ``t_ns`` (A's clock, int64 ns; scalar or array)."""
        dt = np.asarray(t_ns, dtype=np.int64) - np.int64(self.t_ref_ns)
        out = self.offset_ns + self.drift_ppm * 1e-6 * dt.astype(np.float64)
        return float(out) if np.ndim(out) == 0 else out

    def inverse(self) -> PairFit:
        """The same fit seen from B: ``clock_A - clock_B`` against B's clock.

        ``t_ref_ns`` moves to B's reading at A's ``t_ref_ns`` (rounded to the ns) and the slope
        becomes ``-r / (1 + r)`` (r = drift_ppm * 1e-6); ``n_fwd``/``n_rev`` swap. Use it for
        B -> A one-way delays (``agents.owd.owd_stats``).
        """
        r = self.drift_ppm * 1e-6
        r_inv = -r / (1.0 + r)
        shift = round(float(self.offset_ns))
        return PairFit(offset_ns=-self.offset_ns + r_inv * (shift - self.offset_ns),
                       drift_ppm=r_inv * 1e6, t_ref_ns=int(self.t_ref_ns + shift),
                       n_fwd=self.n_rev, n_rev=self.n_fwd, residual_ns=self.residual_ns)


def _as_ns(x, name: str) -> np.ndarray:
    """1-D int64 ns array. Floats are refused: at ~1.8e18 ns a float64 is only good to 256 ns."""
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integer ns timestamps (int64), got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


def _same_len(a: np.ndarray, b: np.ndarray, na: str, nb: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{na} and {nb} differ in length ({a.size} vs {b.size})")


def pure_pairs(tx: np.ndarray, rx: np.ndarray, pair_id: np.ndarray,
               guard_ns: float, segment: np.ndarray | None = None) -> np.ndarray:
    """Mask of the probes that belong to a pure coded pair (Geng et al., NSDI 2018).

    A coded pair is two probes sent back to back (send gap ``s = tx2 - tx1``); it is pure when
    the receive gap matches, ``|(rx2 - rx1) - (tx2 - tx1)| <= guard_ns``, i.e. neither probe
    was held back by queueing more than the other.

    Args:
        tx: shape (n,), int64 ns, send times on the sender's clock.
        rx: shape (n,), int64 ns, receive times on the receiver's clock.
        pair_id: shape (n,), integer ids; each pair's id appears for its 1st then its 2nd
            probe, in that order in the arrays (other probes may sit in between).
        guard_ns: guard band, ns (>= 0).
        segment: shape (n,), integers: probes of many directions at once, a pair being
            ``(segment, pair_id)`` (None: one direction).

    Returns:
        shape (n,) bool: True for both probes of every pure pair. Ids that do not appear
        exactly twice (a lost or duplicated probe) and pairs whose 2nd probe was not sent
        after the 1st are never pure.

    Raises:
        ValueError: arrays of different lengths, not 1-D or not integer, or a negative or
            non-finite guard.
    """
    tx = _as_ns(tx, "tx")
    rx = _as_ns(rx, "rx")
    pid = np.asarray(pair_id)
    if pid.ndim != 1:
        raise ValueError(f"pair_id must be 1-D, got shape {pid.shape}")
    _same_len(tx, rx, "tx", "rx")
    _same_len(tx, pid, "tx", "pair_id")
    if not np.isfinite(guard_ns) or guard_ns < 0:
        raise ValueError(f"guard_ns must be finite and >= 0, got {guard_ns}")
    mask = np.zeros(tx.size, dtype=bool)
    if tx.size < 2:
        return mask
    if segment is None:
        order = np.argsort(pid, kind="stable")  # stable: the 1st probe stays before the 2nd
        sid = pid[order]
        new = sid[1:] != sid[:-1]
    else:
        segment = np.asarray(segment)
        ds, dp = np.diff(segment), np.diff(pid)
        if ((ds > 0) | ((ds == 0) & (dp >= 0))).all():  # already sorted (a window's records)
            order, sid, new = None, pid, (ds != 0) | (dp != 0)
        else:
            order = np.lexsort((pid, segment))  # stable
            sid, sseg = pid[order], segment[order]
            new = (sid[1:] != sid[:-1]) | (sseg[1:] != sseg[:-1])
    starts = np.flatnonzero(np.r_[True, new])
    counts = np.diff(np.r_[starts, sid.size])
    s2 = starts[counts == 2]
    i1, i2 = (s2, s2 + 1) if order is None else (order[s2], order[s2 + 1])
    gap_tx = tx[i2] - tx[i1]
    gap_rx = rx[i2] - rx[i1]
    ok = (gap_tx > 0) & (np.abs((gap_rx - gap_tx).astype(np.float64)) <= guard_ns)
    mask[i1[ok]] = True
    mask[i2[ok]] = True
    return mask


def _check_dirs(fwd_tx, fwd_rx, rev_tx, rev_rx):
    ftx, frx = _as_ns(fwd_tx, "fwd_tx"), _as_ns(fwd_rx, "fwd_rx")
    rtx, rrx = _as_ns(rev_tx, "rev_tx"), _as_ns(rev_rx, "rev_rx")
    _same_len(ftx, frx, "fwd_tx", "fwd_rx")
    _same_len(rtx, rrx, "rev_tx", "rev_rx")
    for name, n in (("fwd (A->B)", ftx.size), ("rev (B->A)", rtx.size)):
        if n < MIN_PROBES:
            raise ValueError(f"{name} has {n} probe(s); the fit needs at least {MIN_PROBES} "
                             "in each direction")
    return ftx, frx, rtx, rrx


class Probes(NamedTuple):
    """The probes of many pairs at once, each pair a segment (``agents.segments``): pair i's
    A -> B probes are ``fwd_*[fwd_starts[i]:fwd_starts[i + 1]]``, its B -> A probes
    ``rev_*[rev_starts[i]:rev_starts[i + 1]]``; int64 ns, conventions of this module; at
    least ``MIN_PROBES`` per direction and pair."""

    fwd_tx: np.ndarray
    fwd_rx: np.ndarray
    fwd_starts: np.ndarray
    rev_tx: np.ndarray
    rev_rx: np.ndarray
    rev_starts: np.ndarray

    @classmethod
    def one(cls, fwd_tx, fwd_rx, rev_tx, rev_rx) -> Probes:
        """One pair's probes (checked: ``ValueError`` as ``fit_pair`` says)."""
        ftx, frx, rtx, rrx = _check_dirs(fwd_tx, fwd_rx, rev_tx, rev_rx)
        return cls(ftx, frx, np.array([0, ftx.size]), rtx, rrx, np.array([0, rtx.size]))

    def default_ref(self) -> np.ndarray:
        """Per pair the middle of its probes' span on A's clock, int64 ns."""
        fs, rs = self.fwd_starts[:-1], self.rev_starts[:-1]
        lo = np.minimum(np.minimum.reduceat(self.fwd_tx, fs), np.minimum.reduceat(self.rev_rx, rs))
        hi = np.maximum(np.maximum.reduceat(self.fwd_tx, fs), np.maximum.reduceat(self.rev_rx, rs))
        return lo + (hi - lo) // 2


class PairFits(NamedTuple):
    """Many pairs' fits (arrays, one entry per pair; ``PairFit``'s fields) and whether each
    succeeded (``ok``; the other fields of a failed one are meaningless)."""

    offset_ns: np.ndarray
    drift_ppm: np.ndarray
    t_ref_ns: np.ndarray
    n_fwd: np.ndarray
    n_rev: np.ndarray
    residual_ns: np.ndarray
    ok: np.ndarray

    def fit(self, i: int) -> PairFit:
        """Pair ``i``'s fit."""
        return PairFit(offset_ns=float(self.offset_ns[i]), drift_ppm=float(self.drift_ppm[i]),
                       t_ref_ns=int(self.t_ref_ns[i]), n_fwd=int(self.n_fwd[i]),
                       n_rev=int(self.n_rev[i]), residual_ns=float(self.residual_ns[i]))

    def offset_at(self, t_ns: np.ndarray) -> np.ndarray:
        """Each pair's B - A (ns) at its own A-clock instant ``t_ns`` (int64, one per pair),
        as ``PairFit.offset_at``."""
        dt = (np.asarray(t_ns, dtype=np.int64) - self.t_ref_ns).astype(np.float64)
        return self.offset_ns + self.drift_ppm * 1e-6 * dt


_PRUNE_AFTER = 2  # steps of ``_max_margin_many`` before it drops the probes that cannot bind


def _can_bind(x: np.ndarray, y: np.ndarray, starts: np.ndarray, seg: np.ndarray,
              lo: np.ndarray, hi: np.ndarray, best: np.ufunc
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The points ``(x, y)`` of each segment that can be the ``best`` (``np.minimum``: the
    least, ``np.maximum``: the greatest) of ``y - m * x`` for a slope ``m`` in the segment's
    bracket ``[lo, hi]``: ``(x, y, starts, seg)`` of those, in order. ``y - m * x`` is
    monotone in ``m`` (in floats too), so a point whose value at either end of the bracket
    is worse than some point's value at both ends never is the best, nor ties with it: the
    ``piece`` of ``_max_margin_many`` finds the same points, and the same first one."""
    at_lo = y - segments.spread(lo, starts) * x
    at_hi = y - segments.spread(hi, starts) * x
    if best is np.minimum:
        keep = np.minimum(at_lo, at_hi) <= segments.spread(np.minimum.reduceat(
            np.maximum(at_lo, at_hi), starts[:-1]), starts)
    else:
        keep = np.maximum(at_lo, at_hi) >= segments.spread(np.maximum.reduceat(
            np.minimum(at_lo, at_hi), starts[:-1]), starts)
    seg = seg[keep]
    return x[keep], y[keep], segments.starts_of(np.bincount(seg, minlength=starts.size - 1)), seg


def _max_margin_many(xu: np.ndarray, yu: np.ndarray, us: np.ndarray, xl: np.ndarray,
                     yl: np.ndarray, ls: np.ndarray, m_bound: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``_max_margin`` for many pairs at once: pair i's points are the segments i of
    ``(xu, yu)`` (starts ``us``) and ``(xl, yl)`` (starts ``ls``); every pair takes the
    same steps with the same floats as alone, all pairs one numpy call per step. Returns
    arrays ``(c, m, D, at_bound)``."""
    useg, lseg = segments.ids(us), segments.ids(ls)

    def piece(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i = segments.argmin(yu - segments.spread(m, us) * xu, us)
        j = segments.argmax(yl - segments.spread(m, ls) * xl, ls)
        return yu[i] - yl[j], xl[j] - xu[i]

    n = us.size - 1
    lo, hi = np.full(n, -m_bound), np.full(n, m_bound)
    a_lo, s_lo = piece(lo)
    a_hi, s_hi = piece(hi)
    at_hi = s_hi >= 0
    at_lo = ~at_hi & (s_lo <= 0)
    m = np.where(at_hi, hi, lo)
    at_bound = (at_hi & (s_hi > 0)) | (at_lo & (s_lo < 0))
    active = ~at_hi & ~at_lo
    tol = m_bound * 4e-16 + 1e-12
    with np.errstate(divide="ignore", invalid="ignore"):
        for step_no in range(200):  # a few steps; the cap only guards float corner cases
            if not active.any():
                break
            if step_no == _PRUNE_AFTER:  # the slopes are bracketed: drop what cannot bind
                xu, yu, us, useg = _can_bind(xu, yu, us, useg, lo, hi, np.minimum)
                xl, yl, ls, lseg = _can_bind(xl, yl, ls, lseg, lo, hi, np.maximum)
            step = (a_hi - a_lo) / (s_lo - s_hi)
            step = np.where((lo < step) & (step < hi), step, 0.5 * (lo + hi))
            m = np.where(active, step, m)
            a, sl = piece(m)
            bound = np.minimum(a_lo + s_lo * m, a_hi + s_hi * m)
            done = (sl == 0) | (a + sl * m >= bound - 1e-9 * np.maximum(1.0, np.abs(bound))) \
                | (hi - lo <= tol)
            active &= ~done
            rise, fall = active & (sl > 0), active & ~(sl > 0)
            lo, a_lo, s_lo = (np.where(rise, m, lo), np.where(rise, a, a_lo),
                              np.where(rise, sl, s_lo))
            hi, a_hi, s_hi = (np.where(fall, m, hi), np.where(fall, a, a_hi),
                              np.where(fall, sl, s_hi))
    up = np.minimum.reduceat(yu - segments.spread(m, us) * xu, us[:-1])
    dn = np.maximum.reduceat(yl - segments.spread(m, ls) * xl, ls[:-1])
    return 0.5 * (up + dn), m, 0.5 * (up - dn), at_bound


def _max_margin(xu: np.ndarray, yu: np.ndarray, xl: np.ndarray, yl: np.ndarray,
                m_bound: float) -> tuple[float, float, float, bool]:
    """Solve the LP  max D  s.t.  c + m*xu + D <= yu,  c + m*xl - D >= yl,  |m| <= m_bound.

    For a fixed slope m the best c and D are closed-form, and the margin
    g(m) = min(yu - m*xu) - max(yl - m*xl) = 2*D(m) is concave and piecewise linear in m; the
    piece active at m has slope xl[j*] - xu[i*] (i*, j* the binding probes). The optimum is
    bracketed by a point where g rises and one where it falls; the pieces active there are
    upper bounds of g (concavity), and where they cross either g touches them (the optimum)
    or the crossing is a new bracket end: each step retires a piece, so a few steps suffice
    (bisection takes over should rounding put a crossing outside the bracket). The same
    optimum as the LP solved by a generic solver (the unit tests check it against
    ``scipy.optimize.linprog``), in a fraction of a millisecond (``_max_margin_many`` solves
    many pairs' LPs at once).

    Returns:
        (c, m, D, at_bound): at_bound is True when the optimum sits on |m| == m_bound, i.e. the
        two directions do not constrain the slope (their probes do not interleave in time).
    """
    c, m, d, at = _max_margin_many(xu, yu, np.array([0, xu.size]), xl, yl,
                                   np.array([0, xl.size]), m_bound)
    return float(c[0]), float(m[0]), float(d[0]), bool(at[0])


def fit_many(p: Probes, t_ref_ns: np.ndarray | None = None, *,
             max_drift_ppm: float = MAX_DRIFT_PPM) -> PairFits:
    """``fit_pair`` of every pair of ``p`` at once (the same floats as one by one); a pair
    whose probes do not interleave in time (``fit_pair`` raises) has ``ok`` False.

    Args:
        p: the pairs' probes.
        t_ref_ns: shape (n_pairs,), int64: each pair's A-clock reference instant (default:
            the middle of its probes' span).
        max_drift_ppm: largest |drift| searched, ppm.
    """
    fs, rs = p.fwd_starts, p.rev_starts
    t_ref = p.default_ref() if t_ref_ns is None else np.asarray(t_ref_ns, dtype=np.int64)
    yu_i = p.fwd_rx - p.fwd_tx          # (B - A) + d_AB, exact int64
    yl_i = p.rev_tx - p.rev_rx          # (B - A) - d_BA
    # ~ the offset, removed before float
    y0 = (np.minimum.reduceat(yu_i, fs[:-1]) + np.maximum.reduceat(yl_i, rs[:-1])) // 2
    yu = (yu_i - segments.spread(y0, fs)).astype(np.float64)
    yl = (yl_i - segments.spread(y0, rs)).astype(np.float64)
    xu = (p.fwd_tx - segments.spread(t_ref, fs)).astype(np.float64) / _NS_PER_S   # seconds
    xl = (p.rev_rx - segments.spread(t_ref, rs)).astype(np.float64) / _NS_PER_S
    c, m, _, at_bound = _max_margin_many(xu, yu, fs, xl, yl, rs, max_drift_ppm * _PPM_NS_PER_S)
    up_gap = yu - (segments.spread(c, fs) + segments.spread(m, fs) * xu)
    dn_gap = (segments.spread(c, rs) + segments.spread(m, rs) * xl) - yl
    # the band's half-width, ~ d_min
    margin = 0.5 * (np.minimum.reduceat(up_gap, fs[:-1]) + np.minimum.reduceat(dn_gap, rs[:-1]))
    resid = 0.5 * (segments.head_mean(up_gap - segments.spread(margin, fs), fs, _ENVELOPE_K)
                   + segments.head_mean(dn_gap - segments.spread(margin, rs), rs, _ENVELOPE_K))
    return PairFits(offset_ns=y0 + c, drift_ppm=m / _PPM_NS_PER_S, t_ref_ns=t_ref,
                    n_fwd=np.diff(fs), n_rev=np.diff(rs), residual_ns=np.maximum(resid, 0.0),
                    ok=~at_bound)


def fit_pair(fwd_tx, fwd_rx, rev_tx, rev_rx, t_ref_ns: int | None = None, *,
             max_drift_ppm: float = MAX_DRIFT_PPM) -> PairFit:
    """Huygens estimate of B's clock relative to A's from the probes' lower envelopes.

    Every A -> B probe sent at ``tx`` (A's clock) bounds B - A from above:
    ``rx_B - tx_A = (B - A)(tx_A) + d_AB >= (B - A)(tx_A) + d_min``; every B -> A probe received
    at ``rx_A`` bounds it from below: ``tx_B - rx_A = (B - A)(rx_A) - d_BA``. Assuming equal
    minimum delays both ways, the line B - A = offset + drift * (t - t_ref) is the centre line
    of the widest band that separates the two point sets (the "forbidden zone"): a hard-margin
    linear SVM / linear program, Geng et al., "Exploiting a Natural Network Effect for Scalable,
    Fine-grained Clock Synchronization", NSDI 2018. Only probes near the minimum
    delay (the envelopes) decide the line, so queueing on either direction, symmetric or not,
    does not bias it; a probe faster than the true minimum (a bad timestamp) would. Pass only
    probes of pure coded pairs (``pure_pairs``). The half-width of the band is the common
    minimum one-way delay; an unequal minimum delay biases the offset by half the difference
    (undetectable from timestamps, as for every two-way method).

    Args:
        fwd_tx, fwd_rx: shape (n_fwd,), int64 ns; A -> B probes, tx on A's clock, rx on B's.
        rev_tx, rev_rx: shape (n_rev,), int64 ns; B -> A probes, tx on B's clock, rx on A's.
        t_ref_ns: A-clock instant (int ns) the offset refers to; default: the middle of the
            probes' span on A's clock (the least correlated offset and drift).
        max_drift_ppm: largest |drift| searched, ppm.

    Returns:
        PairFit; ``residual_ns`` is the mean distance to the fitted envelope of the
        ``min(5, n)`` probes nearest to it in each direction, averaged over both: it scales like
        the spacing of near-minimal delays (the error of the envelope), not like the queueing.

    Raises:
        ValueError: fewer than ``MIN_PROBES`` probes in a direction, mismatched lengths,
            non-integer timestamps, or probes of the two directions that do not interleave in
            time (the slope is then unconstrained).
    """
    p = Probes.one(fwd_tx, fwd_rx, rev_tx, rev_rx)
    fits = fit_many(p, None if t_ref_ns is None else np.array([t_ref_ns], dtype=np.int64),
                    max_drift_ppm=max_drift_ppm)
    if not fits.ok[0]:
        raise ValueError(
            "fwd and rev probes do not interleave in time: the drift is unconstrained "
            f"(fit hit |drift| = {max_drift_ppm} ppm); probe both directions over the window")
    return fits.fit(0)


def line_fits(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ordinary least-squares lines ``y[i] = intercept[i] + slope[i] * x`` of every row of
    ``y`` over its points (NaN: no point there), closed form on centred data (the same lines
    as ``np.polyfit`` row by row, without its SVD, all rows at once).

    Args:
        x: shape (n,) float.
        y: shape (m, n) float, NaN where row i has no point.

    Returns:
        ``(slope, intercept)``, arrays (m,); NaN for a row with fewer than 2 points or whose
        points' x are all equal.
    """
    ok = np.isfinite(y)
    n = ok.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mx = np.where(ok, x, 0.0).sum(axis=1) / n
        my = np.where(ok, y, 0.0).sum(axis=1) / n
        dx = np.where(ok, x - mx[:, None], 0.0)
        sxx = (dx * dx).sum(axis=1)
        slope = (dx * np.where(ok, y - my[:, None], 0.0)).sum(axis=1) / sxx
        slope = np.where((n >= 2) & (sxx > 0), slope, np.nan)
        return slope, my - slope * mx


def ntp_pair(fwd_tx, fwd_rx, rev_tx, rev_rx, t_ref_ns: int | None = None, *,
             filter_n: int = 8) -> PairFit:
    """NTP-style baseline (symmetric delay assumed) on the same probes as ``fit_pair``.

    Exactly what is computed:

    1. Each A -> B probe i (t1 = tx_A, t2 = rx_B) is matched with the B -> A probe j whose
       arrival t4 = rx_A is nearest to t1 on A's clock (t3 = tx_B); rev probes may be reused.
    2. NTP on-wire sample (RFC 5905, section 8): offset ``((t2 - t1) - (t4 - t3)) / 2``,
       delay ``(t4 - t1) - (t3 - t2)``, placed at time ``(t1 + t4) / 2`` (for a linear clock
       the sample is exact there up to ``(d_AB - d_BA) / 2``, the asymmetry bias).
    3. Clock filter (RFC 5905, section 10): samples in time order are cut into consecutive
       blocks of ``filter_n``; the sample of least delay in each block is kept
       (``filter_n=1`` keeps all).
    4. Offset and drift: ordinary least-squares line through the kept samples.

    Args:
        fwd_tx, fwd_rx, rev_tx, rev_rx, t_ref_ns: as for ``fit_pair``.
        filter_n: block length of the min-delay filter (>= 1).

    Returns:
        PairFit; ``residual_ns`` is the RMS residual of the least-squares line.

    Raises:
        ValueError: fewer than ``MIN_PROBES`` probes in a direction, mismatched lengths,
            non-integer timestamps, ``filter_n < 1``, or fewer than 2 distinct sample times
            after filtering (use a smaller ``filter_n``).
    """
    if filter_n < 1:
        raise ValueError(f"filter_n must be >= 1, got {filter_n}")
    p = Probes.one(fwd_tx, fwd_rx, rev_tx, rev_rx)
    fits = ntp_many(p, np.array([filter_n]),
                    None if t_ref_ns is None else np.array([t_ref_ns], dtype=np.int64))
    if not fits.ok[0]:
        kept = -(-p.fwd_tx.size // filter_n)
        raise ValueError(f"ntp_pair: {kept} sample(s) after the filter (filter_n="
                         f"{filter_n}); need 2 at distinct times")
    return fits.fit(0)


def ntp_many(p: Probes, filter_n: np.ndarray, t_ref_ns: np.ndarray | None = None) -> PairFits:
    """``ntp_pair`` of every pair of ``p`` at once, pair i with the clock filter's block
    ``filter_n[i]`` (>= 1); a pair with fewer than 2 distinct sample times after its filter
    (``ntp_pair`` raises) has ``ok`` False."""
    fs, rs = p.fwd_starts, p.rev_starts
    fseg, rseg = segments.ids(fs), segments.ids(rs)
    nf, nr = np.diff(fs), np.diff(rs)
    t_ref = p.default_ref() if t_ref_ns is None else np.asarray(t_ref_ns, dtype=np.int64)
    order = segments.sort_ns(p.rev_rx, rseg, t_ref)
    t4s, t3s = p.rev_rx[order], p.rev_tx[order]
    # each fwd probe's place among its pair's sorted rev arrivals (np.searchsorted, "left"):
    # the rev arrivals before it, counted in one sort of both (a tie puts fwd first)
    times = np.concatenate([p.fwd_tx, t4s])
    is_rev = np.r_[np.zeros(p.fwd_tx.size, np.int64), np.ones(t4s.size, np.int64)]
    merged = segments.sort_ns(times, np.concatenate([fseg, rseg]), t_ref, low=is_rev)
    before_count = np.cumsum(is_rev[merged]) - is_rev[merged]
    place = np.empty(merged.size, np.int64)
    place[merged] = before_count
    r0 = segments.spread(rs[:-1], fs)  # per fwd probe its pair's first rev probe
    k = np.clip(place[:p.fwd_tx.size] - r0, 1, segments.spread(nr, fs) - 1) + r0
    before, after = t4s[k - 1], t4s[k]
    j = np.where(np.abs(p.fwd_tx - before) <= np.abs(after - p.fwd_tx), k - 1, k)
    t1, t2, t3, t4 = p.fwd_tx, p.fwd_rx, t3s[j], t4s[j]
    off = 0.5 * ((t2 - t1) - (t4 - t3)).astype(np.float64)
    delay = ((t4 - t1) - (t3 - t2)).astype(np.float64)
    tf = segments.spread(t_ref, fs)
    mid2 = (t1 - tf) + (t4 - tf)   # twice the sample's time, exact
    x = (mid2.astype(np.float64) * 0.5) / _NS_PER_S
    srt = segments.sort_ns(mid2, fseg, np.zeros(nf.size, np.int64))  # stable, as by x
    x, off, delay = x[srt], off[srt], delay[srt]
    # clock filter: blocks of filter_n[i] consecutive samples, the least delay of each
    block = (np.arange(x.size) - segments.spread(fs[:-1], fs)) // segments.spread(
        np.asarray(filter_n), fs)
    bstarts = np.flatnonzero(np.r_[True, (fseg[1:] != fseg[:-1]) | (block[1:] != block[:-1])])
    bstarts = np.r_[bstarts, x.size]
    keep = segments.argmin(delay, bstarts)
    x, off, kseg = x[keep], off[keep], fseg[keep]
    ks = segments.starts_of(np.bincount(kseg, minlength=nf.size))
    n = np.diff(ks)
    ok = (n >= 2) & (x[ks[:-1]] != x[ks[1:] - 1])  # x is sorted within pairs
    so = segments.sorted_values(off, ks, kseg)
    mid = ks[:-1] + n // 2
    y0 = np.where(n % 2 == 1, so[mid], (so[np.maximum(mid - 1, ks[:-1])] + so[mid]) / 2)
    y = off - segments.spread(y0, ks)
    # ordinary least squares (line_fits) per pair
    mx = np.add.reduceat(x, ks[:-1]) / n
    my = np.add.reduceat(y, ks[:-1]) / n
    dx = x - segments.spread(mx, ks)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.add.reduceat(dx * (y - segments.spread(my, ks)), ks[:-1]) / np.add.reduceat(
            dx * dx, ks[:-1])
    icpt = my - slope * mx
    resid = y - (segments.spread(icpt, ks) + segments.spread(slope, ks) * x)
    rms = np.sqrt(np.add.reduceat(resid ** 2, ks[:-1]) / n)
    return PairFits(offset_ns=y0 + icpt, drift_ppm=slope / _PPM_NS_PER_S, t_ref_ns=t_ref,
                    n_fwd=nf, n_rev=nr, residual_ns=rms, ok=ok)
