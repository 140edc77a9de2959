"""Where the machine running a lab was saturated, judged from samples: which cores, how much
of their time went to softirq (where veth forwarding and qdiscs run), and which links' queues
were limited by the CPU rather than by their configured rate. Pure functions on the samples
``lab.fidelity.FidelitySampler`` takes; the rules, on each interval between two samples:

- A core is *hot* in an interval when it is busy (all but idle and iowait) >= ``HOT_BUSY``
  (90 %); over the run it is *saturated* when hot in >= ``SATURATED_SHARE`` (25 %) of the
  intervals.
- The machine is saturated in an interval when all its cores together are busy >= 90 %.
- A link direction is *queued* in an interval when its root qdisc held packets at both ends
  of it. A shaped queue that stays non-empty sends at its configured rate (HTB is
  work-conserving up to its rate, Ethernet headers counted) as long as the CPU serves it in
  time; when the CPU does not (softirq deferred to ``ksoftirqd``, timers late), it sends less
  while packets wait.
- A direction is *starved* in an interval when it is queued, some core is hot, and it sent
  less than ``UNDER_RATE`` (80 %) of its configured rate.
- A direction is *CPU-limited* over the run when it was starved in >= ``LIMITED_MIN`` (2)
  intervals and in at least half of the intervals it was queued while a core was hot. This
  says "probably": a queue that fills and drains within an interval (bursty traffic) can
  look starved too, which the half rule and the hot core keep rare, not impossible.
- The run is *saturated* (timing results not trustworthy) when the machine was saturated in
  >= 25 % of the intervals, or a direction was CPU-limited.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from lab.queues import QueueReading

HOT_BUSY = 0.90
SATURATED_SHARE = 0.25
UNDER_RATE = 0.80
LIMITED_MIN = 2


@dataclass(frozen=True)
class LinkInterval:
    """One direction over one interval: configured rate and rate sent (Mbit/s, Ethernet
    headers counted), and whether its queue held packets at both ends of the interval."""

    bw_mbit: float
    sent_mbit: float
    queued: bool


@dataclass(frozen=True)
class Interval:
    """One sampling interval: busy and softirq fractions (0-1) per core and of all cores
    together, and the shaped directions' ``LinkInterval`` by label ``"a->b"`` (empty when
    the link queues were not read)."""

    core_busy: tuple[float, ...]
    core_softirq: tuple[float, ...]
    busy: float
    softirq: float
    links: Mapping[str, LinkInterval] = field(default_factory=dict)


def link_interval(prev: QueueReading, cur: QueueReading) -> LinkInterval | None:
    """The interval between two readings of one direction; None when no time passed or the
    counters went back (the qdisc was replaced)."""
    dt = cur.t_s - prev.t_s
    sent = cur.sent_bytes - prev.sent_bytes
    if dt <= 0 or sent < 0:
        return None
    return LinkInterval(bw_mbit=cur.bw_mbit, sent_mbit=sent * 8 / dt / 1e6,
                        queued=prev.backlog_packets > 0 and cur.backlog_packets > 0)


def _frac(x) -> dict[str, float]:
    x = np.asarray(x, dtype=float)
    return {"p50": round(float(np.median(x)), 3), "max": round(float(x.max()), 3)}


def _cores(intervals: Sequence[Interval]) -> list[dict]:
    busy = np.array([i.core_busy for i in intervals])
    soft = np.array([i.core_softirq for i in intervals])
    hot_share = (busy >= HOT_BUSY).mean(axis=0)
    return [{"cpu": c, "busy": _frac(busy[:, c]), "softirq": _frac(soft[:, c]),
             "hot_share": round(float(hot_share[c]), 3),
             "saturated": bool(hot_share[c] >= SATURATED_SHARE)}
            for c in range(busy.shape[1])]


def _queues(intervals: Sequence[Interval]) -> list[dict]:
    """Per direction queued at least once, in label order."""
    labels = sorted({k for i in intervals for k, li in i.links.items() if li.queued})
    out = []
    for label in labels:
        queued, ratios, starved, queued_hot = 0, [], 0, 0
        bw = None
        for i in intervals:
            li = i.links.get(label)
            if li is None or not li.queued:
                continue
            bw = li.bw_mbit
            ratio = li.sent_mbit / li.bw_mbit
            queued += 1
            ratios.append(ratio)
            if max(i.core_busy) >= HOT_BUSY:
                queued_hot += 1
                starved += ratio < UNDER_RATE
        out.append({"link": label, "bw_mbit": bw, "queued_samples": queued,
                    "rate_ratio": _frac(ratios), "starved_samples": starved,
                    "cpu_limited": bool(starved >= LIMITED_MIN and 2 * starved >= queued_hot)})
    return out


def summarize(intervals: Sequence[Interval], interval_s: float, links_read: bool = False,
              links_error: str | None = None) -> dict:
    """The fidelity section of the results (``contracts.results.lab.Fidelity``) from the
    intervals: ``samples``, ``interval_s``, ``cpu_busy``, ``busiest_core`` and ``softirq``
    (``p50``, ``max`` fractions), ``saturated_share`` (intervals with all cores >= 90 %
    busy), ``cores`` (per core: ``busy``, ``softirq``, ``hot_share``, ``saturated``),
    ``queues`` (directions queued at least once: ``bw_mbit``, ``queued_samples``,
    ``rate_ratio`` sent/configured while queued, ``starved_samples``, ``cpu_limited``; null
    when ``links_read`` is False), ``queues_error`` and ``saturated`` (the module's rules).
    Without intervals only ``samples`` (0) and ``saturated`` (None)."""
    if not intervals:
        return {"samples": 0, "saturated": None, "queues_error": links_error}
    busy = np.array([i.busy for i in intervals])
    share = float((busy >= HOT_BUSY).mean())
    queues = _queues(intervals) if links_read else None
    return {"samples": len(intervals), "interval_s": interval_s,
            "cpu_busy": _frac(busy),
            "busiest_core": _frac([max(i.core_busy) for i in intervals]),
            "softirq": _frac([i.softirq for i in intervals]),
            "saturated_share": round(share, 3),
            "cores": _cores(intervals), "queues": queues, "queues_error": links_error,
            "saturated": bool(share >= SATURATED_SHARE
                              or any(q["cpu_limited"] for q in queues or []))}
