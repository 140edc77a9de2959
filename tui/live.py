"""``LiveBackend``: a real lab under the TUI (root), a thin adapter over ``session.Session``.

The Session runs the scenario exactly as ``nslab run`` does (lab, agents, load, timeline,
jobs); this class turns what it reports into the widgets' views (``tui.backend``): rates from
counter deltas, CPU percent from CPU-time deltas, the agents' estimates against the truth.
Every call may block on the lab thread of the Session; the app calls them from worker threads.

``stop()`` is idempotent and callable from any thread; the app calls it on quit and the CLI
again in a ``finally``, so a crash anywhere still tears the lab down.
"""
from __future__ import annotations

import copy
import time

from agents.owd import natural_key
from contracts.events import Event, Fault
from lab.errors import LabError
from lab.observe import LinkState, VmState, tier
from session import scoring, two_step
from session.scenario import load, resolve
from session.session import Session
from tui.backend import (
    EventView,
    FidelityView,
    GroupView,
    JobView,
    LinkView,
    NodeView,
    Snapshot,
    VMView,
    hidden,
)

UNSHAPED_MBIT = 1000.0  # utilization of links without a rate is shown against 1 Gbit/s


def event_view(ev: Event) -> EventView:
    """The log's view of a truth-timeline event."""
    return EventView(t_s=round(ev.t_s, 3), kind=ev.kind, target=ev.target,
                     params={k: v for k, v in ev.params.items() if _plain(v)},
                     source=ev.source)


def _plain(v) -> bool:
    """A scalar, or a list of scalars (a job's VMs): what the log describes in words."""
    scalar = (int, float, str, bool, type(None))
    return isinstance(v, scalar) or (isinstance(v, list) and all(isinstance(x, scalar)
                                                                 for x in v))


def placement_line(entry: dict) -> str:
    """Where a finished job ran and what an iteration took, from its ``jobs`` results entry:
    "on vm1 vm2 (hosts phys1 phys1: 2 ranks share a host), iteration p50 0.41 s"."""
    where = entry.get("placement") or {}
    if not where.get("vms"):
        return ""
    shared = where.get("shared_host_ranks", 0)
    line = (f"on {' '.join(where['vms'])} (hosts {' '.join(where['phys'])}: "
            + (f"{shared} ranks share a host)" if shared else "one rank per host)"))
    p50 = (entry.get("iteration_s") or {}).get("p50")
    return line + (f", iteration p50 {p50:.2f} s" if p50 is not None else "")


