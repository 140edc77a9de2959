"""The scenario's ``cassini`` section at run time: sets of jobs that share a link, each run
alone (profiles), planned (``scheduler.plan``) and run together in every mode.

Modes (results contract ``cassini.sets[].modes``):

    * ``fair``: the jobs together, back to back, sharing the link as TCP shares it;
    * ``shifted_synced``: on CASSINI's slots and shifts, each rank correcting its VM clock by
      the agents' offset and drift estimates (``workloads.schedule``);
    * ``shifted_raw``: the same slots read on the raw VM clocks (offsets and drift uncorrected).

Per mode and set: ``mean_iteration_s`` and ``p99_iteration_s`` over every iteration of every
job of the set (an iteration counts as its slowest rank's), and per job its p50 and p99.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from scheduler import plan as planner
from session import jobs
from session.scenario import CassiniSet, CassiniSpec
from workloads.config import JobConfig
from workloads.schedule import Schedule
from workloads.stats import percentiles

if TYPE_CHECKING:  # pragma: no cover
    from agents.messages import CoordinatorState
    from lab.lab import Lab

START_AHEAD_S = 2.0  # the slots' origin this far after launch: every mesh is up by then


def offsets(state: CoordinatorState | None, vms: Sequence[str], at_ns: int,
            ) -> tuple[list[int], list[float]] | None:
    """Per VM, the agents' offset (VM clock minus the reference, extrapolated to ``at_ns`` on
    the reference clock with the drift) and drift; None when an estimate is missing."""
    if state is None or state.t_ns is None:
        return None
    offs, drifts = [], []
    for v in vms:
        vm = state.vms.get(v)
        if vm is None or vm.offset_ns is None:
            return None
        drift = vm.drift_ppm or 0.0
        offs.append(round(vm.offset_ns + drift * 1e-6 * (at_ns - state.t_ns)))
        drifts.append(drift)
    return offs, drifts


def _run(lab: Lab, runs: list[tuple[str, JobConfig, list[str]]]) -> list[dict]:
    """Jobs together; their full ``nslab.job/1`` summaries."""
    return [summary for _, summary in jobs.run_together(lab, runs)]


def run_set(lab: Lab, spec: CassiniSpec, cset: CassiniSet, configs: Mapping[str, JobConfig],
            vms: Mapping[str, list[str]], state: Callable[[], CoordinatorState | None],
            progress: Callable[[str], None]) -> dict:
    """Profile, plan and run one set in every mode; its ``cassini.sets`` entry."""
    names = cset.jobs
    alone = {n: _run(lab, [(f"{n}_alone", configs[n], vms[n])])[0] for n in names}
    try:
        profiles = {n: planner.profile(alone[n]) for n in names}
        p = planner.plan(profiles, spec.capacity_mbit, spec.margin, spec.quantum_s)
    except ValueError as e:
        return {"name": cset.name, "score": None, "predicted_compatible": None,
                "shifts_s": None, "error": str(e), "modes": {}}
    progress(f"cassini {cset.name}: score {p.score:.3f} (unshifted {p.unshifted_score:.3f}),"
             f" shifts {p.shifts_s}")
    modes: dict[str, dict] = {}
    for mode in spec.modes:
        start = time.time_ns() + round(START_AHEAD_S * 1e9)
        runs = []
        for n in names:
            cfg = configs[n]
            if mode != "fair":
                sched = {"start_ns": start, "period_s": p.slots_s[n],
                         "shift_s": p.shifts_s[n]}
                if mode == "shifted_synced":
                    est = offsets(state(), vms[n], start)
                    if est is None:
                        modes[mode] = {"error": "no offset estimates from the agents"}
                        break
                    sched["offsets_ns"], sched["drifts_ppm"] = est
                cfg = cfg.model_copy(update={"schedule": Schedule(**sched)})
            runs.append((f"{n}_{mode}", cfg, vms[n]))
        else:
            summaries = _run(lab, runs)
            modes[mode] = mode_entry(names, summaries)
            progress(f"cassini {cset.name} {mode}: mean iteration "
                     f"{modes[mode]['mean_iteration_s']} s")
    return {"name": cset.name, "score": p.score, "unshifted_score": p.unshifted_score,
            "predicted_compatible": p.score >= spec.threshold, "perimeter_s": p.perimeter_s,
            "slots_s": p.slots_s, "shifts_s": p.shifts_s,
            "profiles": {n: vars(profiles[n]) for n in names}, "error": None, "modes": modes}


def mode_entry(names: Sequence[str], summaries: Sequence[Mapping]) -> dict:
    """One mode's iteration times: over the set, and per job (p50, p99), s."""
    per_job = {n: planner.per_iteration(s, "iteration_s")
               for n, s in zip(names, summaries, strict=True)}
    errors = [s["error"] for s in summaries if s.get("error")]
    pooled = percentiles([t for ts in per_job.values() for t in ts], keys=("mean", "p99"))
    if errors or pooled is None:
        return {"mean_iteration_s": None, "p99_iteration_s": None, "jobs": {},
                "error": "; ".join(errors) or "no iterations"}
    jobs_ = {n: percentiles(ts, keys=("p50", "p99")) for n, ts in per_job.items()}
    return {"mean_iteration_s": pooled["mean"], "p99_iteration_s": pooled["p99"],
            "jobs": {n: {"p50_s": t["p50"], "p99_s": t["p99"]} for n, t in jobs_.items()},
            "error": None}


def predicted_ranking(sets: Sequence[Mapping]) -> bool | None:
    """Whether the scores rank the sets in the order of their measured gains
    (fair mean / shifted_synced mean); None with fewer than two comparable sets."""
    pts = []
    for s in sets:
        m = s.get("modes", {})
        fair, shifted = (m.get(k, {}).get("mean_iteration_s") for k in ("fair",
                                                                          "shifted_synced"))
        if s.get("score") is not None and fair and shifted:
            pts.append((s["score"], fair / shifted))
    if len(pts) < 2:
        return None
    by_score = [g for _, g in sorted(pts, key=lambda x: x[0])]
    return all(a <= b for a, b in zip(by_score, by_score[1:], strict=False))
