"""The pacer daemon (``python -m agents pacer``): TCP sensing and On-Ramp's OWD-gated hold at the
edge, in one VM, for traffic it did not write.

What it sees is what a cloud VM sees: its sockets (``agents.tcpsense``), its own interface's
qdisc (``agents.hold``), its clock (``agents.clock``: ``NSLAB_CLOCK`` or the system clock) and
the coordinator's API (clock offsets of every VM against the reference, ``GET
/api/v1/state``). It imports nothing of the lab.

Loop:

* every ``sense_s``: established TCP connections (sock_diag) grouped by destination; the
  destinations that are VMs it knows and had data in flight within ``active_s`` are
  *active* (a collective's bursts come every iteration: probing goes on between them, so
  the gate has samples when the next burst starts); a destination this VM sends a TCP SYN
  to is active at once, for ``active_s`` (the native loop watches its interface's outgoing
  SYNs on a packet socket): sock_diag, polled every 50 ms, sees a new connection's data only
  after its first window is in the queue, where every later sample waits behind it;
* every ``probe_s``: a timestamp probe (UDP, ``port``) to each active destination's pacer; the
  destination stamps its arrival in the kernel (``SO_TIMESTAMPING``), converts it to its VM
  clock and echoes both stamps back. The sender computes the one-way delay on synchronized
  clocks, ``owd = (rx - theta_dst) - (tx - theta_src)`` with ``theta`` each VM's offset
  against the reference at that time (offset + drift x elapsed, from the coordinator);
* in ``pace`` mode each sample goes through On-Ramp's gate (``agents.gate``) and a hold
  switches the TBF under the destination's HTB class (``agents.hold.Holder``) to ~0 until
  the hold ends;
* every ``report_s``: a ``PacerReport`` to the coordinator (served in its API).

Probes, echoes, the OWD, the gate and the switch run in one native thread
(``agents.pacerio``, ``agents/native/pacer.c``: the Python loop reacted in 0.1-0.5 s under
load); this module senses, keeps the clock parameters and the destinations' state in it
current (every ``sense_s``), drains its samples and reports.

The probes share the data's last hop (the destination's downlink, where incast queues
build) but ECMP may hash them onto another spine than a given flow; the gate then sees the
fabric's queues on the probe's path only. Stated, not hidden.

Source: Liu et al., "Breaking the Transience-Equilibrium Nexus: A New Approach to Datacenter
Packet Transport", NSDI 2021 (On-Ramp).
"""
from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.request import urlopen

import numpy as np
from pyroute2 import DiagSocket

from agents import pacer_defaults as D
from agents.agent import SO_TIMESTAMPING, ClockView
from agents.clock import Clock
from agents.gate import GateConfig
from agents.hold import Holder
from agents.pacerio import Engine
from agents.tcpsense import by_destination, netstat, sense
from contracts.messages import ClockEstimate, CoordinatorState, PacerDest, PacerReport

__all__ = ["Pacer", "PacerConfig", "Sync"]

log = logging.getLogger("agents.pacer")

_RX_SOFTWARE = (1 << 3) | (1 << 4)         # SOF_TIMESTAMPING_RX_SOFTWARE | _SOFTWARE
_SAMPLES = 20_000                          # OWD samples kept per destination


