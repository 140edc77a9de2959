"""The pacer on the kernel datapath (``python -m agents pacer``, datapath ``bpf``, the default):
the daemon sets policy and the clocks, the kernel senses and holds (``agents/native/
pacer.bpf.c``, loaded by ``agents.bpf``).

What the daemon does every ``sense_s``:

* the clock anchor: the kernel's CLOCK_MONOTONIC (what ``bpf_ktime_get_ns`` reads; a raw
  system call, which a preloaded VM clock does not change) read between two readings of the
  VM clock, mapped to the synchronized (reference) clock ``ref = vm - theta_self`` with this
  VM's offset and drift from the coordinator (``agents.pacer.Sync``), and the rate between
  the last two anchors (``anchor``): the kernel stamps and measures on ``ref``;
* the policy: On-Ramp's ``T`` (above the sync error: ``Sync`` trusts an offset only within
  T / 4) and whether it counts from each destination's base OWD (``from_base``), the longest
  hold, the longest hold in one piece, the pause quantum, whether to hold at all (``pace``),
  per peer whether both clocks are good enough to act on its echoes, and the receive-window
  clamp's inputs (``window``: the line rate, the queue it lets the senders fill
  (``window_queue`` packets of the interface's MTU), the floor of one full segment, the
  activity epoch of 4 x the longest hold);

and every ``report_s``: its TCP connections (sock_diag, for the report only) and the report,
with the kernel's per-destination counters and histograms (``agents.bpf``).

An echo rides on the next segment toward the sender, so how soon it leaves is how soon this
VM's TCP acknowledges: with delayed ACKs a flow sharing a slow bottleneck with others is
acknowledged every second segment, tens of ms apart. In ``pace`` mode the daemon therefore sets
``quickack`` on its interface's routes (ip-route(8), ``RTAX_QUICKACK``: every segment
acknowledged at once) while it runs, and restores them at exit; ``sense`` mode changes no
route (it only stamps and measures).

ACK pacing (``ack_pace``, a fraction of the line; 0: off): the interface's root qdisc becomes
an HTB (tc-htb(8)) with a class for everything (``1:1``, unlimited) and one for this VM's pure
ACKs (``1:2``, rate and ceil ``ack_pace`` x the line, a one-segment burst, every packet counted
as a full segment: ``mpu``), which the datapath steers them into (``skb->priority``): as a
receiver, its ACKs then release its senders' segments no faster than that, together, however
many senders there are (pacer.bpf.c). Removed at exit.

How the kernel holds is chosen by capability (``hold``): ``edt`` where this namespace has
sch_fq (it becomes the interface's root qdisc: a held segment's ``skb->tstamp`` is the hold's
end), else ``refuse`` (``pacer.bpf.c`` says how TCP keeps a refused segment); ``none`` holds
nothing (the window clamp alone).

Sources: Liu et al., "Breaking the Transience-Equilibrium Nexus: A New Approach to Datacenter
Packet Transport", NSDI 2021 (On-Ramp: the hold); Wu et al., "ICTCP: Incast Congestion
Control for TCP in Data Center Networks", CoNEXT 2010 (the receive-window clamp).
"""
from __future__ import annotations

import ctypes
import fcntl
import logging
import platform
import socket
import struct
import subprocess
import time

from agents.bpf import BpfError, Cfg, Datapath, Dest
from agents.clock import Clock
from agents.pacer import PacerBase, PacerConfig
from contracts.messages import ClockEstimate, PacerDest

__all__ = ["BpfPacer", "anchor", "bucket_bounds_ns", "interface_mtu", "kernel_monotonic_ns",
           "pace_acks", "quantile_ns"]

log = logging.getLogger("agents.bpfpacer")

