"""Time series for the results document, kept small: a series longer than ``max_points`` is
cut into that many runs of consecutive samples, each reduced to one point (the mean for a rate
or a fraction, the largest for a duration whose tail matters, the last for a sampled state).
Pure functions; the results' series (``lab.fidelity``, ``session.scoring``, ``session.jobs``)
and the HTML report (``nslab report``) use them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

Reduce = Literal["mean", "max", "last"]


def runs(n: int, max_points: int) -> list[range]:
    """``n`` consecutive samples as at most ``max_points`` runs of near-equal length, in
    order (one sample per run when ``n <= max_points``).

    Raises:
        ValueError: ``max_points`` < 1.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    edges = np.linspace(0, n, min(n, max_points) + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def downsample(values: Sequence[float | None], max_points: int, how: Reduce = "mean",
               digits: int = 6) -> list[float | None]:
    """``values`` reduced to at most ``max_points`` points (``runs``), each rounded to
    ``digits``; a None (not measured) is left out of its run, a run of Nones gives None.

    Args:
        values: the series, in time order.
        max_points: at most this many points out.
        how: ``mean``, ``max`` or ``last`` of each run.
        digits: decimals kept.

    Raises:
        ValueError: ``max_points`` < 1 or an unknown ``how``.
    """
    reduce = {"mean": np.mean, "max": np.max, "last": lambda a: a[-1]}.get(how)
    if reduce is None:
        raise ValueError(f"how must be mean, max or last, got {how!r}")
    out: list[float | None] = []
    for r in runs(len(values), max_points):
        got = [values[i] for i in r if values[i] is not None]
        out.append(round(float(reduce(np.asarray(got, dtype=float))), digits) if got else None)
    return out
