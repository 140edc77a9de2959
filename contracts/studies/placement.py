"""The placement comparison's results section: the naive and the collocation-aware job.
"""
from __future__ import annotations

from pydantic import Field

from contracts.base import Model


class PlacementComparison(Model):
    """Naive vs collocation-aware completion, when both jobs completed."""

    naive_s: float = Field(description="naive job's completion, s")
    aware_s: float = Field(description="collocation-aware job's completion, s")
    ratio: float = Field(description="aware_s / naive_s")
    aware_avoided_shared_hosts: bool
    naive_shared_host_ranks: int = Field(description="ranks of the naive job sharing a host")


SECTIONS = {"placement_comparison": PlacementComparison}
"""Its results sections by key."""


def report_lines(doc) -> list[str]:
    """The comparison in one line (none without it)."""
    cmp_ = doc.placement_comparison
    if cmp_ is None:
        return []
    return [f"  collocation-aware placement: {cmp_.aware_s:.3f} s vs naive "
            f"{cmp_.naive_s:.3f} s (ratio {cmp_.ratio}); avoided shared hosts: "
            f"{cmp_.aware_avoided_shared_hosts}"]
