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

import numpy as np

__all__ = ["MAX_DRIFT_PPM", "MIN_PROBES", "PairFit", "fit_pair", "line_fit", "ntp_pair",
           "pure_pairs"]

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
               guard_ns: float) -> np.ndarray:
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
    order = np.argsort(pid, kind="stable")  # stable: the 1st probe stays before the 2nd
    sid = pid[order]
    starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
    counts = np.diff(np.r_[starts, sid.size])
    s2 = starts[counts == 2]
    i1, i2 = order[s2], order[s2 + 1]
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


def _default_ref(ftx: np.ndarray, rrx: np.ndarray) -> int:
    lo = min(int(ftx.min()), int(rrx.min()))
    hi = max(int(ftx.max()), int(rrx.max()))
    return lo + (hi - lo) // 2


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
    ``scipy.optimize.linprog``), in a fraction of a millisecond.

    Returns:
        (c, m, D, at_bound): at_bound is True when the optimum sits on |m| == m_bound, i.e. the
        two directions do not constrain the slope (their probes do not interleave in time).
    """
    def piece(m: float) -> tuple[float, float]:
        """(intercept, slope) of the piece of g active at m."""
        i = int(np.argmin(yu - m * xu))
        j = int(np.argmax(yl - m * xl))
        return float(yu[i] - yl[j]), float(xl[j] - xu[i])

    lo, hi = -m_bound, m_bound
    a_lo, s_lo = piece(lo)
    a_hi, s_hi = piece(hi)
    if s_hi >= 0:
        m, at_bound = hi, s_hi > 0
    elif s_lo <= 0:
        m, at_bound = lo, s_lo < 0
    else:
        at_bound = False
        tol = m_bound * 4e-16 + 1e-12
        for _ in range(200):  # a few steps; the cap only guards float corner cases
            m = (a_hi - a_lo) / (s_lo - s_hi)
            if not lo < m < hi:
                m = 0.5 * (lo + hi)
            a, sl = piece(m)
            bound = min(a_lo + s_lo * m, a_hi + s_hi * m)
            if sl == 0 or a + sl * m >= bound - 1e-9 * max(1.0, abs(bound)) or hi - lo <= tol:
                break
            if sl > 0:
                lo, a_lo, s_lo = m, a, sl
            else:
                hi, a_hi, s_hi = m, a, sl
    up = float(np.min(yu - m * xu))
    dn = float(np.max(yl - m * xl))
    return 0.5 * (up + dn), m, 0.5 * (up - dn), at_bound


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
    ftx, frx, rtx, rrx = _check_dirs(fwd_tx, fwd_rx, rev_tx, rev_rx)
    if t_ref_ns is None:
        t_ref_ns = _default_ref(ftx, rrx)
    t_ref = np.int64(t_ref_ns)
    yu_i = frx - ftx          # (B - A) + d_AB, exact int64
    yl_i = rtx - rrx          # (B - A) - d_BA
    y0 = (int(yu_i.min()) + int(yl_i.max())) // 2   # ~ the offset, removed before float
    yu = (yu_i - y0).astype(np.float64)
    yl = (yl_i - y0).astype(np.float64)
    xu = (ftx - t_ref).astype(np.float64) / _NS_PER_S   # seconds
    xl = (rrx - t_ref).astype(np.float64) / _NS_PER_S
    c, m, _, at_bound = _max_margin(xu, yu, xl, yl, max_drift_ppm * _PPM_NS_PER_S)
    if at_bound:
        raise ValueError(
            "fwd and rev probes do not interleave in time: the drift is unconstrained "
            f"(fit hit |drift| = {max_drift_ppm} ppm); probe both directions over the window")
    up_gap = np.sort(yu - (c + m * xu))
    dn_gap = np.sort((c + m * xl) - yl)
    k_u, k_l = min(_ENVELOPE_K, up_gap.size), min(_ENVELOPE_K, dn_gap.size)
    margin = 0.5 * (up_gap[0] + dn_gap[0])  # the band's half-width, ~ d_min
    resid = 0.5 * (float(np.mean(up_gap[:k_u] - margin)) + float(np.mean(dn_gap[:k_l] - margin)))
    return PairFit(offset_ns=y0 + c, drift_ppm=m / _PPM_NS_PER_S, t_ref_ns=int(t_ref),
                   n_fwd=int(ftx.size), n_rev=int(rtx.size), residual_ns=max(resid, 0.0))


def line_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Ordinary least-squares line ``y = intercept + slope * x``, closed form on centred data
    (the same line as ``np.polyfit(x, y, 1)``, without its SVD: ~50x faster on short series).

    Args:
        x, y: shape (n,) float arrays, n >= 2, x not all equal.

    Returns:
        ``(slope, intercept)``.

    Raises:
        ValueError: fewer than 2 points or all x equal.
    """
    if x.size < 2:
        raise ValueError(f"a line needs 2 points, got {x.size}")
    mx, my = float(x.mean()), float(y.mean())
    dx = x - mx
    sxx = float(dx @ dx)
    if sxx == 0.0:
        raise ValueError("all x are equal: the slope is undefined")
    slope = float(dx @ (y - my)) / sxx
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
    ftx, frx, rtx, rrx = _check_dirs(fwd_tx, fwd_rx, rev_tx, rev_rx)
    if t_ref_ns is None:
        t_ref_ns = _default_ref(ftx, rrx)
    t_ref = np.int64(t_ref_ns)
    order = np.argsort(rrx, kind="stable")
    t4s, t3s = rrx[order], rtx[order]
    k = np.clip(np.searchsorted(t4s, ftx), 1, t4s.size - 1)
    before, after = t4s[k - 1], t4s[k]
    j = np.where(np.abs(ftx - before) <= np.abs(after - ftx), k - 1, k)
    t1, t2, t3, t4 = ftx, frx, t3s[j], t4s[j]
    off = 0.5 * ((t2 - t1) - (t4 - t3)).astype(np.float64)
    delay = ((t4 - t1) - (t3 - t2)).astype(np.float64)
    x = (((t1 - t_ref) + (t4 - t_ref)).astype(np.float64) * 0.5) / _NS_PER_S
    srt = np.argsort(x, kind="stable")
    x, off, delay = x[srt], off[srt], delay[srt]
    if filter_n > 1:  # blocks of filter_n (the last one padded with +inf delays)
        blocks = -(-x.size // filter_n)
        padded = np.full(blocks * filter_n, np.inf)
        padded[:x.size] = delay
        keep = np.arange(blocks) * filter_n + padded.reshape(blocks, filter_n).argmin(axis=1)
        x, off = x[keep], off[keep]
    if x.size < 2 or x[0] == x[-1]:  # x is sorted
        raise ValueError(f"ntp_pair: {x.size} sample(s) after the filter (filter_n="
                         f"{filter_n}); need 2 at distinct times")
    y0 = float(np.median(off))
    slope, icpt = line_fit(x, off - y0)
    resid = (off - y0) - (icpt + slope * x)
    return PairFit(offset_ns=y0 + float(icpt), drift_ppm=float(slope) / _PPM_NS_PER_S,
                   t_ref_ns=int(t_ref), n_fwd=int(ftx.size), n_rev=int(rtx.size),
                   residual_ns=float(np.sqrt(np.mean(resid ** 2))))
