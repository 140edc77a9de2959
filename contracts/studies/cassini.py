"""CASSINI's results section: each job set's plan and the modes it ran in.

Source: Rajasekaran et al., CASSINI: Network-Aware Job Scheduling in Machine Learning
Clusters, NSDI 2024.
"""
from __future__ import annotations

from pydantic import Field

from contracts.base import Model


class CassiniJobTimes(Model):
    """One job's iteration times in one mode (an iteration counts as its slowest rank's)."""

    p50_s: float = Field(description="median iteration time, s")
    p99_s: float = Field(description="99th percentile iteration time, s")


class CassiniMode(Model):
    """A set's jobs run together in one mode; times over every iteration of every job."""

    mean_iteration_s: float | None = Field(description="mean iteration time, s")
    p99_iteration_s: float | None = Field(description="99th percentile iteration time, s")
    jobs: dict[str, CassiniJobTimes] = Field(default_factory=dict, description="per job")
    comm_overlap: float | None = Field(None, description="fraction of the jobs' collective "
                                       "time during which another job of the set was in its "
                                       "collective too (true time, from the ranks' own "
                                       "timestamps and the lab's clock truth); 0 = fully "
                                       "interleaved")
    comm_overlap_thirds: list[float | None] = Field(
        default_factory=list, description="comm_overlap in each third of the run (by the "
        "collectives' start, true time): how the interleaving held as the clocks drifted; "
        "null for a third without collectives")
    mean_iteration_thirds_s: list[float | None] = Field(
        default_factory=list, description="mean iteration time in each third of the run "
        "(each job's iterations cut in three runs of consecutive ones, pooled over the set), "
        "s")
    skipped_slots: int | None = Field(None, description="slots the jobs let pass, being later "
                                      "for them than their late_s (per job its slowest rank's "
                                      "count, summed; 0 without slots)")
    slot_error_ms: list[float] | None = Field(None, description="on slots: how far apart in "
                                              "true time the ranks' clocks start a slot the "
                                              "plan puts at one time (largest minus smallest "
                                              "error over the set's ranks), at the first and at "
                                              "the last nominal slot, ms: what the agents' "
                                              "correction leaves, or the raw clocks' offsets "
                                              "and drift; null without slots")
    error: str | None = Field(None, description="why the mode has no times")


class CassiniProfile(Model):
    """A job's iteration measured alone (``scheduler.plan.Profile``)."""

    iteration_s: float = Field(description="p50 iteration time alone, s")
    compute_s: float = Field(description="p50 compute phase, s")
    comm_s: float = Field(description="p50 collective phase, s")
    demand_mbit: float = Field(description="bus bandwidth while communicating, Mbit/s")


class CassiniSet(Model):
    """One set of jobs sharing a link: its CASSINI plan and the modes it ran in."""

    name: str
    score: float | None = Field(description="compatibility score at the best rotation (1 = "
                                            "fully compatible); null when it could not be "
                                            "planned")
    unshifted_score: float | None = Field(None, description="score with every shift 0")
    predicted_compatible: bool | None = Field(description="score >= the scenario's threshold")
    perimeter_s: float | None = Field(None, description="unified circle's perimeter, s")
    slots_s: dict[str, float] | None = Field(None, description="per job: its slot period, s")
    shifts_s: dict[str, float] | None = Field(description="per job: its time shift, s")
    late_s: dict[str, float | None] | None = Field(None, description="per job: its clearance, "
                                                   "how much later than its slot it may start "
                                                   "(later: it waits for the next slot), s; "
                                                   "null: starts at once however late")
    profiles: dict[str, CassiniProfile] | None = Field(None, description="per job, alone")
    error: str | None = Field(None, description="why the set could not be planned")
    modes: dict[str, CassiniMode] = Field(description="fair, shifted_synced, shifted_raw, "
                                                      "unfair (those that ran)")


class CassiniSection(Model):
    """CASSINI's sets (``session.cassini``)."""

    sets: list[CassiniSet]
    score_ranks_gains: bool | None = Field(description="the scores rank the sets in the "
                                                       "order of their measured gains (fair / "
                                                       "shifted_synced mean); null with fewer "
                                                       "than two")


SECTIONS = {"cassini": CassiniSection}
"""Its results sections by key."""


def report_lines(doc) -> list[str]:
    """Its lines of the printed report (none without its section)."""
    if doc.cassini is None:
        return []
    lines = []
    for cs in doc.cassini.sets:
        if cs.score is None:
            lines.append(f"  cassini {cs.name}: not planned ({cs.error})")
            continue
        shifts = " ".join(f"{j} {t:.3f}" for j, t in (cs.shifts_s or {}).items())
        lines.append(f"  cassini {cs.name}: score {cs.score:.3f} (unshifted "
                     f"{cs.unshifted_score:.3f}), compatible {cs.predicted_compatible}, "
                     f"shifts s: {shifts}")
        fair = cs.modes.get("fair")
        for name, m in cs.modes.items():
            if m.mean_iteration_s is None:
                lines.append(f"    {name:15s} {m.error}")
                continue
            ratio = (f" (fair / this: mean {fair.mean_iteration_s / m.mean_iteration_s:.2f}, "
                     f"p99 {fair.p99_iteration_s / m.p99_iteration_s:.2f})"
                     if fair and fair.mean_iteration_s and name != "fair" else "")
            overlap = ("" if m.comm_overlap is None else
                       f", collectives overlapping {m.comm_overlap:.0%}")
            lines.append(f"    {name:15s} iteration mean {m.mean_iteration_s:.3f} s, p99 "
                         f"{m.p99_iteration_s:.3f} s{ratio}{overlap}")
    lines.append(f"  cassini: scores rank the sets' gains: {doc.cassini.score_ranks_gains}")
    return lines
