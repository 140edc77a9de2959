"""VM collocation from clock drift: VMs on one physical host share its oscillator.

A VM's drift against a common reference is ``x_v(k) = y_h(v)(k) - y_ref(k) + noise`` per window
k, with ``y_h`` the host's fractional frequency error (base drift plus a slow wander). For two
VMs the reference cancels exactly in the pairwise difference::

    d_ij(k) = x_i(k) - x_j(k) = y_h(i)(k) - y_h(j)(k) + noise_i(k) - noise_j(k)

On one host ``d_ij`` is white noise around 0. On two hosts it carries the difference of base
drifts (a constant) plus the difference of two independent wanders (slow: periods of many
windows). Both live in the low frequencies of ``d_ij``; the noise is spread over all of them.
So the test of "same host" projects ``d_ij`` on its lowest-frequency cosines (the constant
included) and compares that energy with the noise: a chi-square test with few degrees of
freedom, far more sensitive to a slow wander than comparing each window on its own. This is
how hosts whose base drifts are equal or 0.05 ppm apart are told apart: their wanders do not
correlate. (Correlating the differenced series ``x_i(k+1) - x_i(k)`` of two VMs directly
would not work as well: every series also carries the reference's wander, which makes VMs of
different hosts look correlated.)

Offsets say the same more sharply over time: on one host the offset difference of two VMs
stays constant (the same oscillator integrates to the same time), on two hosts it drifts
away by the integral of the frequency difference: 0.05 ppm is 1 us after 20 s, far above
the offsets' noise, while each window's drift carries that noise divided by the window. With
offset series, a second test asks the same of ``theta_i - theta_j`` with the constant left
out (the VMs' offsets differ by an unknown constant), each window clipped to a few sigmas
(a queue that biases one window must not split a host), and a merge needs both to agree.

Source: the idea is Clockwork's (US 12,248,802; US 2023/0297405): co-located VMs share an
oscillator, their drift series coincide, and candidate co-location sets come with a confidence.
The grouping is agglomerative clustering on the p-values of that test between clusters' mean
series; the confidence uses the Bayesian information criterion (G. Schwarz, "Estimating the
dimension of a model", Annals of Statistics, 1978) to turn a test's evidence into a posterior
probability.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.special import chdtrc  # chi-square survival function, a plain ufunc

__all__ = ["MIN_WINDOWS", "Group", "group", "precision_recall"]

MIN_WINDOWS = 3
"""Fewest windows that two VMs must share before they can be grouped."""
_PAIRS_PER_CALL = 4096  # pairs of clusters tested at once (memory: 8 arrays of pairs x windows)


@dataclass
class Group:
    """VMs believed to share one physical host.

    Attributes:
        members: VM names, sorted.
        confidence: 0..1, the posterior probability (equal priors, BIC approximation) of the
            weakest decision behind the group: "same host" for a member against the rest of
            the group, "different host" for the group against another group.
    """

    members: list[str]
    confidence: float


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


class _Bases:
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
class _Cluster:
    members: list[int]
    total: np.ndarray   # (n_windows,) sum of the members' drift samples (NaN counted as 0)
    count: np.ndarray   # (n_windows,) members with a drift sample
    ototal: np.ndarray  # (n_windows,) sum of the members' offsets (NaN counted as 0)
    ocount: np.ndarray  # (n_windows,) members with an offset

    def merged(self, other: _Cluster) -> _Cluster:
        return _Cluster(self.members + other.members, self.total + other.total,
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


class _Stack(NamedTuple):
    """Several clusters' series stacked, one row each (``_Cluster``'s arrays, (L, n_windows),
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
    def of(cls, clusters: list[_Cluster], common: np.ndarray) -> _Stack:
        total, count, ototal, ocount = (np.array([getattr(c, f) for c in clusters])
                                        for f in _SERIES)
        return cls(total, count, ototal, ocount, *_bounds(total, count, common),
                   np.array([len(c.members) for c in clusters], dtype=np.float64))

    def rows(self, idx: np.ndarray | None = None) -> _Rows:
        """Rows ``idx`` (default all) of the stack."""
        return _Rows(self, np.arange(len(self.sizes)) if idx is None else np.asarray(idx))


class _Rows:
    """Rows ``idx`` of a ``_Stack`` (clusters' rows of a test), each field copied out only
    when read: most tests read the counts of every row and the series of a few."""

    def __init__(self, stack: _Stack, idx: np.ndarray):
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


