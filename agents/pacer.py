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
  the gate has samples when the next burst starts);
* every ``probe_s``: a timestamp probe (UDP, ``port``) to each active destination's pacer; the
  destination stamps its arrival in the kernel (``SO_TIMESTAMPING``), converts it to its VM
  clock and echoes both stamps back. The sender computes the one-way delay on synchronized
  clocks, ``owd = (rx - theta_dst) - (tx - theta_src)`` with ``theta`` each VM's offset
  against the reference at that time (offset + drift x elapsed, from the coordinator);
* in ``pace`` mode each sample goes through ``agents.gate.Gate`` (On-Ramp's rule) and a hold
  switches the TBF under the destination's HTB class (``agents.hold.Holder``) to ~0 until
  the hold ends;
* every ``report_s``: a ``PacerReport`` to the coordinator (served in its API).

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
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.request import urlopen

import numpy as np
from pyroute2 import DiagSocket

from agents.agent import SO_TIMESTAMPING, ClockView, kernel_stamp
from agents.clock import Clock
from agents.gate import Gate, GateConfig
from agents.hold import Holder
from agents.messages import CoordinatorState, PacerDest, PacerReport
from agents.tcpsense import by_destination, netstat, sense

__all__ = ["Pacer", "PacerConfig", "Sync"]

log = logging.getLogger("agents.pacer")

_MAGIC = b"NSPC"
_PROBE = struct.Struct("!4sBxxxQq")        # magic, kind, seq, tx_ns
_ECHO = struct.Struct("!4sBxxxQqq")        # magic, kind, seq, tx_ns, rx_ns
_KIND_PROBE, _KIND_ECHO = 1, 2
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
    mode: str = "pace"
    port: int = 7703
    line_mbit: float = 10_000.0
    gate: GateConfig = field(default_factory=GateConfig)
    probe_s: float = 0.0005
    sense_s: float = 0.05
    active_s: float = 1.0
    report_s: float = 1.0
    poll_s: float = 1.0
    sync_sigma_ns: float | None = None
    stale_s: float = 10.0

    def __post_init__(self):
        if self.mode not in ("sense", "pace"):
            raise ValueError(f"mode must be sense or pace, got {self.mode!r}")
        for name in ("probe_s", "sense_s", "active_s", "report_s", "poll_s", "stale_s",
                     "line_mbit"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.name in self.peers:
            raise ValueError(f"the peers list this VM itself ({self.name})")


class Sync:
    """Clock offsets of every VM against the reference, from the coordinator's API, and
    whether they are good enough to gate on.

    ``synced`` needs: a state polled within ``stale_s``, at least 2 windows, estimates for
    this VM and the destination, each with ``offset_sigma_ns`` at most ``sigma_ns`` (default
    a quarter of the gate's threshold)."""

    def __init__(self, me: str, sigma_ns: float, stale_s: float):
        self.me, self.sigma_ns, self.stale_ns = me, sigma_ns, stale_s * 1e9
        self.state: CoordinatorState | None = None
        self.polled_ns = 0

    def update(self, state: CoordinatorState, now_ns: int) -> None:
        self.state, self.polled_ns = state, now_ns

    def why_not(self, dst: str, now_ns: int) -> str | None:
        """None when ``dst`` can be gated on, else the reason in words."""
        st = self.state
        if st is None or now_ns - self.polled_ns > self.stale_ns:
            return "no coordinator state (down or not yet polled): gate open"
        if st.windows < 2:
            return "clock sync converging (fewer than 2 windows): gate open"
        for v in (self.me, dst):
            vs = st.vms.get(v)
            if vs is None or vs.offset_ns is None:
                return f"no offset estimate for {v} yet: gate open"
            if vs.offset_sigma_ns is not None and vs.offset_sigma_ns > self.sigma_ns:
                return (f"offset of {v} uncertain ({vs.offset_sigma_ns:.0f} ns > "
                        f"{self.sigma_ns:.0f} ns): gate open")
        return None

    def theta_ns(self, vm: str, at_vm_ns: int) -> float:
        """``vm``'s clock minus the reference's at its own clock reading ``at_vm_ns``."""
        st = self.state
        vs = st.vms[vm]
        elapsed = (at_vm_ns - vs.offset_ns - st.t_ns) if st.t_ns is not None else 0.0
        return vs.offset_ns + (vs.drift_ppm or 0.0) * 1e-6 * elapsed


class Pacer:
    """One VM's pacer (see the module doc). ``run(stop)`` until ``stop`` is set."""

    def __init__(self, cfg: PacerConfig, clock: Clock | None = None):
        self.cfg = cfg
        self.clock = ClockView(clock or Clock())
        self.by_ip = {ip: name for name, ip in cfg.peers.items()}
        self.gate = Gate(cfg.gate)
        self.sync = Sync(cfg.name, cfg.sync_sigma_ns or cfg.gate.threshold_ns / 4, cfg.stale_s)
        self.holder = Holder(cfg.ifname, cfg.line_mbit, cfg.port) if cfg.mode == "pace" else None
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _RX_SOFTWARE)
        self.sock.bind((cfg.bind, cfg.port))
        self.sock.settimeout(0.05)
        self.diag = DiagSocket()
        self.diag.bind()
        self.net0 = netstat()
        self.active: set[str] = set()
        self.busy_at: dict[str, float] = {}
        self.tcp: dict = {}
        self.owd: dict[str, deque] = {}
        self.releases: dict[str, int] = {}
        self.react: dict[str, deque] = {}
        self.sent: dict[str, int] = {}
        self.echoed: dict[str, int] = {}
        self.above: dict[str, int] = {}
        self.status = "starting"
        self.synced = False
        self.seq = 0
        self.lock = threading.Lock()

    # -- probes ------------------------------------------------------------------------
    def _send_probes(self) -> None:
        for dst in sorted(self.active):
            self.seq += 1
            msg = _PROBE.pack(_MAGIC, _KIND_PROBE, self.seq, self.clock.now_ns())
            try:
                self.sock.sendto(msg, (self.cfg.peers[dst], self.cfg.port))
                self.sent[dst] = self.sent.get(dst, 0) + 1
            except OSError as e:
                log.debug("probe to %s: %s", dst, e)

    def _receive(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                data, anc, _flags, addr = self.sock.recvmsg(64, 512)
            except TimeoutError:
                continue
            except OSError as e:
                log.debug("recv: %s", e)
                continue
            stamp = kernel_stamp(anc)
            rx = self.clock.to_vm_ns(stamp) if stamp else self.clock.now_ns()
            if len(data) == _PROBE.size and data[:4] == _MAGIC and data[4] == _KIND_PROBE:
                _, _, seq, tx = _PROBE.unpack(data)
                try:
                    self.sock.sendto(_ECHO.pack(_MAGIC, _KIND_ECHO, seq, tx, rx), addr)
                except OSError as e:
                    log.debug("echo to %s: %s", addr, e)
            elif len(data) == _ECHO.size and data[:4] == _MAGIC and data[4] == _KIND_ECHO:
                _, _, _seq, tx, prx = _ECHO.unpack(data)
                dst = self.by_ip.get(addr[0])
                if dst is not None:
                    self.echoed[dst] = self.echoed.get(dst, 0) + 1
                    self._sample(dst, tx, prx, rx)

    def _sample(self, dst: str, tx: int, prx: int, seen: int) -> None:
        now = self.clock.now_ns()
        why = self.sync.why_not(dst, now)
        self.synced = why is None
        if why is not None:
            self.status = why
            return
        owd = (prx - self.sync.theta_ns(dst, prx)) - (tx - self.sync.theta_ns(self.cfg.name, tx))
        with self.lock:
            self.owd.setdefault(dst, deque(maxlen=_SAMPLES)).append(owd)
        if owd > self.cfg.gate.threshold_ns:
            self.above[dst] = self.above.get(dst, 0) + 1
        if self.holder is None:
            self.status = "sensing (mode sense): gate off"
            return
        self.status = "pacing"
        d = self.gate.decide(dst, owd, tx, now)
        if d.hold_ns > 0:
            self.holder.hold(self.cfg.peers[dst])
            with self.lock:
                self.releases[dst] = d.until_ns
                self.react.setdefault(dst, deque(maxlen=_SAMPLES)).append(
                    self.clock.now_ns() - seen)

    def _release_due(self) -> None:
        now = self.clock.now_ns()
        with self.lock:
            due = [d for d, t in self.releases.items() if t <= now]
            for d in due:
                del self.releases[d]
        for d in due:
            self.holder.release(self.cfg.peers[d])

    # -- sensing, sync, reports --------------------------------------------------------
    def _sense(self) -> None:
        self.tcp = by_destination(sense(self.diag), exclude_ports={self.cfg.coordinator[1],
                                                                    self.cfg.api[1]})
        now = time.monotonic()
        for ip, s in self.tcp.items():
            if ip in self.by_ip and s.unacked > 0:
                self.busy_at[self.by_ip[ip]] = now
        self.active = {d for d, t in self.busy_at.items() if now - t <= self.cfg.active_s}
        if self.holder is not None:
            for dst in self.active:
                self.holder.prepare(self.cfg.peers[dst])

    def _poll(self) -> None:
        host, port = self.cfg.api
        try:
            with urlopen(f"http://{host}:{port}/api/v1/state?history=0", timeout=1.0) as r:
                self.sync.update(CoordinatorState.model_validate_json(r.read()),
                                 self.clock.now_ns())
        except (OSError, ValueError) as e:
            log.debug("coordinator poll: %s", e)

    def report(self) -> PacerReport:
        """The pacer's state now."""
        dests = {}
        with self.lock:
            owd = {d: np.asarray(s) for d, s in self.owd.items()}
            react = {d: float(np.percentile(s, 99)) / 1e3 for d, s in self.react.items() if s}
        for name, ip in sorted(self.cfg.peers.items()):
            x, tcp = owd.get(name), self.tcp.get(ip)
            holds, held_ns = self.gate.stats(name)
            if x is None and tcp is None and not holds:
                continue
            p50, p99 = (np.percentile(x, [50, 99]) / 1e3).tolist() if x is not None and \
                len(x) else (None, None)
            sent = self.sent.get(name, 0)
            dests[name] = PacerDest(owd_us_p50=p50, owd_us_p99=p99,
                                    owd_samples=0 if x is None else len(x), holds=holds,
                                    held_ms=held_ns / 1e6, react_us_p99=react.get(name),
                                    tcp=tcp, probes_sent=sent,
                                    above_threshold=self.above.get(name, 0),
                                    probes_lost=max(0, sent - self.echoed.get(name, 0)))
        return PacerReport(name=self.cfg.name, t_ns=self.clock.now_ns(), mode=self.cfg.mode,
                           threshold_us=self.cfg.gate.threshold_ns / 1e3,
                           synced=self.synced, status=self.status, net=netstat().since(self.net0),
                           dests=dests)

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
        """Coordinator polls and reports, off the probe loop (an HTTP call may block)."""
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

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set; then release every hold and remove the qdisc."""
        threads = [threading.Thread(target=f, args=(stop,), daemon=True, name=f"pacer-{n}")
                   for n, f in (("rx", self._receive), ("control", self._control))]
        for t in threads:
            t.start()
        next_sense = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                self.clock.refresh()
                if now >= next_sense:
                    self._sense()
                    next_sense = now + self.cfg.sense_s
                if self.holder is not None:  # before the probes: a probe wakes a released
                    self._release_due()        # queue (agents.hold)
                self._send_probes()
                # idle (nothing to probe, no hold to end): wait for the next sensing only
                busy = self.active or self.releases
                time.sleep(self.cfg.probe_s if busy else max(0.0, next_sense - now))
        finally:
            stop.set()
            for t in threads:
                t.join(2.0)
            if self.holder is not None:
                self.holder.close()
            self.diag.close()
            self.sock.close()
