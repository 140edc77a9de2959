"""Summary statistics of samples: the project's one percentile helper.

``percentiles`` uses numpy's default definition (``numpy.percentile``, method "linear";
Hyndman & Fan 1996, "Sample Quantiles in Statistical Packages", definition 7, also R's
default and Excel's PERCENTILE.INC): for ``n`` sorted values ``x[0..n-1]`` the p-th
percentile sits at position ``h = p / 100 * (n - 1)`` and is ``x[floor(h)] + (h - floor(h)) *
(x[floor(h) + 1] - x[floor(h)])``. So ``p50`` of an even number of values is the mean of the
two middle ones (not the upper median), ``p0`` is the minimum and ``p100`` the maximum.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

DEFAULT_KEYS = ("p50", "p90", "p99", "max", "mean")
_PERCENTILE = re.compile(r"^p(\d+(?:\.\d+)?)$")
_OTHER = ("min", "max", "mean", "n")


def _parse_keys(keys: Sequence[str]) -> list[tuple[str, float | None]]:
    parsed: list[tuple[str, float | None]] = []
    for key in keys:
        m = _PERCENTILE.match(key)
        if m and 0.0 <= float(m.group(1)) <= 100.0:
            parsed.append((key, float(m.group(1))))
        elif key in _OTHER:
            parsed.append((key, None))
        else:
            raise ValueError(f"keys: unknown statistic {key!r}; expected pN with N in 0..100 "
                             f"(e.g. p50, p99.9) or one of {', '.join(_OTHER)}")
    return parsed


def percentiles(values: Iterable[float] | np.ndarray,
                keys: Sequence[str] = DEFAULT_KEYS,
                digits: int | None = None) -> dict[str, float | int] | None:
    """Percentiles and simple statistics of ``values``, in the order of ``keys``.

    Args:
        values: samples (any shape; flattened), in any unit; the results keep that unit.
        keys: ``"pN"`` for the N-th percentile (0 <= N <= 100, decimals allowed: ``"p99.9"``,
            linear interpolation as described in the module docstring), ``"min"``, ``"max"``,
            ``"mean"`` (arithmetic) and ``"n"`` (the number of samples, an int).
        digits: round every float result to this many decimals (None: no rounding).

    Returns:
        ``{key: value}`` (floats, and an int for ``"n"``), or None when ``values`` is empty.

    Raises:
        ValueError: an unknown key, or a value that is NaN or infinite.
    """
    parsed = _parse_keys(keys)
    v = np.asarray(list(values) if not isinstance(values, np.ndarray) else values,
                   dtype=float).ravel()
    if v.size == 0:
        return None
    if not np.isfinite(v).all():
        raise ValueError(f"values: {int((~np.isfinite(v)).sum())} of {v.size} samples are NaN "
                         "or infinite; expected finite numbers")
    qs = [q for _, q in parsed if q is not None]
    at = dict(zip(qs, np.percentile(v, qs).tolist(), strict=True)) if qs else {}
    out: dict[str, float | int] = {}
    for key, q in parsed:
        if key == "n":
            out[key] = int(v.size)
            continue
        x = at[q] if q is not None else {"min": v.min, "max": v.max, "mean": v.mean}[key]()
        x = float(x)
        out[key] = round(x, digits) if digits is not None else x
    return out
