"""The emulated VM clock: the one formula shared by the lab (hypervisor), the agents and the
preloaded library ``vmclock/`` that gives it to every program of a VM.

For VM v on physical host h, with true time t (the machine's CLOCK_REALTIME)::

    t_v(t) = t + theta_v + integral_{t0}^{t} y_h(s) ds + c_v(t)
    y_h(s) = y_h0 + sum_i A_i cos(2 pi (s - epoch) / P_i + phi_i)

``y_h`` is the fractional frequency error of h's oscillator: a base drift ``y_h0`` (ppm) and a
bounded wander (|wander| <= sum A_i ppm). ``c_v`` is the VM's own discipline: what its
programs asked of its clock through ``adjtimex``/``clock_adjtime`` (a frequency correction,
ppm), ``ADJ_OFFSET`` (the kernel PLL's phase adjustment: the remaining offset decays by
2^-(2 + time constant) per second, Linux kernel/time/ntp.c) and ``adjtime`` (a slew at
500 us/s until done), and ``settimeofday``/``clock_settime``/``ADJ_SETOFFSET`` (steps). The
PLL's decay is continuous here (exp(-rate * s)) where the kernel applies it in one-second
chunks: the two agree at every whole second from the adjustment. Every change (a clock
step, a live migration to another host, a correction from inside the VM) is a new *segment*:
segment k starts at true time ``start_ns`` with offset ``offset_ns = t_v - t`` and follows its
host's oscillator and its correction from there, so ``t_v`` stays continuous unless a step
was asked for. CLOCK_MONOTONIC (and BOOTTIME) of the VM leave the steps out
(``t + offset - steps``); CLOCK_MONOTONIC_RAW also leaves the corrections out.

The lab publishes each VM's segments in one binary file (``nslab.clock/3``, layout below,
mirrored in ``vmclock/vmclock.c``) and passes its path in ``NSLAB_CLOCK``. A writer (the lab,
or the preloaded library acting on a VM's ``adjtimex``) takes ``flock`` on ``<path>.lock``,
reads the file, writes a new one and renames it over the old, then sets ``stale`` in the old
file: readers that mapped it (``vmclock``) re-open the path when they see that flag.

Programs in a VM started by the lab run with the preload, so their system clock *is* the VM
clock: ``Clock()`` then is the system clock, as it is on a real VM without ``NSLAB_CLOCK``.
"""
from __future__ import annotations

import ctypes
import fcntl
import math
import os
import struct
import time
from dataclasses import dataclass, field

from contracts.enums import SEGMENT_KINDS

SCHEMA = "nslab.clock/3"
ENV_VAR = "NSLAB_CLOCK"
_NS = 1_000_000_000
MAGIC = b"NSLABCK3"
MAX_WANDER = 4
# header: magic, stale, nseg, vm, then the VM's adjtimex state (struct timex fields of
# Linux adjtimex(2): tick us, freq scaled ppm (16-bit fraction), status, maxerror us,
# esterror us, constant (the kernel's time constant), then the kernel's time_reftime (s) and
# the true time (ns) maxerror was set at (it grows by 500 us/s from there)
HEADER = struct.Struct("<8sII32sqqi4xqqqqq")
# segment: start_ns, offset_ns, steps_ns, corr_ns, corr_ppm, epoch_ns, base_ppm, nwander, kind,
# wander (amplitude_ppm, period_s, phase_rad) x MAX_WANDER, host, pll_ns, pll_rate, adj_ns
SEGMENT = struct.Struct("<qddddqdII" + "d" * 3 * MAX_WANDER + "32sddd")
STALE_OFFSET = 8
KINDS = SEGMENT_KINDS
STA_UNSYNC = 0x0040
# Linux defaults after boot: tick 10000 us (USER_HZ 100), no correction, unsynchronized,
# maxerror/esterror NTP_PHASE_LIMIT (16 s in us), time constant 2, no reference time, maxerror
# set at time 0 (so at its limit)
DEFAULT_DISCIPLINE = (10000, 0, STA_UNSYNC, 16_000_000, 16_000_000, 2, 0, 0)
ADJTIME_NS_PER_S = 500_000.0
"""adjtime()'s slew rate: the kernel's MAX_TICKADJ, 500 us per second."""


