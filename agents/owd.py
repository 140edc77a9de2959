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

import math
import re
from collections.abc import Mapping

import numpy as np

from agents.messages import OwdStats

__all__ = ["asymmetry_us", "natural_key", "owd_stats"]


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
    base = round(float(offset_ns))  # integer part removed before float: keeps ns precision
    raw = (rx - tx - np.int64(base)).astype(np.float64)
    corr = (offset_ns - base) + drift_ppm * 1e-6 * (tx - np.int64(t_ref_ns)).astype(np.float64)
    owd_us = (raw - corr) / 1e3
    p50, p99 = np.percentile(owd_us, [50, 99])
    return OwdStats(min_us=float(owd_us.min()), p50_us=float(p50), p99_us=float(p99),
                    n=int(tx.size))


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
    out = {}
    for key, ab in owd.items():
        a, _, b = key.partition("->")
        ba = owd.get(f"{b}->{a}")
        if natural_key(a) < natural_key(b) and ba is not None and \
                ab.p50_us is not None and ba.p50_us is not None:
            out[f"{a}|{b}"] = ab.p50_us - ba.p50_us
    return dict(sorted(out.items(), key=lambda kv: [natural_key(v) for v in kv[0].split("|")]))
