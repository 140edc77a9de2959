"""The load-balancer comparison: every balancer in turn on every VM (``session.lb``); each run
of the first round joins ``live`` as it finishes; with ``repeat`` N the modes run N rotated
rounds per case and each is compared with ECMP over all of them. The fabric modes it needs
are checked before bring-up."""
from __future__ import annotations

from lab.fabric import require_fabric
from session import jobs, lb
from session.studies.base import Study


class Lb(Study):
    key = "lb"

    def __init__(self, session):
        super().__init__(session)
        self.section: dict | None = None
        self.runner: lb.Runner | None = None

    @staticmethod
    def enabled(sc) -> bool:
        return sc.lb is not None

    def check(self, capabilities: dict) -> None:
        for mode in sorted(lb.fabric_modes(self.session.sc.lb)):
            require_fabric(mode, capabilities)

    def run(self) -> None:
        s = self.session
        vms = jobs.naive(list(s.lab.phys), len(s.lab.phys))
        self.runner = lb.Runner(s.lab, s.sc.lb, s.sc.topology, vms, s.call, s.progress,
                                s.rounds, s.sampler.saturated_between)
        self.section = self.runner.run(self.live)

    def sections(self, out: dict) -> None:
        if self.section is not None:
            out["lb"] = self.section
            out.setdefault("comparisons", []).extend(self.comparisons())

    def comparisons(self) -> list[dict]:
        if self.runner is None:
            return []
        return lb.comparisons(dict(self.runner.samples), dict(self.runner.saturated_runs))
