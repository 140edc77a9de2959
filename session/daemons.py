"""Run the agents in a lab: one agent per VM, the coordinator in one VM, as on a real cluster
(``python -m agents ...``, unmodified; they see only their VM's clock and network).

The lab reads the coordinator's API (``agents/API.md``) from inside the coordinator VM's
namespace: a socket is opened in that namespace, so nothing routes lab traffic out; a
coordinator on a remote server is read there, over that server's SSH control connection
(``vm_http_get``). Agents on any server reach the coordinator over the lab's fabric, as on one
server: a cut link is a tunnel of that fabric.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agents import pacer_defaults as PD
from agents.coordinator import DRIFT_WINDOWS
from agents.native import PACER, PACER_BPF, PROBEIO
from agents.probe import HEADER_LEN, TAG_LEN
from contracts.enums import PacerDatapath, PacerHold
from contracts.messages import CoordinatorState
from lab import native
from lab.errors import LabError
from lab.names import state_dir
from lab.netlink import entered
from lab.servers import RemoteProcess
from lab.wait import wait_until
from workloads.stats import percentiles

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab

log = logging.getLogger("session.daemons")

AGENT_PORT, COORD_PORT, HTTP_PORT, PACER_PORT = 7701, 7700, 7780, 7703
WIRE_OVERHEAD = 14 + 20 + 8
"""Ethernet, IPv4 and UDP header bytes around a probe's payload (as HTB counts them)."""


