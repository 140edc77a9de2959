"""Run a scenario: build the lab, start its agents, play its fault timeline, score, tear down."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from lab import results, scoring
from lab.capabilities import probe
from lab.clocks import ClockConfig
from lab.daemons import AgentConfig, AgentMesh
from lab.fidelity import FidelitySampler
from lab.lab import Lab
from lab.load import Flow, LoadRunner
from lab.load import Flow, LoadRunner
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


def make_mesh(sc: Scenario, lab: Lab) -> AgentMesh | None:
    """The scenario's agent mesh (not started), or None when agents are off."""
    a = sc.agents
    if not a.enabled:
        return None
    return AgentMesh(lab, AgentConfig(rate=a.rate, window_s=a.window_s, max_peers=a.max_peers,
                                      key=a.key, coordinator_vm=a.coordinator))


class Watcher(threading.Thread):
    """Polls the coordinator every ``interval_s``: keeps the latest state and the first time
    (s after the agents started) its collocation groups equalled the truth."""

    def __init__(self, lab: Lab, mesh: AgentMesh, interval_s: float = 1.0):
        super().__init__(daemon=True, name="nslab-watcher")
        self.lab, self.mesh, self.interval_s = lab, mesh, interval_s
        self.latest: dict | None = None
        self.detected_after_s: float | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        state = self.mesh.state()
        if state is None:
            return
        self.latest = state
        groups = sorted(sorted(g["members"]) for g in state["collocation"]["groups"])
        matches = groups == scoring.truth_groups(self.lab.phys)
        if matches and self.detected_after_s is None:
            self.detected_after_s = round((time.time_ns() - self.mesh.started_ns) / 1e9, 2)
        elif not matches:
            self.detected_after_s = None  # must hold until the end

    def stop(self) -> None:
        self._stop.set()
        self.join()
        self.poll()


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


def agent_sections(lab: Lab, mesh: AgentMesh, watcher: Watcher) -> dict:
    """``sync``, ``owd_us`` and ``collocation`` scored against the truth."""
    state = watcher.latest
    if state is None:
        return {"agents": {"error": "the coordinator never answered"}}
    return {
        "sync": scoring.sync_section(state["history"], lab.clocks.specs, state["reference"],
                                     mesh.started_ns),
        "owd_us": {"pairs": state["owd_us"], "asymmetry_us": state["asymmetry_us"]},
        "collocation": scoring.collocation_section(state["collocation"]["groups"], lab.phys,
                                                   watcher.detected_after_s),
    }


def run(sc: Scenario, topo, source: str, name: str | None = None,
        progress: Callable[[str], None] | None = None) -> dict:
    """Run scenario ``sc`` end to end and return its ``nslab.results/1`` document.

    Raises:
        LabError (and subclasses): the lab could not be built; it is torn down first.
    """
    progress = progress or (lambda msg: None)
    caps = probe()
    lab = make_lab(sc, topo, name, progress)
    extra: dict = {}
    with FidelitySampler() as sampler, lab:
        placements = dict(lab.phys)
        mesh = make_mesh(sc, lab)
        if mesh is not None:
            progress(f"starting agents in {len(lab.vms)} VMs")
            mesh.start()
            watcher = Watcher(lab, mesh)
            watcher.start()
        load = LoadRunner(lab, [Flow(port=5201 + i, **f.model_dump())
                                for i, f in enumerate(sc.load)])
        load.start()
        try:
            play(lab, sc, progress)
            if sc.load:
                extra["load"] = load.join(timeout_s=60)
        finally:
            if mesh is not None:
                watcher.stop()
                mesh.stop()
        if mesh is not None:
            extra.update(agent_sections(lab, mesh, watcher))
        progress("tearing down")
    doc = results.document(sc, source, lab, caps, sampler.summary(), placements)
    doc.update(extra)
    return doc
