"""Run a scenario: build the lab, start its agents, play its fault timeline, score, tear down."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from session import jobs, results, scoring
from lab.capabilities import probe
from lab.clocks import ClockConfig
from session.daemons import AgentConfig, AgentMesh
from lab.errors import LabError
from lab.fidelity import FidelitySampler
from lab.lab import Lab
from session.load import Flow, LoadRunner
from session.scenario import Scenario


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
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
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
        self._halt.set()
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


def choose(lab: Lab, spec, watcher: Watcher | None) -> list[str]:
    """The VMs of a job under its placement policy.

    Raises:
        LabError: collocation_aware without groups from the agents.
    """
    if isinstance(spec.placement, list):
        return list(spec.placement)
    if spec.placement == "naive":
        return jobs.naive([v.name for v in lab.vms], spec.ranks)
    state = watcher.latest if watcher else None
    if not state or not state["collocation"]["groups"]:
        raise LabError("collocation_aware placement: the agents reported no groups yet")
    return jobs.collocation_aware([g["members"] for g in state["collocation"]["groups"]],
                                  spec.ranks)


def run_jobs(lab: Lab, sc: Scenario, watcher: Watcher | None,
             progress: Callable[[str], None]) -> list[dict]:
    """Run the scenario's jobs one after another; one ``jobs`` entry each (errors included)."""
    out = []
    for spec in sc.jobs:
        try:
            vms = choose(lab, spec, watcher)
        except LabError as e:
            out.append({"name": spec.name, "collective": spec.collective, "error": str(e),
                        "verified": False, "completion_s": None})
            continue
        progress(f"job {spec.name}: {spec.collective} on {' '.join(vms)}")
        opts = dict(iterations=spec.iterations, warmup=spec.warmup)
        if spec.collective != jobs.DDP:
            opts.update(nbytes=spec.bytes, dtype=spec.dtype, compute_units=spec.compute_units,
                        conns_per_peer=spec.conns_per_peer)
        entry = jobs.run(lab, spec.name, spec.collective, vms, timeout_s=spec.timeout_s, **opts)
        entry["placement"]["policy"] = (spec.placement if isinstance(spec.placement, str)
                                        else "explicit")
        progress(f"job {spec.name}: completion {entry['completion_s']} s, "
                 f"verified {entry['verified']}")
        out.append(entry)
    return out


def placement_comparison(entries: list[dict]) -> dict | None:
    """Naive vs collocation-aware completion of the same collective, when both ran."""
    by = {e.get("placement", {}).get("policy"): e for e in entries if e.get("completion_s")}
    naive, aware = by.get("naive"), by.get("collocation_aware")
    if not naive or not aware:
        return None
    return {"naive_s": naive["completion_s"], "aware_s": aware["completion_s"],
            "ratio": round(aware["completion_s"] / naive["completion_s"], 3),
            "aware_avoided_shared_hosts": aware["placement"]["shared_host_ranks"] == 0,
            "naive_shared_host_ranks": naive["placement"]["shared_host_ranks"]}


def agent_sections(lab: Lab, mesh: AgentMesh, watcher: Watcher, cost: dict) -> dict:
    """``agents`` (their ``cost``), and ``sync``, ``owd_us`` and ``collocation`` scored
    against the truth."""
    state = watcher.latest
    if state is None:
        return {"agents": {**cost, "error": "the coordinator never answered"}}
    return {
        "agents": cost,
        "sync": scoring.sync_section(state["history"], lab.clocks.specs, state["reference"],
                                     mesh.started_ns, window_s=state["window_s"],
                                     provisional_windows=state["drift_windows"] // 2),
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
            if sc.jobs:
                extra["jobs"] = run_jobs(lab, sc, watcher if mesh else None, progress)
                comparison = placement_comparison(extra["jobs"])
                if comparison:
                    extra["placement_comparison"] = comparison
        finally:
            if mesh is not None:
                watcher.stop()
                cost = mesh.cost(watcher.latest)
                mesh.stop()
        if mesh is not None:
            extra.update(agent_sections(lab, mesh, watcher, cost))
        progress("tearing down")
    doc = results.document(sc, source, lab, caps, sampler.summary(), placements)
    doc.update(extra)
    return doc
