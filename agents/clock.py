"""The emulated VM clock: the one formula shared by the lab (hypervisor) and the agents.

For VM v on physical host h, with true time t (the machine's CLOCK_REALTIME)::

    t_v(t) = t + theta_v + integral_{t0}^{t} y_h(s) ds
    y_h(s) = y_h0 + sum_i A_i cos(2 pi (s - epoch) / P_i + phi_i)

``y_h`` is the fractional frequency error of h's oscillator: a base drift ``y_h0`` (ppm) and a
bounded wander (|wander| <= sum A_i ppm). The lab publishes the parameters of each VM as a
read-only JSON file (schema ``nslab.clock/1``) and passes its path in ``NSLAB_CLOCK``.
Run-time changes (a clock step, a live migration to another host) are new *segments*: segment k
starts at true time ``start_ns`` with offset ``offset_ns = t_v - t`` and follows its host's
oscillator from there, so ``t_v`` stays continuous unless a step was asked for.

Without ``NSLAB_CLOCK`` the clock is the system clock, so an agent runs unchanged on a real VM.
The file is re-read when it changes (checked by ``stat`` on every read), so a step or a
migration takes effect at once in every process of the VM.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field

SCHEMA = "nslab.clock/1"
ENV_VAR = "NSLAB_CLOCK"
_NS = 1_000_000_000


@dataclass(frozen=True)
class Oscillator:
    """A physical host's oscillator.

    Attributes:
        epoch_ns: true time (ns) at which the wander phases are defined.
        base_ppm: constant fractional frequency error, ppm.
        wander: ``(amplitude_ppm, period_s, phase_rad)`` cosine terms of the bounded wander.
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
        """Accumulated time error integral_{epoch}^{t} y_h(s) ds, in ns."""
        dt_ns = float(true_ns - self.epoch_ns)
        dt = dt_ns / _NS
        acc = self.base_ppm * dt_ns
        for a, p, ph in self.wander:
            swing = math.sin(2 * math.pi * dt / p + ph) - math.sin(ph)
            acc += a * p / (2 * math.pi) * swing * _NS
        return acc * 1e-6


@dataclass(frozen=True)
class Segment:
    """A piece of a VM's clock history: from ``start_ns`` (true time) on, the VM follows
    ``oscillator`` (of physical host ``host``) and ``t_v - t == offset_ns`` at ``start_ns``."""

    start_ns: int
    offset_ns: float
    host: str
    oscillator: Oscillator

    def offset_at(self, true_ns: int) -> float:
        """``t_v - t`` in ns at true time ``true_ns`` (>= start_ns)."""
        osc = self.oscillator
        return self.offset_ns + osc.phase_ns(true_ns) - osc.phase_ns(self.start_ns)


@dataclass
class ClockSpec:
    """All segments of one VM's clock, oldest first (the content of an ``NSLAB_CLOCK`` file)."""

    vm: str
    segments: list[Segment] = field(default_factory=list)

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
        """The VM clock's fractional frequency error (ppm) at ``true_ns``."""
        return self.segment_at(true_ns).oscillator.frequency_ppm(true_ns)

    def to_vm_ns(self, true_ns: int) -> int:
        """VM clock reading (ns) at true time ``true_ns``."""
        return true_ns + round(self.offset_at(true_ns))

    def append(self, start_ns: int, *, step_ns: float = 0.0, host: str | None = None,
               oscillator: Oscillator | None = None) -> Segment:
        """Start a new segment at ``start_ns``: optionally step the clock by ``step_ns`` and/or
        switch to another host's ``oscillator`` (a migration). Continuous when ``step_ns == 0``.

        Raises:
            ValueError: ``start_ns`` is before the last segment's start.
        """
        last = self.segments[-1]
        if start_ns < last.start_ns:
            raise ValueError(f"segment start {start_ns} precedes the last one ({last.start_ns})")
        seg = Segment(start_ns=start_ns, offset_ns=self.offset_at(start_ns) + step_ns,
                      host=host or last.host, oscillator=oscillator or last.oscillator)
        self.segments.append(seg)
        return seg

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, "vm": self.vm,
                           "segments": [asdict(s) for s in self.segments]}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> ClockSpec:
        """Parse an ``nslab.clock/1`` document.

        Raises:
            ValueError: wrong schema or no segment.
        """
        doc = json.loads(text)
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"not an {SCHEMA} document (schema={doc.get('schema')!r})")
        segs = []
        for s in doc["segments"]:
            o = s["oscillator"]
            osc = Oscillator(int(o["epoch_ns"]), float(o["base_ppm"]),
                             tuple(tuple(float(x) for x in w) for w in o["wander"]))
            segs.append(Segment(int(s["start_ns"]), float(s["offset_ns"]), s["host"], osc))
        if not segs:
            raise ValueError("clock document has no segment")
        return cls(vm=doc["vm"], segments=segs)

    def write(self, path: str) -> None:
        """Publish atomically (write then rename) as a read-only file."""
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(self.to_json())
        os.chmod(tmp, 0o444)
        os.replace(tmp, path)


class Clock:
    """A VM's clock as seen from inside the VM.

    ``Clock()`` reads ``NSLAB_CLOCK``; with no such variable it is the system clock.
    """

    def __init__(self, path: str | None = None):
        self.path = path if path is not None else os.environ.get(ENV_VAR) or None
        self._spec: ClockSpec | None = None
        self._key: tuple[int, int] | None = None

    @property
    def emulated(self) -> bool:
        return self.path is not None

    def _current(self) -> ClockSpec | None:
        if self.path is None:
            return None
        st = os.stat(self.path)
        key = (st.st_ino, st.st_mtime_ns)
        if key != self._key:
            with open(self.path) as f:
                self._spec = ClockSpec.from_json(f.read())
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
