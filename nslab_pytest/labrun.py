"""A lab started for a test (``nslab_lab``), and what a test does with it.

    lab = nslab_lab(LeafSpine(spines=1, leaves=2, vms_per_leaf=1), pcap=["vm1"])
    procs = spawn(lab, ["vm2"], [sys.executable, "my_agent.py", "--port", "9000"])
    inject(lab, {"kind": "link_down", "link": ["leaf2", "spine1"]})   # or a contracts.events model
    truth(lab).placements, truth(lab).faults     # the ground truth (contracts.results)
    agents_state(lab)                            # the coordinator's API, typed

A ``LabRun`` owns everything it started for the lab (the lab or the scenario's Session, the
agents, tcpdump, the test's processes) and stops it all in ``stop``; with ``keep`` it first
writes the truth and copies the agents' logs, writes a scenario's results document and its
HTML report once the Session stopped, then keeps its work directory (the processes' output,
the pcaps) there. Kernel work of a scenario's lab runs on its Session's lab thread
(``inject`` goes through it); a lab built from a Topo is driven from the test's thread.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mininet.topo import Topo
from pydantic import TypeAdapter

from contracts.events import Event, Fault
from contracts.messages import CoordinatorState
from contracts.results import write
from contracts.results.truth import TruthSection
from lab.capture import Capture
from lab.errors import LabError
from lab.lab import Lab
from lab.names import state_dir
from lab.wait import wait_until
from nslab_pytest.names import next_lab_name
from session.daemons import AgentMesh, AgentsSpec
from session.document import truth_section
from session.scenario import load, resolve
from session.session import Session

STOP_S = 2.0
"""How long a test's process has to exit after SIGTERM before SIGKILL, s."""
_FAULT = TypeAdapter(Fault)
_RUNS: dict[str, LabRun] = {}


@dataclass
class Proc:
    """A process ``spawn`` started in a VM: its ``popen``, and ``log``, the file holding its
    stdout and stderr."""

    vm: str
    popen: subprocess.Popen
    log: str

    def output(self) -> str:
        """What it wrote so far (stdout and stderr)."""
        with open(self.log, errors="replace") as f:
            return f.read()

    def wait_for(self, text: str, timeout_s: float) -> str:
        """Wait until its output contains ``text``; the output so far.

        Raises:
            TimeoutError: not within ``timeout_s`` s, or it exited without writing it (its
                output is quoted).
        """
        seen = {"out": ""}

        def said() -> bool:
            exited = self.popen.poll() is not None  # before reading: its last words count
            seen["out"] = self.output()
            if text not in seen["out"] and exited:
                raise TimeoutError(f"{self.vm}: exited ({self.popen.poll()}) without {text!r} "
                                   f"in its output:\n{seen['out'][-2000:]}")
            return text in seen["out"]

        if not wait_until(said, timeout_s):
            raise TimeoutError(f"{self.vm}: no {text!r} in its output within {timeout_s} s "
                               f"(exit code {self.popen.poll()}):\n{seen['out'][-2000:]}")
        return seen["out"]

    def wait(self, timeout_s: float) -> int:
        """Its exit code.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout_s`` s.
        """
        return self.popen.wait(timeout_s)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_S`` (this process only, by its PID)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


