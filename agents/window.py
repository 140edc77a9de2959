"""The per-window solve: from one window's probe records to every VM's clock against the
reference VM, the NTP-style baseline and the one-way delays (steps 2, 3 and 5 of the
pipeline in ``agents.coordinator``). A function of the records, the previous window's offsets
and the pairs' round-trip floors (``RttFloors``, which each window updates): no threads,
sockets or clocks.

Every step works on all pairs at once (``agents.segments``): one numpy call per step for the
whole window, not one per pair.

1. Per unordered pair (A < B lexicographically): coded-pair purity (``estimate.pure_pairs``,
   guard band ``guard_ns``), then the Huygens envelope fit (``estimate.fit_pair``) and the
   NTP-style baseline (``estimate.ntp_pair``) on the very same pure probes. A pair needs
   ``MIN_PURE`` pure probes each way, and is dropped (``pairs_inconsistent``) when the fitted
   line leaves a direction a minimum delay below ``-INCONSISTENT_NS``: a clock step inside
   the window. A pair queued in the window (its round trip above its floor over
   ``ANCHOR_WINDOWS``) is re-anchored on the direction the queue left free
   (``agents.anchor``, ``pairs_queued``, ``pairs_anchored``); one that cannot be is left out
   of the solve (``pairs_left_out``) where both its VMs stay connected to the reference
   without such pairs. A VM two thirds of whose pairs with a floor (``RttFloors``: the
   pair's least minimum round trip over the last ``FLOOR_WINDOWS`` windows) stand
   ``QUEUED_NS`` above it, not anchored, is left out of the window (``vms_queued``), unless
   pairs free of the queue connect it to the reference: a queue on its own link biased all
   its pairs alike, which the solve would take as its offset. So is a VM that only pairs
   queued for themselves and not anchored connect to the reference (``vms_behind_queues``,
   counted in ``vms_queued`` too), and a VM queued so in most parts of
   the window (``PARTS``; ``vms_queued_part``, counted in ``vms_queued`` too): a queue that
   stood for all of it but a few probes' time leaves the window's round trips at the floor
   and still biases the fits. Every fitted pair whose VMs are both connected to the
   reference by pairs free of queues (or anchored) keeps the difference of their estimates
   as its trusted clock (``RttFloors.trust``), what later windows predict it from.
2. Network effect (``network.solve``): both fits are evaluated at the window's centre
   ``t_k`` (read on A's clock: ``t_k + theta_A``) and solved over the graph of pairs,
   weights ``1 / (residual_ns**2 + floor**2)``, twice (the second pass evaluates at the
   first pass's offsets; one factorisation serves both, ``network.GraphSolve``). Only the
   VMs connected to the reference get an estimate.
3. OWD per ordered pair on all of the window's probes (pure or not) with the
   network-corrected relative clock (``owd.owd_many``); asymmetry per pair
   (``owd.asymmetry_many``, as ``owd.asymmetry_us`` defines it).

Source: Geng et al., "Exploiting a Natural Network Effect for Scalable, Fine-grained Clock
Synchronization", NSDI 2018 (coded probes, envelope fit, network effect); RFC 5905 for the
baseline.
"""
from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from pydantic import TypeAdapter
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from agents import segments
from agents.anchor import ANCHOR_WINDOWS, anchor
from agents.anchor import EXCESS_NS as ANCHOR_EXCESS_NS
from agents.estimate import PairFits, Probes, fit_many, ntp_many, pure_pairs
from agents.network import GraphSolve, NodeEstimate
from agents.owd import asymmetry_many, owd_many
from contracts.messages import OwdStats

__all__ = ["FLOOR_WINDOWS", "INCONSISTENT_NS", "MIN_PURE", "PARTS", "QUEUED_NS", "QUEUED_SHARE",
           "Records", "RttFloors", "WindowResult", "solve_window"]

log = logging.getLogger("agents.window")

