"""The agent daemon that runs in every VM: a mesh of coded UDP probes with kernel timestamps.

What it does (Huygens, Geng et al., NSDI 2018, with kernel software timestamps):

* Every ``1 / rate`` s on average (uniform jitter +-50%, so agents never lock in phase) a
  round: a *coded pair* to each active peer (two probes back to back on one UDP socket), the
  peers in a random order, sent ``per_send`` pairs at a time spread evenly over the round (a
  whole round at once, 2 x 16 probes, would overflow this VM's own NIC queue where it is
  shallow and slow).
* Start-up burst, as chrony's ``iburst`` (chrony.conf(5)): for its first ``burst_s`` it sends
  at ``burst_rate`` instead, so that each pair's round-trip floor (``agents.anchor``) is
  learnt from probes sent before a queue that stands up soon after (a job's flows) and then
  never drains. It costs ``(burst_rate - rate) x burst_s`` pairs per active peer, once.
* Timestamps come from the kernel (``SO_TIMESTAMPING``, see Linux
  ``Documentation/networking/timestamping.rst``): software receive stamps arrive with each
  datagram (``SCM_TIMESTAMPING`` control message), software transmit stamps on the socket's
  error queue (``MSG_ERRQUEUE``; the looped-back packet identifies the probe by its sequence).
  Both are CLOCK_REALTIME and are converted into the VM clock with ``agents.clock.Clock``.
* Two-step scheme: a probe's precise TX stamp is known only after it left, so each pair sent
  to a peer carries, as a follow-up, the TX stamps of the *previous* pair sent to that peer.
  The receiver keeps the RX stamps of recent pairs per sender and, when the follow-up
  arrives, emits one record ``(src, pair_id, idx, tx_ns, rx_ns)`` per probe: tx on the
  sender's VM clock, rx on this VM's clock. If the kernel gave no TX stamp, the follow-up
  carries user-space stamps (flag FU_USER, counted as ``tx_user_stamps``); a missing RX stamp
  is replaced by the user-space clock (``rx_user_stamps``).
* Peers: all of them when there are at most ``max_peers``; otherwise a random subset of
  ``max_peers``, re-drawn every ``redraw_s``. An agent also probes back every peer that probed
  it during the last two windows, so each probed pair has both directions (the fit needs
  both).
* Reports go to the coordinator over TCP as JSON lines (``API.md``, "Agent reports"), every
  ``report_s`` on average (each period drawn in [0.5, 1.5] x it) on a connection paced at
  ``report_mbit`` (``SO_MAX_PACING_RATE``, socket(7)): every agent's report arrives at the
  coordinator's VM, and agents started together would otherwise send theirs together, a
  window each, an incast on its link. Their records are packed
  (``contracts.messages.PackedRecords``, grouped by the compiled side: no Python per record).
  The connection is re-established with exponential
  backoff (0.2 s .. 5 s, jittered). Records wait in a bounded buffer: when full, the oldest
  are dropped and counted (``records_dropped``).
* Received datagrams are validated as ``agents.probe.ProbeFilter`` does; rejects are counted
  by reason and reported, never fatal.
* Everything done per datagram (encoding, sending, TX stamps, validation, pairing) and the
  loop of sends and sleeps run in compiled code, ``agents.probeio`` (built by ``make
  setup``), called once per report period; this module keeps the peers, the clock and the
  reports.
"""
from __future__ import annotations

import logging
import os
import random
import select
import socket
import struct
import threading
import time
import zlib
from collections import Counter, deque
from dataclasses import dataclass

from agents.clock import Clock, ClockSpec
from agents.probe import length, node_id, peer_ids
from agents.probeio import ProbeIO, Record
from contracts.messages import REPORT_SCHEMA, AgentStats, Hello, PackedRecords, Report

__all__ = ["Agent", "AgentConfig", "ClockView", "RecordBuffer", "Reporter"]

log = logging.getLogger("agents.agent")