class LabRun:
    """One lab of a test (see the module doc).

    Args:
        source: a Mininet ``Topo``, or a scenario (a YAML file or a built-in name).
        workdir: the test's directory; the lab's files go to ``workdir/<lab name>``.
        name: lab name (default: ``nslab_pytest.names.next_lab_name()``, unique).
        pcap: capture with tcpdump: True for every VM, or a list of VMs and links ``a-b``;
            the pcaps go to ``<lab dir>/pcap``.
        pcap_filter: a tcpdump capture filter (pcap-filter(7)).
        agents: Topo labs only: start the project's agents (``python -m agents``) in every
            VM, True or the fields of ``session.daemons.AgentsSpec``; a scenario's own
            ``agents:`` section decides for a scenario.
        options: ``Lab`` arguments for a Topo (seed, clocks, cpu_cores, host_cpu, fabric);
            ``Session`` arguments for a scenario (run_jobs, progress).

    Raises:
        TypeError: an option the lab or the session does not take.
        ScenarioError: an invalid scenario.
    """

    def __init__(self, source: Topo | str | os.PathLike, workdir: str, name: str | None = None,
                 pcap: bool | list[str] | None = None, pcap_filter: str | None = None,
                 agents: bool | Mapping | None = None, **options):
        self.name = name or next_lab_name()
        self.dir = os.path.join(workdir, self.name)
        os.makedirs(self.dir, exist_ok=True)
        capture = {"directory": os.path.join(self.dir, "pcap"), "bpf": pcap_filter,
                   "targets": None if pcap is True else list(pcap)} if pcap else None
        self.session: Session | None = None
        self.capture: Capture | None = None
        self._mesh: AgentMesh | None = None
        self.procs: list[Proc] = []
        self.placements: dict[str, str] = {}
        if isinstance(source, Topo):
            self.lab = Lab(source, name=self.name, **options)
            self.capture = Capture(self.lab, **capture) if capture else None
            spec = dict(agents) if isinstance(agents, Mapping) else {}
            self.agents = AgentsSpec.model_validate(
                {**spec, "enabled": agents is True or isinstance(agents, Mapping)})
        else:
            if agents is not None:
                raise TypeError("agents: a scenario's own 'agents:' section says whether its "
                                "agents run")
            sc, topo = load(source)
            self.session = Session(sc, topo, str(resolve(source)), self.name, capture=capture,
                                   **options)
            self.lab = self.session.lab

    @property
    def mesh(self) -> AgentMesh | None:
        """The agents running in the lab, or None."""
        return self.session.mesh if self.session else self._mesh

    def start(self) -> Lab:
        """Bring the lab up (a scenario: its Session starts, timeline, load and agents with
        it), then the capture and the agents; the running lab.

        Raises:
            LabError (NotRootError, CapabilityError, ...): it could not; all is torn down.
        """
        if self.session is not None:  # both tear down what they built before raising
            self.session.start()
        else:
            self.lab.start()
        _RUNS[self.name] = self
        if self.session is None:
            try:
                if self.capture is not None:
                    self.capture.start()
                if self.agents.enabled:
                    self._mesh = AgentMesh(self.lab, self.agents)
                    self._mesh.start()
            except BaseException:
                self.stop()
                raise
        self.placements = dict(self.lab.phys)
        return self.lab

    def stop(self, keep: str | None = None) -> list[str]:
        """Stop the test's processes, the agents, the capture and the lab; with ``keep``,
        first write ``truth.json`` and copy the agents' logs (``logs/``) into the lab's
        directory (a scenario's lab also ``results.json`` and ``report.html``, once its
        Session stopped), then copy that directory to ``keep``. What survived teardown (normally [],
        ``Lab.leftovers``)."""
        for proc in self.procs:
            proc.stop()
        if keep:
            self._save()
        try:
            if self.session is not None:
                self.session.stop()
                if keep:
                    self._save_results()
            else:
                try:
                    if self._mesh is not None:
                        self._mesh.stop()
                finally:
                    if self.capture is not None:
                        self.capture.stop()
                    self.lab.stop()
        finally:
            _RUNS.pop(self.name, None)
            if keep:
                shutil.copytree(self.dir, keep, dirs_exist_ok=True)
        return list(self.lab.leftovers)

    def _save_results(self) -> None:
        """A scenario's results document and its HTML report (``nslab report``) into the
        lab's directory: ``results.json``, ``report.html``; what went wrong making them in
        ``results-error.txt`` instead (the test's own failure is what the run reports)."""
        from report import page  # plotly, only for a failing test
        try:
            doc = self.session.results()
            write(doc, os.path.join(self.dir, "results.json"))
            page.write(doc, os.path.join(self.dir, "report.html"))
        except (ValueError, OSError) as e:  # ValidationError too: kept, not raised
            with open(os.path.join(self.dir, "results-error.txt"), "w") as f:
                f.write(f"{type(e).__name__}: {e}\n")

    def _save(self) -> None:
        if self.lab.clocks is not None:
            with open(os.path.join(self.dir, "truth.json"), "w") as f:
                f.write(truth_section(self.lab, self.placements).model_dump_json(indent=1))
        logs = os.path.join(state_dir(self.name), "logs")
        if os.path.isdir(logs):
            shutil.copytree(logs, os.path.join(self.dir, "logs"), dirs_exist_ok=True)


def run_of(lab: Lab) -> LabRun:
    """The ``LabRun`` of a lab ``nslab_lab`` started.

    Raises:
        LookupError: ``lab`` was not started by ``nslab_lab`` (or is torn down).
    """
    run = _RUNS.get(lab.name)
    if run is None or run.lab is not lab:
        raise LookupError(f"lab {lab.name} was not started by the nslab_lab fixture")
    return run