class _Pool:
    """The live clusters' series in preallocated rows by cluster id: a test against all
    others indexes rows instead of stacking hundreds of arrays per call."""

    def __init__(self, n_ids: int, n_windows: int):
        self.rows = _Stack(*(np.zeros((n_ids, n_windows)) for _ in range(4)),
                           *(np.zeros(n_ids) for _ in range(5)))

    def put_stack(self, cids: np.ndarray, stack: _Stack) -> None:
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


def _components(single: _Stack, nv: int, s2: float, alpha: float) -> np.ndarray:
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


def _project(z: np.ndarray, ok: np.ndarray, bases: _Bases, skip_constant: bool
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


def _test_many(a: _Rows, others: _Rows, s2: float, bases: _Bases
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


def _offset_test_many(a: _Rows, others: _Rows, s2: float, bases: _Bases
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
    centre = _row_nanmedian(z)[:, None]
    z = np.clip(np.where(ok, z - centre, 0.0), -Z_CLIP, Z_CLIP)
    stat, k = _project(z, ok, bases, skip_constant=True)
    return stat, k, ok.sum(axis=1)


def _row_nanmedian(z: np.ndarray) -> np.ndarray:
    """``np.nanmedian(z, axis=1)`` (NaN for a row without a number; the same floats),
    without its masked-array path (a millisecond a call)."""
    srt = np.sort(z, axis=1)  # NaN last
    c = np.isfinite(z).sum(axis=1)
    rows = np.arange(z.shape[0])
    lo, hi = srt[rows, np.maximum(c - 1, 0) // 2], srt[rows, np.minimum(c // 2, z.shape[1] - 1)]
    return np.where(c > 0, (lo + hi) / 2, np.nan)


class _Tests:
    """Both tests of "same host" between clusters: drift always, offsets when given."""

    def __init__(self, s2: float, os2: float | None, bases: _Bases, alpha: float):
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


def _noise_floor(x: np.ndarray, finite: np.ndarray, bases: _Bases) -> float:
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


def _offset_noise(o: np.ndarray) -> float:
    """Median over VMs of the offsets' noise variance (ns^2) from second differences, which
    remove each VM's offset and drift against the reference: robust (MAD) per VM, as white
    noise gives a second difference of variance 6 sigma^2. 0 without enough data."""
    if o.shape[1] < MIN_WINDOWS + 2:
        return 0.0
    d2 = np.diff(o, 2, axis=1)  # NaN where a window is missing
    med = _row_nanmedian(d2)    # np.median of each row's numbers, the same floats
    mad = _row_nanmedian(np.abs(d2 - med[:, None]))
    per_vm = (1.4826 * mad[np.isfinite(d2).sum(axis=1) >= MIN_WINDOWS]) ** 2 / 6.0
    return float(np.median(per_vm)) if per_vm.size else 0.0


def group(drift_series: dict[str, np.ndarray], sigma_ppm: float, *, alpha: float = 1e-5,
          min_period_windows: float = 8.0,
          offset_series: dict[str, np.ndarray] | None = None,
          offset_sigma_ns: float = 0.0) -> list[Group]:
    """Group VMs whose drift series coincide (same oscillator, hence same physical host).

    Test of "same host" for two sets of VMs (single VMs at first): over the windows where both
    have data, the difference of their mean series, scaled by its noise
    ``sigma * sqrt(1/n_a + 1/n_b)``, is projected on the ``k = 1 + floor(2 * span /
    min_period_windows)`` (at most n - 1) lowest cosines of the span (DCT-II, constant
    included); under "same host" that energy S is chi-square with k degrees of freedom.
    Clustering is agglomerative: merge the two clusters with the largest p-value while it is
    >= ``alpha``. Averaging a cluster's members lowers the noise, so a new VM is tested against
    a host more sharply than against any one of its VMs. Sets sharing fewer than
    ``MIN_WINDOWS`` windows are never merged. The greedy runs on components of VMs that no
    merge can join (drift ranges apart by more than the test can take, ``_components``),
    every component's next merge in one batch: the same merges as one greedy over all VMs,
    without testing the thousands of pairs of hosts far apart again after every merge.

    ``sigma`` is ``max(sigma_ppm, s_hat)`` with ``s_hat`` the noise seen in the high
    frequencies of the series, where a slow wander hardly reaches (see ``_noise_floor``): an
    underestimated ``sigma_ppm`` would otherwise split true hosts. An overestimated one makes
    close hosts merge.

    Confidence: for a test with statistic S over n windows, the BIC posterior of "same host"
    against "k free low-frequency terms" is ``q = 1 / (1 + exp((S - k ln n) / 2))``. A group's
    confidence is the least of ``q`` of each member against the rest of its group and
    ``1 - q`` of the group against each other group (0.5 for a test without enough data):
    the weakest decision behind the group. It grows with the number of windows.

    With ``offset_series``, each decision also runs the offset test (module docstring) over
    the windows where every member of both sets has an offset: the difference of the sets'
    mean offsets, scaled by ``sqrt(s2o * (1/n_a + 1/n_b))`` and clipped to +-``Z_CLIP``, is
    projected on the same cosines without the constant (k - 1 dof). ``s2o`` is
    ``max(offset_sigma_ns**2, the offsets' noise from second differences)``. A merge needs
    the least p-value of the two tests to be >= alpha; a confidence takes the weaker
    posterior of "same host" for members and the stronger evidence of "different" between
    groups.

    Args:
        drift_series: ``{vm: shape (n_windows,) float}``, drift vs a common reference in ppm,
            one sample per window, the same windows for every VM; NaN for a missing window.
        sigma_ppm: one-sigma noise of one sample, ppm (> 0).
        offset_series: ``{vm: shape (n_windows,) float}``, offsets vs the same reference in
            ns over the same windows, NaN where missing; a VM's offsets must be continuous
            (no clock step inside its series: leave the windows before a step NaN).
        offset_sigma_ns: a floor of the offsets' one-sigma noise, ns.
        alpha: significance of each merge test: a same-host merge is refused with
            probability alpha (a host of m VMs needs m - 1 merges, and the greedy order leaves
            its most deviant VM last, so expect a false split per host at a few times
            m * alpha). Smaller values merge close hosts more easily.
        min_period_windows: shortest wander period (in windows) the test looks for; with 2 s
            windows the default 8 covers periods >= 16 s (the lab draws 20-200 s).

    Returns:
        Groups (singletons included), members sorted, groups sorted by their first member.

    Raises:
        ValueError: series of different lengths or not 1-D, or ``sigma_ppm``/``alpha``/
            ``min_period_windows`` out of range.
    """
    if not (np.isfinite(sigma_ppm) and sigma_ppm > 0):
        raise ValueError(f"sigma_ppm must be finite and > 0, got {sigma_ppm}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not min_period_windows >= 2:
        raise ValueError(f"min_period_windows must be >= 2, got {min_period_windows}")
    names = sorted(drift_series)
    series = [np.asarray(drift_series[v], dtype=np.float64) for v in names]
    if any(s.ndim != 1 for s in series):
        raise ValueError("every drift series must be 1-D (one sample per window)")
    lengths = {s.size for s in series}
    if len(lengths) > 1:
        raise ValueError(f"drift series differ in length: {sorted(lengths)}; "
                         "they must cover the same windows")
    nv = len(names)
    if nv == 0:
        return []
    x = np.vstack(series)
    finite = np.isfinite(x)
    if offset_series is not None:
        o = np.vstack([np.asarray(offset_series[v], dtype=np.float64) for v in names])
        if o.shape != x.shape:
            raise ValueError(f"offset series have shape {o.shape}, drift series {x.shape}")
    else:
        o = np.full_like(x, np.nan)
    ofinite = np.isfinite(o)
    bases = _Bases(min_period_windows)
    s2 = max(sigma_ppm ** 2, _noise_floor(x, finite, bases))
    tests = _Tests(s2, max(offset_sigma_ns ** 2, _offset_noise(o), 1.0)
                   if offset_series is not None else None, bases, alpha)
    common = _row_nanmedian(x.T)  # per window, the median VM: the reference's own wander
    clusters = [_Cluster([i], np.where(finite[i], x[i], 0.0), finite[i].astype(np.float64),
                         np.where(ofinite[i], o[i], 0.0), ofinite[i].astype(np.float64))
                for i in range(nv)]
    # p-values between live clusters by id (a < b); ids nv.. are merged clusters
    pv = np.full((2 * nv, 2 * nv), -np.inf)
    live = dict(enumerate(clusters))
    pool = _Pool(2 * nv, x.shape[1])
    singles = _Stack.of(clusters, common)
    pool.put_stack(np.arange(nv), singles)
    comp = _components(pool.rows, nv, s2, alpha)
    # every pair of VMs of one component (cid b against a < b), a few thousand per call
    bb, aa = np.tril_indices(nv, -1)
    within = comp[bb] == comp[aa]
    bb, aa = bb[within], aa[within]
    for lo in range(0, bb.size, _PAIRS_PER_CALL):
        b, a = bb[lo:lo + _PAIRS_PER_CALL], aa[lo:lo + _PAIRS_PER_CALL]
        pv[a, b] = tests.p_values(pool.rows.rows(b), pool.rows.rows(a))
    # the greedy merges, every component's next one in the same round: a component's
    # p-values change only with its own merges, so its merges come in the order the global
    # argmax would take them (ties too: ids keep their order within a component)
    by_comp = np.argsort(comp, kind="stable")
    groups_left = [ids.tolist() for ids in np.split(by_comp, np.flatnonzero(np.diff(
        comp[by_comp])) + 1) if ids.size > 1]
    next_id = nv
    while groups_left:
        new_b, new_a, still, made = [], [], [], []
        for ids in groups_left:
            sub = pv[np.ix_(ids, ids)]
            i, j = np.unravel_index(int(np.argmax(sub)), sub.shape)
            if sub[i, j] < alpha:
                continue
            a, b = ids[i], ids[j]
            merged = live.pop(a).merged(live.pop(b))
            pv[[a, b], :] = -np.inf
            pv[:, [a, b]] = -np.inf
            live[next_id] = merged
            made.append(next_id)
            ids = [c for c in ids if c != a and c != b]
            new_a += ids
            new_b += [next_id] * len(ids)
            ids.append(next_id)
            next_id += 1
            if len(ids) > 1:
                still.append(ids)
        if made:  # the round's merged clusters into the pool at once
            pool.put_stack(np.array(made), _Stack.of([live[c] for c in made], common))
        for lo in range(0, len(new_b), _PAIRS_PER_CALL):
            b, a = new_b[lo:lo + _PAIRS_PER_CALL], new_a[lo:lo + _PAIRS_PER_CALL]
            pv[a, b] = tests.p_values(pool.rows.rows(b), pool.rows.rows(a))
        groups_left = still
    finals = list(live.values())
    # confidence: each member against the rest of its group, each group against each other
    # one (all of them in one call each)
    conf = np.ones(len(finals))
    owner, members, rests = [], [], []
    for gi, g in enumerate(finals):
        for i in g.members if len(g.members) > 1 else ():
            rest = [clusters[j] for j in g.members if j != i]
            rest_c = rest[0]
            for r in rest[1:]:
                rest_c = rest_c.merged(r)
            owner.append(gi)
            members.append(i)
            rests.append(rest_c)
    if owner:
        np.minimum.at(conf, owner, tests.q_sames(singles.rows(members),
                                                 _Stack.of(rests, common).rows()))
    if len(finals) > 1:
        gg, hh = np.nonzero(~np.eye(len(finals), dtype=bool))
        stack = _Stack.of(finals, common)
        np.minimum.at(conf, gg, 1.0 - tests.q_sames(stack.rows(gg), stack.rows(hh)))
    groups = [Group(sorted(names[i] for i in g.members), float(c))
              for g, c in zip(finals, conf, strict=True)]
    groups.sort(key=lambda gr: gr.members)
    return groups


def _pairs(groups: list[list[str]], what: str) -> set[frozenset[str]]:
    seen: set[str] = set()
    out: set[frozenset[str]] = set()
    for g in groups:
        for v in g:
            if v in seen:
                raise ValueError(f"{what}: VM {v!r} appears in more than one group")
            seen.add(v)
        out.update(frozenset(p) for p in itertools.combinations(g, 2))
    return out


def precision_recall(groups: list[list[str]], truth: list[list[str]]) -> tuple[float, float]:
    """Pairwise co-location precision and recall of ``groups`` against ``truth``.

    A positive is an unordered pair of VMs placed in one group. ``precision = |P & T| / |P|``
    and ``recall = |P & T| / |T|`` for predicted pairs P and true pairs T. When there is no
    predicted pair, precision is 1.0 (no false claim was made); when there is no true pair,
    recall is 1.0 (nothing was missed). So all-singleton predictions for all-singleton truth
    score (1.0, 1.0). A VM absent from a list counts as a singleton there.

    Args:
        groups: predicted groups (lists of VM names), e.g. ``[g.members for g in group(...)]``.
        truth: true groups (one list per physical host).

    Returns:
        (precision, recall), each in [0, 1].

    Raises:
        ValueError: a VM listed twice in ``groups`` or in ``truth``.
    """
    p = _pairs(groups, "groups")
    t = _pairs(truth, "truth")
    hit = len(p & t)
    precision = hit / len(p) if p else 1.0
    recall = hit / len(t) if t else 1.0
    return precision, recall
