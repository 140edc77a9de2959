"""The results' ``comparisons``: every compared pair of arms of every study, from all the
repetitions of a run (``nslab run --repeat N``; one run is N = 1 and ``no_difference``).
Computed by ``session.stats`` (the interval's model and its source are there)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from contracts.base import Model

Verdict = Literal["better", "worse", "no_difference"]
"""Whether the arm did better than its baseline, worse, or no difference showed at this N
(the ratio's interval holds 1, or is unbounded)."""


class Comparison(Model):
    """One arm against its baseline on one metric."""

    study: str = Field(description="the study that ran both arms, e.g. placement, two_step")
    arm: str = Field(description="the arm compared, e.g. aware")
    baseline: str = Field(description="the arm it is compared with, e.g. naive")
    metric: str = Field(description="what was measured, with its unit, e.g. completion_s")
    better: Literal["lower", "higher"] = Field(description="which way of the metric is better")
    n: int = Field(description="repetitions with a sample in both arms (the smaller count)")
    ratio_median: float | None = Field(description="median(arm) / median(baseline); null "
                                       "without samples")
    ratio_ci95: list[float | None] = Field(description="95 % interval of the ratio of the "
                                           "arms' medians [low, high] (Welch's t on logs); "
                                           "null bounds: unbounded at this N")
    verdict: Verdict
    medians: dict[str, float | None] = Field(description="per arm: its median, in the "
                                             "metric's unit")
    medians_ci95: dict[str, list[float | None]] = Field(description="per arm: 95 % interval "
                                                        "of its median [low, high]")
    samples: dict[str, list[float | None]] = Field(description="per arm: every repetition's "
                                                   "value in order; null: it failed")
    saturated: dict[str, list[bool]] = Field(description="per arm: whether the fidelity "
                                             "check flagged each repetition (kept in the "
                                             "samples)")
    saturated_n: int = Field(description="repetitions with either arm flagged saturated")
    reference: float | None = Field(None, description="the seed's or a paper's figure for "
                                    "the same ratio, shown beside ours, never instead")
    reference_source: str | None = Field(None, description="where the reference comes from")


def report_lines(doc) -> list[str]:
    """The comparisons, one line each (none without them)."""
    lines = []
    for c in doc.comparisons or []:
        lo, hi = (f"{x:.3f}" if x is not None else "?" for x in c.ratio_ci95)
        ratio = f"{c.ratio_median:.3f}" if c.ratio_median is not None else "-"
        ref = (f"; {c.reference_source} {c.reference}" if c.reference is not None else "")
        sat = f", saturated in {c.saturated_n} of {c.n}" if c.saturated_n else ""
        words = {"better": "BETTER", "worse": "WORSE",
                 "no_difference": f"no difference at N={c.n}"}
        lines.append(f"    {c.study}: {c.arm} / {c.baseline} {c.metric} {ratio} "
                     f"[{lo}, {hi}] n={c.n}{sat}: {words[c.verdict]}{ref}")
    return (["  comparisons (ratio of medians [95 % interval]):"] + lines) if lines else []