class AgentsSpec(BaseModel):
    """How the agent daemons (``python -m agents``) run: one per VM plus a coordinator (the
    scenario's ``agents:`` section)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    rate: float = Field(20.0, gt=0, le=1000, description="coded probe pairs per second per peer")
    window_s: float = Field(2.0, gt=0, description="estimation window, s")
    max_peers: int = Field(16, gt=0, description="peers per agent (Huygens: 10-20)")
    key: str | None = Field(None, pattern=r"^[0-9a-fA-F]{16,128}$",
                            description="shared HMAC key (hex) for authenticated probes")
    coordinator: str | None = Field(None, description="VM running the coordinator (default: "
                                                      "the first VM)")
    drift_windows: int = Field(DRIFT_WINDOWS, ge=1, description="odd number of windows, "
                               "centred on a window, whose offsets give its drift")

    @field_validator("drift_windows")
    @classmethod
    def _odd(cls, v: int) -> int:
        if v % 2 == 0:
            raise ValueError(f"drift_windows must be odd, got {v}")
        return v


class PacerSpec(BaseModel):
    """How the pacers (``python -m agents pacer``) run when a job asks for them (the
    scenario's ``pacer:`` section; a job's ``pacer: sense|pace`` starts them in its VMs)."""

    model_config = ConfigDict(extra="forbid")

    threshold_us: float = Field(
        PD.THRESHOLD_US, gt=0, description="On-Ramp's T, us: above the sync error p99 and the "
                                           "base OWD")
    max_hold_us: float = Field(
        PD.MAX_HOLD_US, gt=0, description="longest single hold, us; it also sets how old an "
                                          "echo may be (4x) and the longest hold in one piece "
                                          "(10x): agents.gate.GateConfig.for_hold")
    probe_us: float = Field(
        PD.PROBE_US, ge=100, description="probe: OWD probe period per active destination, us "
                                         "(while at most 2 probes are unanswered)")
    predict: bool = Field(
        PD.PREDICT, description="probe: hold for the OWD extrapolated to now (False: "
                                "On-Ramp's rule as published; agents/gate.py)")
    fresh: bool = Field(
        PD.FRESH, description="probe: a hold also lasts until a sample sent during it comes "
                              "back below T, and a probe without echo for T + max_hold_us "
                              "holds too (False: On-Ramp's rule as published; agents/gate.py)")
    spread: bool = Field(
        PD.SPREAD, description="probe, with fresh: a release waits a draw in [0, the hold's "
                               "largest OWD - T), per VM, so that senders held together "
                               "release apart (False: at once; agents/gate.py says why that "
                               "is the default); bpf: a hold's first length is stretched by a "
                               "draw in [0, itself)")
    datapath: PacerDatapath = Field(
        PD.DATAPATH, description="bpf: OWD of every TCP data segment and holds in the kernel "
                                 "(tc/cls_bpf on the VM's interface; a kernel without BPF "
                                 "falls back to probe, saying why); probe: UDP probes and HTB "
                                 "switches from a user-space loop")
    hold: PacerHold = Field(
        PD.HOLD, description="bpf: edt (sch_fq) or refuse (TCP keeps a held segment unsent); "
                             "auto: edt where the kernel has sch_fq (nslab doctor: "
                             "pacer_datapath); none: no hold (the window clamp alone)")
    quantum_us: float = Field(
        PD.QUANTUM_US, ge=0, description="bpf: holds rounded up to a multiple of this, us "
                                         "(0: not)")
    threshold_from: Literal["base", "zero"] = Field(
        PD.THRESHOLD_FROM, description="bpf: T counts from each destination's base OWD (its "
                                       "full-size segments' smallest) or from 0 (On-Ramp as "
                                       "published)")
    window_clamp: bool = Field(
        PD.WINDOW_CLAMP, description="bpf: receivers clamp the window they advertise so that "
                                     "their active senders' windows sum to the line's bytes "
                                     "in the base RTT plus window_queue packets (ICTCP's "
                                     "idea, our rule from the measured OWD)")
    window_queue: int = Field(
        PD.WINDOW_QUEUE, ge=1, description="bpf, window clamp: packets of the bottleneck's "
                                           "queue the clamped senders may fill together")
    ack_pace: float = Field(
        PD.ACK_PACE, ge=0, le=1, description="bpf: receivers send their pure ACKs no faster "
                                             "than this fraction of their line, each counted "
                                             "as a full segment (NDP's receiver pacing with "
                                             "TCP's ACKs); 0: off")

    @model_validator(mode="after")
    def _spread_needs_fresh(self) -> PacerSpec:
        if self.spread and not self.fresh:
            raise ValueError("pacer.spread needs pacer.fresh: only a fresh release is put off")
        return self


def ns_http_get(ns: str, host: str, port: int, path: str, timeout: float = 3.0) -> dict:
    """GET ``path`` from ``host:port`` inside network namespace ``ns``; the JSON body.

    Raises:
        OSError: connection failed; ValueError: not JSON.
    """
    with entered(ns):
        sock = socket.create_connection((host, port), timeout=timeout)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.sock = sock
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise OSError(f"{path}: HTTP {resp.status}")
    return json.loads(body)


# GET argv[1] with a timeout of argv[2] s; the body on stdout (run in a VM's namespace)
_GET = ("import sys, urllib.request; "
        "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))"
        ".read().decode())")


def vm_http_get(vm, port: int, path: str, timeout: float = 3.0) -> dict:
    """GET ``path`` from ``vm``'s own address and ``port``, from inside ``vm``'s namespace
    (``ns_http_get``); on a remote server, there, through its ``ServerShell``
    (``python3``'s urllib in the namespace), so the lab reads the API of a coordinator on any
    server without a route from outside the lab.

    Raises:
        OSError: connection failed (or the server refused); ValueError: not JSON.
    """
    if not vm.remote:
        return ns_http_get(vm.netns, vm.IP(), port, path, timeout)
    try:
        body = vm.on.run(["ip", "netns", "exec", vm.netns, "python3", "-c", _GET,
                          f"http://{vm.IP()}:{port}{path}", str(timeout)], timeout=timeout + 5)
    except LabError as e:
        raise OSError(str(e)) from e
    return json.loads(body)


class AgentMesh:
    """The agent daemons of a running lab (``start``, ``state``, ``stop``)."""

    def __init__(self, lab: Lab, cfg: AgentsSpec):
        self.lab, self.cfg = lab, cfg
        self.procs: dict[str, subprocess.Popen] = {}
        self.coordinator = None
        self.started_ns = 0
        self.steady: tuple[int, dict[str, tuple[float, float]]] | None = None
        self.logdir = os.path.join(state_dir(lab.name), "logs")

    def _spawn(self, vm, key: str, args: list[str]) -> None:
        os.makedirs(self.logdir, exist_ok=True)
        log = open(os.path.join(self.logdir, f"{key}.log"), "w")
        self.procs[key] = vm.popen([sys.executable, "-m", "agents", *args], stdout=log,
                                   stderr=subprocess.STDOUT)
        log.close()

    def start(self) -> None:
        """Start the coordinator, then one agent per VM (all peers listed; each agent picks
        ``max_peers`` of them).

        Raises:
            LabError: the agents' compiled datagram path cannot be built."""
        native.ensure(PROBEIO)  # before the VMs' agents start: none of them compiles it
        vms = self.lab.vms
        name = self.cfg.coordinator or vms[0].name
        self.coordinator = self.lab[name]
        cip = self.coordinator.IP()
        self._spawn(self.coordinator, "coordinator",
                    ["coordinator", "--bind", cip, "--port", str(COORD_PORT),
                     "--http-port", str(HTTP_PORT), "--window", str(self.cfg.window_s),
                     "--drift-windows", str(self.cfg.drift_windows)])
        self.wait_api(10.0)
        key = ["--key", self.cfg.key] if self.cfg.key else []
        for vm in vms:
            peers = ",".join(f"{p.name}={p.IP()}" for p in vms if p is not vm)
            self._spawn(vm, f"agent-{vm.name}",
                        ["agent", "--name", vm.name, "--bind", vm.IP(), "--peers", peers,
                         "--coordinator", f"{cip}:{COORD_PORT}", "--port", str(AGENT_PORT),
                         "--rate", str(self.cfg.rate), "--window", str(self.cfg.window_s),
                         "--max-peers", str(self.cfg.max_peers), *key])
        self.started_ns = time.time_ns()

    def start_pacers(self, vms: list, mode: str, spec: PacerSpec) -> dict[str, int]:
        """Start a pacer in each of ``vms`` (``mode`` sense or pace), told its vNIC's rate
        (the tenant knows its VM's bandwidth) and every other VM as a peer.

        Returns:
            VM -> its clock's reading (ns) before its pacer started: a report with a later
            ``t_ns`` is the new pacer's (``session.edge.wait_synced``), not the last one of
            a pacer stopped just before, which may reach the coordinator after this.

        Raises:
            LabError: the pacer's compiled loop cannot be built."""
        native.ensure(PACER)
        pins = []
        if spec.datapath == "bpf":
            try:
                native.ensure(PACER_BPF)
                pins = ["--pin-dir", os.path.join(state_dir(self.lab.name), "bpf")]
            except LabError as e:  # the pacers fall back to the probe datapath and say why
                log.warning("%s", e)
        clocks = self.lab.clocks.specs
        started = {vm.name: clocks[vm.name].to_vm_ns(time.time_ns()) for vm in vms}
        cip = self.coordinator.IP()
        for vm in vms:
            intf = vm.defaultIntf()
            peers = ",".join(f"{p.name}={p.IP()}" for p in self.lab.vms if p is not vm)
            line = intf.shaping.bw or 10_000.0
            self._spawn(vm, f"pacer-{vm.name}",
                        ["pacer", "--name", vm.name, "--bind", vm.IP(), "--ifname", intf.name,
                         "--peers", peers, "--coordinator", f"{cip}:{COORD_PORT}",
                         "--api", f"{cip}:{HTTP_PORT}", "--mode", mode,
                         "--port", str(PACER_PORT), "--line-mbit", str(line),
                         "--threshold-us", str(spec.threshold_us),
                         "--max-hold-us", str(spec.max_hold_us),
                         "--probe-us", str(spec.probe_us), "--datapath", spec.datapath,
                         "--hold", spec.hold, "--quantum-us", str(spec.quantum_us),
                         "--threshold-from", spec.threshold_from,
                         "--window-clamp" if spec.window_clamp else "--no-window-clamp",
                         "--window-queue", str(spec.window_queue),
                         "--ack-pace", str(spec.ack_pace)]
                        + ([pins[0], os.path.join(pins[1], vm.name)] if pins else [])
                        + ["--predict" if spec.predict else "--no-predict",
                           "--fresh" if spec.fresh else "--no-fresh",
                           "--spread" if spec.spread else "--no-spread"])
        return started

    def stop_pacers(self) -> None:
        """Stop every pacer (SIGTERM: each releases its holds, removes its qdisc and sends a
        last report)."""
        self._stop_procs([k for k in self.procs if k.startswith("pacer-")])

    def wait_api(self, timeout_s: float) -> None:
        """Wait until the coordinator answers.

        Raises:
            LabError: it did not within ``timeout_s`` (its log is named).
        """
        def healthy() -> bool:
            try:
                vm_http_get(self.coordinator, HTTP_PORT, "/api/v1/health", timeout=1.0)
                return True
            except (OSError, ValueError):
                if self.procs["coordinator"].poll() is not None:
                    raise LabError("the coordinator exited; see " + log) from None
                return False

        log = os.path.join(self.logdir, "coordinator.log")
        if not wait_until(healthy, timeout_s, 0.2):
            raise LabError(f"the coordinator did not come up within {timeout_s:.0f} s; see {log}")

    def wait_agents(self, timeout_s: float) -> bool:
        """Wait until every VM's agent has reported to the coordinator (it probes from its
        start, its start-up burst first: ``AgentConfig.burst_s``), so that load started next
        finds the agents running, as on VMs whose agent runs from boot. Returns whether they
        all did within ``timeout_s`` (a late one is logged, not fatal)."""
        n = len(self.lab.vms)

        def connected() -> bool:
            try:
                doc = vm_http_get(self.coordinator, HTTP_PORT, "/api/v1/health", timeout=1.0)
            except (OSError, ValueError):
                return False
            return doc.get("agents_connected", 0) >= n

        if wait_until(connected, timeout_s, 0.1):
            return True
        log.warning("not every agent reported within %.0f s; the load starts anyway", timeout_s)
        return False

    def state(self, history: int | None = None) -> CoordinatorState | None:
        """The coordinator's ``/api/v1/state`` with its last ``history`` windows (None: all
        it keeps; 0: none), or None if it does not answer (or answers something that is not
        that document)."""
        query = "" if history is None else f"?history={history}"
        try:
            doc = vm_http_get(self.coordinator, HTTP_PORT, "/api/v1/state" + query)
            return CoordinatorState.model_validate(doc)
        except (OSError, ValueError):
            return None

    def usage(self) -> dict[str, tuple[float, float]]:
        """``(cpu_s, rss_mb)`` of every running daemon, by key (``coordinator``,
        ``agent-<vm>``): CPU time so far (user + system, s) and resident memory now (MiB),
        from psutil (a daemon on a remote server: ``RemoteProcess.usage``, from its
        ``/proc`` there)."""
        out = {}
        for key, p in self.procs.items():
            if isinstance(p, RemoteProcess):  # on its server
                use = p.usage()
                if use is not None:
                    out[key] = use
                continue
            try:
                proc = psutil.Process(p.pid)
                with proc.oneshot():
                    cpu, rss = proc.cpu_times(), proc.memory_info().rss
            except psutil.Error:
                continue
            out[key] = (cpu.user + cpu.system, rss / 2**20)
        return out

    def mark_steady(self) -> None:
        """Note the daemons' CPU time now, once: the end of their start-up (the coordinator
        closed its first window, so every agent was reporting). ``cost`` counts from here."""
        if self.steady is None:
            self.steady = (time.time_ns(), self.usage())

    def cost(self, state: CoordinatorState | None) -> dict:
        """What the agents cost while they ran: the results' ``agents`` section.

        Returns:
            ``run_s``; ``agent_cpu_core`` (``p50``, ``max`` over agents of CPU time / run
            time: 0.03 is 3 % of one core, counted from ``mark_steady`` when it was called,
            else from the start: start-up is Python's and pydantic's imports, not probing);
            ``agent_startup_cpu_s`` (``p50``, ``max``: CPU seconds before ``mark_steady``);
            ``coordinator_cpu_core``; ``probe_bit_s`` (``p50``, ``max`` over agents of probes
            sent x wire bytes x 8 / run time, bit/s, Ethernet/IP/UDP headers counted);
            ``probe_bytes`` (on the wire, one probe); ``agent_rss_mb`` (``p50``, ``max``) and
            ``coordinator_rss_mb``, MiB at the end.
        """
        now = time.time_ns()
        run_s = (now - self.started_ns) / 1e9
        use = self.usage()
        t0, before = self.steady if self.steady is not None else (self.started_ns, {})
        steady_s = (now - t0) / 1e9
        keys = [k for k in use if k.startswith("agent-")]
        agents = sorted((use[k][0] - before.get(k, (0.0, 0.0))[0]) / steady_s for k in keys)
        startup = sorted(before[k][0] for k in keys if k in before)
        rss = sorted(use[k][1] for k in keys)
        size = HEADER_LEN + (TAG_LEN if self.cfg.key else 0) + WIRE_OVERHEAD
        tx = sorted(v.probes_tx for v in state.vms.values()) if state else []
        bits = [n * size * 8 / run_s for n in tx]

        def p50_max(xs: list[float], digits: int) -> dict:
            return percentiles(xs, ("p50", "max"), digits) or {"p50": None, "max": None}

        coord = use.get("coordinator")
        return {"run_s": round(run_s, 2), "agent_cpu_core": p50_max(agents, 4),
                "agent_startup_cpu_s": p50_max(startup, 3),
                "coordinator_cpu_core": round(coord[0] / run_s, 4) if coord else None,
                "probe_bit_s": p50_max(bits, 0), "probe_bytes": size,
                "agent_rss_mb": p50_max(rss, 1),
                "coordinator_rss_mb": round(coord[1], 1) if coord else None}

    def stop(self) -> None:
        """SIGTERM every daemon, then SIGKILL what is left after 2 s."""
        self._stop_procs(list(self.procs))

    def _stop_procs(self, keys: list[str]) -> None:
        procs = [self.procs.pop(k) for k in keys]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 2.0
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
