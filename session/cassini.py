"""The scenario's ``cassini`` section at run time: sets of jobs that share a link, each run
alone (profiles), planned (``scheduler.plan``) and run together in every mode.

Modes (results contract ``cassini.sets[].modes``):

    * ``fair``: the jobs together, back to back, sharing the link as TCP shares it;
    * ``shifted_synced``: on CASSINI's slots and shifts, each rank correcting its VM clock by
      the agents' offset and drift estimates (``workloads.schedule``; a rank later for a slot
      than its job's clearance, ``scheduler.plan.Plan.late_s``, waits for the next one);
    * ``shifted_raw``: the same slots read on the raw VM clocks (offsets and drift
      uncorrected);
    * ``unfair``: back to back as in ``fair``, but the k-th job of the set marks its packets
      DSCP ``8 (k + 1)`` (class selector k + 1, ``JobConfig.dscp``) and every fabric link
      gives that DSCP a class of HTB prio k and ``CassiniSpec.unfair_share(k)`` of the rate
      (``lab.qos``), removed after the run: the precursor's unfair shares (Rajasekaran et
      al., HotNets 2022), here as a switch priority instead of a congestion control timer.

Per mode and set: ``mean_iteration_s`` and ``p99_iteration_s`` over every iteration of every
job of the set (an iteration counts as its slowest rank's), per job its p50 and p99, and
``comm_overlap``: how much the jobs' collectives met (``overlap_fraction``), in true time: the
ranks' own VM-clock timestamps mapped through the lab's clock truth, which only the lab knows;
``skipped_slots``, the slots the jobs let pass; and ``slot_error_ms``, how far apart in true
time the ranks' clocks put a slot (``slot_error_ms``).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from agents.clock import ClockSpec
from lab import qos
from lab.errors import LabError
from lab.tc import TrafficClass
from lab.wait import wait_until
from scheduler import plan as planner
from session import jobs, stats
from session.scenario import CassiniSet, CassiniSpec
from workloads.config import JobConfig
from workloads.schedule import Schedule
from workloads.stats import percentiles

if TYPE_CHECKING:  # pragma: no cover
    from contracts.messages import CoordinatorState
    from lab.lab import Lab

PARTS = 3
"""The run cut in thirds for ``comm_overlap_thirds`` and ``mean_iteration_thirds_s``."""
START_AHEAD_S = 2.0
"""The slots' origin this far after launch: most meshes are up by then, and a rank that is
not starts on the first slot it can still catch (``Schedule.next_slot``)."""
ESTIMATE_WAIT_S = 10.0
"""How long the shifted_synced mode waits for the agents' offsets of the set's VMs, s (a
state without them failed the mode once on a loaded machine)."""


def offsets(state: CoordinatorState | None, vms: Sequence[str], at_ns: int,
            ) -> tuple[list[int], list[float]] | None:
    """Per VM, the agents' offset (VM clock minus the reference, extrapolated to ``at_ns`` on
    the reference clock with the drift) and drift; None when an estimate is missing."""
    if state is None or state.t_ns is None:
        return None
    offs, drifts = [], []
    for v in vms:
        est = state.estimate(v)
        if est is None:
            return None
        offs.append(round(est.offset_at(at_ns)))
        drifts.append(est.drift_ppm)
    return offs, drifts


def _estimates(state: Callable[[], CoordinatorState | None], vms: Sequence[str]
               ) -> CoordinatorState | None:
    """The coordinator's state once it has an offset for every VM of ``vms``, or the last
    state after ``ESTIMATE_WAIT_S`` (a loaded coordinator may answer late, or not at once)."""
    last = [None]

    def estimated() -> bool:
        last[0] = state()
        return offsets(last[0], vms, 0) is not None

    wait_until(estimated, ESTIMATE_WAIT_S, 0.5)
    return last[0]


def _run(lab: Lab, runs: list[tuple[str, JobConfig, list[str]]]) -> list[dict]:
    """Jobs together; their full ``nslab.job/1`` summaries."""
    return [summary for _, summary in jobs.run_together(lab, runs)]


def unfair_dscp(k: int) -> int:
    """The DSCP of a set's k-th job (0-based) in the unfair mode: class selector k + 1."""
    return 8 * (k + 1)