@dataclass(frozen=True)
class Oscillator:
    """A physical host's oscillator.

    Attributes:
        epoch_ns: true time (ns) at which the wander phases are defined.
        base_ppm: constant fractional frequency error, ppm.
        wander: ``(amplitude_ppm, period_s, phase_rad)`` cosine terms of the bounded wander
            (at most ``MAX_WANDER``).
    """

    epoch_ns: int
    base_ppm: float
    wander: tuple[tuple[float, float, float], ...] = ()

    def frequency_ppm(self, true_ns: int) -> float:
        """Fractional frequency error y_h(t) in ppm at true time ``true_ns``."""
        dt = (true_ns - self.epoch_ns) / _NS
        return self.base_ppm + sum(
            a * math.cos(2 * math.pi * dt / p + ph) for a, p, ph in self.wander
        )

    def phase_ns(self, true_ns: int) -> float:
        """Accumulated time error integral_{epoch}^{t} y_h(s) ds, in ns (``vmclock.c``
        computes it with the same operations in the same order)."""
        dt_ns = float(true_ns - self.epoch_ns)
        dt = dt_ns / 1e9
        acc = self.base_ppm * dt_ns
        for a, p, ph in self.wander:
            swing = math.sin(2 * math.pi * dt / p + ph) - math.sin(ph)
            acc += a * p / (2 * math.pi) * swing * 1e9
        return acc * 1e-6


@dataclass(frozen=True)
class Segment:
    """A piece of a VM's clock history: from ``start_ns`` (true time) on, the VM follows
    ``oscillator`` (of physical host ``host``) plus its correction ``corr_ppm``, and
    ``t_v - t == offset_ns`` at ``start_ns``. ``steps_ns``: all steps up to this segment (left
    out of CLOCK_MONOTONIC); ``corr_ns``: the time all corrections added before it. ``kind``:
    what started it (``KINDS``). Slews still to apply at ``start_ns``: ``pll_ns`` (the kernel
    PLL's phase, decaying as exp(-pll_rate * s)) and ``adj_ns`` (adjtime's, at
    ``ADJTIME_NS_PER_S``)."""

    start_ns: int
    offset_ns: float
    host: str
    oscillator: Oscillator
    corr_ppm: float = 0.0
    steps_ns: float = 0.0
    corr_ns: float = 0.0
    kind: str = "start"
    pll_ns: float = 0.0
    pll_rate: float = 0.0
    adj_ns: float = 0.0

    def pll_left_ns(self, true_ns: int) -> float:
        """The PLL's phase still to apply at ``true_ns``, ns."""
        return self.pll_ns * math.exp(-self.pll_rate * float(true_ns - self.start_ns) / 1e9)

    def adj_left_ns(self, true_ns: int) -> float:
        """adjtime's slew still to apply at ``true_ns``, ns."""
        done = min(abs(self.adj_ns), ADJTIME_NS_PER_S * float(true_ns - self.start_ns) / 1e9)
        return self.adj_ns - math.copysign(done, self.adj_ns)

    def slew_ns(self, true_ns: int) -> float:
        """The time the PLL and adjtime added from ``start_ns`` to ``true_ns``, ns."""
        return ((self.pll_ns - self.pll_left_ns(true_ns))
                + (self.adj_ns - self.adj_left_ns(true_ns)))

    def slew_ppm(self, true_ns: int) -> float:
        """The rate of ``slew_ns`` at ``true_ns``, ppm."""
        adj = self.adj_left_ns(true_ns)
        return (self.pll_rate * self.pll_left_ns(true_ns) * 1e-3
                + (math.copysign(ADJTIME_NS_PER_S * 1e-3, adj) if adj else 0.0))

    def _swing(self, true_ns: int) -> float:
        osc = self.oscillator
        return osc.phase_ns(true_ns) - osc.phase_ns(self.start_ns)

    def offset_at(self, true_ns: int) -> float:
        """``t_v - t`` (CLOCK_REALTIME) in ns at true time ``true_ns`` (>= start_ns)."""
        return (self.offset_ns + self._swing(true_ns)
                + self.corr_ppm * float(true_ns - self.start_ns) * 1e-6
                + self.slew_ns(true_ns))

    def monotonic_offset_at(self, true_ns: int) -> float:
        """The VM's CLOCK_MONOTONIC minus the machine's, ns: the offset without steps."""
        return self.offset_at(true_ns) - self.steps_ns

    def raw_offset_at(self, true_ns: int) -> float:
        """The VM's CLOCK_MONOTONIC_RAW minus the machine's, ns: the oscillator alone."""
        return (self.offset_ns - self.steps_ns - self.corr_ns) + self._swing(true_ns)

    def pack(self) -> bytes:
        osc = self.oscillator
        if len(osc.wander) > MAX_WANDER:
            raise ValueError(f"at most {MAX_WANDER} wander terms, got {len(osc.wander)}")
        terms = [x for w in osc.wander for x in w] + [0.0] * 3 * (MAX_WANDER - len(osc.wander))
        return SEGMENT.pack(self.start_ns, self.offset_ns, self.steps_ns, self.corr_ns,
                            self.corr_ppm, osc.epoch_ns, osc.base_ppm, len(osc.wander),
                            KINDS.index(self.kind), *terms, self.host.encode(), self.pll_ns,
                            self.pll_rate, self.adj_ns)

    @classmethod
    def unpack(cls, data: bytes, offset: int) -> Segment:
        (start, off, steps, corr, corr_ppm, epoch, base, nw, kind,
         *rest) = SEGMENT.unpack_from(data, offset)
        terms, (host, pll, rate, adj) = rest[:-4], rest[-4:]
        wander = tuple(tuple(terms[3 * i:3 * i + 3]) for i in range(nw))
        return cls(start, off, host.rstrip(b"\0").decode(), Oscillator(epoch, base, wander),
                   corr_ppm=corr_ppm, steps_ns=steps, corr_ns=corr, kind=KINDS[kind],
                   pll_ns=pll, pll_rate=rate, adj_ns=adj)


