"""The statistics behind ``agents.collocation.group``: the low-frequency cosine bases, the
clusters' pooled drift and offset series, and the chi-square tests of "same oscillator" between
clusters (many pairs at once), with the noise floors they compare against. See
``agents.collocation`` for the model and its sources.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.special import chdtrc  # chi-square survival function, a plain ufunc

MIN_WINDOWS = 3
"""Fewest windows that two VMs must share before they can be grouped."""


def _low_basis(rel: np.ndarray, min_period: float) -> np.ndarray:
    """Orthonormal basis, shape (len(rel), k), of the k lowest DCT-II cosines over the span of
    the window indices ``rel`` (sorted, rel[0] == 0), sampled at ``rel``;
    ``k = min(n - 1, 1 + floor(2 * span / min_period))``."""
    n = rel.size
    span = int(rel[-1]) + 1
    k = _dof(n, span, min_period)
    j = np.arange(k)
    basis = np.cos(np.pi * (rel[:, None] + 0.5) * j[None, :] / span)
    q, _ = np.linalg.qr(basis)
    return q


def _dof(n: int | np.ndarray, span: int | np.ndarray, min_period: float) -> int | np.ndarray:
    """Cosines of the low basis of ``n`` samples over ``span`` windows (``_low_basis``)."""
    return np.maximum(1, np.minimum(n - 1, 1 + (2 * span // min_period).astype(int))) \
        if isinstance(n, np.ndarray) else max(1, min(n - 1, 1 + int(2 * span // min_period)))


class Bases:
    """Low-frequency bases by sampling pattern (most pairs share one)."""

    def __init__(self, min_period: float):
        self.min_period = min_period
        self._cache: dict[bytes, np.ndarray] = {}

    def __call__(self, ok: np.ndarray) -> np.ndarray:
        idx = np.flatnonzero(ok)
        rel = idx - idx[0]
        key = rel.tobytes()
        q = self._cache.get(key)
        if q is None:
            q = self._cache[key] = _low_basis(rel, self.min_period)
        return q


Z_CLIP = 4.0
"""Test samples are clipped to +-Z_CLIP sigmas: one window hit by a queue (a biased offset, a
drift off by 1 ppm) adds at most Z_CLIP**2 to a statistic instead of splitting a host; white
Gaussian noise is hardly touched (6e-5 of the samples lie beyond 4 sigmas)."""


@dataclass
class Cluster:
    members: list[int]
    total: np.ndarray   # (n_windows,) sum of the members' drift samples (NaN counted as 0)
    count: np.ndarray   # (n_windows,) members with a drift sample
    ototal: np.ndarray  # (n_windows,) sum of the members' offsets (NaN counted as 0)
    ocount: np.ndarray  # (n_windows,) members with an offset

    def merged(self, other: Cluster) -> Cluster:
        return Cluster(self.members + other.members, self.total + other.total,
                        self.count + other.count, self.ototal + other.ototal,
                        self.ocount + other.ocount)


_SERIES = ("total", "count", "ototal", "ocount")


def _bounds(total: np.ndarray, count: np.ndarray, common: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row of clusters' series (L, n_windows; ``common``: the drift series' common mode,
    (n_windows,)): the range ``lo``, ``hi`` of the mean drift less the common mode over the
    windows with data and the fewest members with data in a window ``cmin`` (NaN without
    any), for ``_separated``; ``complete``, 1.0 where every window has data. Arrays (L,),
    all rows in one numpy call each (a cluster at a time cost 0.1 ms, 960 of them at 256 VMs)."""
    has = count > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        dev = total / count - common
    some = has.any(axis=1)
    lo = np.where(some, np.min(dev, axis=1, where=has, initial=np.inf), np.nan)
    hi = np.where(some, np.max(dev, axis=1, where=has, initial=-np.inf), np.nan)
    cmin = np.where(some, np.min(count, axis=1, where=has, initial=np.inf), np.nan)
    return lo, hi, cmin, has.all(axis=1).astype(np.float64)


class Stack(NamedTuple):
    """Several clusters' series stacked, one row each (``Cluster``'s arrays, (L, n_windows),
    its bounds ``lo``, ``hi``, ``cmin``, ``complete`` (L,) (``_bounds``) and ``sizes`` (L,)
    members)."""

    total: np.ndarray
    count: np.ndarray
    ototal: np.ndarray
    ocount: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    cmin: np.ndarray
    complete: np.ndarray
    sizes: np.ndarray

    @classmethod
    def of(cls, clusters: list[Cluster], common: np.ndarray) -> Stack:
        total, count, ototal, ocount = (np.array([getattr(c, f) for c in clusters])
                                        for f in _SERIES)
        return cls(total, count, ototal, ocount, *_bounds(total, count, common),
                   np.array([len(c.members) for c in clusters], dtype=np.float64))

    def rows(self, idx: np.ndarray | None = None) -> _Rows:
        """Rows ``idx`` (default all) of the stack."""
        return _Rows(self, np.arange(len(self.sizes)) if idx is None else np.asarray(idx))