# Linux socket API (include/uapi/asm-generic/socket.h, linux/net_tstamp.h, linux/errqueue.h)
SO_TIMESTAMPING = 37              # SO_TIMESTAMPING_OLD: struct timespec[3] (native longs)
SO_MAX_PACING_RATE = 47           # bytes/s (asm-generic/socket.h; socket(7))
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
TS_FLAGS = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE
MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)
_TIMESPEC = struct.Struct("@ll")


def kernel_stamp(ancdata) -> int | None:
    """CLOCK_REALTIME ns of the software stamp (ts[0]) in an SCM_TIMESTAMPING message."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(data, 0)
            if sec or nsec:
                return sec * 1_000_000_000 + nsec
    return None


class ClockView:
    """The VM clock for the agent's hot path: ``agents.clock.Clock``'s formula and file, but
    the file is checked by ``refresh()`` (by ``convert`` at most every ``max_age_s``) instead
    of on every conversion: a ``stat`` per timestamp cost more than the rest of the agent.
    Converting a stamp later is exact as long as segments are only appended
    (``ClockSpec.append``); only stamps taken after a clock change and converted before the
    next refresh (within ``max_age_s``) use the previous segment. In a lab VM (``vmclock``
    preloaded) the system clock and the kernel's stamps already are the VM clock: ``Clock()``
    then has no path and this is the identity.
    """

    def __init__(self, clock: Clock, max_age_s: float = 0.02):
        self.path = clock.path
        self.max_age_s = max_age_s
        self._spec: ClockSpec | None = None
        self._key: tuple[int, int] | None = None
        self._checked = 0.0
        self.errors = 0
        self.refresh()

    def refresh(self) -> None:
        """Re-read the clock file if it changed (a failure keeps the last spec, counted)."""
        if self.path is None:
            return
        self._checked = time.monotonic()
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_mtime_ns)
            if key != self._key:
                self._spec = ClockSpec.read(self.path)
                self._key = key
        except (OSError, ValueError, KeyError):
            if self._spec is None:
                raise
            self.errors += 1

    def to_vm_ns(self, system_ns: int) -> int:
        """CLOCK_REALTIME ns -> VM clock ns."""
        spec = self._spec
        return system_ns if spec is None else spec.to_vm_ns(system_ns)

    def convert(self, system_ns: int) -> int:
        """``to_vm_ns`` after a ``refresh`` when the last one is older than ``max_age_s``
        (the compiled loop's conversion: it runs a report period between Python's passes)."""
        if time.monotonic() - self._checked > self.max_age_s:
            self.refresh()
        return self.to_vm_ns(system_ns)

    def now_ns(self) -> int:
        """Current VM time, ns."""
        return self.to_vm_ns(time.time_ns())


@dataclass
class AgentConfig:
    """An agent's settings (``python -m agents agent --help`` explains each).

    Attributes:
        name: this VM's name.
        bind: IPv4 address to bind the probe socket to.
        peers: ``{name: ip}`` of the other VMs (all use the same ``port``).
        coordinator: ``(host, port)`` of the coordinator's report listener.
        port: UDP probe port.
        rate: coded pairs per second per active peer.
        burst_rate: the same during the start-up burst.
        burst_s: the start-up burst's length, s (0: none).
        per_send: the most pairs sent together (0: a whole round at once).
        key: shared HMAC key, or None.
        window_s: the estimation window, s (peers that probed us within two windows are
            probed back).
        max_peers: size of the random peer subset.
        size: probe datagram size in bytes (0: minimal, 56 or 72 with a key).
        redraw_s: re-draw period of the peer subset, s.
        report_s: report period, s (each drawn in [0.5, 1.5] x it, so that agents started
            together do not report together).
        report_mbit: the report connection's pacing rate, Mbit/s (``SO_MAX_PACING_RATE``:
            TCP spreads a report's segments at it, where it would send a window at once;
            0: unpaced).
        max_records: bound of the record buffer while the coordinator is away.
        seed: seed of the peer choice and send jitter (None: from the name and the time).
    """

    name: str
    bind: str
    peers: dict[str, str]
    coordinator: tuple[str, int]
    port: int = 7701
    rate: float = 20.0
    burst_rate: float = 100.0
    burst_s: float = 1.0
    per_send: int = 4
    key: bytes | None = None
    window_s: float = 2.0
    max_peers: int = 16
    size: int = 0
    redraw_s: float = 60.0
    report_s: float = 0.5
    report_mbit: float = 2.0
    max_records: int = 50_000
    seed: int | None = None


class Agent:
    """The probe mesh of one VM. ``run(stop)`` blocks until ``stop`` is set.

    Raises (from the constructor):
        OSError: the socket cannot be bound or timestamping is not supported.
        ValueError: two VM names hash to the same probe id, or bad settings.
        agents.probeio.ProbeIOError: the compiled datagram path cannot be built.
    """

    def __init__(self, cfg: AgentConfig, clock: Clock | None = None):
        if not (cfg.rate > 0 and cfg.burst_rate > 0):
            raise ValueError(f"rates must be > 0, got {cfg.rate} and {cfg.burst_rate}")
        if not cfg.burst_s >= 0:
            raise ValueError(f"burst_s must be >= 0, got {cfg.burst_s}")
        if cfg.max_peers < 1:
            raise ValueError(f"max_peers must be >= 1, got {cfg.max_peers}")
        if cfg.per_send < 0:
            raise ValueError(f"per_send must be >= 0, got {cfg.per_send}")
        self.cfg = cfg
        self.clock = ClockView(clock or Clock())
        self.names = sorted(cfg.peers)
        ids = peer_ids(cfg.name, {p: cfg.peers[p] for p in self.names})
        self.index = {p: k for k, p in enumerate(self.names)}
        self.size = length(cfg.key, cfg.size)
        self.rng = random.Random(cfg.seed if cfg.seed is not None
                                 else node_id(cfg.name) ^ time.time_ns())
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TS_FLAGS)
            # the loop drains the socket at every wake-up: room for rounds (capped by rmem_max)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            self.sock.bind((cfg.bind, cfg.port))
            self.sock.setblocking(False)
            # sequence numbers start at the VM clock in us, so a restarted agent stays ahead
            # of its previous run in its peers' replay windows
            self.started_ns = self.clock.now_ns()
            self.io = ProbeIO(self.sock, node_id(cfg.name),
                              [(i, ip) for i, (_, ip) in ids.items()], cfg.port, self.size,
                              cfg.key, self.started_ns // 1000, self.rng.getrandbits(32),
                              cfg.burst_rate if cfg.burst_s else cfg.rate, cfg.per_send,
                              self.rng.getrandbits(64),
                              self.clock.convert if self.clock.path else None)
        except BaseException:
            self.sock.close()
            raise
        self.last_rx: dict[str, float] = {}
        self.burst_end: float | None = None  # monotonic s; None: not started, or over
        self.chosen: list[str] = []
        self.next_redraw = 0.0
        self.records = RecordBuffer(cfg.max_records)
        self.collected_ns = self.started_ns  # every record emitted before it is in records
        self.counters: Counter[str] = Counter()
        self.reporter = Reporter(self)

    # ---- peers -------------------------------------------------------------------------
    def _redraw(self, now: float) -> None:
        names = sorted(self.cfg.peers)
        if len(names) <= self.cfg.max_peers:
            self.chosen = names
            self.next_redraw = float("inf")
        else:
            self.chosen = sorted(self.rng.sample(names, self.cfg.max_peers))
            self.next_redraw = now + self.cfg.redraw_s
            log.info("peers: %s", ",".join(self.chosen))

    def active_peers(self, now: float) -> set[str]:
        """The chosen subset plus every peer that probed this VM in the last two windows."""
        horizon = now - 2 * self.cfg.window_s
        return set(self.chosen) | {p for p, t in self.last_rx.items() if t >= horizon}

    # ---- main loop ---------------------------------------------------------------------
    def stats(self) -> AgentStats:
        """Counters for the coordinator (a snapshot; see API.md)."""
        c, io = self.counters, self.io.counters
        return AgentStats(
            probes_tx=io.probes_tx, probes_rx=io.probes_rx, rejects=self.io.rejects(),
            send_errors=self.io.send_errors(),
            records_dropped=self.records.dropped, records_unsent=c["records_unsent"],
            tx_user_stamps=io.tx_user_stamps, rx_user_stamps=io.rx_user_stamps,
            tx_stamps_missing=io.tx_stamps_missing, loop_errors=c["loop_errors"],
            peers_active=sorted(self.active_peers(time.monotonic())))

    def _step(self) -> None:
        """One pass: the active peers to the compiled loop, which probes for one report
        period; then its records into the buffer, the peers it heard, and the reporter
        woken."""
        self.clock.refresh()
        now = time.monotonic()
        if now >= self.next_redraw:
            self._redraw(now)
        names, index = self.names, self.index
        self.io.active(sorted(index[p] for p in self.active_peers(now)))
        data, heard = self.io.run(self._span(now))
        t_ns = self.clock.now_ns()
        now = time.monotonic()
        for k in heard:
            self.last_rx[names[k]] = now
        self.records.add(data)
        self.collected_ns = t_ns
        self.reporter.due.set()

    def _span(self, now: float) -> float:
        """The compiled loop's next span, s: a report period (drawn), or what is left of the
        start-up burst (then the steady rate from its end on)."""
        cfg = self.cfg
        period = cfg.report_s * self.rng.uniform(0.5, 1.5)
        if self.burst_end is None:
            return period
        if now < self.burst_end:
            return min(period, self.burst_end - now)
        self.io.rate(cfg.rate)
        self.burst_end = None
        return period

    def run(self, stop: threading.Event) -> None:
        """Probe, receive and report until ``stop`` is set; closes the socket on return.

        The compiled loop (``agents.probeio.ProbeIO.run``) sleeps until the next send and
        then drains the error queue and the receive queue: the kernel stamped every datagram
        on arrival, so reading it later changes no timestamp. It returns once per report
        period (or at a signal); each return wakes the reporter. One wake-up per send of
        ``per_send`` pairs instead of per peer's pair, and Python once per report instead of
        once per 20 ms
        tick, took the agent from 2.1 % to 0.8 % of a core at 7 peers x 20 pairs/s
        (``benchmarks/agent_cost.py``).
        """
        self.reporter.start()
        if self.cfg.burst_s:
            self.burst_end = time.monotonic() + self.cfg.burst_s
        try:
            while not stop.is_set():
                try:
                    self._step()
                except Exception:  # noqa: BLE001 - a bug must not take the VM's agent down
                    log.exception("agent loop failed; continuing")
                    self.counters["loop_errors"] += 1
                    self.reporter.due.set()  # the coordinator still gets the counters
                    # sleep, not stop.wait(): a signal handler that sets ``stop`` while this
                    # thread holds the event's lock inside wait() would deadlock
                    time.sleep(0.1)
        finally:
            self.reporter.close()
            self.reporter.join(timeout=2.0)
            if not self.reporter.is_alive():  # it reads the C side's counters
                self.io.close()
            self.sock.close()

    def hello(self) -> Hello:
        """The first line of every connection to the coordinator."""
        cfg = self.cfg
        return Hello(schema=REPORT_SCHEMA, name=cfg.name, ip=cfg.bind, port=cfg.port,
                     rate=cfg.rate, window_s=cfg.window_s, report_s=cfg.report_s,
                     start_ns=self.started_ns, peers=sorted(cfg.peers), pid=os.getpid())


class RecordBuffer:
    """Finished records (``agents.probeio.Record`` bytes, as the compiled loop returns them)
    waiting for a report: at most ``limit``, the oldest dropped and counted (``dropped``)
    when full. The loop adds, the reporter takes (thread-safe)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.dropped = 0
        self._chunks: deque[bytes] = deque()
        self._n = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def add(self, data: bytes) -> None:
        """Append ``data`` (whole records), dropping the oldest beyond ``limit``."""
        if not data:
            return
        with self._lock:
            self._chunks.append(data)
            self._n += len(data) // Record.size
            while self._n > self.limit:
                over = self._n - self.limit
                head = self._chunks[0]
                if len(head) // Record.size <= over:
                    self._chunks.popleft()
                    gone = len(head) // Record.size
                else:
                    self._chunks[0] = head[over * Record.size:]
                    gone = over
                self._n -= gone
                self.dropped += gone

    def take(self) -> bytes:
        """Every buffered record, oldest first; the buffer is left empty."""
        with self._lock:
            data = b"".join(self._chunks)
            self._chunks.clear()
            self._n = 0
        return data


