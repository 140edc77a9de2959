"""From a tenant's measured jobs to CASSINI time shifts: profiles, slots and a plan per link.

What a scheduler beside the jobs sees: each job's own report of a run alone (``nslab.job/1``
summaries of ``workloads.job``: per-iteration compute and collective times on the VM clocks,
the size and the bus factor) and the capacity of the link the jobs share. It imports nothing
of the lab.

* ``profile``: the job's iteration alone, p50 of its compute and collective phases, and its
  demand while communicating (nccl-tests bus bandwidth: ``8 * bytes * bus_factor / comm``,
  what crosses each link of the ring, Mbit/s).
* ``slot_s``: the period the job will run at under a schedule: its iteration time plus a
  margin, rounded up to a quantum so the unified circle (LCM) stays short; in ``plan``, jobs
  whose iteration plus margin reaches the longest iteration take the longest slot.
* ``plan``: circles on the slots (compute arc down, collective arc up), the best rotation on
  the shared link (``cassini.best_rotation``), the shifts per job and how late each may start
  a slot before its collective meets another's (``cassini.clearance``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.cassini import (
    DEFAULT_RESOLUTION_S,
    Circle,
    best_rotation,
    clearance,
    job_shifts,
    score,
)
from workloads.stats import percentiles

FITS = 1e-9
"""A rotation fits (no demand above the capacity) when its score is within this of 1."""


@dataclass(frozen=True)
class Profile:
    """A job's iteration measured alone.

    Attributes:
        iteration_s: p50 iteration time, s.
        compute_s: p50 compute phase, s (the circle's "down" arc).
        comm_s: p50 collective phase, s (the "up" arc).
        demand_mbit: bus bandwidth while communicating, Mbit/s.
    """

    iteration_s: float
    compute_s: float
    comm_s: float
    demand_mbit: float


def per_iteration(summary: Mapping, key: str) -> list[float]:
    """Per timed iteration of a job, its slowest rank's ``key`` (``iteration_s``,
    ``compute_s``, ``comm_s`` of the ranks' ``nslab.worker/1`` documents), s; [] when the job
    failed."""
    workers = summary.get("workers") or []
    if summary.get("error") or not workers or any(w is None for w in workers):
        return []
    return [max(x) for x in zip(*(w[key] for w in workers), strict=True)]


def profile(summary: Mapping) -> Profile:
    """A job's ``Profile`` from its ``nslab.job/1`` summary of a run alone (``per_iteration``
    compute and collective phases, their p50).

    Raises:
        ValueError: the job failed (no timings), or its collectives took no time.
    """
    compute, comm = (percentiles(per_iteration(summary, k), keys=("p50",))
                     for k in ("compute_s", "comm_s"))
    if compute is None or comm is None:
        raise ValueError(f"job {summary.get('name')}: no timings to profile "
                         f"({summary.get('error')})")
    compute, comm = compute["p50"], comm["p50"]
    if comm <= 0:
        raise ValueError(f"job {summary.get('name')}: collectives of 0 s")
    return Profile(iteration_s=compute + comm, compute_s=compute, comm_s=comm,
                   demand_mbit=8 * summary["bytes"] * summary["bus_factor"] / comm / 1e6)


def slot_s(p: Profile, margin: float, quantum_s: float) -> float:
    """``p.iteration_s * (1 + margin)`` rounded up to a multiple of ``quantum_s``, s."""
    return math.ceil(p.iteration_s * (1 + margin) / quantum_s - 1e-9) * quantum_s


def circle(p: Profile, slot: float, resolution_s: float = DEFAULT_RESOLUTION_S) -> Circle:
    """The job's demand circle: perimeter ``slot`` (s), its collective arc (``demand_mbit``)
    after its compute arc."""
    return Circle.from_phases(slot, [(p.compute_s, p.compute_s + p.comm_s, p.demand_mbit)],
                              resolution_s)


@dataclass(frozen=True)
class Plan:
    """The schedule of jobs sharing one link.

    Attributes:
        score: compatibility score at the best rotation (1 = fully compatible).
        unshifted_score: the score with every shift 0 (what fair sharing starts from).
        perimeter_s: the unified circle's perimeter, s.
        slots_s: job -> slot period, s.
        shifts_s: job -> time shift, s, in [0, slot).
        late_s: job -> its clearance at the rotation (``cassini.clearance``): how much later
            than its slot it can start without lowering the score, s; a job later than that
            waits for its next slot, restoring the rotation. None (a late job starts at once)
            when the rotation does not fit (score < 1: the jobs overrun their slots anyway,
            and waiting would cost a slot for nothing) or leaves no spare time.
    """

    score: float
    unshifted_score: float
    perimeter_s: float
    slots_s: dict[str, float]
    shifts_s: dict[str, float]
    late_s: dict[str, float | None]


def plan(profiles: Mapping[str, Profile], capacity_mbit: float, margin: float = 0.1,
         quantum_s: float = 0.05, resolution_s: float = DEFAULT_RESOLUTION_S) -> Plan:
    """Slots, the best rotation and per-job shifts for jobs that share one link of
    ``capacity_mbit``: each job's circle has perimeter ``slot_s`` (the longest slot when its
    iteration times ``1 + margin`` reaches the longest iteration) with its collective arc
    (``demand_mbit``) after its compute arc.

    Raises:
        ValueError: no jobs, ``capacity_mbit <= 0``, or more rotations than
            ``cassini.best_rotation`` searches.
    """
    if not profiles:
        raise ValueError("profiles: at least one job")
    names = list(profiles)
    slots = {n: slot_s(profiles[n], margin, quantum_s) for n in names}
    top = max(profiles[n].iteration_s for n in names)
    slots = {n: max(slots.values()) if profiles[n].iteration_s * (1 + margin) >= top else t
             for n, t in slots.items()}
    circles = [circle(p, slots[n], resolution_s) for n, p in profiles.items()]
    rot = best_rotation(circles, capacity_mbit)
    shifts = job_shifts({"link": dict(zip(names, rot.shifts_s, strict=True))}, slots)
    return Plan(score=rot.score, unshifted_score=score(circles, [0.0] * len(circles),
                                                       capacity_mbit),
                perimeter_s=rot.perimeter_s, slots_s=slots,
                shifts_s={n: float(shifts[n]) for n in names},
                late_s={n: (clearance(circles, rot.shifts_s, capacity_mbit, j)
                            if rot.score >= 1 - FITS else 0.0) or None
                        for j, n in enumerate(names)})