class LiveBackend:
    """A scenario's Session, driven by the TUI: a ``tui.backend.LabResults`` (no replay
    controls).

    Args:
        scenario: built-in name or YAML path (``session.scenario.load``).
        name: lab name (default: the scenario's).
        run_jobs: run the scenario's jobs after its timeline.
        progress: called with bring-up messages (from the lab thread).
        hide: what the snapshots leave out (``tui.backend.hidden``: an exercise's truth).
    """

    replays = False
    lab_results = True

    def __init__(self, scenario: str = "quickstart", name: str | None = None,
                 run_jobs: bool = True, progress=None, hide: frozenset[str] = frozenset()):
        self.scenario, self.name, self.run_jobs = scenario, name, run_jobs
        self.hide = hide
        self.progress = progress or (lambda msg: None)
        self.session: Session | None = None
        self.error: str | None = None
        self._prev: dict[str, tuple[int, object]] = {}

    @property
    def lab(self):
        return self.session.lab if self.session else None

    @property
    def state(self) -> str:
        if self.session is None:
            return "error" if self.error else "starting"
        return self.session.state

    # -- Backend ---------------------------------------------------------------------------
    def start(self, scenario: str | None = None) -> None:
        """Build the lab, start agents, load and the timeline.

        Raises:
            LabError: the scenario is invalid or the lab could not be built (torn down).
        """
        if scenario:
            self.scenario = scenario
        try:
            sc, topo = load(self.scenario)
            self.session = Session(sc, topo, str(resolve(self.scenario)), self.name,
                                   run_jobs=self.run_jobs, progress=self.progress)
            self.session.start()
        except LabError as e:
            self.error = str(e)
            raise

    def inject(self, fault: Fault) -> EventView:
        """Apply a fault now, stamped in the lab's truth timeline (source "tui").

        Raises:
            LabError: the lab is not running, or it refused the fault.
        """
        if self.session is None:
            raise LabError("the lab is not running")
        return event_view(self.session.inject(fault, "tui"))

    def pause(self) -> None:
        if self.session is not None:
            self.session.pause()

    def resume(self) -> None:
        if self.session is not None:
            self.session.resume()

    def step(self) -> EventView | None:
        ev = self.session.step() if self.session is not None else None
        return event_view(ev) if ev is not None else None

    def stop(self) -> None:
        """Tear the lab down (idempotent, any thread)."""
        if self.session is not None:
            self.session.stop()

    def job_results(self) -> list[dict]:
        """The finished jobs' entries, as in the results' ``jobs`` section (an exercise's
        check reads them)."""
        if self.session is None:
            return []
        entries = self.session.live("placement", {})
        return [entries[s.name] for s in self.session.sc.jobs if s.name in entries]

    def truth(self) -> dict:
        """The truth an exercise's check needs, shaped as the results' ``truth`` section:
        ``placements`` (VM -> physical host at the start).

        Raises:
            LabError: the lab is not up.
        """
        if self.session is None or not self.session.placements:
            raise LabError("the lab is not up yet")
        return {"placements": dict(self.session.placements)}

    # -- snapshot --------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return hidden(self._snapshot(), self.hide)

    def _snapshot(self) -> Snapshot:
        s = self.session
        if s is None or s.state in ("created", "starting", "stopped", "error"):
            return Snapshot(scenario=self.scenario, lab=s.lab.name if s else "",
                            state=self.state,
                            events=[event_view(e) for e in s.timeline] if s else [])
        now_ns = time.time_ns()
        lab, topo = s.lab, s.topo
        snap = Snapshot(time_s=round(s.now_s(), 2), scenario=s.sc.name, lab=lab.name,
                        fabric=lab.fabric, state=s.state,
                        hosts=sorted(set(lab.phys.values()), key=natural_key),
                        truth_groups=scoring.truth_groups(lab.phys))
        snap.nodes = [NodeView(n, topo.nodeInfo(n).get("role", "vm"), tier(lab, n))
                      for n in topo.nodes()]
        queues = s.queues()
        snap.links = [self._link_view(lk, now_ns, queues) for lk in s.links()]
        snap.vms = [self._vm_view(v, now_ns) for v in s.vms()]
        self._agent_views(snap)
        snap.events = [event_view(e) for e in s.timeline]
        snap.pending = [EventView(t_s=at, kind=f.kind, target=f.target, params=f.params(),
                                  source="timeline") for at, f in s.pending()]
        snap.jobs = self._job_views()
        snap.cassini = copy.deepcopy(list(s.live("cassini", [])))
        snap.comparisons = s.comparisons()
        if s.sampler.busy:
            snap.fidelity = FidelityView(busy=round(s.sampler.busy[-1], 3),
                                         softirq=round(s.sampler.softirq[-1], 3),
                                         saturated=bool(s.sampler.summary()["saturated"]))
        return snap

    def _delta(self, key: str, now_ns: int, value):
        """(seconds, previous value) since the last call with ``key``; None the first time."""
        prev = self._prev.get(key)
        self._prev[key] = (now_ns, value)
        if prev is None or now_ns <= prev[0]:
            return None
        return (now_ns - prev[0]) / 1e9, prev[1]

    def _link_view(self, lk: LinkState, now_ns: int, queues: dict) -> LinkView:
        mbit = drop_rate = 0.0
        d = self._delta(f"{lk.a}-{lk.b}", now_ns, (lk.tx_bytes, lk.drops))
        if d is not None:
            dt, (before, drops_before) = d
            mbit = max(max(0, x - y) for x, y in zip(lk.tx_bytes, before, strict=True)) \
                * 8 / dt / 1e6
            drop_rate = max(0, lk.drops - drops_before) / dt
        backlog = [q.backlog_packets for k, q in queues.items()
                   if k in (f"{lk.a}->{lk.b}", f"{lk.b}->{lk.a}")]
        return LinkView(a=lk.a, b=lk.b, up=lk.up, drops=lk.drops, mbit=round(mbit, 2),
                        drop_rate=round(drop_rate, 1),
                        queue_pkts=max(backlog) if backlog else None,
                        utilization=round(min(1.0, mbit / (lk.bw_mbit or UNSHAPED_MBIT)), 3),
                        bw_mbit=lk.bw_mbit, loss_percent=lk.loss_percent,
                        tx_bytes=sum(lk.tx_bytes))

    def _vm_view(self, v: VmState, now_ns: int) -> VMView:
        cpu = 0.0
        d = self._delta("cpu:" + v.name, now_ns, v.cpu_ns) if v.cpu_ns is not None else None
        if d is not None:
            cpu = 100.0 * (v.cpu_ns - d[1]) / (d[0] * 1e9)
        return VMView(name=v.name, phys=v.phys, leaf=v.leaf, cpu_pct=round(max(0.0, cpu), 1),
                      offset_ms=round(v.offset_ns / 1e6, 4), drift_ppm=round(v.drift_ppm, 3),
                      paused=v.paused, hog=v.hog)

    def _agent_views(self, snap: Snapshot) -> None:
        """Estimates, OWD and collocation from the coordinator's latest state (API.md)."""
        s = self.session
        if not s.sc.agents.enabled:
            snap.agents = "off"
            return
        state = s.agents_state
        if state is None:
            snap.agents = "waiting" if s.mesh is not None else "failed"
            return
        snap.agents = "running"
        snap.reference = state.reference
        truth = {}
        specs = s.lab.clocks.specs
        if state.reference in specs and state.t_ns is not None:
            truth = scoring.truth_at(specs, state.reference, state.t_ns)
        for v in snap.vms:
            est = state.vms.get(v.name)
            if est is None or est.offset_ns is None:
                continue
            v.est_offset_ms = round(est.offset_ns / 1e6, 4)
            if est.drift_ppm is not None:
                v.est_drift_ppm = round(est.drift_ppm, 3)
            if v.name in truth:
                off, drift = truth[v.name]
                v.err_offset_us = round((est.offset_ns - off) / 1e3, 2)
                if est.drift_ppm is not None:
                    v.err_drift_ppm = round(est.drift_ppm - drift, 3)
        snap.owd_us = {pair: round(st.p50_us, 1) for pair, st in state.owd_us.items()
                       if st.p50_us is not None}
        snap.asymmetry_us = {pair.replace("|", "<->"): round(x, 1)
                             for pair, x in state.asymmetry_us.items() if x is not None}
        snap.groups = [GroupView(sorted(g.members, key=natural_key), g.confidence)
                       for g in state.collocation.groups]

    def _job_views(self) -> list[JobView]:
        s = self.session
        started = {e.target for e in s.timeline if e.kind == "job_start"}
        out = []
        for spec in s.sc.jobs:
            if s.sc.two_step is not None and spec.name == s.sc.two_step.job:
                out += self._two_step_views(spec.name, started)
                continue
            e = s.live("placement", {}).get(spec.name)
            if e is None:
                out.append(JobView(spec.name, 0.5 if spec.name in started else 0.0))
                continue
            out.append(JobView(spec.name, 1.0, e.get("iteration_times_s") or [],
                               e.get("completion_s"), e.get("verified"),
                               e.get("error"), detail=placement_line(e)))
        return out + self._lb_views()

    def _lb_views(self) -> list[JobView]:
        """One line per ``lb`` run done (the balancer, its completion, imbalance and the
        leaf-spine links' MB) and the one running (``session.lb``)."""
        s = self.session
        if s.sc.lb is None:
            return []
        out = []
        for e in list(s.live("lb", [])):
            mb = " ".join(f"{k} {v / 1e6:.1f}" for k, v in sorted(
                e["link_bytes"].items(), key=lambda kv: natural_key(kv[0])))
            out.append(JobView(
                f"lb {e['mode']} {e['collective']} {e['case']} 1:{e['oversubscription']:g}",
                1.0, [], e["completion_s"], e["finished"], e["error"],
                detail=f"imbalance {e['imbalance']}, retransmits {e['retransmits']}; "
                       f"MB {mb}"))
        started = [e.target for e in s.timeline if e.kind == "job_start"
                   and e.target.startswith("lb_")]
        if s.state == "jobs" and started and len(started) > len(out):
            out.append(JobView(started[-1], 0.5))
        return out

    def _two_step_views(self, job: str, started: set[str]) -> list[JobView]:
        """One line per two_step step: done (completion, drops, retransmissions), running,
        or to come."""
        done = {e["name"]: e for e in list(self.session.live("two_step", []))}
        out = []
        for step, *_ in two_step.STEPS:
            e = done.get(step)
            if e is None:
                running = two_step.step_job_name(job, step) in started
                out.append(JobView(f"{job} {step}", 0.5 if running else 0.0))
                continue
            out.append(JobView(f"{job} {step}", 1.0, [], e["completion_s"], e["verified"],
                               e["error"], detail=f"pacer {e['pacer']}, cc {e['cc'] or '-'}: "
                               f"drops {e['fabric_drops']}, retransmits {e['retransmits']}, "
                               f"RTOs {e['rtos']}"))
        return out