class Reporter(threading.Thread):
    """Sends an agent's records and counters to the coordinator as JSON lines.

    One ``hello`` per connection, then a ``report`` each time the agent's loop collected
    records (``due``; once per ``report_s``), at most ``batch`` records per line. Reconnects
    with exponential backoff; records of a failed send are lost and counted
    (``records_unsent``): TCP cannot tell what the dead peer received.
    """

    def __init__(self, agent: Agent, batch: int = 5000):
        super().__init__(daemon=True, name="nslab-reporter")
        self.agent = agent
        self.batch = batch
        self.stop = threading.Event()
        self.due = threading.Event()
        self.connected = False
        self.connects = 0

    def _report(self, sock: socket.socket) -> None:
        """Send every buffered record, ``batch`` per line; the last line carries ``t_ns``
        (when the agent's loop last collected records, read before the buffer was emptied: so
        every record emitted before ``t_ns`` is in this report or an earlier one) and the
        counters."""
        a = self.agent
        t_ns = a.collected_ns
        data = a.records.take()
        step = self.batch * Record.size
        lines = []
        for start in range(0, len(data) + 1, step):
            part = data[start:start + step]
            last = start + step > len(data)
            counts, packed = a.io.pack(part)
            kept = [k for k, c in enumerate(counts) if c]
            msg = Report(name=a.cfg.name, t_ns=t_ns if last else None,
                         rx_packed=PackedRecords(senders=[a.names[k] for k in kept],
                                                 counts=[counts[k] for k in kept],
                                                 records=zlib.compress(packed, 1),
                                                 encoding="zlib"),
                         stats=a.stats() if last else None)
            lines.append((msg.model_dump_json().encode() + b"\n", len(part) // Record.size))
        for data, n in lines:
            try:
                sock.sendall(data)
            except OSError:
                a.counters["records_unsent"] += n
                raise

    def _wait(self) -> bool:
        """Until the agent's loop has collected records (True) or ``close`` (False)."""
        self.due.wait()
        self.due.clear()
        return not self.stop.is_set()

    def close(self) -> None:
        """Stop after a last report."""
        self.stop.set()
        self.due.set()

    def run(self) -> None:
        host, port = self.agent.cfg.coordinator
        backoff = 0.2
        while not self.stop.is_set():
            try:
                sock = socket.create_connection((host, port), timeout=2.0)
            except OSError as e:
                log.debug("coordinator %s:%d unreachable: %s", host, port, e)
                self.stop.wait(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.2
            self.connects += 1
            self.connected = True
            log.info("connected to coordinator %s:%d", host, port)
            try:
                sock.settimeout(2.0)
                if self.agent.cfg.report_mbit:
                    sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE,
                                    int(self.agent.cfg.report_mbit * 1e6 / 8))
                sock.sendall(self.agent.hello().model_dump_json().encode() + b"\n")
                while self._wait():
                    # the coordinator never writes: readable means closed (or reset)
                    if select.select([sock], [], [], 0)[0] and sock.recv(4096) == b"":
                        raise ConnectionResetError("coordinator closed the connection")
                    self._report(sock)
                try:  # last report on a clean stop
                    self._report(sock)
                except OSError:
                    pass
            except OSError as e:
                log.info("coordinator connection lost: %s", e)
            except Exception:  # noqa: BLE001 - the reporter must outlive any bug
                log.exception("reporter failed; reconnecting")
                self.stop.wait(1.0)
            finally:
                self.connected = False
                sock.close()