@dataclass
class ClockSpec:
    """All segments of one VM's clock, oldest first, and the VM's adjtimex state
    ``discipline`` (tick, freq, status, maxerror, esterror, constant, reftime_s,
    maxerror_set_ns): the content of an ``NSLAB_CLOCK`` file."""

    vm: str
    segments: list[Segment] = field(default_factory=list)
    discipline: tuple[int, ...] = DEFAULT_DISCIPLINE

    def segment_at(self, true_ns: int) -> Segment:
        """The segment in force at ``true_ns``; the first one for earlier times."""
        current = self.segments[0]
        for seg in self.segments[1:]:
            if seg.start_ns > true_ns:
                break
            current = seg
        return current

    def offset_at(self, true_ns: int) -> float:
        """``t_v - t`` in ns at true time ``true_ns``."""
        return self.segment_at(true_ns).offset_at(true_ns)

    def frequency_ppm(self, true_ns: int) -> float:
        """The VM clock's fractional frequency error (ppm) at ``true_ns``: its host's
        oscillator plus the VM's own correction and slews."""
        seg = self.segment_at(true_ns)
        return seg.oscillator.frequency_ppm(true_ns) + seg.corr_ppm + seg.slew_ppm(true_ns)

    def to_vm_ns(self, true_ns: int) -> int:
        """VM clock reading (ns) at true time ``true_ns``."""
        return true_ns + round(self.offset_at(true_ns))

    def append(self, start_ns: int, *, step_ns: float = 0.0, host: str | None = None,
               oscillator: Oscillator | None = None, corr_ppm: float | None = None,
               kind: str | None = None) -> Segment:
        """Start a new segment at ``start_ns``: optionally step the clock by ``step_ns``,
        switch to another host's ``oscillator`` (a migration) and/or set the VM's frequency
        correction ``corr_ppm``. Continuous when ``step_ns == 0``; the slews left carry on.

        Raises:
            ValueError: ``start_ns`` is before the last segment's start.
        """
        last = self.segments[-1]
        if start_ns < last.start_ns:
            raise ValueError(f"segment start {start_ns} precedes the last one ({last.start_ns})")
        if kind is None:
            kind = "migrate" if oscillator is not None else "step"
        seg = Segment(start_ns=start_ns, offset_ns=self.offset_at(start_ns) + step_ns,
                      host=host or last.host, oscillator=oscillator or last.oscillator,
                      corr_ppm=last.corr_ppm if corr_ppm is None else corr_ppm,
                      steps_ns=last.steps_ns + step_ns,
                      corr_ns=last.corr_ns
                      + last.corr_ppm * float(start_ns - last.start_ns) * 1e-6
                      + last.slew_ns(start_ns),
                      kind=kind, pll_ns=last.pll_left_ns(start_ns), pll_rate=last.pll_rate,
                      adj_ns=last.adj_left_ns(start_ns))
        self.segments.append(seg)
        return seg

    def to_bytes(self) -> bytes:
        head = HEADER.pack(MAGIC, 0, len(self.segments), self.vm.encode(), *self.discipline)
        return head + b"".join(s.pack() for s in self.segments)

    @classmethod
    def from_bytes(cls, data: bytes) -> ClockSpec:
        """Parse an ``nslab.clock/2`` file.

        Raises:
            ValueError: not such a file, truncated, or no segment.
        """
        if len(data) < HEADER.size or data[:8] != MAGIC:
            raise ValueError(f"not an {SCHEMA} file")
        magic, _stale, nseg, vm, *discipline = HEADER.unpack_from(data)
        if nseg == 0 or len(data) < HEADER.size + nseg * SEGMENT.size:
            raise ValueError(f"{SCHEMA} file truncated or without segments")
        segs = [Segment.unpack(data, HEADER.size + i * SEGMENT.size) for i in range(nseg)]
        return cls(vm=vm.rstrip(b"\0").decode(), segments=segs, discipline=tuple(discipline))

    @classmethod
    def read(cls, path: str) -> ClockSpec:
        with open(path, "rb") as f:
            return cls.from_bytes(f.read())

    def write(self, path: str) -> None:
        """Publish atomically: write a new file, rename it over ``path``, then mark the old
        file stale so that processes mapping it re-open ``path``. Callers that modify a
        published clock go through ``update`` (which holds the lock)."""
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(self.to_bytes())
        os.chmod(tmp, 0o644)
        try:
            old = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            old = None
        try:
            os.replace(tmp, path)
            if old is not None:
                os.pwrite(old, struct.pack("<I", 1), STALE_OFFSET)
        finally:
            if old is not None:
                os.close(old)