def _run_unfair(lab: Lab, spec: CassiniSpec, runs: list[tuple[str, JobConfig, list[str]]]
                ) -> list[dict]:
    """``runs`` (the k-th marked ``unfair_dscp(k)``) together, each job in its own fabric
    class (module docstring)."""
    qos.set_classes(lab, [TrafficClass(dscp=unfair_dscp(k), share=spec.unfair_share(k), prio=k)
                          for k in range(len(runs))])
    try:
        return _run(lab, runs)
    finally:
        qos.set_classes(lab, [])


def run_set(lab: Lab, spec: CassiniSpec, cset: CassiniSet, configs: Mapping[str, JobConfig],
            vms: Mapping[str, list[str]], state: Callable[[], CoordinatorState | None],
            progress: Callable[[str], None], publish: Callable[[dict], None],
            rounds: Callable = lambda modes: [(0, modes)], samples: dict | None = None,
            saturated: Callable[[int, int], bool | None] = lambda a, b: None) -> dict:
    """Profile, plan and run one set in every mode; its ``cassini.sets`` entry, handed to
    ``publish`` as soon as it is planned (its ``modes`` then grow: each mode's entry replaces
    the whole ``modes`` dict, so a reader in another thread never sees one half-built).

    With ``rounds`` (``Session.rounds``) the modes run in several rotated rounds: the entry
    holds the first round's; ``samples`` gets, per mode, every round's mean iteration (s, None
    without times) and fidelity flag (``saturated(start_ns, end_ns)``):
    ``{mode: {"mean_iteration_s": [...], "saturated": [...]}}``."""
    names = cset.jobs
    alone = {n: _run(lab, [(f"{n}_alone", configs[n], vms[n])])[0] for n in names}
    try:
        profiles = {n: planner.profile(alone[n]) for n in names}
        p = planner.plan(profiles, spec.capacity_mbit, spec.margin, spec.quantum_s)
    except ValueError as e:
        entry = {"name": cset.name, "score": None, "predicted_compatible": None,
                 "shifts_s": None, "error": str(e), "modes": {}}
        publish(entry)
        return entry
    progress(f"cassini {cset.name}: score {p.score:.3f} (unshifted {p.unshifted_score:.3f}),"
             f" shifts {p.shifts_s}")
    entry = {"name": cset.name, "score": p.score, "unshifted_score": p.unshifted_score,
             "predicted_compatible": p.score >= spec.threshold, "perimeter_s": p.perimeter_s,
             "slots_s": p.slots_s, "shifts_s": p.shifts_s, "late_s": p.late_s,
             "profiles": {n: vars(profiles[n]) for n in names}, "error": None, "modes": {}}
    publish(entry)
    samples = {} if samples is None else samples
    for r, order in rounds(list(spec.modes)):
        for mode in order:
            t0 = time.time_ns()
            m = _run_mode(lab, spec, mode, p, configs, vms, names, state)
            got = samples.setdefault(mode, {"mean_iteration_s": [], "saturated": []})
            got["mean_iteration_s"].append(m["mean_iteration_s"])
            got["saturated"].append(bool(saturated(t0, time.time_ns())))
            if r == 0:
                entry["modes"] = {**entry["modes"], mode: m}
            progress(f"cassini {cset.name} {mode}: mean iteration {m['mean_iteration_s']} s, "
                     f"collectives overlapping {m.get('comm_overlap')}")
    return entry


def comparisons(set_name: str, samples: Mapping[str, Mapping[str, list]]) -> list[dict]:
    """Every mode of a set against ``fair`` on the mean iteration over the rounds (arms named
    ``set mode``)."""
    if "fair" not in samples:
        return []
    fair = f"{set_name} fair"
    return [stats.comparison(
        "cassini", f"{set_name} {mode}", fair, "mean_iteration_s",
        {f"{set_name} {mode}": got["mean_iteration_s"],
         fair: samples["fair"]["mean_iteration_s"]},
        {f"{set_name} {mode}": got["saturated"], fair: samples["fair"]["saturated"]})
        for mode, got in samples.items() if mode != "fair"]


