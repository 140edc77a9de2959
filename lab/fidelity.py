"""Fidelity of the emulation: is the machine saturated while a scenario runs?

A background thread samples the CPU times (psutil, from ``/proc/stat``) every ``interval_s``
and keeps, per
interval, the busy fraction of all CPUs (everything but idle and iowait) and the softirq
fraction (where veth forwarding and qdiscs run), and the busiest core's busy fraction (one
saturated core limits a single flow even when the machine as a whole is not). When the
machine is saturated, timers fire
late and packets queue in the kernel instead of in the emulated queues, so timing results
are not trustworthy: the summary flags it.
"""
from __future__ import annotations

import threading

import numpy as np
import psutil

SATURATED_BUSY = 0.90      # an interval is saturated at >= 90 % busy ...
SATURATED_SHARE = 0.25     # ... and the run is flagged when >= 25 % of intervals are


_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
"""The CPU times that add up to a core's time (guest time is counted in user and nice)."""


def read_cpu_times() -> np.ndarray:
    """CPU times (s), shape (1 + cores, 8): row 0 is the sum over cores, then one row per
    core; columns ``_FIELDS`` (psutil.cpu_times, proc(5))."""
    cores = np.array([[getattr(c, f, 0.0) for f in _FIELDS]
                      for c in psutil.cpu_times(percpu=True)])
    return np.vstack([cores.sum(axis=0), cores])


class FidelitySampler:
    """``with FidelitySampler() as s: ...``; then ``s.summary()``."""

    def __init__(self, interval_s: float = 0.25):
        self.interval_s = interval_s
        self.busy: list[float] = []
        self.core_busy: list[float] = []
        self.softirq: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="nslab-fidelity")

    def __enter__(self) -> FidelitySampler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Start sampling in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (idempotent; also when never started)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        prev = read_cpu_times()
        while not self._stop.wait(self.interval_s):
            cur = read_cpu_times()
            d = cur - prev
            prev = cur
            total = d.sum(axis=1)
            if (total <= 0).any():
                continue
            busy = 1 - (d[:, 3] + d[:, 4]) / total
            self.busy.append(float(busy[0]))
            self.core_busy.append(float(busy[1:].max()))
            self.softirq.append(float(d[0, 6] / total[0]))

    def summary(self) -> dict:
        """``samples``, ``cpu_busy`` (all cores), ``busiest_core`` and ``softirq`` fractions
        (p50, max), ``saturated`` (judged on all cores)."""
        if not self.busy:
            return {"samples": 0, "saturated": None}
        busy = np.array(self.busy)
        soft = np.array(self.softirq)
        return {"samples": len(busy), "interval_s": self.interval_s,
                "cpu_busy": {"p50": round(float(np.median(busy)), 3),
                             "max": round(float(busy.max()), 3)},
                "busiest_core": {"p50": round(float(np.median(self.core_busy)), 3),
                                 "max": round(float(max(self.core_busy)), 3)},
                "softirq": {"p50": round(float(np.median(soft)), 3),
                            "max": round(float(soft.max()), 3)},
                "saturated": bool(np.mean(busy >= SATURATED_BUSY) >= SATURATED_SHARE)}
