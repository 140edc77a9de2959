"""CASSINI's job sets: each profiled, planned and run in every mode (``session.cassini``);
a set's entry joins ``live`` once planned (the TUI draws it), its modes as they finish. With
``repeat`` N the modes run N rotated rounds per set, each compared with ``fair``.

Source: Rajasekaran et al., CASSINI: Network-Aware Job Scheduling in Machine Learning
Clusters, NSDI 2024.
"""
from __future__ import annotations

from session import cassini
from session.studies.base import Study


class Cassini(Study):
    key = "cassini"

    def __init__(self, session):
        super().__init__(session)
        self.samples: dict[str, dict] = {}
        """Per set: ``cassini.run_set``'s samples of every mode over the rounds."""

    @staticmethod
    def enabled(sc) -> bool:
        return sc.cassini is not None

    def run(self) -> None:
        s = self.session
        specs = {j.name: j for j in s.sc.jobs}
        for cset in s.sc.cassini.sets:
            if s.halted:
                return
            configs = {n: specs[n].config() for n in cset.jobs}
            vms = {n: list(specs[n].placement) for n in cset.jobs}
            cassini.run_set(s.lab, s.sc.cassini, cset, configs, vms,
                            lambda: s.agents_state, s.progress, self.live.append, s.rounds,
                            self.samples.setdefault(cset.name, {}),
                            s.sampler.saturated_between)

    def sections(self, out: dict) -> None:
        if self.live:
            out["cassini"] = {"sets": self.live,
                              "score_ranks_gains": cassini.predicted_ranking(self.live)}
            out.setdefault("comparisons", []).extend(self.comparisons())

    def comparisons(self) -> list[dict]:
        return [c for name, got in list(self.samples.items())
                for c in cassini.comparisons(name, got)]
