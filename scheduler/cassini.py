"""CASSINI's geometric abstraction: demand circles, compatibility scores and time shifts.

Pure logic (numpy only): a scheduler that knows the jobs' measured iteration profiles and which
links they share runs it; it imports nothing of the lab. Source: S. Rajasekaran, M. Ghobadi,
A. Akella, "CASSINI: Network-Aware Job Scheduling in Machine Learning Clusters", NSDI 2024,
section 3 (the geometric abstraction, the compatibility score, Algorithm 1 for the shifts);
its precursor is "Congestion control in machine learning clusters", HotNets 2022.

The model, with times in seconds and demands in any bandwidth unit shared with the capacity:

* A job j iterates with period ``iter_j``; its bandwidth demand over one iteration,
  ``d_j(t)`` for t in [0, iter_j), is rolled onto a *circle* of perimeter ``iter_j``
  (communication arcs "up", compute arcs "down"). ``Circle`` holds it sampled in bins of
  ``resolution_s``.
* The jobs sharing one link of capacity C go on a *unified circle* of perimeter
  ``p = LCM(iter_j)`` (periods rounded to the resolution first); job j repeats ``p / iter_j``
  times on it and is rotated by an angle ``Delta_j``, i.e. delayed by the time shift
  ``t_j = Delta_j / (2 pi) * p`` (only ``t_j mod iter_j`` matters).
* The *compatibility score* of a rotation, over the angles alpha of the unified circle's
  grid (``|A|`` of them)::

      score = 1 - sum_alpha max(0, sum_j d_j(alpha - Delta_j) - C) / (|A| * C)

  1 means the jobs fit under the capacity at every angle (fully compatible); the excess demand
  lowers it (it is negative when the excess exceeds C on average). ``best_rotation`` searches
  the rotations on a grid (job 0 fixed at 0) for the highest score.
* Across links, the *affinity graph* (bipartite: jobs and links, an edge per job on a link,
  weighted by the job's shift on that link) turns per-link shifts into one shift per job: a
  walk from a root job at 0 gives link l the reference ``T_j - t_j^l`` and the next job k on
  it ``T_k = ref_l + t_k^l``. The shifts are unique when the graph has no loop; ``job_shifts``
  refuses a graph with one (CASSINI then discards that placement candidate).
* A job's *clearance* (``clearance``): how much later than its shift it can run before the
  score falls; a job later than that for a slot is better off waiting for its next one
  (``workloads.schedule``). Not in the paper: our enforcement's tolerance.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Circle", "Rotation", "best_rotation", "clearance", "job_shifts", "score",
           "unified_perimeter"]

DEFAULT_RESOLUTION_S = 0.01
MAX_CANDIDATES = 200_000


def _bins(seconds: float, resolution_s: float) -> int:
    """``seconds`` as a whole number of bins (rounded to the nearest)."""
    return int(round(seconds / resolution_s))


@dataclass(frozen=True)
class Circle:
    """One job's bandwidth demand over one iteration, sampled in bins.

    Attributes:
        demand: shape (n,), the demand in bin i = [i * resolution_s, (i + 1) * resolution_s)
            of the iteration; the same unit as the link capacity (e.g. Mbit/s).
        resolution_s: bin width, s; the perimeter is ``n * resolution_s``.
    """

    demand: np.ndarray
    resolution_s: float = DEFAULT_RESOLUTION_S

    def __post_init__(self) -> None:
        d = np.asarray(self.demand, dtype=float)
        if d.ndim != 1 or d.size == 0:
            raise ValueError(f"demand: a non-empty 1-D array, not shape {d.shape}")
        if not np.all(np.isfinite(d)) or np.any(d < 0):
            raise ValueError("demand: finite values >= 0")
        if not self.resolution_s > 0:
            raise ValueError(f"resolution_s: > 0, not {self.resolution_s}")
        object.__setattr__(self, "demand", d)

    @classmethod
    def from_phases(cls, period_s: float, phases: Sequence[tuple[float, float, float]],
                    resolution_s: float = DEFAULT_RESOLUTION_S) -> Circle:
        """A circle of perimeter ``period_s`` (rounded to the resolution) with demand ``bw``
        on every arc ``(start_s, end_s, bw)`` (from the iteration's start; arcs may wrap past
        the perimeter and add up where they overlap) and 0 elsewhere.

        Raises:
            ValueError: a period shorter than one bin, an arc with ``end_s < start_s`` or a
                negative demand.
        """
        n = _bins(period_s, resolution_s)
        if n < 1:
            raise ValueError(f"period_s: {period_s} s is shorter than one bin "
                             f"({resolution_s} s)")
        demand = np.zeros(n)
        for start, end, bw in phases:
            if end < start or bw < 0:
                raise ValueError(f"phase ({start}, {end}, {bw}): needs start <= end, bw >= 0")
            a, b = _bins(start, resolution_s), _bins(end, resolution_s)
            idx = np.arange(a, b) % n
            np.add.at(demand, idx, bw)
        return cls(demand, resolution_s)

    @property
    def bins(self) -> int:
        """Number of bins of one iteration."""
        return int(self.demand.size)

    @property
    def period_s(self) -> float:
        """Perimeter (iteration time), s."""
        return self.bins * self.resolution_s

    def on(self, total_bins: int, shift_bins: int = 0) -> np.ndarray:
        """The demand over ``total_bins`` bins (a multiple of ``bins``) of a unified circle,
        the job delayed by ``shift_bins`` bins: ``out[b] = demand[(b - shift) mod n]``."""
        if total_bins % self.bins:
            raise ValueError(f"total_bins: {total_bins} is not a multiple of {self.bins}")
        return np.roll(np.tile(self.demand, total_bins // self.bins), shift_bins)


def _same_resolution(circles: Sequence[Circle]) -> float:
    if not circles:
        raise ValueError("circles: at least one")
    res = {c.resolution_s for c in circles}
    if len(res) != 1:
        raise ValueError(f"circles: one resolution_s for all, not {sorted(res)}")
    return res.pop()


def unified_perimeter(circles: Sequence[Circle]) -> float:
    """The unified circle's perimeter: LCM of the iteration times (in whole bins), s.

    Raises:
        ValueError: no circles, or circles of different resolutions.
    """
    res = _same_resolution(circles)
    return math.lcm(*(c.bins for c in circles)) * res


def _excess(circles: Sequence[Circle], shifts: Sequence[int], total: int,
            capacity: float) -> float:
    load = sum(c.on(total, s) for c, s in zip(circles, shifts, strict=True))
    return float(np.maximum(load - capacity, 0.0).sum())


def score(circles: Sequence[Circle], shifts_s: Sequence[float], capacity: float) -> float:
    """The compatibility score of ``circles`` on a link of ``capacity`` with job j delayed by
    ``shifts_s[j]`` seconds (rounded to bins): ``1 - sum excess / (|A| * C)`` over the bins of
    the unified circle (see the module docstring).

    Raises:
        ValueError: ``capacity <= 0``, a shift per circle missing, or mixed resolutions.
    """
    if not capacity > 0:
        raise ValueError(f"capacity: > 0, not {capacity}")
    res = _same_resolution(circles)
    total = math.lcm(*(c.bins for c in circles))
    shifts = [_bins(s, res) for s in shifts_s]
    return 1.0 - _excess(circles, shifts, total, capacity) / (total * capacity)


@dataclass(frozen=True)
class Rotation:
    """The best rotation of a link's jobs.

    Attributes:
        score: compatibility score at that rotation (1 = fully compatible).
        shifts_s: per job (circle order), its time shift on this link, s, in
            [0, iteration time); job 0's is 0.
        perimeter_s: the unified circle's perimeter, s.
    """

    score: float
    shifts_s: tuple[float, ...]
    perimeter_s: float


def best_rotation(circles: Sequence[Circle], capacity: float, step_s: float | None = None,
                  max_candidates: int = MAX_CANDIDATES) -> Rotation:
    """The rotation of the jobs on one link with the highest compatibility score.

    Job 0 stays at 0; every other job j is tried at every shift ``0, step_s, 2 step_s, ...``
    below its iteration time (exhaustive over the grid's product). Among rotations of equal
    score it takes the one deepest inside their set (``_deepest``: most grid steps from any
    worse rotation, so a job that runs a little early or late keeps the score; then the
    smallest shifts, in order). Cost: candidates x unified bins.

    Args:
        circles: the jobs' circles, one resolution.
        capacity: the link's capacity, the demands' unit.
        step_s: the rotation grid, s (default: the resolution; rounded to whole bins).
        max_candidates: refuse a grid with more rotations than this.

    Raises:
        ValueError: ``capacity <= 0``, mixed resolutions, or more candidates than
            ``max_candidates`` (the message gives the count: use a coarser ``step_s``).
    """
    if not capacity > 0:
        raise ValueError(f"capacity: > 0, not {capacity}")
    res = _same_resolution(circles)
    step = max(1, _bins(step_s, res)) if step_s is not None else 1
    total = math.lcm(*(c.bins for c in circles))
    grids = [range(0, c.bins, step) for c in circles[1:]]
    count = math.prod(len(g) for g in grids)
    if count > max_candidates:
        raise ValueError(f"step_s: {count} rotations on the grid, more than max_candidates "
                         f"{max_candidates}; use a coarser step_s")
    tiled0 = circles[0].on(total)
    rest = [[c.on(total, s) for s in g] for c, g in zip(circles[1:], grids, strict=True)]
    excess = np.empty([len(g) for g in grids])
    for combo in itertools.product(*(range(len(g)) for g in grids)):
        load = tiled0 + sum((rest[j][k] for j, k in enumerate(combo)), np.zeros(total))
        excess[combo] = np.maximum(load - capacity, 0.0).sum()
    least = float(excess.min())
    best = _deepest(excess <= least + 1e-9 * capacity)
    shifts = (0.0,) + tuple(g[k] * res for g, k in zip(grids, best, strict=True))
    return Rotation(score=1.0 - least / (total * capacity), shifts_s=shifts,
                    perimeter_s=total * res)


def _deepest(best: np.ndarray) -> tuple[int, ...]:
    """The first cell (C order) of the last non-empty erosion of the boolean grid ``best``:
    each step keeps the cells whose neighbours one step along every axis (circularly: a
    shift wraps around its job's iteration) are kept too."""
    while True:
        inner = best.copy()
        for axis in range(best.ndim):
            for d in (1, -1):
                inner &= np.roll(best, d, axis=axis)
        if not inner.any() or inner.all():
            return tuple(int(i) for i in np.argwhere(best)[0])
        best = inner


def clearance(circles: Sequence[Circle], shifts_s: Sequence[float], capacity: float,
              job: int) -> float:
    """How much later than its shift job ``job`` can run, the others on theirs, before the
    compatibility score falls: the largest delay d (whole bins, below its iteration time)
    such that every delay in [0, d] keeps ``score(circles, shifts_s, capacity)``, s.

    Raises:
        ValueError: as ``score``.
    """
    res = _same_resolution(circles)
    at = score(circles, shifts_s, capacity)
    later = list(shifts_s)
    for d in range(1, circles[job].bins):
        later[job] = shifts_s[job] + d * res
        if score(circles, later, capacity) < at - 1e-9:
            return (d - 1) * res
    return (circles[job].bins - 1) * res


def job_shifts(links: Mapping[Hashable, Mapping[Hashable, float]],
               periods_s: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """One time shift per job from the per-link shifts, through the affinity graph.

    Args:
        links: link -> {job: that job's shift on that link, s} (``Rotation.shifts_s``).
        periods_s: job -> iteration time, s (a shift is reduced modulo it).

    Returns:
        job -> shift in [0, period), s; the first job of every connected part (in the order
        of ``links``) is at 0.

    Raises:
        ValueError: the affinity graph has a loop (two links share two jobs, or a longer
            cycle): its shifts would not be unique; or a job without a period.
    """
    jobs_of = {link: dict(shifts) for link, shifts in links.items()}
    links_of: dict[Hashable, list[Hashable]] = {}
    for link, shifts in jobs_of.items():
        for job in shifts:
            if job not in periods_s:
                raise ValueError(f"periods_s: no period for job {job!r}")
            links_of.setdefault(job, []).append(link)
    out: dict[Hashable, float] = {}
    seen_links: set[Hashable] = set()
    for root in links_of:
        if root in out:
            continue
        out[root] = 0.0
        stack: list[tuple[Hashable, Hashable | None]] = [(root, None)]  # (job, via link)
        while stack:
            job, via = stack.pop()
            for link in links_of[job]:
                if link == via:
                    continue
                if link in seen_links:
                    raise ValueError(f"affinity graph: a loop through job {job!r} and link "
                                     f"{link!r}; the shifts would not be unique")
                seen_links.add(link)
                ref = out[job] - jobs_of[link][job]
                for other, t in jobs_of[link].items():
                    if other == job:
                        continue
                    if other in out:
                        raise ValueError(f"affinity graph: a loop through job {other!r} and "
                                         f"link {link!r}; the shifts would not be unique")
                    out[other] = (ref + t) % periods_s[other]
                    stack.append((other, link))
    return out
