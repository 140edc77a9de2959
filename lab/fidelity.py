"""Fidelity of the emulation: is the machine saturated while a scenario runs, and where?

A background thread samples every ``interval_s`` the CPU times of every core (psutil, from
``/proc/stat``) and, once a lab is watched (``watch``), the counters of its links' emulated
queues (``lab.queues``). Per interval it keeps each core's busy fraction (everything but idle
and iowait) and softirq fraction (where veth forwarding and qdiscs run), the same for all
cores together, and each shaped direction's rate sent and whether its queue held packets.
``summary()`` judges them (``lab.saturation``: which cores were saturated, which links' queues
the CPU limited, whether timing results can be trusted). When the machine is saturated, timers
fire late and packets wait in the kernel instead of in the emulated queues.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import psutil

from lab.queues import QueueReading
from lab.saturation import Interval, link_interval, summarize
from lab.series import downsample

SERIES_POINTS = 240
"""At most this many points in the fidelity section's ``series`` (2 min at 0.5 s)."""
IDLE_BELOW = 0.01
"""A direction whose utilization stays below this fraction is left out of ``series``."""

_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
"""The CPU times that add up to a core's time (guest time is counted in user and nice)."""


def read_cpu_times() -> np.ndarray:
    """CPU times (s), shape (1 + cores, 8): row 0 is the sum over cores, then one row per
    core; columns ``_FIELDS`` (psutil.cpu_times, proc(5))."""
    cores = np.array([[getattr(c, f, 0.0) for f in _FIELDS]
                      for c in psutil.cpu_times(percpu=True)])
    return np.vstack([cores.sum(axis=0), cores])


def cpu_interval(prev: np.ndarray, cur: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Busy and softirq fractions (0-1), each shape (1 + cores,) as ``read_cpu_times``' rows,
    between two of its readings; None when a core's time did not advance."""
    d = cur - prev
    total = d.sum(axis=1)
    if (total <= 0).any():
        return None
    return 1 - (d[:, 3] + d[:, 4]) / total, d[:, 6] / total


class FidelitySampler:
    """``with FidelitySampler() as s: ...``; then ``s.summary()``.

    Args:
        interval_s: time between two samples, s.
    """

    def __init__(self, interval_s: float = 0.25):
        self.interval_s = interval_s
        self.intervals: list[Interval] = []
        self.ends_ns: list[int] = []
        self._queues: Callable[[], Mapping[str, QueueReading]] | None = None
        self._queues_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="nslab-fidelity")

    def __enter__(self) -> FidelitySampler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def busy(self) -> list[float]:
        """Busy fraction of all cores, per interval so far."""
        return [i.busy for i in self.intervals]

    @property
    def softirq(self) -> list[float]:
        """Softirq fraction of all cores, per interval so far."""
        return [i.softirq for i in self.intervals]

    def watch(self, queues: Callable[[], Mapping[str, QueueReading]]) -> None:
        """Also sample link queues from now on: ``queues()`` (e.g. ``lab.queues.QueueReader``)
        is called on the sampler's thread each interval; stop the sampler before the lab.
        Its first exception ends queue sampling and is reported as ``queues_error``."""
        self._queues = queues

    def start(self) -> None:
        """Start sampling in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (idempotent; also when never started)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _read_queues(self) -> Mapping[str, QueueReading]:
        if self._queues is None or self._queues_error is not None:
            return {}
        try:
            return self._queues()
        except Exception as e:  # noqa: BLE001 - any failure ends queue sampling, reported
            self._queues_error = f"{type(e).__name__}: {e}"
            return {}

    def _run(self) -> None:
        prev, prev_q = read_cpu_times(), self._read_queues()
        while not self._stop.wait(self.interval_s):
            cur, cur_q = read_cpu_times(), self._read_queues()
            fracs = cpu_interval(prev, cur)
            links = {k: li for k, q in cur_q.items()
                     if k in prev_q and (li := link_interval(prev_q[k], q)) is not None}
            prev, prev_q = cur, cur_q
            if fracs is None:
                continue
            busy, soft = fracs
            self.ends_ns.append(time.time_ns())
            self.intervals.append(Interval(
                core_busy=tuple(float(x) for x in busy[1:]),
                core_softirq=tuple(float(x) for x in soft[1:]),
                busy=float(busy[0]), softirq=float(soft[0]), links=links))

    def saturated_between(self, start_ns: int, end_ns: int) -> bool | None:
        """Whether the machine was saturated (``summarize``'s rules) over the intervals that
        ended between ``start_ns`` and ``end_ns`` (CLOCK_REALTIME ns, e.g. one repetition of
        a comparison's arm); None without such an interval."""
        picked = [i for i, end in zip(list(self.intervals), list(self.ends_ns), strict=False)
                  if start_ns < end <= end_ns]
        if not picked:
            return None
        return summarize(picked, self.interval_s, links_read=self._queues is not None
                         )["saturated"]

    def summary(self, t0_ns: int | None = None) -> dict:
        """``lab.saturation.summarize`` of the intervals so far (the results' fidelity
        section); with ``t0_ns`` (the lab's bring-up, ns CLOCK_REALTIME) also its ``series``
        (``series``) of the intervals that ended after it."""
        intervals, ends = list(self.intervals), list(self.ends_ns)
        out = summarize(intervals, self.interval_s, links_read=self._queues is not None,
                        links_error=self._queues_error)
        if t0_ns:
            n = min(len(intervals), len(ends))
            after = [k for k in range(n) if ends[k] > t0_ns]
            out["series"] = series([intervals[k] for k in after],
                                   [(ends[k] - t0_ns) / 1e9 for k in after])
        return out


def series(intervals: Sequence[Interval], ends_s: Sequence[float],
           max_points: int = SERIES_POINTS) -> dict:
    """The fidelity section's ``series`` (``contracts.results.lab.FidelitySeries``): ``t_s`` (end
    of each point, s after bring-up), ``cpu_busy`` and ``busiest_core`` (busy fraction of all
    cores, of the busiest core) and ``links`` (by direction ``a->b``: rate sent / configured
    rate, Ethernet headers counted, null where not read; directions that never reached
    ``IDLE_BELOW`` left out), each the mean of a run of intervals (``lab.series``).

    Args:
        intervals: the sampler's intervals, in time order.
        ends_s: when each ended, s after bring-up.
        max_points: at most this many points.
    """
    labels = sorted({k for i in intervals for k in i.links})
    links = {k: downsample([i.links[k].sent_mbit / i.links[k].bw_mbit if k in i.links
                            else None for i in intervals], max_points, digits=3)
             for k in labels}
    return {"t_s": downsample(list(ends_s), max_points, how="last", digits=2),
            "cpu_busy": downsample([i.busy for i in intervals], max_points, digits=3),
            "busiest_core": downsample([max(i.core_busy) for i in intervals], max_points,
                                       digits=3),
            "links": {k: v for k, v in links.items()
                      if max((x for x in v if x is not None), default=0) >= IDLE_BELOW}}
