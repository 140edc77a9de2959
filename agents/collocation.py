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

import numpy as np

from agents.colloc_stats import (
    MIN_WINDOWS,
    Bases,
    Cluster,
    Pool,
    Stack,
    Tests,
    components,
    noise_floor,
    offset_noise,
    row_nanmedian,
)

__all__ = ["MIN_WINDOWS", "Group", "group", "precision_recall"]

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
    merge can join (drift ranges apart by more than the test can take, ``components``),
    every component's next merge in one batch: the same merges as one greedy over all VMs,
    without testing the thousands of pairs of hosts far apart again after every merge.

    ``sigma`` is ``max(sigma_ppm, s_hat)`` with ``s_hat`` the noise seen in the high
    frequencies of the series, where a slow wander hardly reaches (see ``noise_floor``): an
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
    bases = Bases(min_period_windows)
    s2 = max(sigma_ppm ** 2, noise_floor(x, finite, bases))
    tests = Tests(s2, max(offset_sigma_ns ** 2, offset_noise(o), 1.0)
                   if offset_series is not None else None, bases, alpha)
    common = row_nanmedian(x.T)  # per window, the median VM: the reference's own wander
    clusters = [Cluster([i], np.where(finite[i], x[i], 0.0), finite[i].astype(np.float64),
                         np.where(ofinite[i], o[i], 0.0), ofinite[i].astype(np.float64))
                for i in range(nv)]
    # p-values between live clusters by id (a < b); ids nv.. are merged clusters
    pv = np.full((2 * nv, 2 * nv), -np.inf)
    live = dict(enumerate(clusters))
    pool = Pool(2 * nv, x.shape[1])
    singles = Stack.of(clusters, common)
    pool.put_stack(np.arange(nv), singles)
    comp = components(pool.rows, nv, s2, alpha)
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
            pool.put_stack(np.array(made), Stack.of([live[c] for c in made], common))
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
                                                 Stack.of(rests, common).rows()))
    if len(finals) > 1:
        gg, hh = np.nonzero(~np.eye(len(finals), dtype=bool))
        stack = Stack.of(finals, common)
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
