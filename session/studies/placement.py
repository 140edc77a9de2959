"""The scenario's jobs, one after another, and the naive / collocation-aware comparison.

Every job's VMs are chosen as the jobs begin, from the agents' groups then (a later job is not
placed from groups an earlier job's load moved); a job that could not be placed then (no
groups yet) is placed at its turn. Each job runs with its pacers (``session.edge``); its entry
carries the lab's queue drops while it ran (``fabric_drops``, per link ``drops_by_link``).
Jobs of other studies (``Scenario.own_turn_jobs``) are left to them. With ``repeat`` N, the
jobs run N rounds, rotated (``Session.rounds``): the ``jobs`` entries are the first round's,
and each collocation-aware job is compared with the naive job of its collective over every
round (``comparisons``).
"""
from __future__ import annotations

import contextlib
import time

from lab.errors import LabError
from session import incast, jobs, scoring, stats
from session.edge import job_edge
from session.studies.base import Study


class Placement(Study):
    key = "placement"

    def __init__(self, session):
        super().__init__(session)
        self.live: dict[str, dict] = {}
        self.samples: dict[str, list[float | None]] = {}
        self.saturated: dict[str, list[bool]] = {}

    @staticmethod
    def enabled(sc) -> bool:
        return any(s.name not in sc.own_turn_jobs() for s in sc.jobs)

    def _specs(self) -> list:
        own_turn = self.session.sc.own_turn_jobs()
        return [s for s in self.session.sc.jobs if s.name not in own_turn]

    def run(self) -> None:
        s = self.session
        specs = self._specs()
        chosen: dict[str, list[str]] = {}
        for spec in specs:
            with contextlib.suppress(LabError, ValueError):  # placed at its turn instead
                chosen[spec.name] = s.choose(spec)
        for r, order in s.rounds(specs):
            for spec in order:
                if s.halted:
                    return
                t0 = time.time_ns()
                entry = self._run_job(spec, chosen.get(spec.name))
                if r == 0:
                    self.live[spec.name] = entry
                self.samples.setdefault(spec.name, []).append(entry.get("completion_s"))
                self.saturated.setdefault(spec.name, []).append(
                    bool(s.sampler.saturated_between(t0, time.time_ns())))

    def _run_job(self, spec, vms: list[str] | None) -> dict:
        s = self.session
        policy = spec.placement if isinstance(spec.placement, str) else "explicit"
        try:
            vms = vms or s.choose(spec)
            s.progress(f"job {spec.name}: {spec.collective} on {' '.join(vms)}")
            # drops while the job runs, its pacers up: their start and stop (a qdisc
            # grafted on the guest's vNIC drops what it sends meanwhile) are not the job's
            with job_edge(s.lab, s.mesh, vms, spec.pacer, s.sc.pacer) as sensed:
                before = s.call(incast.drops, s.lab)
                entry = jobs.run(s.lab, spec.name, spec.config(), vms)
                after = s.call(incast.drops, s.lab)
        except (LabError, ValueError) as e:
            return {"name": spec.name, "collective": spec.collective, "error": str(e),
                    "verified": False, "completion_s": None}
        entry["drops_by_link"] = {k: n - before.get(k, 0) for k, n in after.items()
                                  if n > before.get(k, 0)}
        entry["fabric_drops"] = sum(entry["drops_by_link"].values())
        entry["placement"]["policy"] = policy
        entry["edge"] = {"pacer": spec.pacer, "cc": spec.cc,
                         "retransmits": sensed.retransmits, "rtos": sensed.rtos,
                         "owd_p99_us": sensed.owd_p99_us}
        s.progress(f"job {spec.name}: completion {entry['completion_s']} s, "
                   f"verified {entry['verified']}")
        return entry

    def sections(self, out: dict) -> None:
        out["jobs"] = [self.live[s.name] for s in self._specs() if s.name in self.live]
        out["placement_comparison"] = scoring.placement_comparison(out["jobs"])
        out.setdefault("comparisons", []).extend(self.comparisons())

    def comparisons(self) -> list[dict]:
        """Each collocation-aware job against the naive job of its collective."""
        specs = [sp for sp in self._specs() if sp.name in self.samples]
        naive = {sp.collective: sp.name for sp in reversed(specs) if sp.placement == "naive"}
        return [stats.comparison("placement", sp.name, naive[sp.collective], "completion_s",
                                 self.samples, self.saturated)
                for sp in specs
                if sp.placement == "collocation_aware" and sp.collective in naive]
