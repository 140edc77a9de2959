"""Accelerator time: a rank's GPU kernels as time on its VM clock, not CPU work.

A VM's accelerator is its own (GPUs are not shared between VMs), so the host's CPU load does
not slow it: a kernel of ``d`` ns is a wait until the VM clock has advanced by ``d`` ns,
during which the rank's CPU is free (DESIGN.md, "Accelerators"). The wait is read on the VM
clock (``agents.clock.Clock``), so a kernel lasts ``d`` of the VM's own nanoseconds whatever
its oscillator's drift.

``cycles_ns`` turns a trace's accelerator cycles into nanoseconds at a clock rate (ASTRA-sim's
workload files count cycles; its examples assume 1 GHz, 1 cycle = 1 ns) times a scale factor.
"""
from __future__ import annotations

import queue

from workloads.schedule import MAX_SLEEP_S, NowNs, wait_until


def cycles_ns(cycles: float, clock_ghz: float = 1.0, scale: float = 1.0) -> int:
    """Nanoseconds of ``cycles`` accelerator cycles at ``clock_ghz`` GHz, times ``scale``.

    Raises:
        ValueError: negative cycles, or a clock rate or scale that is not positive.
    """
    if cycles < 0:
        raise ValueError(f"cycles: {cycles} is negative")
    if clock_ghz <= 0 or scale <= 0:
        raise ValueError(f"clock_ghz ({clock_ghz}) and scale ({scale}) must be positive")
    return round(cycles / clock_ghz * scale)


def run_until(clock: NowNs, end_ns: int, events: queue.Queue | None = None) -> object:
    """The accelerator is busy until the VM clock reads ``end_ns`` (a kernel, or none when
    already past). With ``events``, return early with the first item put there meanwhile
    (another stream's completion) and None once ``end_ns`` is reached.

    The wait is a sleep re-read on the VM clock at least every ``MAX_SLEEP_S``.
    """
    if events is None:
        wait_until(clock, end_ns)
        return None
    now = clock.now_ns()
    while True:
        try:
            return events.get(timeout=max(0.0, min((end_ns - now) / 1e9, MAX_SLEEP_S)))
        except queue.Empty:
            now = clock.now_ns()
            if now >= end_ns:
                return None