def spawn(lab: Lab, vms: list[str], argv: list[str] | Callable[[object], list[str]],
          name: str | None = None, env: Mapping[str, str] | None = None,
          cwd: str | None = None) -> dict[str, Proc]:
    """Start a command in each of ``vms`` as the VM's own process: in its namespace and its
    physical host's cgroup, on its clock (``NSLAB_CLOCK``, vmclock), without the machine's
    capabilities. It is stopped (SIGTERM, then SIGKILL) before the lab is torn down.

    Args:
        lab: a lab from ``nslab_lab``.
        vms: VM names.
        argv: the command, or a function of the VM node (``.name``, ``.IP()``) giving it. A
            program that imports this project's code must be ``sys.executable`` (the venv's).
        name: label of the log files ``<name>-<vm>.log`` (default ``proc<n>``).
        env: variables added to the test's environment.
        cwd: working directory (default: the test's).

    Returns:
        ``{vm: Proc}``.

    Raises:
        LabError: a name that is not a VM of the lab; LookupError: see ``run_of``.
    """
    run = run_of(lab)
    names = {v.name for v in lab.vms}
    unknown = [v for v in vms if v not in names]
    if unknown:
        raise LabError(f"no VM {', '.join(unknown)} in lab {lab.name} (VMs: "
                       f"{', '.join(sorted(names))})")
    label = name or f"proc{len(run.procs) + 1}"
    out = {}
    for vm in vms:
        node = lab[vm]
        cmd = argv(node) if callable(argv) else list(argv)
        log = os.path.join(run.dir, f"{label}-{vm}.log")
        with open(log, "w") as f:
            popen = node.popen(cmd, stdin=subprocess.DEVNULL, stdout=f,
                               stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                               cwd=cwd)
        out[vm] = Proc(vm, popen, log)
        run.procs.append(out[vm])
    return out


def inject(lab: Lab, fault: Fault | Mapping) -> Event:
    """Apply a fault now and stamp it in the truth timeline (source ``test``).

    Args:
        fault: a ``contracts.events`` model (``LinkDown(link=("leaf1", "spine1"))``) or the same as
            a scenario's ``faults:`` entry (``{"kind": "loss", "link": [...], "percent": 5}``).

    Raises:
        pydantic.ValidationError: a dict that is not a fault; LabError: the lab refused it.
    """
    if isinstance(fault, Mapping):
        fault = _FAULT.validate_python(fault)
    run = run_of(lab)
    if run.session is not None:
        return run.session.inject(fault, "test")
    return lab.inject(fault, "test")


def truth(lab: Lab) -> TruthSection:
    """The ground truth so far: ``placements`` (at start) and ``placements_end`` (now), VM ->
    physical host; ``clocks`` (per-host oscillators: base_ppm and wander; per-VM segments:
    start_ns, offset_ns, host); ``faults``, the timeline of events (t_s, true_ns, kind,
    target, params, source). The same as the results' ``truth`` section."""
    return truth_section(lab, run_of(lab).placements)


def agents_state(lab: Lab) -> CoordinatorState | None:
    """The coordinator's ``GET /api/v1/state`` now (``agents/API.md``), or None while it does
    not answer.

    Raises:
        LabError: no agents run in this lab (``nslab_lab(topo, agents=True)`` or a scenario
            with ``agents: {enabled: true}`` starts them).
    """
    mesh = run_of(lab).mesh
    if mesh is None:
        raise LabError(f"no agents run in lab {lab.name}: nslab_lab(topo, agents=True) or a "
                       "scenario with agents: {enabled: true} starts them")
    return mesh.state()


def wait_agents(lab: Lab, until: Callable[[CoordinatorState], bool], timeout_s: float = 30.0,
                interval_s: float = 0.5) -> CoordinatorState:
    """Poll ``agents_state`` until ``until(state)`` holds; that state.

    Raises:
        TimeoutError: not within ``timeout_s`` s (the windows seen are named);
        LabError: see ``agents_state``.
    """
    last = [None]

    def met() -> bool:
        state = last[0] = agents_state(lab)
        return state is not None and bool(until(state))

    if wait_until(met, timeout_s, interval_s):
        return last[0]
    seen = f"{last[0].windows} windows" if last[0] is not None else "no answer"
    raise TimeoutError(f"agents of lab {lab.name}: condition not met within {timeout_s} s "
                       f"({seen})")
