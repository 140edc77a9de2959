"""Medians, 95 % intervals and verdicts of repeated measurements (``--repeat N``).

Every study that compares arms hands its samples here; one implementation for the studies and
the benchmarks. The model: a timing (a completion, an offset error) is positive and
right-skewed, so each arm is taken as log-normal. An arm's interval is Student's t interval of
the mean of its logs, exponentiated (an interval for its median); a comparison's is Welch's t
interval of the difference of the two arms' mean logs, exponentiated (an interval for the
ratio of their medians). Why not the bootstrap: at the N a lab affords (3-10) a percentile
bootstrap has few distinct resamples (10 at N = 3) and covers the truth well under 95 % of the
time; why not a rank interval (Hodges-Lehmann with Mann-Whitney): it cannot reach 95 % below 4
samples per arm. The t intervals hold about 95 % from N = 2 when the log-normal model holds
(``tests/unit/test_stats.py`` draws 1000 pairs of arms and counts).

A verdict is given only where the interval excludes 1: ``better`` (the arm's metric moved the
way that is better, lower by default), ``worse``, otherwise ``no_difference`` (at this N).

Sources: B. L. Welch, "The generalization of Student's problem when several different
population variances are involved", Biometrika 1947; ``scipy.stats.ttest_ind``,
``scipy.stats.ttest_1samp`` (``confidence_interval``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

LEVEL = 0.95
"""The intervals' confidence level."""


def _logs(samples: Sequence[float | None]) -> np.ndarray:
    """The logs of the positive, finite samples (a failed repetition is None)."""
    x = np.array([s for s in samples if s is not None and math.isfinite(s) and s > 0], float)
    return np.log(x)


def _finite(x: float) -> float | None:
    return round(float(x), 6) if math.isfinite(x) else None


def median_ci(samples: Sequence[float | None]) -> tuple[float | None, list[float | None]]:
    """An arm's median and its 95 % interval ``[low, high]``: None without samples, the
    interval None-bounded with fewer than 2 (unbounded at this N)."""
    y = _logs(samples)
    if y.size == 0:
        return None, [None, None]
    median = _finite(float(np.median(np.exp(y))))
    if y.size < 2 or np.ptp(y) == 0:
        return median, [median, median] if y.size >= 2 else [None, None]
    ci = sps.ttest_1samp(y, 0.0).confidence_interval(LEVEL)
    return median, [_finite(math.exp(ci.low)), _finite(math.exp(ci.high))]


def ratio_ci(arm: Sequence[float | None], baseline: Sequence[float | None]
             ) -> tuple[float | None, list[float | None], int]:
    """``median(arm) / median(baseline)``, the 95 % interval of the ratio of their medians
    (Welch's t on the logs, see the module doc) and n, the smaller arm's sample count. The
    interval is ``[None, None]`` (unbounded) with fewer than 2 samples in either arm."""
    a, b = _logs(arm), _logs(baseline)
    n = int(min(a.size, b.size))
    if n == 0:
        return None, [None, None], 0
    ratio = _finite(float(np.median(np.exp(a)) / np.median(np.exp(b))))
    if n < 2:
        return ratio, [None, None], n
    if np.ptp(a) == 0 and np.ptp(b) == 0:  # no spread at all: the ratio is exact
        return ratio, [ratio, ratio], n
    ci = sps.ttest_ind(a, b, equal_var=False).confidence_interval(LEVEL)
    return ratio, [_finite(math.exp(ci.low)), _finite(math.exp(ci.high))], n


def verdict(ci: Sequence[float | None], better: str = "lower") -> str:
    """``better``, ``worse`` or ``no_difference``: the interval of arm / baseline against 1,
    where ``better`` says which way is better (``lower`` or ``higher``)."""
    low, high = ci
    if low is None or high is None or low <= 1.0 <= high:
        return "no_difference"
    below = high < 1.0
    return "better" if below == (better == "lower") else "worse"


def comparison(study: str, arm: str, baseline: str, metric: str,
               samples: dict[str, Sequence[float | None]],
               saturated: dict[str, Sequence[bool]] | None = None, better: str = "lower",
               reference: float | None = None, reference_source: str | None = None) -> dict:
    """One ``comparisons`` entry (``contracts.comparisons.Comparison``): ``arm`` against
    ``baseline`` on ``metric`` from every repetition's sample of each (``samples``: arm ->
    values in repetition order, None for a failed one; ``saturated``: arm -> whether the
    fidelity check flagged that repetition; ``reference``: the seed's or a paper's ratio, shown
    beside ours)."""
    ratio, ci, n = ratio_ci(samples[arm], samples[baseline])
    medians = {k: median_ci(samples[k]) for k in (arm, baseline)}
    flags = {k: list((saturated or {}).get(k, [False] * len(samples[k]))) for k in (arm, baseline)}
    return {"study": study, "arm": arm, "baseline": baseline, "metric": metric,
            "better": better, "n": n, "ratio_median": ratio, "ratio_ci95": ci,
            "verdict": verdict(ci, better),
            "medians": {k: m for k, (m, _) in medians.items()},
            "medians_ci95": {k: c for k, (_, c) in medians.items()},
            "samples": {k: list(samples[k]) for k in (arm, baseline)},
            "saturated": flags,
            "saturated_n": sum(any(f[i] for f in flags.values() if i < len(f))
                               for i in range(max(map(len, flags.values()), default=0))),
            "reference": reference, "reference_source": reference_source}
