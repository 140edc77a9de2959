"""One-way delay (OWD) of probes once the two clocks are related by a fit.

With ``clock_B - clock_A = offset_ns + drift_ppm * 1e-6 * (t - t_ref_ns)`` (``t`` on A's
clock, as in ``agents.estimate.PairFit``), a probe A -> B sent at ``tx`` (A's clock) and received
at ``rx`` (B's clock) took ``owd = (rx - tx) - (offset_ns + drift_ppm * 1e-6 * (tx - t_ref_ns))``.
Its error is the fit's offset error; in Huygens the two directions' minimum OWDs are equal by
construction (the fit assumes it), so asymmetry shows in the percentiles above the minimum.

Source: OWD from synchronized clocks, as in Geng et al., "Exploiting a Natural Network Effect
for Scalable, Fine-grained Clock Synchronization", NSDI 2018; percentiles are the empirical
("linear", numpy's default) quantiles.
"""
from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping

import numpy as np

from agents import segments
from contracts.messages import OwdStats

__all__ = ["asymmetry_many", "asymmetry_us", "natural_key", "owd_many", "owd_stats"]


def _ns(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integer ns timestamps, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


def owd_stats(tx_ns, rx_ns, offset_ns: float, drift_ppm: float, t_ref_ns: int) -> OwdStats:
    """Corrected one-way delays of probes A -> B, summarised.

    Args:
        tx_ns: shape (n,), int64 ns, send times on A's clock.
        rx_ns: shape (n,), int64 ns, receive times on B's clock.
        offset_ns, drift_ppm, t_ref_ns: the B - A clock fit (``PairFit`` fields).

    Returns:
        ``OwdStats`` (``min_us``, ``p50_us``, ``p99_us`` in us, ``n``); with no probe,
        ``n == 0`` and the delays are None (a window without traffic is not an error).

    Raises:
        ValueError: arrays of different lengths, not 1-D or not integer; a non-finite fit.
    """
    tx = _ns(tx_ns, "tx_ns")
    rx = _ns(rx_ns, "rx_ns")
    if tx.shape != rx.shape:
        raise ValueError(f"tx_ns and rx_ns differ in length ({tx.size} vs {rx.size})")
    if not (math.isfinite(offset_ns) and math.isfinite(drift_ppm)):
        raise ValueError(f"non-finite clock fit: offset_ns={offset_ns}, drift_ppm={drift_ppm}")
    if tx.size == 0:
        return OwdStats()
    lo, p50, p99 = owd_many(tx, rx, np.array([0, tx.size]), np.array([offset_ns]),
                            np.array([drift_ppm]), np.array([t_ref_ns], dtype=np.int64))
    return OwdStats(min_us=float(lo[0]), p50_us=float(p50[0]), p99_us=float(p99[0]),
                    n=int(tx.size))


def owd_many(tx: np.ndarray, rx: np.ndarray, starts: np.ndarray, offset_ns: np.ndarray,
             drift_ppm: np.ndarray, t_ref_ns: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``owd_stats`` of many directions at once (the same floats): direction i's probes are
    ``tx[starts[i]:starts[i + 1]]`` (int64 ns, non-empty, ``agents.segments``) and its fit
    ``offset_ns[i]``, ``drift_ppm[i]``, ``t_ref_ns[i]`` (arrays). Returns arrays (min, p50,
    p99) in us, one entry per direction; finite fits assumed."""
    seg = segments.ids(starts)
    base = np.round(offset_ns).astype(np.int64)  # integer part removed before float
    raw = (rx - tx - segments.spread(base, starts)).astype(np.float64)
    corr = segments.spread(offset_ns - base, starts) + segments.spread(drift_ppm, starts) \
        * 1e-6 * (tx - segments.spread(t_ref_ns, starts)).astype(np.float64)
    owd_us = (raw - corr) / 1e3
    owd_us = segments.sorted_values(owd_us, starts, seg)
    return (owd_us[starts[:-1]], segments.percentile(owd_us, starts, 50),
            segments.percentile(owd_us, starts, 99))


@functools.lru_cache(maxsize=1 << 16)
def natural_key(name: str) -> tuple:
    """Sort key of a VM name in natural order: digit runs compare as numbers, so ``vm2``
    sorts before ``vm10`` (ties, e.g. ``vm01`` and ``vm1``, by the plain string)."""
    parts = re.split(r"(\d+)", name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


def asymmetry_us(owd: Mapping[str, OwdStats]) -> dict[str, float]:
    """OWD asymmetry of every pair measured both ways: the one definition the API serves.

    Args:
        owd: ``{"a->b": OwdStats}``, each direction corrected with its own clock fit.

    Returns:
        ``{"a|b": p50(a->b) - p50(b->a)}`` in us, with ``a`` before ``b`` in natural order
        (``natural_key``: ``vm2|vm10``); > 0: a -> b is the slower direction. A pair is
        left out unless both directions have a median.
    """
    ends = [key.partition("->")[::2] for key in owd]
    names = sorted({v for ab in ends for v in ab})
    index = {v: i for i, v in enumerate(names)}
    return asymmetry_many(names, np.array([index[a] for a, _ in ends], dtype=np.int64),
                          np.array([index[b] for _, b in ends], dtype=np.int64),
                          np.array([np.nan if s.p50_us is None else s.p50_us
                                    for s in owd.values()], dtype=np.float64))


def asymmetry_many(names: list[str], src: np.ndarray, dst: np.ndarray, p50_us: np.ndarray
                   ) -> dict[str, float]:
    """``asymmetry_us`` of directions given as arrays: direction i goes from VM
    ``names[src[i]]`` to ``names[dst[i]]`` (each direction once) with median OWD
    ``p50_us[i]`` (NaN: none); the same dict, in the same order."""
    if not src.size:
        return {}
    n = len(names)
    key = src * n + dst
    order = np.argsort(key)
    pos = np.searchsorted(key[order], dst * n + src)
    back = order[np.minimum(pos, key.size - 1)]
    nat = np.empty(n, dtype=np.int64)
    nat[sorted(range(n), key=lambda i: natural_key(names[i]))] = np.arange(n)
    use = np.flatnonzero((pos < key.size) & (key[back] == dst * n + src)
                         & (nat[src] < nat[dst]) & np.isfinite(p50_us)
                         & np.isfinite(p50_us[back]))
    use = use[np.lexsort((nat[dst[use]], nat[src[use]]))]
    diff = p50_us[use] - p50_us[back[use]]
    return {f"{names[a]}|{names[b]}": d for a, b, d in zip(
        src[use].tolist(), dst[use].tolist(), diff.tolist(), strict=True)}