MIN_PURE = 4
"""Fewest pure probes per direction for a pair to be fitted in a window."""
INCONSISTENT_NS = 1000.0
"""A pair fit whose implied minimum one-way delay is below minus this (ns) is dropped."""
QUEUED_NS = 50_000.0
"""A VM whose pairs' minimum round trips stand more than this (ns) above their floors
(``RttFloors``, ``QUEUED_SHARE`` of them) is left out of the window (``vms_queued``): a queue on
its own link that no probe of the window got through empty (the iperf3 sender of quickstart: its
egress queue stood for seconds) delays every probe it sends, or every probe to it, by at least
the queue's minimum q. The envelope fit halves that into each of its pairs' offsets alike, so
the loops of the network solve cannot see it: the VM's offset was off by -q/2, 61-476 us, in
the 1-2 windows of the load, and the collocation offset test split its host. The round trip's
minimum, the sum of both directions' minima about the fitted line, does not depend on the
offset: idle, 6-25 us in the quickstart lab."""
QUEUED_SHARE = 2 / 3
"""Share of a VM's pairs with a floor that must stand ``QUEUED_NS`` above it (``RttFloors``;
compared in integers: 3 x above >= 2 x pairs)."""
PARTS = 8
"""Parts of a window (250 ms at 2 s) in each of which a VM's pairs are judged against their
floors too (``vms_queued_part``): all of its pairs with probes both ways in the part stand
``QUEUED_NS`` above their floors (each pair's least round trip about its fitted line among
the part's probes) in the part. A VM queued so in all but fewer than ``PARTS // 4`` parts is
left out of the window (a flow that covers all of a window but 50 ms; a part the queue
covered only in part reads free, its least round trip the floor's; a queue in scattered
parts, bursts a few times a window, keeps the VM): the few probes it sent before the queue stood (or
after it drained) left some pairs' fits free to tilt (drift ~q / window) under its queued
probes, a band as wide as the floor's with the offset at the centre q/2 low, while the fits
that stayed right had few probes at their envelopes and a tiny weight (``residual_ns``
60-180 us against 8): vm5 295-301 us off in the synthetic test (-381 and -391 us in
quickstart). With 300 ms of the window free the fits were 0.4-1.9 us off, with 500 ms
0.1-0.4 us. The fitted drift that reads the round trips off the line is tilted by at most
~q / window, which moves a part's round trip by less than q / ``PARTS``. Longer parts than
a window's 16th, and every pair rather than a share: a part holds a few probes per pair,
and a VM each of whose probes, both ways, waited 100 us on average (busy links, no standing
queue) was left out of every window that had floors (8 of 8) with 16 parts and a share, of
none with 8 parts and every pair (200 us: none; 400 us, a link near saturation: 5 of 8)."""
FLOOR_WINDOWS = 8
"""Windows of a pair's history whose least minimum round trip is its floor: a queue that
stands longer than this (16 s at 2 s windows) becomes the floor and biases again."""
PREDICT_DRIFTS = 5
"""Trusted windows whose drifts' median is a pair's predicted drift (``RttFloors.predict``)."""
PREDICT_OFFSETS = 5
"""Trusted windows whose offsets' median is a pair's predicted offset."""
_OWD = TypeAdapter(dict[str, OwdStats])


