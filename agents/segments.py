"""Reductions over contiguous segments of flat arrays: the coordinator fits every probed pair
of a window at once, each pair's probes one segment of the same arrays, instead of one numpy
call per pair (a few microseconds each, thousands of pairs per window at 256 VMs).

A segmentation is ``starts``, shape (n_seg + 1,) int64, increasing: segment i holds the
elements ``starts[i]:starts[i + 1]``; every segment is non-empty (``np.ufunc.reduceat``
needs that); ``ids(starts)`` gives each element its segment.
"""
from __future__ import annotations

import numpy as np

__all__ = ["argmax", "argmin", "head_mean", "ids", "percentile", "ranges", "sort_ns",
           "sorted_values", "spread", "starts_of"]


def starts_of(counts: np.ndarray) -> np.ndarray:
    """Segment starts, shape (n + 1,), of segments of ``counts`` (n,) elements."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def ids(starts: np.ndarray) -> np.ndarray:
    """Each element's segment, shape (starts[-1],) int64."""
    return np.repeat(np.arange(starts.size - 1), np.diff(starts))


def spread(v: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each segment's value ``v[i]`` on each of its elements: ``v[ids(starts)]`` by
    ``np.repeat`` (a third of the CPU of that gather)."""
    return np.repeat(v, np.diff(starts))


def _first(hit: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Index of each segment's first True of ``hit`` (its start when it has none): the first
    True at or after each start, found among the Trues (half the CPU of a minimum over a
    per-element index array)."""
    nz = np.flatnonzero(hit)
    if not nz.size:
        return starts[:-1].copy()
    at = np.searchsorted(nz, starts[:-1])
    first = nz[np.minimum(at, nz.size - 1)]
    return np.where((at < nz.size) & (first < starts[1:]), first, starts[:-1])


def argmin(v: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Flat index of each segment's minimum of ``v`` (the first one, as ``np.argmin``)."""
    return _first(v == spread(np.minimum.reduceat(v, starts[:-1]), starts), starts)


def argmax(v: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Flat index of each segment's maximum of ``v`` (the first one, as ``np.argmax``)."""
    return _first(v == spread(np.maximum.reduceat(v, starts[:-1]), starts), starts)


def sorted_values(v: np.ndarray, starts: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """``v`` (float64, no NaN) sorted within each segment, segments kept in place: the values
    of ``np.sort`` of each segment, for order statistics. Segments of similar lengths (a
    window's directions) are rows of one padded matrix sorted row by row (2x faster than
    one radix sort of all values keyed by segment, at 640 000 probes); ragged ones one
    ``np.lexsort``."""
    if not v.size:
        return v.copy()
    n = np.diff(starts)
    width = int(n.max())
    if width * n.size > 2 * v.size + 4096:
        return v[np.lexsort((v, seg))]
    # each element's place in the matrix, flat: np.put and np.take on it cost half of a
    # (row, column) fancy index
    at = np.arange(v.size) + spread(np.arange(n.size) * width - starts[:-1], starts)
    rows = np.full(n.size * width, np.inf)
    np.put(rows, at, v)
    rows.reshape(n.size, width).sort(axis=1)
    return np.take(rows, at)


def sort_ns(t: np.ndarray, seg: np.ndarray, ref: np.ndarray,
            low: np.ndarray | None = None) -> np.ndarray:
    """Stable permutation that sorts int64 times ``t`` (ns) within each segment, then by
    ``low`` (0/1, optional) among equal times: one int64 key and a radix sort when every
    ``t - ref[seg]`` is within +-2**39 ns (9 minutes), else ``np.lexsort``."""
    rel = t - ref[seg]
    if rel.size == 0 or (-(1 << 39) <= rel.min() and rel.max() < 1 << 39
                         and seg.max() < 1 << 21):
        key = (seg << 41) | ((rel + (1 << 39)) << 1)
        return np.argsort(key if low is None else key | low, kind="stable")
    return np.lexsort((t, seg) if low is None else (low, t, seg))


def head_mean(v: np.ndarray, starts: np.ndarray, k: int) -> np.ndarray:
    """Mean of the ``min(k, n_i)`` smallest elements of each segment, summed smallest first
    (as the mean of a sorted head): k passes of ``argmin``, no sort."""
    n = np.minimum(np.diff(starts), k)
    w = v.copy()
    acc = np.zeros(n.size)
    for r in range(k):
        i = argmin(w, starts)
        take = r < n
        acc = np.where(take, acc + w[i], acc)
        w[i[take]] = np.inf
    return acc / n


def ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The indices ``lo[0]..hi[0]-1, lo[1]..hi[1]-1, ...`` in one array (int64)."""
    n = hi - lo
    s = starts_of(n)
    return np.arange(s[-1]) - np.repeat(s[:-1] - lo, n)


def percentile(v_sorted: np.ndarray, starts: np.ndarray, q: float) -> np.ndarray:
    """The ``q``-th percentile of each segment (``v`` sorted within segments) as
    ``np.percentile(segment, q)`` computes it (method "linear": the same virtual index and
    the same interpolation; numpy 2.4 differs from it by a few ulps, 1e-12 relative)."""
    n = np.diff(starts).astype(np.float64)
    quant = np.true_divide(q, 100)
    virtual = n * quant + (1 + quant * (1 - 1 - 1)) - 1   # numpy's linear: alpha = beta = 1
    prev = np.floor(virtual)
    gamma = virtual - prev
    lo = starts[:-1] + np.clip(prev, 0, n - 1).astype(np.int64)
    hi = starts[:-1] + np.clip(prev + 1, 0, n - 1).astype(np.int64)
    a, b = v_sorted[lo], v_sorted[hi]
    diff = b - a
    return np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
