"""Iteration slots: a job starts its iterations on a schedule (CASSINI's time shift).

A ``Schedule`` gives a job a grid of slots on a *reference clock*: slot k starts at
``T_k = start_ns + (shift_s + k * period_s) * 1e9``, and iteration i (warmup included) starts
no earlier than ``T_{k0 + i}``, where ``k0`` (``first_slot``) is the first slot the rank can
still catch once its mesh is up: a job that took longer to start skips the slots it missed
instead of running late for all of them (and losing its phase, the point of the shift).
Each rank reads the reference time through its own VM clock: ``offsets_ns[rank]`` is that
VM's clock minus the reference clock at ``start_ns`` and ``drifts_ppm[rank]`` its rate
against the reference (what the agents estimate), so the slot on the VM clock is
``T_i + offset + drift * 1e-6 * (T_i - start_ns)`` and CASSINI's shifts hold across VMs.
Without them a rank takes its raw VM clock for the reference (its offset and drift then move
the slots). A rank that is late for a slot starts at once. Source of the
mechanism: Rajasekaran et al., "CASSINI", NSDI 2024, section 4 (a job's iterations are
delayed by its time shift).
"""
from __future__ import annotations

import math
import time
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

MAX_SLEEP_S = 0.05  # re-read the clock at least this often while waiting for a slot


class NowNs(Protocol):
    def now_ns(self) -> int: ...


class Schedule(BaseModel):
    """The iteration slots of one job (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    start_ns: int = Field(ge=0, description="origin of the slots on the reference clock, ns "
                          "since the Unix epoch")
    period_s: float = Field(gt=0, le=3600, description="slot length: one iteration per slot, s")
    shift_s: float = Field(0.0, ge=0, le=3600, description="the job's time shift: its slots "
                           "start this much after start_ns, s")
    offsets_ns: list[int] = Field(default_factory=list, description="per rank: its VM clock "
                                  "minus the reference clock at start_ns, ns (empty: raw VM "
                                  "clocks)")
    drifts_ppm: list[float] = Field(default_factory=list, description="per rank: its VM "
                                    "clock's rate minus the reference clock's, ppm (empty: 0)")

    def slot_ns(self, iteration: int, rank: int) -> int:
        """Start of ``iteration``'s slot on rank ``rank``'s VM clock, ns."""
        since = (self.shift_s + iteration * self.period_s) * 1e9
        offset = self.offsets_ns[rank] if self.offsets_ns else 0
        drift = self.drifts_ppm[rank] if self.drifts_ppm else 0.0
        return self.start_ns + offset + round(since * (1 + drift * 1e-6))

    def first_slot(self, now_ns: int, rank: int) -> int:
        """The first slot k >= 0 whose start on rank ``rank``'s VM clock is not before
        ``now_ns`` (that clock's reading now)."""
        late_s = (now_ns - self.slot_ns(0, rank)) / 1e9
        k = max(0, math.ceil(late_s / self.period_s))
        while self.slot_ns(k, rank) < now_ns:  # drift: at most a step or two
            k += 1
        return k


def wait_until(clock: NowNs, target_ns: int) -> float:
    """Sleep until ``clock.now_ns() >= target_ns``; returns the seconds waited (clock time, 0
    when already past)."""
    t0 = now = clock.now_ns()
    while now < target_ns:
        time.sleep(min((target_ns - now) / 1e9, MAX_SLEEP_S))
        now = clock.now_ns()
    return (now - t0) / 1e9
