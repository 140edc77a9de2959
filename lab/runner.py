"""Run a scenario: build the lab, play its fault timeline, record, tear down, report."""
from __future__ import annotations

import time
from collections.abc import Callable

from lab import results
from lab.capabilities import probe
from lab.clocks import ClockConfig
from lab.fidelity import FidelitySampler
from lab.lab import Lab
from lab.scenario import Scenario


def make_lab(sc: Scenario, topo, name: str | None = None,
             progress: Callable[[str], None] | None = None) -> Lab:
    """The ``Lab`` a scenario describes (not started)."""
    clocks = ClockConfig(drift_ppm=sc.clocks.drift_ppm, offset_ms=sc.clocks.offset_ms,
                         wander_ppm=sc.clocks.wander_ppm,
                         host_drift_ppm=dict(sc.clocks.host_drift_ppm))
    overrides = {h: o.model_dump(exclude_none=True) for h, o in sc.hosts.overrides.items()}
    return Lab(topo, name=name or sc.name, seed=sc.seed, clocks=clocks,
               cpu_cores=sc.hosts.cpu_cores, host_cpu=overrides, progress=progress)


def play(lab: Lab, sc: Scenario, progress: Callable[[str], None]) -> None:
    """Inject the timeline's faults at their times, then wait out ``duration_s``."""
    for f in sorted(sc.faults, key=lambda f: f.at_s):
        wait = f.at_s - lab.now_s()
        if wait > 0:
            time.sleep(wait)
        ev = lab.faults.apply(f.kind, **f.call_args())
        progress(f"{ev['t_s']:6.2f} s  {f.kind} {ev['target']}")
    rest = sc.duration_s - lab.now_s()
    if rest > 0:
        time.sleep(rest)


def run(sc: Scenario, topo, source: str, name: str | None = None,
        progress: Callable[[str], None] | None = None) -> dict:
    """Run scenario ``sc`` end to end and return its ``nslab.results/1`` document.

    Raises:
        LabError (and subclasses): the lab could not be built; it is torn down first.
    """
    progress = progress or (lambda msg: None)
    caps = probe()
    lab = make_lab(sc, topo, name, progress)
    with FidelitySampler() as sampler:
        with lab:
            placements = dict(lab.phys)
            play(lab, sc, progress)
            progress("tearing down")
    return results.document(sc, source, lab, caps, sampler.summary(), placements)