class Records(NamedTuple):
    """One window's probes of every direction ``(src, dst)``, each direction a segment
    (``agents.segments``), sorted by ``(pair_id, idx)`` within it; arrays shape (n,) int64."""

    vms: list[str]
    """The VMs of the directions, sorted."""
    src: np.ndarray
    """Shape (directions,) int64: each direction's sender, an index into ``vms``; the
    directions are sorted by ``(src, dst)``."""
    dst: np.ndarray
    """Shape (directions,) int64: each direction's receiver, an index into ``vms``."""
    starts: np.ndarray
    """Shape (directions + 1,): direction i's probes are ``[starts[i]:starts[i + 1]]``."""
    pair_id: np.ndarray
    """Coded pair of each probe."""
    idx: np.ndarray
    """0 for a pair's first probe, 1 for its second."""
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
        owd: ``"a->b"`` -> one-way delays of the window's probes (the coordinator empties it
            once a later window is its latest: only the latest is served).
        asym: ``"a|b"`` -> OWD asymmetry, us (``owd.asymmetry_us``; emptied as ``owd``).
        pairs: pairs fitted and connected to the reference.
        drift: VM -> served drift, ppm (the centred slope, set by the coordinator).
        ntp_drift: the same for the baseline.
        queued: VMs left out as queued (``RttFloors``): no estimate of theirs in this window,
            and no clock step either; their pairs' OWD and asymmetry are read on an offset
            from their own pairs alone (the queue's bias on them, not on the others).
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
    queued: list[str] = field(default_factory=list)


class RttFloors:
    """Per pair of VMs, its minimum round trips (ns) of the last windows, whose least is the
    pair's floor, its round trip with no queue standing, and its trusted fits (``trust``,
    ``predict``; ``agents.anchor``). Relative to each pair's own floor, not to other pairs':
    pairs differ by their paths (a leaf's VMs between themselves, across spines, links with a
    configured delay). The coordinator keeps one across windows, which it solves in order
    from one thread (``Coordinator.step``).

    Args:
        span: windows of the floor that ``queued`` judges against (``FLOOR_WINDOWS``).
        keep: windows of history kept (at least ``span``): the longest floor (``floor``'s
            ``span``) and the trusted fits (``ANCHOR_WINDOWS``).

    Raises:
        ValueError: ``span`` < 1.
    """

    def __init__(self, span: int = FLOOR_WINDOWS, keep: int = ANCHOR_WINDOWS):
        if span < 1:
            raise ValueError(f"span must be at least 1 window, not {span}")
        self.span = span
        self.keep = max(span, keep)
        self._seen: dict[tuple[str, str], deque[tuple[int, float]]] = {}
        self._fits: dict[tuple[str, str], deque[tuple[int, int, float, float]]] = {}
        self._prune_at = 0  # next window at which pairs no longer probed are forgotten

    @staticmethod
    def keys(vms: list[str], a: np.ndarray, b: np.ndarray) -> list[tuple[str, str]]:
        """The pairs ``(a, b)`` (indices into ``vms``) as names."""
        return [(vms[i], vms[j]) for i, j in zip(a.tolist(), b.tolist(), strict=True)]

    def floor(self, k: int, vms: list[str], a: np.ndarray, b: np.ndarray,
              span: int | None = None) -> np.ndarray:
        """Each pair ``(a, b)``'s floor before window ``k`` over ``span`` windows (default
        ``self.span``, at most ``keep``), ns (NaN: none yet)."""
        return self.floors(k, vms, a, b, (span or self.span,))[0]

    def floors(self, k: int, vms: list[str], a: np.ndarray, b: np.ndarray,
               spans: tuple[int, ...]) -> list[np.ndarray]:
        """``floor`` over each of ``spans``, in one pass over the history."""
        los = [k - min(sp, self.keep) for sp in spans]
        out = np.full((len(spans), a.size), np.nan)
        for i, key in enumerate(self.keys(vms, a, b)):
            for kk, r in self._seen.get(key, ()):
                if kk < k:
                    for j, lo in enumerate(los):
                        if lo <= kk and not r >= out[j, i]:
                            out[j, i] = r
        return list(out)

    def forget_offsets(self, vms: list[str], a: np.ndarray, b: np.ndarray,
                       sel: np.ndarray) -> None:
        """The pairs ``sel`` (a mask over ``(a, b)``: their round trip fell below their floor,
        so their earlier windows were judged against a queue's) forget their trusted offsets,
        not their drifts (a queue that stands alike at both ends of a window does not tilt
        it)."""
        for i in np.flatnonzero(sel).tolist():
            seen = self._fits.get((vms[a[i]], vms[b[i]]), ())
            for j, (kk, t, _, d) in enumerate(seen):
                seen[j] = (kk, t, np.nan, d)

    def trust(self, k: int, vms: list[str], a: np.ndarray, b: np.ndarray, t_ns: np.ndarray,
              x: np.ndarray) -> None:
        """Keep window ``k``'s clocks of the pairs ``(a, b)`` as trusted: B - A (ns, ``x[:,
        0]``) at A's instant ``t_ns`` (int64) and its drift (ppm, ``x[:, 1]``), as the
        network solve put them (its VMs' estimates' differences: the loops correct a pair
        whose own fit was queued, or whose clock stepped)."""
        for i, key in enumerate(self.keys(vms, a, b)):
            seen = self._fits.setdefault(key, deque())
            seen.append((k, int(t_ns[i]), float(x[i, 0]), float(x[i, 1])))
            while seen[0][0] <= k - self.keep:
                seen.popleft()

    def predict(self, k: int, vms: list[str], a: np.ndarray, b: np.ndarray,
                t_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each pair's B - A (ns) at its A-clock instant ``t_ns`` and its slope (ppm),
        predicted from its trusted fits of the ``keep`` windows before ``k``: the slope is
        the median of the latest ``PREDICT_DRIFTS`` windows' drifts, the offset the median of
        the latest ``PREDICT_OFFSETS`` windows' offsets carried to ``t_ns`` on that slope
        (medians: a window tilted by a queue, or anchored on the wrong side, does not move
        them). NaN: no trusted offset."""
        off = np.full(a.size, np.nan)
        drift = np.full(a.size, np.nan)
        for i, key in enumerate(self.keys(vms, a, b)):
            seen = [e for e in self._fits.get(key, ()) if k - self.keep <= e[0] < k]
            offs = [e for e in seen if np.isfinite(e[2])][-PREDICT_OFFSETS:]
            if not offs:
                continue
            d = float(np.median([e[3] for e in seen[-PREDICT_DRIFTS:]]))
            drift[i] = d
            off[i] = float(np.median([o + d * 1e-6 * float(int(t_ns[i]) - t)
                                      for _, t, o, _ in offs]))
        return off, drift

    def queued(self, k: int, vms: list[str], a: np.ndarray, b: np.ndarray, rtt: np.ndarray,
               ref: int, floor: np.ndarray | None = None,
               anchored: np.ndarray | None = None) -> np.ndarray:
        """The VMs (indices into ``vms``, never ``ref``) at least ``QUEUED_SHARE`` of whose
        pairs of window ``k`` with a floor (pairs ``(a, b)``, minimum round trips ``rtt`` ns)
        stand more than ``QUEUED_NS`` above it; then window ``k``'s round trips join the
        history. A share, not every pair: a pair whose probe got through just before the
        queue stood up has its floor's round trip and still the others' bias; not a
        majority: a VM half of whose peers are queued (an incast's ranks) is not. The
        reference stays: its bias shifts every other VM alike (offset differences,
        collocation, keep). ``floor``: ``floor(k, vms, a, b)`` if the caller has it;
        ``anchored``: a mask of pairs re-anchored on their free direction (``agents.anchor``),
        which never count as above."""
        keys = self.keys(vms, a, b)
        if floor is None:
            floor = self.floor(k, vms, a, b)
        for key, r in zip(keys, rtt.tolist(), strict=True):
            seen = self._seen.setdefault(key, deque())
            seen.append((k, r))
            while seen[0][0] <= k - self.keep:
                seen.popleft()
        if k >= self._prune_at:  # pairs no longer probed (peers re-drawn, VMs gone)
            self._prune_at = k + self.keep
            for hist in (self._seen, self._fits):
                for key in [q for q, seen in hist.items() if seen[-1][0] <= k - self.keep]:
                    del hist[key]
        has = ~np.isnan(floor)
        over = (rtt - np.where(has, floor, 0.0)) > QUEUED_NS
        if anchored is not None:
            over &= ~anchored
        ah, bh, over = a[has], b[has], over[has]
        if 0 <= ref and _share(len(vms), ah, bh, over)[ref]:
            over &= (ah != ref) & (bh != ref)  # its queue, not its peers'
        bad = np.flatnonzero(_share(len(vms), ah, bh, over))
        return bad[bad != ref]


def _queued_in_parts(n: int, a: np.ndarray, b: np.ndarray, part_rtt: np.ndarray,
                     floor: np.ndarray, ref: int) -> np.ndarray:
    """The VMs (indices of ``n``, never ``ref``) queued in so many parts of the window
    (``PARTS``) that fewer than ``PARTS // 4`` parts are free of the queue: in a part, every
    pair ``(a, b)`` of the VM with a ``floor`` (ns, NaN: none) and probes both ways there has
    its round trip of the part (``part_rtt``, shape (pairs, ``PARTS``), inf: none)
    ``QUEUED_NS`` above it. Every pair, not a share as over the window: a part holds a few
    probes per pair (``PARTS``). In a part where the reference is so queued, its pairs do not
    count for its peers."""
    pi, pt = np.nonzero(np.isfinite(part_rtt) & ~np.isnan(floor)[:, None])
    over = (part_rtt[pi, pt] - floor[pi]) > QUEUED_NS

    def queued(sel: np.ndarray) -> np.ndarray:
        ka, kb = a[pi[sel]] * PARTS + pt[sel], b[pi[sel]] * PARTS + pt[sel]
        pairs = np.bincount(ka, minlength=n * PARTS) + np.bincount(kb, minlength=n * PARTS)
        below = np.bincount(ka[~over[sel]], minlength=n * PARTS) + np.bincount(
            kb[~over[sel]], minlength=n * PARTS)
        return ((pairs > 0) & (below == 0)).reshape(n, PARTS)

    q = queued(np.ones(pi.size, dtype=bool))
    if 0 <= ref and q[ref].any():  # its queue, not its peers'
        q = queued(~(((a[pi] == ref) | (b[pi] == ref)) & q[ref][pt]))
    bad = np.flatnonzero(q.any(axis=1) & (PARTS - q.sum(axis=1) < PARTS // 4))
    return bad[bad != ref]


def _share(n: int, a: np.ndarray, b: np.ndarray, over: np.ndarray) -> np.ndarray:
    """Per VM (``n``), whether at least ``QUEUED_SHARE`` of its pairs ``(a, b)`` are ``over``
    (and it has one)."""
    pairs = np.bincount(a, minlength=n) + np.bincount(b, minlength=n)
    above = np.bincount(a[over], minlength=n) + np.bincount(b[over], minlength=n)
    return (pairs > 0) & (3 * above >= 2 * pairs)


def solve_window(k: int, records: Records, ref: str, offsets_ns: dict[str, float], *,
                 window_ns: int, guard_ns: float = 20_000.0, weight_floor_ns: float = 100.0,
                 counts: Counter[str] | None = None,
                 floors: RttFloors | None = None) -> WindowResult | None:
    """Solve window ``k``.

    Args:
        k: window index on the reference clock (centre ``k * window_ns + window_ns // 2``).
        records: the window's probes.
        ref: the reference VM.
        offsets_ns: VM -> its offset to ``ref`` (ns) from the previous windows, to read the
            centre on each VM's clock in the first pass (missing: 0).
        window_ns: window length, ns.
        guard_ns: coded-pair guard band, ns.
        weight_floor_ns: floor added to the fits' residuals in the solve weights, ns.
        counts: diagnostics are added here (``pairs_too_few_pure``, ``pair_fit_failures``,
            ``pairs_inconsistent``, ``ntp_fit_failures``, ``windows_without_reference``,
            ``solve_failures``, ``vms_queued``, ``vms_queued_part``, ``vms_behind_queues``,
            ``pairs_queued``, ``pairs_anchored``, ``pairs_left_out``).
        floors: the pairs' round-trip floors from the previous windows (``RttFloors``;
            None: no history, no VM left out as queued); this window's round trips are added.

    Returns:
        The window's estimates, or None when no fitted pair connects ``ref`` to another VM
        (or the solve failed).
    """
    counts = Counter() if counts is None else counts
    t_k = k * window_ns + window_ns // 2
    vms, dsrc, ddst = records.vms, records.src, records.dst
    pa, pb, huygens, ntp_fits, rtt, part_rtt, probes = _fit_pairs(records, dsrc, ddst,
                                                                  guard_ns, counts, window_ns)
    if not pa.size:
        return None
    queued = np.empty(0, dtype=np.int64)
    suspect = np.zeros(pa.size, dtype=bool)  # queued for the pair, not anchored
    fitted = pa, pb
    if floors is not None:
        iref = vms.index(ref) if ref in vms else -1
        floor, long_floor = floors.floors(k, vms, pa, pb, (floors.span, ANCHOR_WINDOWS))
        huygens, anchored, pair_queued = anchor(
            probes, huygens, rtt, part_rtt, long_floor,
            lambda i, t_ns: floors.predict(k, vms, pa[i], pb[i], t_ns),
            near_ns=window_ns / PARTS)
        counts["pairs_queued"] += int(pair_queued.sum())
        counts["pairs_anchored"] += int(anchored.sum())
        floors.forget_offsets(vms, pa, pb, rtt < long_floor - ANCHOR_EXCESS_NS)
        suspect = pair_queued & ~anchored
        part_rtt = np.where(anchored[:, None], np.inf, part_rtt)
        queued = floors.queued(k, vms, pa, pb, rtt, iref, floor, anchored)
        part = np.setdiff1d(_queued_in_parts(len(vms), pa, pb, part_rtt, floor, iref), queued)
        if part.size:  # queued in most parts, not over the whole window
            counts["vms_queued_part"] += int(part.size)
            queued = np.union1d(queued, part)
        if iref >= 0:
            reach = _component(len(vms), iref, pa[~suspect], pb[~suspect])
            queued = queued[~reach[queued]]  # kept where pairs free of the queue reach ref
            behind = np.setdiff1d(np.flatnonzero(_component(len(vms), iref, pa, pb) & ~reach),
                                  queued)  # reached through queued, unanchored pairs alone
            if behind.size:
                counts["vms_behind_queues"] += int(behind.size)
                queued = np.union1d(queued, behind)
    touch = np.isin(pa, queued) | np.isin(pb, queued)
    qa, qb, qfits = pa[touch], pb[touch], _take(huygens, touch)  # for their OWD only
    if queued.size:
        counts["vms_queued"] += int(queued.size)
        log.info("window %d: left out as queued: %s", k, [vms[i] for i in queued.tolist()])
        pa, pb, suspect = pa[~touch], pb[~touch], suspect[~touch]
        huygens, ntp_fits = _take(huygens, ~touch), _take(ntp_fits, ~touch)
        if not pa.size:
            return None
    r = vms.index(ref) if ref in vms else None
    inside = _component(len(vms), r, pa, pb) if r is not None else None
    if inside is None or inside.sum() < 2:
        counts["windows_without_reference"] += 1
        return None
    clean = _component(len(vms), r, pa[~suspect], pb[~suspect])  # reached free of queues
    if suspect.any():  # left out where both VMs stay connected to ref without them
        drop = suspect & clean[pa] & clean[pb]
        counts["pairs_left_out"] += int(drop.sum())
        pa, pb = pa[~drop], pb[~drop]
        huygens, ntp_fits = _take(huygens, ~drop), _take(ntp_fits, ~drop)
    names = [vms[i] for i in np.flatnonzero(inside).tolist()]
    index = np.cumsum(inside) - 1  # VM -> its row in the solve (inside only)
    keep = inside[pa]
    pa, pb = pa[keep], pb[keep]
    huygens, ntp_fits = _take(huygens, keep), _take(ntp_fits, keep)
    ia, ib = index[pa], index[pb]
    floor2 = weight_floor_ns ** 2

    def values(fits: PairFits, theta: np.ndarray, a: np.ndarray) -> np.ndarray:
        """Each pair's (offset ns, drift ppm) at the centre read on its A's clock."""
        t_a = t_k + np.round(theta[a]).astype(np.int64)
        return np.column_stack([fits.offset_at(t_a), fits.drift_ppm])

    theta = np.array([offsets_ns.get(v, 0.0) for v in names])
    try:
        y = values(huygens, theta, ia)
        w = 1.0 / (huygens.residual_ns ** 2 + floor2)
        _check_finite(y, w)
        solver = GraphSolve(len(names), int(index[r]), ia, ib, w)
        x, _ = solver.solve(y)
        x, sig = solver.solve(values(huygens, x[:, 0], ia))
        _check_finite(x, w)
    except (ValueError, np.linalg.LinAlgError) as e:  # non-finite fits: skip the window
        log.warning("window %d: solve failed: %s", k, e)
        counts["solve_failures"] += 1
        return None
    est = _estimates(names, x, sig)
    theta = x[:, 0]
    if floors is not None:  # every fitted pair's network-corrected clock, at the centre on
        fa, fb = fitted      # A's clock, those left out of the solve too, between VMs that
        both = clean[fa] & clean[fb]  # pairs free of queues connect to the reference
        fa, fb = fa[both], fb[both]
        floors.trust(k, vms, fa, fb, t_k + np.round(theta[index[fa]]).astype(np.int64),
                     x[index[fb]] - x[index[fa]])
    ntp: dict[str, NodeEstimate] = {}
    ok = ntp_fits.ok
    ninside = _component(len(vms), r, pa[ok], pb[ok])
    if ninside.sum() > 1:
        sub = ok & ninside[pa]
        nidx = np.cumsum(ninside) - 1
        fits = _take(ntp_fits, sub)
        try:
            y = values(fits, theta, ia[sub])
            w = 1.0 / (fits.residual_ns ** 2 + floor2)
            _check_finite(y, w)
            nx, nsig = GraphSolve(int(ninside.sum()), int(nidx[r]), nidx[pa[sub]],
                                  nidx[pb[sub]], w).solve(y)
            ntp = _estimates([vms[i] for i in np.flatnonzero(ninside).tolist()], nx, nsig)
        except (ValueError, np.linalg.LinAlgError) as e:
            log.warning("window %d: NTP solve failed: %s", k, e)
            counts["solve_failures"] += 1
    row = np.where(inside, index, -1)  # VM -> its row of x (-1: none)
    held: list[str] = []
    for v in queued.tolist():  # its pairs' OWD, on an offset from them alone (others kept)
        sel = ((qa == v) & inside[qb]) | ((qb == v) & inside[qa])
        if not sel.any():
            continue
        v_is_a = qa[sel] == v
        u = np.where(v_is_a, qb[sel], qa[sel])
        fits = _take(qfits, sel)
        theta_a = np.where(v_is_a, offsets_ns.get(vms[v], 0.0), x[row[u], 0])
        y = values(fits, theta_a, np.arange(u.size))  # edge value: B's less A's
        vals = x[row[u]] + np.where(v_is_a, -1.0, 1.0)[:, None] * y
        w = 1.0 / (fits.residual_ns ** 2 + floor2)
        if not (np.isfinite(vals).all() and np.isfinite(w).all()):
            continue
        row[v] = len(names) + len(held)
        held.append(vms[v])
        x = np.vstack([x, w @ vals / w.sum()])
    owd, asym = _owd(records, names + held, row[dsrc], row[ddst], x, t_k)
    return WindowResult(k, t_k, est, ntp, owd, asym, int(pa.size),
                        queued=[vms[i] for i in queued.tolist()])


def _check_finite(y: np.ndarray, w: np.ndarray) -> None:
    if not (np.isfinite(y).all() and np.isfinite(w).all() and (w > 0).all()):
        raise ValueError("non-finite pair fits or weights")


def _estimates(names: list[str], x: np.ndarray, sig: np.ndarray) -> dict[str, NodeEstimate]:
    return {v: NodeEstimate(float(x[i, 0]), float(x[i, 1]), float(sig[i, 0]),
                            float(sig[i, 1])) for i, v in enumerate(names)}


def _take(fits: PairFits, sel: np.ndarray) -> PairFits:
    return PairFits(*(a[sel] for a in fits))


def _owd(records: Records, names: list[str], src: np.ndarray, dst: np.ndarray,
         x: np.ndarray, t_k: int) -> tuple[dict[str, OwdStats], dict[str, float]]:
    """OWD of every direction between two estimated VMs, on all its probes, and the
    asymmetry of every pair measured both ways (step 3); ``src``, ``dst``: per direction of
    ``records`` its VMs' rows in the solve ``x`` (``names``), -1 for a VM outside it."""
    use = np.flatnonzero((src >= 0) & (dst >= 0))
    if not use.size:
        return {}, {}
    src, dst = src[use], dst[use]
    lo, hi = records.starts[:-1][use], records.starts[1:][use]
    take = segments.ranges(lo, hi)
    starts = segments.starts_of(hi - lo)
    mins, p50, p99 = owd_many(records.tx_ns[take], records.rx_ns[take], starts,
                              x[dst, 0] - x[src, 0], x[dst, 1] - x[src, 1],
                              t_k + np.round(x[src, 0]).astype(np.int64))
    # one validation of every direction's OwdStats (half the CPU of one model each)
    owd = _OWD.validate_python({f"{names[s]}->{names[d]}": {
        "min_us": a, "p50_us": b, "p99_us": c, "n": m} for s, d, a, b, c, m in zip(
        src.tolist(), dst.tolist(), mins.tolist(), p50.tolist(), p99.tolist(),
        np.diff(starts).tolist(), strict=True)})
    return owd, asymmetry_many(names, src, dst, p50)


def _fit_pairs(records: Records, src: np.ndarray, dst: np.ndarray, guard_ns: float,
               counts: Counter[str], window_ns: int
               ) -> tuple[np.ndarray, np.ndarray, PairFits, PairFits, np.ndarray, np.ndarray,
                          Probes]:
    """The pairs (a, b) (a < b: ``src``, ``dst`` are each direction's VMs, numbered in name
    order) probed both ways with enough pure probes whose Huygens fit succeeded and is
    consistent, as arrays ``(a, b)``, with their Huygens and NTP-style fits (``ok`` False
    where the baseline failed), their minimum round trips and those of the window's parts
    (``_min_delays_ns``) (step 1)."""
    seg = segments.ids(records.starts)
    pure = pure_pairs(records.tx_ns, records.rx_ns, records.pair_id, guard_ns, seg)
    npure = np.bincount(seg[pure], minlength=records.src.size)
    nv = int(max(src.max(), dst.max())) + 1 if src.size else 1
    key = src * nv + dst
    order = np.argsort(key, kind="stable")
    pos = np.searchsorted(key[order], dst * nv + src)
    back = order[np.minimum(pos, max(key.size - 1, 0))] if key.size else order
    cand = np.flatnonzero((src < dst) & (pos < key.size) & (key[back] == dst * nv + src))
    few = (npure[cand] < MIN_PURE) | (npure[back[cand]] < MIN_PURE)
    counts["pairs_too_few_pure"] += int(few.sum())
    fi = cand[~few]
    ri = back[fi]
    if not fi.size:
        return fi, fi, None, None, fi, np.empty((0, PARTS)), None
    st = records.starts
    fsel, rsel = segments.ranges(st[fi], st[fi + 1]), segments.ranges(st[ri], st[ri + 1])
    fsel, rsel = fsel[pure[fsel]], rsel[pure[rsel]]  # pair by pair, each in record order
    nf, nr = npure[fi], npure[ri]
    p = Probes(records.tx_ns[fsel], records.rx_ns[fsel], segments.starts_of(nf),
               records.tx_ns[rsel], records.rx_ns[rsel], segments.starts_of(nr))
    h = fit_many(p)
    counts["pair_fit_failures"] += int((~h.ok).sum())
    fwd_min, rev_min, part_rtt = _min_delays_ns(h, p, window_ns)
    consistent = h.ok & (np.minimum(fwd_min, rev_min) >= -INCONSISTENT_NS)
    # no line leaves both directions a non-negative delay: a clock step or a bad timestamp
    # inside the window
    counts["pairs_inconsistent"] += int((h.ok & ~consistent).sum())
    # RFC 5905's clock filter keeps 1 sample in 8; fewer in a sparse window
    n = ntp_many(p, np.maximum(1, np.minimum(8, nf // 4)))
    counts["ntp_fit_failures"] += int((consistent & ~n.ok).sum())
    return (src[fi][consistent], dst[fi][consistent], _take(h, consistent),
            _take(n, consistent), (fwd_min + rev_min)[consistent], part_rtt[consistent],
            _take_probes(p, consistent))


def _take_probes(p: Probes, sel: np.ndarray) -> Probes:
    """The pairs ``sel`` (a mask) of ``p``."""
    fs, rs = p.fwd_starts, p.rev_starts
    i = np.flatnonzero(sel)
    fsel, rsel = segments.ranges(fs[i], fs[i + 1]), segments.ranges(rs[i], rs[i + 1])
    return Probes(p.fwd_tx[fsel], p.fwd_rx[fsel], segments.starts_of(fs[i + 1] - fs[i]),
                  p.rev_tx[rsel], p.rev_rx[rsel], segments.starts_of(rs[i + 1] - rs[i]))


def _min_delays_ns(fits: PairFits, p: Probes, window_ns: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair the two directions' minimum one-way delays implied by its fit (ns): the
    forward one and the reverse one (their sum, the minimum round trip, does not depend on
    the fitted offset); and, shape (pairs, ``PARTS``), its minimum round trip in each part of
    the window (the least forward plus the least reverse delay among the part's probes, inf
    where a direction has none), parts of ``window_ns // PARTS`` on A's clock about the
    middle of the pair's probes."""
    base = np.round(fits.offset_ns).astype(np.int64)  # integer part first, as in agents.owd
    n = fits.offset_ns.size

    def at(t, starts):
        """Per probe (times ``t``, pairs' segments ``starts``) the fit at ``t``, the integer
        part of its pair's offset and its flat index (pair, part)."""
        rel = t - segments.spread(fits.t_ref_ns, starts)
        fit = segments.spread(fits.offset_ns, starts) + segments.spread(
            fits.drift_ppm, starts) * 1e-6 * rel.astype(np.float64)
        part = np.clip((rel + window_ns // 2) * PARTS // window_ns, 0, PARTS - 1)
        return fit, segments.spread(base, starts), segments.ids(starts) * PARTS + part

    def least(d, flat):
        out = np.full(n * PARTS, np.inf)
        np.minimum.at(out, flat, d)
        return out.reshape(n, PARTS)
    fit, b, ff = at(p.fwd_tx, p.fwd_starts)
    fwd = (p.fwd_rx - p.fwd_tx - b).astype(np.float64) - (fit - b)
    fit, b, rf = at(p.rev_rx, p.rev_starts)
    rev = (p.rev_rx - p.rev_tx + b).astype(np.float64) + (fit - b)
    return (np.minimum.reduceat(fwd, p.fwd_starts[:-1]),
            np.minimum.reduceat(rev, p.rev_starts[:-1]), least(fwd, ff) + least(rev, rf))


def _component(n: int, ref: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mask, shape (n,), of the VMs connected to VM ``ref`` by the pairs ``(a[i], b[i])``."""
    labels = connected_components(coo_matrix((np.ones(a.size), (a, b)), shape=(n, n)),
                                  directed=False)[1]
    return labels == labels[ref]
