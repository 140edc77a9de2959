"""The two-step story: one job naive, collocation-aware, aware + pacer, and the BBR and
CUBIC baselines (``session.two_step``); each step joins ``live`` as it finishes."""
from __future__ import annotations

from session import two_step
from session.studies.base import Study


class TwoStep(Study):
    key = "two_step"

    def __init__(self, session):
        super().__init__(session)
        self.section: dict | None = None
        self.reports: dict = {}

    @staticmethod
    def enabled(sc) -> bool:
        return sc.two_step is not None

    def run(self) -> None:
        s = self.session
        spec = next(j for j in s.sc.jobs if j.name == s.sc.two_step.job)
        self.section, self.reports = two_step.run(
            s.lab, s.mesh, spec, s.sc.pacer,
            lambda policy: s.choose(spec.model_copy(update={"placement": policy})),
            lambda: s.call(two_step.drops, s.lab), s.progress, self.live)

    def sections(self, out: dict) -> None:
        if self.section is None:
            return
        out["two_step"] = self.section
        out["pacer"] = {**self.session.sc.pacer.model_dump(),
                        "reports": {k: r.model_dump() for k, r in self.reports.items()}}
