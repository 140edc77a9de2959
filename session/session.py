"""``Session``: one running scenario, the same for ``nslab run`` and the TUI.

A Session owns the scenario's Lab, its agent daemons, its background load, its fault timeline
(which can be paused, stepped and extended while it runs), its jobs and the truth. It emits
every event of the truth timeline (``lab.events.Event``) to its subscribers as it happens.

    session = Session(scenario, topo, source)
    session.subscribe(print)
    session.start()          # bring-up, agents, load, timeline player
    session.wait()           # the timeline, its duration and the jobs are over
    session.stop()           # teardown (idempotent, any thread)
    doc = session.results()  # the nslab.results/1 document

Threads: every kernel operation (bring-up, faults, counters, teardown) runs on the session's
*lab thread*, a single-worker executor: the nodes' pyroute2 sockets are opened per thread, so
one thread uses one set of them (pyroute2: namespace sockets and threads). ``call`` runs a
function there from any thread. The timeline player, the agents' watcher, the fidelity sampler,
the iperf3 load and the jobs run in their own threads; jobs start ranks with ``vm.popen``.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from mininet.topo import Topo

from lab.capabilities import probe
from lab.capture import Capture
from lab.errors import LabError
from lab.events import Event, Fault, Source
from lab.fabric import require_fabric
from lab.fidelity import FidelitySampler
from lab.lab import Lab
from lab.observe import LinkState, VmState, link_states, vm_states
from lab.queues import QueueReader
from session import cassini, incast, jobs, lb, results, scoring, two_step
from session.chrony import ChronyMesh
from session.daemons import AgentMesh
from session.edge import job_edge
from session.load import LoadRunner
from session.scenario import JobSpec, Scenario

T = TypeVar("T")
LOAD_JOIN_S = 60.0
"""How long the end of the timeline waits for background iperf3 flows, s."""


def make_lab(scenario: Scenario, topo: Topo, name: str | None = None,
             progress: Callable[[str], None] | None = None) -> Lab:
    """The ``Lab`` a scenario describes (not started; ``nslab up`` starts it alone)."""
    return Lab(topo, name=name or scenario.name, seed=scenario.seed, clocks=scenario.clocks,
               cpu_cores=scenario.hosts.cpu_cores, cpu_reserve=scenario.hosts.reserve,
               fabric=scenario.fabric.mode,
               host_cpu={h: o.model_dump(exclude_none=True)
                         for h, o in scenario.hosts.overrides.items()},
               progress=progress)


class Watcher(threading.Thread):
    """Polls the coordinator every ``interval_s``: keeps the latest state and the first time
    (s after the agents started) its collocation groups equalled the truth, and marks the
    agents' start-up over at its first closed window (``AgentMesh.mark_steady``). While it
    runs it asks for the state without its window history (at 256 VMs a full state took the
    coordinator ~1 s of CPU to build, 12.6 MB, every poll); ``stop`` takes the last state
    whole (the results score that history)."""

    def __init__(self, lab: Lab, mesh: AgentMesh, interval_s: float = 1.0):
        super().__init__(daemon=True, name="nslab-watcher")
        self.lab, self.mesh, self.interval_s = lab, mesh, interval_s
        self.latest = None
        self.detected_after_s: float | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.poll(history=0)

    def poll(self, history: int | None = None) -> bool:
        """Take the coordinator's state now (``AgentMesh.state``); False if it did not
        answer."""
        state = self.mesh.state(history)
        if state is None:
            return False
        self.latest = state
        if state.windows:
            self.mesh.mark_steady()
        groups = sorted(sorted(g.members) for g in state.collocation.groups)
        matches = groups == scoring.truth_groups(self.lab.phys)
        if matches and self.detected_after_s is None:
            self.detected_after_s = round((time.time_ns() - self.mesh.started_ns) / 1e9, 2)
        elif not matches:
            self.detected_after_s = None  # must hold until the end
        return True

    def stop(self) -> None:
        self._halt.set()
        self.join()
        for _ in range(3):  # a loaded coordinator may miss one request's timeout
            if self.poll():
                return


class Session:
    """A scenario running (see the module doc).

    Args:
        scenario: a validated scenario (``session.scenario.load``).
        topo: its topology.
        source: the scenario file (for the results).
        name: lab name (default: the scenario's).
        run_jobs: run the scenario's jobs after its timeline.
        capture: record packets while the lab runs: keyword arguments of
            ``lab.capture.Capture`` (``directory``, ``targets``, ``bpf``); tcpdump starts right
            after bring-up (before the agents) and stops before teardown (``self.capture``).
        progress: called with short messages during long steps.

    ``state``: "created", "starting", "running", "paused" (timeline held), "jobs", "done"
    (timeline and jobs over; the lab still runs), "stopped" (torn down) or "error".
    """

    def __init__(self, scenario: Scenario, topo: Topo, source: str = "",
                 name: str | None = None, run_jobs: bool = True, capture: dict | None = None,
                 progress: Callable[[str], None] | None = None):
        self.sc, self.topo, self.source, self.run_jobs = scenario, topo, source, run_jobs
        self.progress = progress or (lambda msg: None)
        self.lab = make_lab(scenario, topo, name, self.progress)
        self.capture = Capture(self.lab, **capture) if capture else None
        self.state = "created"
        self.error: str | None = None
        self.mesh: AgentMesh | None = None
        self.watcher: Watcher | None = None
        self.chrony: ChronyMesh | None = None
        self.sampler = FidelitySampler(interval_s=0.5)
        self.load = LoadRunner(self.lab, list(scenario.load))
        self.job_entries: dict[str, dict] = {}
        self.cassini_sets: list[dict] = []
        self.two_step: dict | None = None
        self.two_step_steps: list[dict] = []
        self.lb: dict | None = None
        self.lb_runs: list[dict] = []
        self.pacer_reports: dict = {}
        self.load_entries: list[dict] = []
        self.capabilities: dict = {}
        self.placements: dict[str, str] = {}
        self._agent_cost: dict | None = None
        self._pending: list[Fault] = sorted(scenario.faults, key=lambda f: f.at_s)
        self._paused_at: float | None = None
        self._shift_s = 0.0
        self._lock = threading.RLock()
        self._halt = threading.Event()
        self._done = threading.Event()
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nslab-lab")
        self._player: threading.Thread | None = None
        self._stopped = False
        self._queues: QueueReader | None = None

    # -- plumbing --------------------------------------------------------------------------
    def call(self, fn: Callable[..., T], *args, **kw) -> T:
        """Run ``fn`` on the lab thread and wait for it (its exception is re-raised)."""
        if threading.current_thread().name.startswith("nslab-lab"):
            return fn(*args, **kw)
        return self._exec.submit(fn, *args, **kw).result()

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback(event)`` for every event stamped from now on (from the thread that
        stamped it; keep it short)."""
        self.lab.listeners.append(callback)

    @property
    def timeline(self) -> list[Event]:
        """The truth timeline so far (a copy)."""
        return list(self.lab.timeline)

    def now_s(self) -> float:
        """Seconds since bring-up (0 before)."""
        return self.lab.now_s() if self.lab.t0_ns else 0.0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Build the lab, start the agents, the load and the timeline player.

        Raises:
            LabError (and subclasses): the lab could not be built (it is torn down first).
        """
        self.state = "starting"
        try:
            self.call(self._start)
        except BaseException as e:
            self.state = "error"
            self.error = str(e)
            self.stop()
            raise
        self._player = threading.Thread(target=self._play, daemon=True, name="nslab-timeline")
        self._player.start()

    def _start(self) -> None:
        self.capabilities = probe()
        for mode in sorted(lb.fabric_modes(self.sc.lb) if self.sc.lb else ()):
            require_fabric(mode, self.capabilities)  # before anything is built
        self.sampler.start()
        self.lab.start()
        self.sampler.watch(QueueReader(self.lab))
        self.placements = dict(self.lab.phys)
        self.lab.stamp("lab_up", self.lab.name, bringup_s=round(self.lab.bringup_s, 3))
        if self.capture is not None:
            files = self.capture.start()
            self.progress(f"capturing into {self.capture.dir}: {', '.join(sorted(files))}")
        if self.sc.agents.enabled:
            self.progress(f"starting agents in {len(self.lab.vms)} VMs")
            self.mesh = AgentMesh(self.lab, self.sc.agents)
            self.mesh.start()
            self.watcher = Watcher(self.lab, self.mesh)
            self.watcher.start()
            self.lab.stamp("agents_up", f"{len(self.lab.vms)} VMs")
        if self.sc.chrony.enabled:
            self.progress(f"starting chronyd in {len(self.lab.vms)} VMs")
            self.chrony = ChronyMesh(self.lab, self.sc.chrony)
            self.chrony.start()
            self.lab.stamp("chrony_up", self.chrony.server)
        self.load.start()
        self.state = "running"

    def _play(self) -> None:
        """The timeline player: each fault at its time (shifted by pauses), then the rest of
        ``duration_s``, the load's end and the jobs."""
        while not self._halt.is_set():
            with self._lock:
                due = self._paused_at is None and (
                    self._pending[0].at_s if self._pending else self.sc.duration_s
                ) + self._shift_s <= self.lab.now_s()
                fault = self._pending.pop(0) if due and self._pending else None
            if due and fault is None:
                break
            if fault is None:
                self._halt.wait(0.02)
                continue
            self._apply(fault, "timeline")
        if self._halt.is_set():
            return
        if self.sc.load:
            self.load_entries = self.load.join(timeout_s=LOAD_JOIN_S)
        if self.run_jobs and (self.sc.jobs or self.sc.lb):
            self.state = "jobs"
            self._jobs()
            if self.sc.cassini is not None:
                self._cassini()
            if self.sc.two_step is not None:
                self._two_step()
            if self.sc.lb is not None and not self._halt.is_set():
                self._lb()
        if not self._halt.is_set():
            self.state = "done"
        self._done.set()

    def _apply(self, fault: Fault, source: Source) -> Event | None:
        try:
            return self.call(self.lab.inject, fault, source)
        except LabError as e:  # the run goes on; the timeline says what failed
            self.lab.stamp("fault_failed", fault.target, fault=fault.kind, error=str(e))
            return None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the timeline, its duration and the jobs are over; False on timeout."""
        return self._done.wait(timeout_s)

    def stop(self) -> None:
        """Stop the jobs' turn, the timeline, the agents and the load; tear the lab down
        (idempotent, from any thread, also after a failed start)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._halt.set()
        try:
            self.call(self._stop)
        finally:
            self._exec.shutdown(wait=False)
            self._done.set()

    def _stop(self) -> None:
        self.progress("tearing down")
        try:
            if self.chrony is not None:
                self.chrony.stop()
            if self.watcher is not None:
                self.watcher.stop()
            if self.mesh is not None:
                self._agent_cost = self.mesh.cost(self.watcher.latest if self.watcher else None)
                self.mesh.stop()
        finally:
            self.sampler.stop()  # first: it reads the lab's queues
            if self.capture is not None:
                self.capture.stop()
            self.lab.stop()
            if self.state != "error":
                self.state = "stopped"

    def run(self) -> dict:
        """Start, wait for the end, stop; the results document (``nslab run``).

        Raises:
            LabError (and subclasses): the lab could not be built (it is torn down first).
        """
        self.start()
        try:
            self.wait()
        finally:
            self.stop()
        return self.results()

    # -- the timeline, live ----------------------------------------------------------------
    def inject(self, fault: Fault, source: Source = "tui") -> Event:
        """Apply ``fault`` now.

        Raises:
            LabError: the lab is not running, or it refused the fault.
        """
        if self._stopped or self.state in ("created", "starting"):
            raise LabError("the lab is not running")
        return self.call(self.lab.inject, fault, source)

    def schedule(self, fault: Fault) -> None:
        """Add ``fault`` to the timeline at its ``at_s`` (s after bring-up, before pauses)."""
        with self._lock:
            self._pending.append(fault)
            self._pending.sort(key=lambda f: f.at_s)

    def pending(self) -> list[tuple[float, Fault]]:
        """The timeline's faults not played yet: (when, s after bring-up with the pauses so
        far, fault), in order."""
        with self._lock:
            shift = self._shift_s + (self.now_s() - self._paused_at
                                     if self._paused_at is not None else 0.0)
            return [(round(f.at_s + shift, 3), f) for f in self._pending]

    def pause(self) -> None:
        """Hold the timeline (faults already injected stay; load and jobs go on)."""
        with self._lock:
            if self._paused_at is None and self.state == "running":
                self._paused_at = self.now_s()
                self.state = "paused"
                self.lab.stamp("timeline_paused", "")

    def resume(self) -> None:
        """Let the timeline play on; the remaining steps keep their spacing."""
        with self._lock:
            if self._paused_at is not None:
                self._shift_s += self.now_s() - self._paused_at
                self._paused_at = None
                self.state = "running"
                self.lab.stamp("timeline_resumed", "")

    def step(self) -> Event | None:
        """Play the timeline's next fault now; None when none is left (or it failed)."""
        with self._lock:
            if not self._pending or self._stopped:
                return None
            fault = self._pending.pop(0)
        return self._apply(fault, "step")

    # -- jobs ------------------------------------------------------------------------------
    def choose(self, spec: JobSpec) -> list[str]:
        """The VMs of a job under its placement policy.

        Raises:
            LabError: collocation_aware without groups from the agents.
        """
        if isinstance(spec.placement, list):
            return list(spec.placement)
        if spec.placement == "naive":
            return jobs.naive(list(self.lab.phys), spec.ranks)
        state = self.watcher.latest if self.watcher else None
        if state is None or not state.collocation.groups:
            raise LabError("collocation_aware placement: the agents reported no groups yet")
        return jobs.collocation_aware([g.members for g in state.collocation.groups],
                                      spec.ranks)

    def _jobs(self) -> None:
        """The scenario's jobs one after another (but those of ``cassini`` sets and
        ``two_step``), each with its pacers (``session.edge``); one ``jobs`` entry each
        (errors included), with the lab's queue drops during the job (``fabric_drops``, and
        per link ``drops_by_link``). Every job's VMs are chosen as the jobs begin, from the
        agents' groups then: a later job is not placed from groups that an earlier job's
        load moved (quickstart: {vm1, vm2} split while the naive job ran on them, and the
        aware job got both); a job that could not be placed then (no groups yet: a timeline
        shorter than the agents take to find them) is placed at its turn."""
        own_turn = self.sc.own_turn_jobs()
        specs = [s for s in self.sc.jobs if s.name not in own_turn]
        chosen: dict[str, list[str]] = {}
        for spec in specs:
            with contextlib.suppress(LabError, ValueError):  # placed at its turn instead
                chosen[spec.name] = self.choose(spec)
        for spec in specs:
            if self._halt.is_set():
                return
            policy = spec.placement if isinstance(spec.placement, str) else "explicit"
            try:
                vms = chosen.get(spec.name) or self.choose(spec)
                self.progress(f"job {spec.name}: {spec.collective} on {' '.join(vms)}")
                before = self.call(incast.drops, self.lab)
                with job_edge(self.lab, self.mesh, vms, spec.pacer, self.sc.pacer) as sensed:
                    entry = jobs.run(self.lab, spec.name, spec.config(), vms)
                after = self.call(incast.drops, self.lab)
                entry["drops_by_link"] = {k: n - before.get(k, 0) for k, n in after.items()
                                          if n > before.get(k, 0)}
                entry["fabric_drops"] = sum(entry["drops_by_link"].values())
            except (LabError, ValueError) as e:
                self.job_entries[spec.name] = {"name": spec.name, "collective": spec.collective,
                                               "error": str(e), "verified": False,
                                               "completion_s": None}
                continue
            entry["placement"]["policy"] = policy
            entry["edge"] = {"pacer": spec.pacer, "cc": spec.cc,
                             "retransmits": sensed.retransmits, "rtos": sensed.rtos,
                             "owd_p99_us": sensed.owd_p99_us}
            self.progress(f"job {spec.name}: completion {entry['completion_s']} s, "
                          f"verified {entry['verified']}")
            self.job_entries[spec.name] = entry

    def _cassini(self) -> None:
        """The ``cassini`` sets: each profiled, planned and run in every mode
        (``session.cassini``); each set's entry joins ``cassini_sets`` once planned (the TUI
        draws it), its modes as they finish."""
        specs = {j.name: j for j in self.sc.jobs}
        for cset in self.sc.cassini.sets:
            if self._halt.is_set():
                return
            configs = {n: specs[n].config() for n in cset.jobs}
            vms = {n: list(specs[n].placement) for n in cset.jobs}
            cassini.run_set(self.lab, self.sc.cassini, cset, configs, vms,
                            lambda: self.agents_state, self.progress, self.cassini_sets.append)

    def _two_step(self) -> None:
        """The ``two_step`` section: its job naive, aware, aware + pacer, and the BBR and
        CUBIC baselines (``session.two_step``)."""
        spec = next(j for j in self.sc.jobs if j.name == self.sc.two_step.job)
        self.two_step, self.pacer_reports = two_step.run(
            self.lab, self.mesh, spec, self.sc.pacer,
            lambda policy: self.choose(spec.model_copy(update={"placement": policy})),
            lambda: self.call(two_step.drops, self.lab), self.progress, self.two_step_steps)

    def _lb(self) -> None:
        """The ``lb`` section: every balancer in turn on every VM (``session.lb``)."""
        vms = jobs.naive(list(self.lab.phys), len(self.lab.phys))
        self.lb = lb.Runner(self.lab, self.sc.lb, self.sc.topology, vms, self.call,
                            self.progress).run(self.lb_runs)

    # -- what it shows now -----------------------------------------------------------------
    def links(self) -> list[LinkState]:
        """Every link's state and counters now (read on the lab thread)."""
        return self.call(link_states, self.lab)

    def queues(self) -> dict:
        """{``"a->b"``: ``lab.queues.QueueReading``} of every rate-shaped direction now (read
        on the lab thread)."""
        if self._queues is None:
            self._queues = QueueReader(self.lab)
        return self.call(self._queues)

    def vms(self) -> list[VmState]:
        """Every VM's host, CPU and clock truth now (read on the lab thread)."""
        return self.call(vm_states, self.lab)

    @property
    def agents_state(self):
        """The coordinator's latest state (``agents.messages.CoordinatorState``), or None."""
        return self.watcher.latest if self.watcher else None

    # -- results ---------------------------------------------------------------------------
    def results(self) -> dict:
        """The ``nslab.results/1`` document of a stopped session, validated against
        ``session.results.Results`` (``nslab schema results``).

        Raises:
            pydantic.ValidationError: a section that does not fit the model (a bug).
        """
        sections: dict = {}
        if self.load_entries:
            sections["load"] = self.load_entries
        if self.mesh is not None:
            sections.update(scoring.agent_sections(self.lab, self.mesh, self.watcher,
                                                   self._agent_cost or {}))
            if self.chrony is not None and "sync" in sections:
                sections["sync"]["chrony"] = self.chrony.section()
        if any(s.name not in self.sc.own_turn_jobs() for s in self.sc.jobs):
            sections["jobs"] = [self.job_entries[s.name] for s in self.sc.jobs
                                if s.name in self.job_entries]
            sections["placement_comparison"] = scoring.placement_comparison(sections["jobs"])
        if self.cassini_sets:
            sections["cassini"] = {"sets": self.cassini_sets,
                                   "score_ranks_gains": cassini.predicted_ranking(
                                       self.cassini_sets)}
        if self.lb is not None:
            sections["lb"] = self.lb
        if self.two_step is not None:
            sections["two_step"] = self.two_step
            sections["pacer"] = {**self.sc.pacer.model_dump(),
                                 "reports": {k: r.model_dump() for k, r in
                                             self.pacer_reports.items()}}
        return results.document(self.sc, self.source, self.lab, self.capabilities,
                                self.sampler.summary(self.lab.t0_ns), self.placements, **sections)
