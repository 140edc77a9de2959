"""``Session``: one running scenario, the same for ``nslab run`` and the TUI.

A Session owns the scenario's Lab, its agent daemons, its background load, its fault timeline
(which can be paused, stepped and extended while it runs), its jobs and the truth. It emits
every event of the truth timeline (``contracts.events.Event``) to its subscribers as it happens.

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

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from mininet.topo import Topo

from contracts.events import Event, Fault, Source
from lab.capabilities import probe
from lab.capture import Capture
from lab.errors import LabError
from lab.fidelity import FidelitySampler
from lab.lab import Lab
from lab.observe import LinkState, VmState, link_states, vm_states
from lab.queues import QueueReader
from session import document, jobs, scoring
from session.daemons import AgentMesh
from session.load import LoadRunner
from session.scenario import HostCpuSpec, JobSpec, Scenario
from session.studies import STUDIES
from session.studies.base import Study

T = TypeVar("T")
LOAD_JOIN_S = 60.0
"""How long the end of the timeline waits for background iperf3 flows, s."""


def make_lab(scenario: Scenario, topo: Topo, name: str | None = None,
             progress: Callable[[str], None] | None = None,
             ssh_options: Sequence[str] = ()) -> Lab:
    """The ``Lab`` a scenario describes (not started; ``nslab up`` starts it alone), split
    across the scenario's ``servers`` when it lists more than one (``ssh_options``: extra
    ``ssh`` arguments for the remote ones).

    Raises:
        topo.split.SplitError: the servers cannot carry the topology (also checked when the
            scenario loads).
        LabError: a split lab with clock daemons (chrony, clock_daemons): a VM's own clock
            corrections on a remote server are not read back into the truth yet.
    """
    if len(scenario.servers) > 1 and (scenario.chrony.enabled or scenario.clock_daemons.enabled):
        raise LabError("servers: clock daemons (chrony, clock_daemons) discipline the VM clocks, "
                       "and a VM's own corrections on a remote server are not read back into "
                       "the truth yet; run them on one server")
    return Lab(topo, name=name or scenario.name, seed=scenario.seed, clocks=scenario.clocks,
               cpu_cores=scenario.hosts.cpu_cores, cpu_reserve=scenario.hosts.reserve,
               fabric=scenario.fabric.mode,
               host_cpu={h: o.model_dump(include=set(HostCpuSpec.model_fields),
                                         exclude_none=True)
                         for h, o in scenario.hosts.overrides.items()},
               progress=progress, servers=[s.server() for s in scenario.servers],
               server_placement=scenario.server_placement, ssh_options=ssh_options)


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
        ssh_options: extra ``ssh`` arguments for the scenario's remote ``servers``.

    ``state``: "created", "starting", "running", "paused" (timeline held), "jobs", "done"
    (timeline and jobs over; the lab still runs), "stopped" (torn down) or "error".
    """

    def __init__(self, scenario: Scenario, topo: Topo, source: str = "",
                 name: str | None = None, run_jobs: bool = True, capture: dict | None = None,
                 progress: Callable[[str], None] | None = None,
                 ssh_options: Sequence[str] = ()):
        self.sc, self.topo, self.source, self.run_jobs = scenario, topo, source, run_jobs
        self.progress = progress or (lambda msg: None)
        self.lab = make_lab(scenario, topo, name, self.progress, ssh_options)
        self.capture = Capture(self.lab, **capture) if capture else None
        self.state = "created"
        self.error: str | None = None
        self.mesh: AgentMesh | None = None
        self.watcher: Watcher | None = None
        self.sampler = FidelitySampler(interval_s=0.5)
        self.load = LoadRunner(self.lab, list(scenario.load))
        self.studies: dict[str, Study] = {S.key: S(self) for S in STUDIES
                                          if S.enabled(scenario)}
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
        self._wake = threading.Event()  # the timeline changed: the player looks again
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

    @property
    def halted(self) -> bool:
        """The session is stopping: a study's ``run`` returns at its next step."""
        return self._halt.is_set()

    def live(self, key: str, default=None):
        """What study ``key`` has finished so far (``Study.live``), or ``default`` when the
        scenario does not run it."""
        study = self.studies.get(key)
        return default if study is None else study.live

    def rounds(self, arms: list[T]) -> Iterator[tuple[int, list[T]]]:
        """The scenario's ``repeat`` rounds of ``arms``: (round, the arms in that round's
        order), rotated by one each round (A B C, B C A, C A B, ...), so that no arm always
        runs first or right after the same one."""
        for r in range(self.sc.repeat):
            k = r % len(arms) if arms else 0
            yield r, arms[k:] + arms[:k]

    def comparisons(self) -> list[dict]:
        """Every study's compared pairs so far (the TUI's view; the results add the sync's)."""
        return [c for study in self.studies.values() for c in study.comparisons()]

    def now_s(self) -> float:
        """Seconds since bring-up (0 before)."""
        return self.lab.now_s() if self.lab.t0_ns else 0.0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Build the lab, start the agents (and wait, at most 10 s, until each has reported:
        the load finds them running, their start-up burst under way), the load and the
        timeline player.

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
        for study in self.studies.values():
            study.check(self.capabilities)  # before anything is built
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
            self.mesh.wait_agents(10.0)
            self.watcher = Watcher(self.lab, self.mesh)
            self.watcher.start()
            self.lab.stamp("agents_up", f"{len(self.lab.vms)} VMs")
        for study in self.studies.values():
            study.start()
        self.load.start()
        self.state = "running"

    def _play(self) -> None:
        """The timeline player: each fault at its time (shifted by pauses), then the rest of
        ``duration_s``, the load's end and the jobs."""
        while not self._halt.is_set():
            self._wake.clear()
            with self._lock:
                now = self.lab.now_s()
                at = (self._pending[0].at_s if self._pending else self.sc.duration_s
                      ) + self._shift_s
                paused = self._paused_at is not None
                due = not paused and at <= now
                fault = self._pending.pop(0) if due and self._pending else None
            if due and fault is None:
                break
            if fault is None:  # sleep until it is due, or the timeline changes
                self._wake.wait(None if paused else at - now)
                continue
            self._apply(fault, "timeline")
        if self._halt.is_set():
            return
        if self.sc.load:
            self.load_entries = self.load.join(timeout_s=LOAD_JOIN_S)
        turn = [st for st in self.studies.values() if st.turn]
        if self.run_jobs and turn:
            self.state = "jobs"
            for study in turn:
                if self._halt.is_set():
                    break
                study.run()
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
        self._wake.set()
        try:
            self.call(self._stop)
        finally:
            self._exec.shutdown(wait=False)
            self._done.set()

    def _stop(self) -> None:
        self.progress("tearing down")
        try:
            for study in self.studies.values():
                study.stop()
            if self.watcher is not None:
                self.watcher.stop()
            if self.mesh is not None:
                self._agent_cost = self.mesh.cost(self.watcher.latest if self.watcher else None)
                self.mesh.stop()
        finally:
            self.sampler.stop()  # first: it reads the lab's queues
            try:
                if self.capture is not None:
                    self.capture.stop()  # before teardown: remote pcaps come back first
            finally:
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
        self._wake.set()

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
        self._wake.set()

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
        """The coordinator's latest state (``contracts.messages.CoordinatorState``), or None."""
        return self.watcher.latest if self.watcher else None

    # -- results ---------------------------------------------------------------------------
    def results(self) -> dict:
        """The ``nslab.results/1`` document of a stopped session, validated against
        ``contracts.results.Results`` (``nslab schema results``).

        Raises:
            pydantic.ValidationError: a section that does not fit the model (a bug).
        """
        sections: dict = {}
        if self.load_entries:
            sections["load"] = self.load_entries
        if self.mesh is not None:
            sections.update(scoring.agent_sections(self.lab, self.mesh, self.watcher,
                                                   self._agent_cost or {}, self.sc.repeat,
                                                   self.sampler.saturated_between))
        for study in self.studies.values():
            study.sections(sections)
        return document.document(self.sc, self.source, self.lab, self.capabilities,
                                 self.sampler.summary(self.lab.t0_ns), self.placements,
                                 **sections)