@dataclass(frozen=True)
class PacerConfig:
    """Pacer parameters (``python -m agents pacer --help``).

    Raises:
        ValueError: a parameter out of range.
    """

    name: str
    bind: str
    ifname: str
    peers: dict[str, str]
    coordinator: tuple[str, int]
    api: tuple[str, int]
    mode: str = D.MODE
    port: int = D.PORT
    line_mbit: float = D.LINE_MBIT
    gate: GateConfig = field(default_factory=GateConfig)
    probe_s: float = D.PROBE_US / 1e6
    sense_s: float = 0.05
    active_s: float = D.ACTIVE_S
    report_s: float = 1.0
    poll_s: float = 1.0
    sync_sigma_ns: float | None = None
    stale_s: float = 10.0
    datapath: str = D.DATAPATH
    pin_dir: str = D.PIN_DIR
    hold: str = D.HOLD
    quantum_ns: float = D.QUANTUM_US * 1e3
    from_base: bool = D.THRESHOLD_FROM == "base"
    window: bool = D.WINDOW_CLAMP
    window_queue: int = D.WINDOW_QUEUE
    ack_pace: float = D.ACK_PACE

    def __post_init__(self):
        if self.mode not in ("sense", "pace"):
            raise ValueError(f"mode must be sense or pace, got {self.mode!r}")
        if self.datapath not in ("bpf", "probe"):
            raise ValueError(f"datapath must be bpf or probe, got {self.datapath!r}")
        if self.hold not in ("auto", "edt", "refuse", "none"):
            raise ValueError(f"hold must be auto, edt, refuse or none, got {self.hold!r}")
        if self.window_queue < 1:
            raise ValueError(f"window_queue must be >= 1, got {self.window_queue}")
        if not 0 <= self.ack_pace <= 1:
            raise ValueError(f"ack_pace must be in [0, 1], got {self.ack_pace}")
        if self.quantum_ns < 0:
            raise ValueError(f"quantum_ns must be >= 0, got {self.quantum_ns}")
        for name in ("probe_s", "sense_s", "active_s", "report_s", "poll_s", "stale_s",
                     "line_mbit"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.name in self.peers:
            raise ValueError(f"the peers list this VM itself ({self.name})")


class Sync:
    """Clock offsets of every VM against the reference, from the coordinator's API, and
    whether they are good enough to gate on.

    ``synced`` needs: a state polled within ``stale_s``, at least 2 windows, and for this VM
    and the destination an estimate with ``offset_sigma_ns`` at most ``sigma_ns`` (default a
    quarter of the gate's threshold) in a state polled within ``stale_s``: the last good
    estimate is kept (holdover) while a window lacks one or has only one above ``sigma_ns``,
    as under an incast, whose queues delay and drop the agents' probes too (extrapolated with
    its drift: 10 s at 0.1 ppm of drift error is 1 us)."""

    def __init__(self, me: str, sigma_ns: float, stale_s: float):
        self.me, self.sigma_ns, self.stale_ns = me, sigma_ns, stale_s * 1e9
        self.state: CoordinatorState | None = None
        self.polled_ns = 0
        self.good: dict[str, tuple[ClockEstimate, int]] = {}
        """VM -> its last good estimate and when it was polled (ns)."""

    def update(self, state: CoordinatorState, now_ns: int) -> None:
        self.state, self.polled_ns = state, now_ns
        if state.windows < 2:
            return
        for name, vs in state.vms.items():
            if vs.offset_ns is not None and (vs.offset_sigma_ns is None
                                             or vs.offset_sigma_ns <= self.sigma_ns):
                self.good[name] = (state.estimate(name), now_ns)

    def why_not(self, dst: str, now_ns: int) -> str | None:
        """None when ``dst`` can be gated on, else the reason in words."""
        st = self.state
        if st is None or now_ns - self.polled_ns > self.stale_ns:
            return "no coordinator state (down or not yet polled): gate open"
        if st.windows < 2:
            return "clock sync converging (fewer than 2 windows): gate open"
        for v in (self.me, dst):
            good = self.good.get(v)
            if good is not None and now_ns - good[1] <= self.stale_ns:
                continue
            vs = st.vms.get(v)
            if vs is None or vs.offset_ns is None or vs.offset_sigma_ns is None:
                return f"no offset estimate for {v} yet: gate open"
            return (f"offset of {v} uncertain ({vs.offset_sigma_ns:.0f} ns > "
                    f"{self.sigma_ns:.0f} ns): gate open")
        return None

    def clock_of(self, vm: str) -> tuple[float, float, int | None]:
        """``vm``'s clock against the reference from its last good estimate, moved along its
        drift to the last state's time (one reference for every VM: the compiled loop keeps
        one): (offset ns, drift ppm, reference time ns or None), the compiled loop's
        ``ClockEstimate.offset_at_vm``. Zeros when unknown (``why_not`` says so)."""
        good = self.good.get(vm)
        if good is None:
            return 0.0, 0.0, None
        est = good[0].moved_to(self.state.t_ns if self.state is not None else None)
        return est.offset_ns, est.drift_ppm, est.ref_ns


class PacerBase:
    """What both datapaths share: the configuration, the VM clock, the synchronization state
    from the coordinator, TCP sensing (sock_diag) and the report loop. A subclass provides
    ``_start``, ``_step`` (every ``sense_s``), ``_dests`` (the report's per-destination part)
    and ``_close``."""

    datapath = "probe"

    def __init__(self, cfg: PacerConfig, clock: Clock | None = None):
        self.cfg = cfg
        self.clock = ClockView(clock or Clock())
        self.names = sorted(cfg.peers)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.by_ip = {ip: name for name, ip in cfg.peers.items()}
        self.sync = Sync(cfg.name, cfg.sync_sigma_ns or cfg.gate.threshold_ns / 4, cfg.stale_s)
        self.diag = DiagSocket()
        self.diag.bind()
        self.net0 = netstat()
        self.active: set[str] = set()
        self.busy_at: dict[str, float] = {}
        self.tcp: dict = {}
        self.status = "starting"
        self.synced = False
        self.note = ""
        """Appended to the status: why this datapath runs (a fallback's reason)."""
        self.lock = threading.Lock()

    def _state(self, whys: dict[str, str | None]) -> None:
        """``synced`` and ``status`` from each peer's reason not to gate (None: it can be):
        the active destinations', or every peer's while none is."""
        why = next((whys[n] for n in (self.active or self.names) if whys[n] is not None), None)
        self.synced = why is None
        self.status = (why or ("pacing" if self.cfg.mode == "pace"
                               else "sensing (mode sense): gate off")) + self.note

    # -- sensing, sync, reports --------------------------------------------------------
    def _sense(self) -> None:
        self.tcp = by_destination(sense(self.diag), exclude_ports={self.cfg.coordinator[1],
                                                                    self.cfg.api[1]})
        now = time.monotonic()
        for ip, s in self.tcp.items():
            if ip in self.by_ip and s.unacked > 0:
                self.busy_at[self.by_ip[ip]] = now
        self.active = {d for d, t in self.busy_at.items() if now - t <= self.cfg.active_s}

    def _poll(self) -> None:
        host, port = self.cfg.api
        try:
            with urlopen(f"http://{host}:{port}/api/v1/state?fields=vms", timeout=1.0) as r:
                self.sync.update(CoordinatorState.model_validate_json(r.read()),
                                 self.clock.now_ns())
        except (OSError, ValueError) as e:
            log.debug("coordinator poll: %s", e)

    def _dests(self) -> dict[str, PacerDest]:
        raise NotImplementedError

    def report(self) -> PacerReport:
        """The pacer's state now."""
        return PacerReport(name=self.cfg.name, t_ns=self.clock.now_ns(), mode=self.cfg.mode,
                           datapath=self.datapath, threshold_us=self.cfg.gate.threshold_ns / 1e3,
                           synced=self.synced, status=self.status, net=netstat().since(self.net0),
                           dests=self._dests())

    def _send_report(self, conn: list) -> None:
        line = (json.dumps(self.report().model_dump(mode="json")) + "\n").encode()
        try:
            if not conn:
                conn.append(socket.create_connection(self.cfg.coordinator, timeout=1.0))
            conn[0].sendall(line)
        except OSError as e:
            log.debug("report: %s", e)
            if conn:
                conn.pop().close()

    def _control(self, stop: threading.Event) -> None:
        """Coordinator polls and reports, off the sensing loop (an HTTP call may block)."""
        conn: list = []
        next_report = 0.0
        while not stop.is_set():
            self._poll()
            if time.monotonic() >= next_report:
                self._send_report(conn)
                next_report = time.monotonic() + self.cfg.report_s
            stop.wait(min(self.cfg.poll_s, self.cfg.report_s))
        self._send_report(conn)
        for c in conn:
            c.close()

    def _start(self) -> None:
        raise NotImplementedError

    def _step(self) -> None:
        raise NotImplementedError

    def _close(self, reported: bool) -> None:
        raise NotImplementedError

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set; then release every hold and remove what the datapath
        added to the interface."""
        control = threading.Thread(target=self._control, args=(stop,), daemon=True,
                                   name="pacer-control")
        control.start()
        self._start()
        try:
            while not stop.is_set():
                self.clock.refresh()
                self._sense()
                self._step()
                stop.wait(self.cfg.sense_s)
        finally:
            stop.set()
            control.join(5.0)
            self._close(not control.is_alive())  # its last report reads the counters
            self.diag.close()


class Pacer(PacerBase):
    """One VM's pacer (see the module doc). ``run(stop)`` until ``stop`` is set.

    Raises:
        agents.pacerio.PacerIOError: the compiled loop cannot be built.
    """

    def __init__(self, cfg: PacerConfig, clock: Clock | None = None):
        super().__init__(cfg, clock)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _RX_SOFTWARE)
        self.sock.bind((cfg.bind, cfg.port))
        self.sock.setblocking(False)
        self.engine = Engine(self.sock, cfg.port, [cfg.peers[n] for n in self.names],
                             cfg.mode == "pace", cfg.gate, cfg.probe_s,
                             self.clock.to_vm_ns if self.clock.path else None)
        self.holder = Holder(cfg.ifname, cfg.line_mbit, cfg.port) if cfg.mode == "pace" else None
        if self.holder is not None:  # every peer's class ready: a hold never waits for one
            for i, name in enumerate(self.names):
                self.engine.set_switch(i, *self.holder.messages(cfg.peers[name]))
        try:
            self.engine.watch_syn(socket.if_nametoindex(cfg.ifname), cfg.active_s)
        except OSError as e:
            log.warning("no SYN watch on %s (%s): destinations are probed once sock_diag "
                        "shows their data", cfg.ifname, e)
        self.owd: dict[str, deque] = {}
        self.react: dict[str, deque] = {}
        self.wake: dict[str, deque] = {}

    # -- the native loop's state -------------------------------------------------------
    def _update(self) -> None:
        """Tell the native loop which destinations to probe and gate, with their clocks."""
        now = self.clock.now_ns()
        whys = {}
        for i, name in enumerate(self.names):
            active = name in self.active
            whys[name] = why = self.sync.why_not(name, now)
            off, drift, at = self.sync.clock_of(name)
            self.engine.set_dest(i, active, why is None, off, drift if at else 0.0, at or 0)
        off, drift, at = self.sync.clock_of(self.cfg.name)
        self.engine.set_dest(len(self.names), False, True, off, drift if at else 0.0, at or 0)
        self._state(whys)

    def _drain(self) -> None:
        """The native loop's samples into the per-destination OWD and reaction series."""
        recs = self.engine.drain()
        if not len(recs):
            return
        with self.lock:
            for i in np.unique(recs["dst"]):
                mine = recs[recs["dst"] == i]
                name = self.names[i]
                self.owd.setdefault(name, deque(maxlen=_SAMPLES)).extend(mine["owd_ns"])
                self.wake.setdefault(name, deque(maxlen=_SAMPLES)).extend(mine["wake_ns"])
                held = mine["react_ns"][mine["held"] != 0]
                if len(held):
                    self.react.setdefault(name, deque(maxlen=_SAMPLES)).extend(held)

    def _dests(self) -> dict[str, PacerDest]:
        dests = {}
        with self.lock:
            owd = {d: np.asarray(s) for d, s in self.owd.items()}
            react, wake = ({d: float(np.percentile(s, 99)) / 1e3 for d, s in x.items() if s}
                           for x in (self.react, self.wake))
        for i, name in enumerate(self.names):
            x, tcp = owd.get(name), self.tcp.get(self.cfg.peers[name])
            st, held_ns = self.engine.stats(i)
            if x is None and tcp is None and not st.holds:
                continue
            p50, p99 = (np.percentile(x, [50, 99]) / 1e3).tolist() if x is not None and \
                len(x) else (None, None)
            dests[name] = PacerDest(owd_us_p50=p50, owd_us_p99=p99, owd_samples=st.samples,
                                    holds=st.holds, overdue_holds=st.overdue,
                                    held_ms=held_ns / 1e6,
                                    react_us_p99=react.get(name),
                                    wake_us_p99=wake.get(name), tcp=tcp,
                                    probes_sent=st.sent, above_threshold=st.above,
                                    probes_lost=st.sent - st.echoed,
                                    stale_echoes=st.stale)
        return dests

    def _start(self) -> None:
        self.engine.start()

    def _step(self) -> None:
        self._update()
        self._drain()

    def _close(self, reported: bool) -> None:
        if reported:
            self.engine.close()
        if self.holder is not None:
            self.holder.close()
        self.sock.close()