def update(path: str, change) -> ClockSpec:
    """Read the clock published at ``path``, apply ``change(spec)`` and publish it again, under
    the file's lock (shared with ``vmclock``'s writers: a VM's own corrections are never lost).
    Returns the new spec."""
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        spec = ClockSpec.read(path)
        change(spec)
        spec.write(path)
        return spec


def preloaded() -> bool:
    """True when this process runs with ``vmclock`` preloaded: its system clock (and the
    kernel's socket timestamps it receives) already are the VM clock."""
    try:
        return hasattr(ctypes.CDLL(None), "nslab_vmclock_active")
    except OSError:
        return False


class Clock:
    """A VM's clock as seen from inside the VM.

    ``Clock()`` reads ``NSLAB_CLOCK``; with no such variable, or with ``vmclock`` preloaded
    (which already makes the system clock the VM clock), it is the system clock.
    """

    def __init__(self, path: str | None = None):
        # vmclock preloaded on a VM clock: the system clock already is the VM clock
        self.vmclock = path is None and bool(os.environ.get(ENV_VAR)) and preloaded()
        if path is None and not self.vmclock:
            path = os.environ.get(ENV_VAR) or None
        self.path = path
        self._spec: ClockSpec | None = None
        self._key: tuple[int, int] | None = None

    @property
    def emulated(self) -> bool:
        """True on an emulated VM clock (a clock file, or ``vmclock`` preloaded)."""
        return self.path is not None or self.vmclock

    def _current(self) -> ClockSpec | None:
        if self.path is None:
            return None
        st = os.stat(self.path)
        key = (st.st_ino, st.st_mtime_ns)
        if key != self._key:
            self._spec = ClockSpec.read(self.path)
            self._key = key
        return self._spec

    def to_vm_ns(self, system_ns: int) -> int:
        """Convert a CLOCK_REALTIME timestamp (ns; e.g. a kernel SO_TIMESTAMPING stamp) into
        this VM's clock (ns)."""
        spec = self._current()
        return system_ns if spec is None else spec.to_vm_ns(system_ns)

    def now_ns(self) -> int:
        """Current VM time in ns."""
        return self.to_vm_ns(time.time_ns())