class _Rows:
    """Rows ``idx`` of a ``Stack`` (clusters' rows of a test), each field copied out only
    when read: most tests read the counts of every row and the series of a few."""

    def __init__(self, stack: Stack, idx: np.ndarray):
        self.stack, self.idx = stack, idx

    def __getattr__(self, field: str) -> np.ndarray:
        return getattr(self.stack, field)[self.idx]

    def __len__(self) -> int:
        return self.idx.size

    @property
    def windows(self) -> int:
        return self.stack.count.shape[1]

    def take(self, rows: np.ndarray) -> _Rows:
        return _Rows(self.stack, self.idx[rows])

    def pick(self, rows: np.ndarray) -> _Rows:
        """``take(rows)``, or these rows themselves when they are one (broadcast to all)."""
        return self if self.idx.size == 1 else self.take(rows)


class Pool:
    """The live clusters' series in preallocated rows by cluster id: a test against all
    others indexes rows instead of stacking hundreds of arrays per call."""

    def __init__(self, n_ids: int, n_windows: int):
        self.rows = Stack(*(np.zeros((n_ids, n_windows)) for _ in range(4)),
                           *(np.zeros(n_ids) for _ in range(5)))

    def put_stack(self, cids: np.ndarray, stack: Stack) -> None:
        """Rows ``cids`` of the pool become the rows of ``stack``."""
        for arr, rows in zip(self.rows, stack, strict=True):
            arr[cids] = rows


def _separated(a: _Rows, others: _Rows, s2: float) -> np.ndarray:
    """Per row whether the other cluster's mean drift and ``a``'s are so far apart in every window
    that the test's z is beyond ``Z_CLIP`` with one sign throughout (saturated), known
    without computing z: the common mode cancels in their difference, so the ranges of
    ``mean - common`` separated by ``Z_CLIP`` times the largest sigma (fewest members)
    suffice. Hosts whose drifts differ by far more than the noise, most pairs at 256 VMs."""
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = Z_CLIP * np.sqrt(s2 * (1.0 / a.cmin + 1.0 / others.cmin)) * (1 + 1e-9)
        return (a.lo - others.hi >= gap) | (others.lo - a.hi >= gap)


def components(single: Stack, nv: int, s2: float, alpha: float) -> np.ndarray:
    """Per VM (rows ``0..nv-1`` of ``single``, one VM each) a component, shape (nv,) int,
    such that the greedy merges never join VMs of two components: any clusters made of VMs
    of different components are ``_separated`` (a saturated statistic, whose p-value is
    below ``alpha``) or share fewer than ``MIN_WINDOWS`` windows (never merged).

    A cluster's mean drift less the common mode lies within its members' ranges in every
    window and its sigma is at most a single VM's, so VMs whose ranges, sorted, leave a gap
    of ``_separated``'s width for single VMs (with a margin for rounding) split the VMs into
    components that stay apart. VMs with fewer than ``MIN_WINDOWS`` samples are components
    of their own; all VMs are one component when a saturated statistic could reach
    ``alpha`` (a tiny ``alpha``)."""
    w = single.count.shape[1]
    n = np.arange(MIN_WINDOWS, max(w, MIN_WINDOWS) + 1)
    if not (chdtrc(n - 1, Z_CLIP ** 2 * n) < alpha).all():  # k <= n - 1 dof: the largest p
        return np.zeros(nv, dtype=int)
    lo, hi = single.lo[:nv], single.hi[:nv]
    few = (single.count[:nv] > 0).sum(axis=1) < MIN_WINDOWS
    gap = Z_CLIP * np.sqrt(s2 * 2.0) * (1 + 1e-6)
    order = np.flatnonzero(~few)
    order = order[np.argsort(lo[order], kind="stable")]
    comp = np.empty(nv, dtype=int)
    if order.size:
        reach = np.maximum.accumulate(hi[order])
        comp[order] = np.cumsum(np.r_[False, lo[order[1:]] - reach[:-1] >= gap])
    start = int(comp[order].max()) + 1 if order.size else 0
    comp[few] = start + np.arange(int(few.sum()))
    return comp


