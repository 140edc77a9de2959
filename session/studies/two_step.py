"""The two-step story: one job naive, collocation-aware, aware + pacer, and the BBR and
CUBIC baselines (``session.two_step``). Each step joins ``live`` as it finishes (the first
round's make the ``two_step`` section); with ``repeat`` N the steps run N rounds, rotated
(``Session.rounds``), and every pair of ``two_step.COMPARISONS`` is compared on completion over
all of them, the seed product's ratio beside ours where it has one."""
from __future__ import annotations

import time

from session import stats, two_step
from session.studies.base import Study


class TwoStep(Study):
    key = "two_step"

    def __init__(self, session):
        super().__init__(session)
        self.reports: dict = {}
        self.chosen: dict[str, list[str]] = {}
        self.samples: dict[str, list[float | None]] = {}
        self.drops: dict[str, list[int | None]] = {}
        self.saturated: dict[str, list[bool]] = {}

    @staticmethod
    def enabled(sc) -> bool:
        return sc.two_step is not None

    def _vms_for(self, policy: str) -> list[str]:
        s = self.session
        if policy not in self.chosen:
            spec = self._spec()
            self.chosen[policy] = s.choose(spec.model_copy(update={"placement": policy}))
        return self.chosen[policy]

    def _spec(self):
        s = self.session
        return next(j for j in s.sc.jobs if j.name == s.sc.two_step.job)

    def run(self) -> None:
        s = self.session
        spec = self._spec()
        for r, order in s.rounds(list(two_step.STEPS)):
            for step in order:
                if s.halted:
                    return
                t0 = time.time_ns()
                entry, reports = two_step.run_step(
                    s.lab, s.mesh, spec, s.sc.pacer, step, self._vms_for,
                    lambda: s.call(two_step.drops, s.lab), s.progress)
                self.samples.setdefault(entry["name"], []).append(entry["completion_s"])
                self.drops.setdefault(entry["name"], []).append(entry["fabric_drops"])
                self.saturated.setdefault(entry["name"], []).append(
                    bool(s.sampler.saturated_between(t0, time.time_ns())))
                if entry["name"] == "aware_paced" and reports:
                    self.reports = reports
                if r == 0:
                    self.live.append(entry)

    def sections(self, out: dict) -> None:
        if not self.live:
            return
        s = self.session
        steps = [{**e, "drops_by_round": self.drops[e["name"]]}
                 if len(self.drops.get(e["name"], [])) > 1 else e for e in self.live]
        out["two_step"] = two_step.section(s.sc.two_step.job, steps)
        out["pacer"] = {**s.sc.pacer.model_dump(),
                        "reports": {k: r.model_dump() for k, r in self.reports.items()}}
        out.setdefault("comparisons", []).extend(self.comparisons())

    def comparisons(self) -> list[dict]:
        """Every pair of ``two_step.COMPARISONS`` that has samples, the seed's ratio beside
        ours against naive."""
        return [
            stats.comparison("two_step", arm, base, "completion_s", self.samples,
                             self.saturated, reference=two_step.SEED_RATIOS.get(arm)
                             if base == "naive" else None,
                             reference_source="seed product" if base == "naive"
                             and arm in two_step.SEED_RATIOS else None)
            for arm, base in two_step.COMPARISONS
            if arm in self.samples and base in self.samples]