_SYS_CLOCK_GETTIME = {"x86_64": 228, "aarch64": 113}
_CLOCK_MONOTONIC = 1
_SIOCGIFMTU = 0x8921
_ACK_CLASS = 0x10002
"""The HTB class ``1:2`` that paces pure ACKs (``ack_pace``), as ``skb->priority``."""
_MAX_PPB = 1_000_000
"""The largest rate difference between the kernel clock and the reference that an anchor
takes, ppb (1000 ppm: more is a clock step between anchors, not a rate)."""
_libc = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def kernel_monotonic_ns() -> int:
    """The kernel's CLOCK_MONOTONIC, ns, by the raw system call (clock_gettime(2)).

    Raises:
        OSError: the call failed or this architecture's call number is not known.
    """
    nr = _SYS_CLOCK_GETTIME.get(platform.machine())
    if nr is None:
        raise OSError(f"clock_gettime's system call number on {platform.machine()} is unknown")
    ts = _Timespec()
    if _libc.syscall(nr, _CLOCK_MONOTONIC, ctypes.byref(ts)) != 0:
        raise OSError(ctypes.get_errno(), "clock_gettime(CLOCK_MONOTONIC)")
    return ts.tv_sec * 1_000_000_000 + ts.tv_nsec


def interface_mtu(ifname: str) -> int:
    """The MTU of ``ifname`` in this network namespace, bytes (netdevice(7), SIOCGIFMTU).

    Raises:
        OSError: no such interface.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16si12x", ifname.encode()[:15], 0)
        return struct.unpack("16si12x", fcntl.ioctl(s.fileno(), _SIOCGIFMTU, req))[1]


def _tc_batch(lines: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["tc", "-batch", "-"], input="\n".join(lines) + "\n",
                          capture_output=True, text=True)


def pace_acks(ifname: str, rate_bit_s: float, frame: int) -> int:
    """Make ``ifname``'s root qdisc (in place of the one there) the HTB of ACK pacing (module
    doc): class ``1:1`` for
    everything, ``1:2`` at ``rate_bit_s`` (at least 8 kbit/s) with a one-frame burst and every
    packet counted as ``frame`` bytes (tc-htb(8) ``mpu``: a full segment's Ethernet frame).
    Returns ``1:2``'s handle, for the datapath's ``ack_class`` (``skb->priority``); the
    caller removes the root qdisc when done.

    Raises:
        BpfError: tc failed (its message); nothing is left behind.
    """
    rate = max(int(rate_bit_s), 8000)
    _tc_batch([f"qdisc del dev {ifname} root"])  # whatever was there (an HTB is not replaced)
    r = _tc_batch([f"qdisc add dev {ifname} root handle 1: htb default 1",
                   f"class add dev {ifname} parent 1: classid 1:1 htb rate 100gbit",
                   f"class add dev {ifname} parent 1: classid 1:2 htb rate {rate}bit ceil "
                   f"{rate}bit burst {frame}b cburst {frame}b mpu {frame}",
                   f"qdisc add dev {ifname} parent 1:2 pfifo limit 10000"])
    if r.returncode != 0:
        _tc_batch([f"qdisc del dev {ifname} root"])
        raise BpfError(f"ack pacing: tc on {ifname} failed: {r.stderr.strip()}")
    return _ACK_CLASS


def anchor(k_ns: int, ref_ns: int, prev: tuple[int, int] | None) -> tuple[int, int, int]:
    """The kernel-to-reference map for ``pacer.bpf.c``: ``(k0, ref0, ppb)`` so that
    ``ref = ref0 + (k - k0) x (1 + ppb / 1e9)``; ``ppb`` from the previous anchor ``prev``
    (``(k, ref)``), 0 without one, when the kernel clock did not advance, or when the rate
    exceeds 1000 ppm (a step of the VM clock or of its estimate, not a rate)."""
    if prev is None or k_ns <= prev[0]:
        return k_ns, ref_ns, 0
    dk = k_ns - prev[0]
    ppb = round(((ref_ns - prev[1]) - dk) * 1e9 / dk)
    return k_ns, ref_ns, ppb if abs(ppb) <= _MAX_PPB else 0


def bucket_bounds_ns(b: int) -> tuple[int, int]:
    """Bucket ``b``'s range of ``pacer.bpf.c``'s histograms, ns ``[low, high)``: 1.024 us
    wide below 8.192 us, then 8 buckets per power of two."""
    if b < 8:
        return b << 10, (b + 1) << 10
    msb, mant = b // 8 + 2, b % 8
    return (8 + mant) << (msb - 3) << 10, (9 + mant) << (msb - 3) << 10


def quantile_ns(counts: list[int], q: float) -> float | None:
    """The ``q``-quantile (0..1) of a histogram (``bucket_bounds_ns``), ns: the middle of the
    bucket holding it; None when empty.

    Raises:
        ValueError: ``q`` outside [0, 1].
    """
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1], got {q}")
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * (total - 1), 0
    for b, n in enumerate(counts):
        seen += n
        if seen > rank:
            lo, hi = bucket_bounds_ns(b)
            return (lo + hi) / 2
    return None  # pragma: no cover (seen reaches total > rank)


def _us(counts: list[int], q: float) -> float | None:
    x = quantile_ns(counts, q)
    return None if x is None else x / 1e3


class BpfPacer(PacerBase):
    """One VM's pacer on the kernel datapath (module doc). ``run(stop)`` until ``stop``.

    Raises:
        agents.bpf.BpfError: the datapath cannot be loaded here, or ``hold`` is ``edt`` and
            this kernel has no sch_fq (the message says which).
    """

    datapath = "bpf"

    def __init__(self, cfg: PacerConfig, clock: Clock | None = None):
        super().__init__(cfg, clock)
        if len(self.names) > 256:
            raise BpfError(f"{len(self.names)} peers: the datapath keeps 256")
        self.dp = Datapath(cfg.ifname, cfg.pin_dir)
        self.note = f" (programs on {self.dp.attach})"
        try:
            self.hold = self._choose_hold(cfg.hold) if cfg.mode == "pace" else "none"
            self.mtu = interface_mtu(cfg.ifname)
        except BpfError:
            self.dp.close()
            raise
        try:
            self.ack_class = self._ack_qdisc() if cfg.mode == "pace" and cfg.ack_pace else 0
        except BpfError:
            self.dp.close()
            raise
        self.routes = self._quickack() if cfg.mode == "pace" else []
        self.prev: tuple[int, int] | None = None
        self.next_sense = 0.0
        self.peer_synced: dict[str, bool] = {}
        for i, name in enumerate(self.names):
            self.dp.set_peer(cfg.peers[name], i, False)
            self.peer_synced[name] = False

    def _ip_route(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "-4", *args], capture_output=True, text=True)

    def _quickack(self) -> list[str]:
        """Set ``quickack 1`` on the interface's IPv4 routes (module doc); the routes as they
        were, for ``_close`` (a route that refused the change is left out, logged)."""
        out = []
        for line in self._ip_route("-o", "route", "show", "dev", self.cfg.ifname
                                   ).stdout.splitlines():
            if "quickack" in line:
                continue
            r = self._ip_route("route", "change", *line.split(), "dev", self.cfg.ifname,
                               "quickack", "1")
            if r.returncode == 0:
                out.append(line)
            else:
                log.warning("quickack on route %r: %s", line, r.stderr.strip())
        return out

    def _tc_fq(self, action: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tc", "qdisc", action, "dev", self.cfg.ifname, "root", "fq"],
                              capture_output=True, text=True)

    def _ack_qdisc(self) -> int:
        """``pace_acks`` on this VM's interface at ``ack_pace`` x the line (module doc).

        Raises:
            BpfError: the hold is ``edt`` (sch_fq is then the root qdisc), or tc failed.
        """
        if self.hold == "edt":
            raise BpfError("ack pacing takes the interface's root qdisc, which hold edt gives "
                           "to sch_fq: use hold refuse or none")
        return pace_acks(self.cfg.ifname, self.cfg.line_mbit * 1e6 * self.cfg.ack_pace,
                         self.mtu + 14)

    def _choose_hold(self, want: str) -> str:
        """``edt`` with sch_fq installed as the root qdisc, or ``refuse`` (module doc); ``none``
        as asked."""
        if want in ("refuse", "none"):
            return want
        r = self._tc_fq("replace")
        if r.returncode == 0:
            return "edt"
        if want == "edt":
            raise BpfError(f"hold edt needs sch_fq on {self.cfg.ifname} and 'tc qdisc replace "
                           f"... root fq' fails: {r.stderr.strip()} (CONFIG_NET_SCH_FQ; or use "
                           "hold refuse)")
        return "refuse"

    def _sense(self) -> None:
        """TCP sensing (sock_diag) once per ``report_s``: here it feeds only the reports and
        the status (the kernel senses and holds), and each dump costs about 1 ms of CPU."""
        if time.monotonic() >= self.next_sense:
            self.next_sense = time.monotonic() + self.cfg.report_s
            super()._sense()

    def _step(self) -> None:
        now = self.clock.now_ns()
        whys = {n: self.sync.why_not(n, now) for n in self.names}
        for i, name in enumerate(self.names):
            ok = whys[name] is None
            if ok != self.peer_synced[name]:
                self.dp.set_peer(self.cfg.peers[name], i, ok)
                self.peer_synced[name] = ok
        v0 = self.clock.now_ns()
        k = kernel_monotonic_ns()
        v1 = self.clock.now_ns()
        vm = (v0 + v1) // 2
        ref = int(vm - ClockEstimate(*self.sync.clock_of(self.cfg.name)).offset_at_vm(vm))
        k0, ref0, ppb = anchor(k, ref, self.prev)
        self.prev = (k, ref)
        g = self.cfg.gate
        me_ok = self.sync.why_not(self.cfg.name, now) is None
        pace = self.cfg.mode == "pace"
        self.dp.set_cfg(Cfg(k0=k0, ref0=ref0, ppb=ppb, synced=int(me_ok),
                            pace=int(pace and self.hold != "none"), edt=int(self.hold == "edt"),
                            threshold_ns=int(g.threshold_ns), max_hold_ns=int(g.max_hold_ns),
                            max_cont_ns=int(g.max_continuous_ns),
                            quantum_ns=int(self.cfg.quantum_ns),
                            max_transit_ns=int(g.max_age_ns),
                            ps_per_byte=int(8e12 / (self.cfg.line_mbit * 1e6)),
                            burst_ns=int(2 * 1514 * 8e9 / (self.cfg.line_mbit * 1e6)),
                            spread=int(g.spread), from_base=int(self.cfg.from_base),
                            window=int(pace and self.cfg.window), active_ns=int(g.max_age_ns),
                            full_bytes=self.mtu - 52, min_window=self.mtu - 52,
                            queue_bytes=self.cfg.window_queue * self.mtu,
                            ack_class=self.ack_class))
        self._state(whys)
        self.status += f" (hold {self.hold})" if self.hold != "none" else ""

    def _dests(self) -> dict[str, PacerDest]:
        dests = {}
        for i, name in enumerate(self.names):
            d: Dest = self.dp.dest(i)
            tcp = self.tcp.get(self.cfg.peers[name])
            if tcp is None and not (d.fb_samples or d.rx_samples or d.holds):
                continue
            owd, transit, echo = (self.dp.histogram(i, k) for k in range(3))
            dests[name] = PacerDest(owd_us_p50=_us(owd, 0.5), owd_us_p99=_us(owd, 0.99),
                                    owd_samples=d.fb_samples, above_threshold=d.above,
                                    holds=d.holds, held_ms=d.held_ns / 1e6,
                                    react_us_p99=_us(transit, 0.99),
                                    echo_us_p99=_us(echo, 0.99), echoes=d.echoes,
                                    refused=d.refused + d.paced, clamped=d.clamped,
                                    window_bytes=d.window or None, tcp=tcp)
        return dests

    def _start(self) -> None:
        log.info("kernel datapath on %s, hold %s, maps in %s", self.cfg.ifname, self.hold,
                 self.cfg.pin_dir)

    def _close(self, reported: bool) -> None:
        self.dp.close()
        for line in self.routes:
            self._ip_route("route", "change", *line.split(), "dev", self.cfg.ifname)
        if self.hold == "edt":
            self._tc_fq("del")
        if self.ack_class:
            _tc_batch([f"qdisc del dev {self.cfg.ifname} root"])