def _project(z: np.ndarray, ok: np.ndarray, bases: Bases, skip_constant: bool
             ) -> tuple[np.ndarray, np.ndarray]:
    """Energy of each row of ``z`` (L, n_windows) on the low cosines of its windows ``ok``:
    ``(S, k)`` arrays (L,), S NaN where fewer than ``MIN_WINDOWS`` windows or no dof."""
    stat = np.full(z.shape[0], np.nan)
    k = np.zeros(z.shape[0], dtype=int)
    if (ok == ok[:1]).all():  # complete data: one pattern (np.unique of rows is slow)
        patterns, inv = ok[:1], np.zeros(ok.shape[0], dtype=int)
    else:
        patterns, inv = np.unique(ok, axis=0, return_inverse=True)
    for u, pat in enumerate(patterns):
        if int(pat.sum()) < MIN_WINDOWS:
            continue
        q = bases(pat)[:, 1:] if skip_constant else bases(pat)
        if q.shape[1] == 0:
            continue
        rows = np.flatnonzero(inv.reshape(-1) == u)
        coef = z[np.ix_(rows, np.flatnonzero(pat))] @ q
        stat[rows] = np.einsum("ij,ij->i", coef, coef)
        k[rows] = q.shape[1]
    return stat, k


def _test_many(a: _Rows, others: _Rows, s2: float, bases: Bases
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Low-frequency chi-square of the difference of L pairs of clusters' mean drift series:
    row i of ``a`` (or its one row for all) against row i of ``others``.

    Per window where both have data: ``z = (mean_a - mean_o) / sqrt(s2 * (1/n_a + 1/n_o))``,
    white N(0, 1) if they share an oscillator, clipped to +-``Z_CLIP``. Returns arrays (L,)
    ``S = |Q^T z|^2`` (chi-square with k dof under "same host"), ``k``, ``n`` (windows
    used) and ``saturated``; ``S`` is NaN where fewer than ``MIN_WINDOWS`` windows are
    shared. A saturated row (z clipped to the same sign in every window: hosts whose drifts
    differ by far more than the noise, most pairs) is not projected: the constant lies in
    the basis, so its S is ``Z_CLIP**2 * n`` exactly; rows ``_separated`` says are
    saturated are not even computed."""
    w = others.windows
    if a.complete.all() and others.complete.all():  # both have every window (most tests)
        ok, n = None, np.full(len(others), w)
    else:
        ok = (a.count > 0) & (others.count > 0)
        n = ok.sum(axis=1)
    sat = _separated(a, others, s2) & (n >= MIN_WINDOWS)
    full = np.flatnonzero(~sat)
    af, of = a.pick(full), others.take(full)
    okf = np.ones((full.size, w), dtype=bool) if ok is None else ok[full]
    a_total, a_count, totals, counts = af.total, af.count, of.total, of.count
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (a_total / a_count - totals / counts) / np.sqrt(
            s2 * (1.0 / a_count + 1.0 / counts))
    z = np.clip(np.where(okf, z, 0.0), -Z_CLIP, Z_CLIP)
    sat[full] = (n[full] >= MIN_WINDOWS) & (
        (np.where(okf, z, Z_CLIP) == Z_CLIP).all(axis=1)
        | (np.where(okf, z, -Z_CLIP) == -Z_CLIP).all(axis=1))
    stat = np.full(len(n), np.nan)
    k = np.zeros(len(n), dtype=int)
    proj = np.flatnonzero(~sat[full])
    stat[full[proj]], k[full[proj]] = _project(z[proj], okf[proj], bases, skip_constant=False)
    if sat.any():
        first, last = np.zeros(int(sat.sum()), int), np.full(int(sat.sum()), w - 1)
        if ok is not None:
            oks = ok[sat]
            first, last = oks.argmax(axis=1), w - 1 - oks[:, ::-1].argmax(axis=1)
        stat[sat] = Z_CLIP ** 2 * n[sat]
        k[sat] = _dof(n[sat], last - first + 1, bases.min_period)
    return stat, k, n, sat


def _offset_test_many(a: _Rows, others: _Rows, s2: float, bases: Bases
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same for offsets (``s2`` in ns^2), over the windows where every member of both
    clusters has an offset; z less its median (the unknown constant) clipped to
    +-``Z_CLIP``, the constant left out of the projection: chi-square with k - 1 dof under
    "same host" (a little less: clipping only shrinks the statistic)."""
    totals, counts, sizes = others.ototal, others.ocount, others.sizes[:, None]
    na = a.sizes[:, None]
    ok = (a.ocount == na) & (counts == sizes)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (a.ototal / na - totals / sizes) / np.sqrt(s2 * (1.0 / na + 1.0 / sizes))
    z = np.where(ok, z, np.nan)
    centre = row_nanmedian(z)[:, None]
    z = np.clip(np.where(ok, z - centre, 0.0), -Z_CLIP, Z_CLIP)
    stat, k = _project(z, ok, bases, skip_constant=True)
    return stat, k, ok.sum(axis=1)


def row_nanmedian(z: np.ndarray) -> np.ndarray:
    """``np.nanmedian(z, axis=1)`` (NaN for a row without a number; the same floats),
    without its masked-array path (a millisecond a call)."""
    srt = np.sort(z, axis=1)  # NaN last
    c = np.isfinite(z).sum(axis=1)
    rows = np.arange(z.shape[0])
    lo, hi = srt[rows, np.maximum(c - 1, 0) // 2], srt[rows, np.minimum(c // 2, z.shape[1] - 1)]
    return np.where(c > 0, (lo + hi) / 2, np.nan)


class Tests:
    """Both tests of "same host" between clusters: drift always, offsets when given."""

    def __init__(self, s2: float, os2: float | None, bases: Bases, alpha: float):
        self.s2, self.os2, self.bases, self.alpha = s2, os2, bases, alpha

    def _runs(self, a: _Rows, others: _Rows) -> list[tuple]:
        """Per row (pairs as in ``_test_many``), ``(S, k, n)`` arrays of the drift test and,
        with offsets, of the offset test (``S`` NaN: not enough data). The offset test is left
        out where the drift test alone already refuses the merge with a saturated statistic
        (``_test_many``): the least p-value stays below ``alpha`` without it."""
        stat, k, n, sat = _test_many(a, others, self.s2, self.bases)
        runs = [(stat, k, n)]
        if self.os2 is not None:
            with np.errstate(invalid="ignore"):
                need = np.flatnonzero(~(sat & (chdtrc(k, stat) < self.alpha)))
            n_o = len(others)
            ostat = np.full(n_o, np.nan)
            ok_, on = np.zeros(n_o, dtype=int), np.zeros(n_o, dtype=int)
            if need.size:
                ostat[need], ok_[need], on[need] = _offset_test_many(
                    a.pick(need), others.take(need), self.os2, self.bases)
            runs.append((ostat, ok_, on))
        return runs

    def p_values(self, a: _Rows, others: _Rows) -> np.ndarray:
        """Per row the least p-value of the tests (-1, never merged, without a
        drift test)."""
        runs = self._runs(a, others)
        stat, k, _ = runs[0]
        with np.errstate(invalid="ignore"):
            p = np.where(np.isnan(stat), -1.0, chdtrc(k, stat))
            for ostat, ok_, _ in runs[1:]:
                p = np.where(np.isnan(stat) | np.isnan(ostat), p,
                             np.minimum(p, chdtrc(ok_, ostat)))
        return p

    def q_sames(self, a: _Rows, others: _Rows) -> np.ndarray:
        """Per row the least BIC posterior (equal priors) of "same host" against
        k free low-frequency terms over the tests, ``1 / (1 + exp((S - k ln n) / 2))``
        (0.5 without data)."""
        q = np.full(len(others), np.inf)
        for stat, k, n in self._runs(a, others):
            with np.errstate(invalid="ignore", divide="ignore"):
                qi = 1.0 / (1.0 + np.exp(np.minimum((stat - k * np.log(n)) / 2.0, 700.0)))
            q = np.where(np.isnan(stat), q, np.minimum(q, qi))
        return np.where(np.isinf(q), 0.5, q)


def noise_floor(x: np.ndarray, finite: np.ndarray, bases: Bases) -> float:
    """Median over VMs of the energy per degree of freedom in the high frequencies of each
    VM's own series (ppm^2), or 0 without enough data.

    There a series holds its noise plus a little leakage of the (slow) wanders of its host and
    of the reference: measured on the lab's oscillator model with 2 s windows, within a few
    percent of the noise for 0.02 ppm and an excess of ~0.005 ppm for much smaller noise."""
    per_vm = []
    for i in range(x.shape[0]):
        ok = finite[i]
        n = int(ok.sum())
        if n < MIN_WINDOWS:
            continue
        q = bases(ok)
        if n - q.shape[1] < 1:
            continue
        v = x[i, ok]
        coef = q.T @ v
        per_vm.append(max(float(v @ v - coef @ coef), 0.0) / (n - q.shape[1]))
    return float(np.median(per_vm)) if per_vm else 0.0


def offset_noise(o: np.ndarray) -> float:
    """Median over VMs of the offsets' noise variance (ns^2) from second differences, which
    remove each VM's offset and drift against the reference: robust (MAD) per VM, as white
    noise gives a second difference of variance 6 sigma^2. 0 without enough data."""
    if o.shape[1] < MIN_WINDOWS + 2:
        return 0.0
    d2 = np.diff(o, 2, axis=1)  # NaN where a window is missing
    med = row_nanmedian(d2)    # np.median of each row's numbers, the same floats
    mad = row_nanmedian(np.abs(d2 - med[:, None]))
    per_vm = (1.4826 * mad[np.isfinite(d2).sum(axis=1) >= MIN_WINDOWS]) ** 2 / 6.0
    return float(np.median(per_vm)) if per_vm.size else 0.0