def _run_mode(lab: Lab, spec: CassiniSpec, mode: str, p: planner.Plan,
              configs: Mapping[str, JobConfig], vms: Mapping[str, list[str]],
              names: Sequence[str], state: Callable[[], CoordinatorState | None]) -> dict:
    """The set's jobs together in ``mode`` (module docstring); the mode's entry."""
    st = _estimates(state, [v for n in names for v in vms[n]]) \
        if mode == "shifted_synced" else None
    start = time.time_ns() + round(START_AHEAD_S * 1e9)
    runs = []
    for k, n in enumerate(names):
        cfg = configs[n]
        if mode == "unfair":
            cfg = cfg.model_copy(update={"dscp": (unfair_dscp(k),)})
        elif mode != "fair":
            sched = {"start_ns": start, "period_s": p.slots_s[n], "shift_s": p.shifts_s[n],
                     "late_s": p.late_s[n]}
            if mode == "shifted_synced":
                est = offsets(st, vms[n], start)
                if est is None:
                    return failed("no offset estimates from the agents")
                sched["offsets_ns"], sched["drifts_ppm"] = est
            cfg = cfg.model_copy(update={"schedule": Schedule(**sched)})
        runs.append((f"{n}_{mode}", cfg, vms[n]))
    try:
        summaries = _run_unfair(lab, spec, runs) if mode == "unfair" else _run(lab, runs)
    except LabError as e:  # the fabric refused the unfair mode's classes
        return failed(str(e))
    specs = lab.clocks.specs
    phases = [true_comm_phases(s, vms[n], specs) for n, s in zip(names, summaries, strict=True)]
    skipped = sum(max((w or {}).get("skipped_slots", 0) for w in s.get("workers") or [{}])
                  for s in summaries)
    scheduled = [(cfg.schedule, vms[n], cfg.warmup + cfg.iterations)
                 for n, (_, cfg, _) in zip(names, runs, strict=True) if cfg.schedule]
    return mode_entry(names, summaries) | {
        "comm_overlap": overlap_fraction(phases), "comm_overlap_thirds": by_part(phases),
        "skipped_slots": skipped,
        "slot_error_ms": [slot_error_ms(scheduled, specs, last) for last in (False, True)]
        if scheduled else None}


def slot_error_ms(scheduled: Sequence[tuple[Schedule, Sequence[str], int]],
                  specs: Mapping[str, ClockSpec], last: bool) -> float:
    """How far apart in true time the set's ranks start a slot that the plan puts at one
    reference time: over every rank of every job (``(schedule, vms, iterations)``), the
    largest minus the smallest error ``true(slot on its VM clock) - reference``, ms; at the
    jobs' first slot, or (``last``) at their last nominal one (``iterations`` later): what
    the ranks' clock corrections leave, and raw clocks' offsets and drift."""
    errors = []
    for sched, vms, iterations in scheduled:
        k = iterations if last else 0
        ref = sched.start_ns + round((sched.shift_s + k * sched.period_s) * 1e9)
        errors += [true_ns(sched.slot_ns(k, r), specs[vm]) - ref for r, vm in enumerate(vms)]
    return (max(errors) - min(errors)) / 1e6


def true_ns(vm_ns: int, spec: ClockSpec) -> int:
    """True time of a VM-clock reading, ns (the offset read at VM time: off by drift x
    offset, well under a microsecond here)."""
    return vm_ns - round(spec.offset_at(vm_ns))


def by_part(phases: Sequence[Sequence[tuple[int, int]]], parts: int = PARTS
            ) -> list[float | None]:
    """``overlap_fraction`` in each of ``parts`` equal parts of the run (from the first
    phase's start to the last one's end), by the phases' starts: how the interleaving held
    over time (raw clocks drift apart during a run)."""
    starts = [s for ivs in phases for s, _ in ivs]
    if not starts:
        return []
    t0, t1 = min(starts), max(e for ivs in phases for _, e in ivs)
    edges = [t0 + (t1 - t0) * q / parts for q in range(parts + 1)]
    return [overlap_fraction(phases, (edges[q], edges[q + 1])) for q in range(parts)]


