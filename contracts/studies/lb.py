"""The load-balancer comparison's results section: ECMP, spraying, REPS and Ethereal.
"""
from __future__ import annotations

from pydantic import Field

from contracts.base import Model
from contracts.enums import BalancerMode, LbCase, LbCollective


class LbRun(Model):
    """One run of the load-balancer comparison (``session.lb``)."""

    mode: BalancerMode = Field(
        description="ecmp, spray: the fabric alone; reps, ethereal: the hosts' balancer on the "
        "entropy fabric")
    collective: LbCollective = Field(
        description="all_to_all, an AllReduce algorithm, or the section's trace")
    case: LbCase
    oversubscription: float = Field(description="a leaf's VM rate / its uplink rate (1: 1:1)")
    completion_s: float | None = Field(description="the job's completion, s (VM clocks); "
                                                   "null when it did not finish")
    imbalance: float | None = Field(description="max / mean of the bytes on the leaf-spine "
                                                "links (both directions, the lab's counters; "
                                                "link_down: the failed link's spine left out); "
                                                "1.0 is perfect")
    retransmits: int | None = Field(description="TCP segments the ranks retransmitted "
                                                "(TCP_INFO, warm-up included)")
    rtos: int | None = Field(description="the ranks' TCP retransmission timeouts (TCP_INFO; "
                                         "null before Linux 6.7)")
    reordering: int | None = Field(description="reordering events the ranks' TCP senders "
                                               "detected (TCP_INFO reord_seen; losses are not "
                                               "counted)")
    finished: bool = Field(description="every rank verified every iteration in time")
    fault_at_s: float | None = Field(description="link_down: when the link went down, s after "
                                                 "the job's launch")
    link_bytes: dict[str, int] = Field(description="bytes per leaf-spine link (leaf-spine) "
                                                   "during the run")
    link_bytes_at_fault: dict[str, int] = Field(description="link_down: bytes per leaf-spine "
                                                "link from the run's start until the link was "
                                                "down and the routes around it (empty "
                                                "otherwise)")
    balancer_events: dict[str, int] = Field(description="the ranks' balancer counters summed: "
                                            "ethereal failed_marks, moves, path_changes; reps "
                                            "clean_acks, marked_acks, freezes (empty for "
                                            "ecmp, spray)")
    error: str | None = Field(description="null, or why the run failed")


class LbRatio(Model):
    """Every mode's completion as a fraction of ECMP's in the same conditions."""

    oversubscription: float = Field(description="a leaf's VM rate / its uplink rate")
    collective: str
    case: str
    ecmp_s: float | None = Field(description="ECMP's completion, s")
    to_ecmp: dict[str, float | None] = Field(description="mode -> completion / ECMP's")


class LbSection(Model):
    """ECMP, packet spraying, REPS and Ethereal compared (``session.lb``)."""

    runs: list[LbRun]
    ratios: list[LbRatio]
    paper: dict[str, float] = Field(description="Ethereal's completion as a fraction of "
                                                "spraying's and REPS's at best, in the paper")


SECTIONS = {"lb": LbSection}
"""Its results sections by key."""


def report_lines(doc) -> list[str]:
    """Its lines of the printed report (none without its section)."""
    if doc.lb is None:
        return []
    lines = ["  load balancers (completion s / ECMP's, imbalance max/mean, retransmits, "
             "reordering):"]
    by_key = {(r.oversubscription, r.collective, r.case, r.mode): r for r in doc.lb.runs}
    for ratio in doc.lb.ratios:
        cells = []
        for mode, x in ratio.to_ecmp.items():
            r = by_key[(ratio.oversubscription, ratio.collective, ratio.case, mode)]
            if not r.finished:
                cells.append(f"{mode} FAILED")
                continue
            imb = f"{r.imbalance:.2f}" if r.imbalance is not None else "-"
            cells.append(f"{mode} {r.completion_s:.3f} ({x if x is not None else '-'}) {imb} "
                         f"{r.retransmits} {r.reordering}")
        lines.append(f"    1:{ratio.oversubscription:g} {ratio.collective:16s} {ratio.case:9s} "
                     + "  ".join(cells))
    errors = [f"{r.mode} {r.collective} {r.case}: {r.error}" for r in doc.lb.runs if r.error]
    lines += [f"    error {e}" for e in errors]
    lines.append(f"    paper (Astra-Sim): Ethereal at best {doc.lb.paper['ethereal_vs_spray']} "
                 f"of spraying, {doc.lb.paper['ethereal_vs_reps']} of REPS")
    return lines