def iteration_by_part(per_job: Sequence[Sequence[float]], parts: int = PARTS
                      ) -> list[float | None]:
    """The mean iteration time in each of ``parts`` parts of the run: every job's iterations
    (s, in order) cut into ``parts`` runs of consecutive iterations (``numpy.array_split``),
    the k-th runs of all jobs pooled, s; None for a part without iterations."""
    pooled: list[list[float]] = [[] for _ in range(parts)]
    for ts in per_job:
        for k, chunk in enumerate(np.array_split(np.asarray(ts, dtype=float), parts)):
            pooled[k] += chunk.tolist()
    return [float(np.mean(p)) if p else None for p in pooled]


def overlap_fraction(jobs_: Sequence[Sequence[tuple[int, int]]],
                     window: tuple[float, float] | None = None) -> float | None:
    """The fraction of the jobs' communication time during which another job communicated.

    Args:
        jobs_: per job, its collective phases as [start, end) intervals (any one time unit,
            one clock for all).
        window: count only the phases that start in [window[0], window[1]) (all others still
            count as the other jobs' phases they meet).
    Returns:
        sum over jobs and counted phases of the time shared with another job's phases,
        divided by the sum of their lengths; in [0, 1]; None when no counted phase has a
        length.
    """
    total = shared = 0
    for j, mine in enumerate(jobs_):
        others = [iv for k, ivs in enumerate(jobs_) if k != j for iv in ivs]
        for s0, e0 in mine:
            if window is not None and not window[0] <= s0 < window[1]:
                continue
            total += max(0, e0 - s0)
            cut = sorted((max(s0, s1), min(e0, e1)) for s1, e1 in others if s1 < e0 and e1 > s0)
            reach = s0
            for a, b in cut:  # the union of the others' phases within [s0, e0)
                shared += max(0, b - max(a, reach))
                reach = max(reach, b)
    return shared / total if total else None


def true_comm_phases(summary: Mapping, vms: Sequence[str], specs: Mapping[str, ClockSpec]
                     ) -> list[tuple[int, int]]:
    """A job's collective phases in true time, ns: per timed iteration, from the last rank's
    start to the last rank's end (each rank's VM-clock stamps through its VM's ``ClockSpec``);
    [] when the job failed."""
    workers = summary.get("workers") or []
    if summary.get("error") or not workers or any(w is None for w in workers):
        return []

    per_rank = [[(true_ns(t, specs[vm]), true_ns(t + round(c * 1e9), specs[vm]))
                 for t, c in zip(w["comm_start_ns"], w["comm_s"], strict=True)]
                for w, vm in zip(workers, vms, strict=True)]
    return [(max(s for s, _ in it), max(e for _, e in it)) for it in zip(*per_rank, strict=True)]


def mode_entry(names: Sequence[str], summaries: Sequence[Mapping]) -> dict:
    """One mode's iteration times: over the set (mean, p99 and the mean per third of the
    run, ``iteration_by_part``), and per job (p50, p99), s."""
    per_job = {n: planner.per_iteration(s, "iteration_s")
               for n, s in zip(names, summaries, strict=True)}
    errors = [s["error"] for s in summaries if s.get("error")]
    pooled = percentiles([t for ts in per_job.values() for t in ts], keys=("mean", "p99"))
    if errors or pooled is None:
        return failed("; ".join(errors) or "no iterations")
    jobs_ = {n: percentiles(ts, keys=("p50", "p99")) for n, ts in per_job.items()}
    return {"mean_iteration_s": pooled["mean"], "p99_iteration_s": pooled["p99"],
            "mean_iteration_thirds_s": iteration_by_part(list(per_job.values())),
            "jobs": {n: {"p50_s": t["p50"], "p99_s": t["p99"]} for n, t in jobs_.items()},
            "error": None}


def failed(why: str) -> dict:
    """A mode's entry without times."""
    return {"mean_iteration_s": None, "p99_iteration_s": None, "jobs": {}, "error": why}


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
