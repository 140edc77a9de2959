"""Iteration slots: a job starts its iterations on a schedule (CASSINI's time shift).

A ``Schedule`` gives a job a grid of slots on a *reference clock*: slot k starts at
``T_k = start_ns + (shift_s + k * period_s) * 1e9``. Each iteration (warmup included) takes
the next slot after the previous iteration's (``next_slot``) and starts no earlier than it; a
rank later than ``late_s`` for that slot lets it pass and waits for the first one it can still
catch (so does the first iteration, once the mesh is up), instead of running late for all the
next ones and losing its phase, the point of the shift. A rank late by less starts at once.
Each rank decides alone: the others start on time and wait in the collective for the rank that
skipped, so they come late to their next slot and skip it too; one late rank can cost the job
two slots (ranks that agreed first would need a round trip per iteration).
Each rank reads the reference time through its own VM clock: ``offsets_ns[rank]`` is that
VM's clock minus the reference clock at ``start_ns`` and ``drifts_ppm[rank]`` its rate
against the reference (what the agents estimate), so the slot on the VM clock is
``T_i + offset + drift * 1e-6 * (T_i - start_ns)`` and CASSINI's shifts hold across VMs.
Without them a rank takes its raw VM clock for the reference (its offset and drift then move
the slots). Source of the mechanism: Rajasekaran et al., "CASSINI", NSDI 2024, section 4 (a
job's iterations are delayed by its time shift); ``late_s`` is ours.
"""
from __future__ import annotations

import math
import time
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from contracts.messages import ClockEstimate

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
    late_s: float | None = Field(None, ge=0, le=3600, description="a rank later than this "
                                 "for a slot waits for the next one it can catch, s (null: it "
                                 "starts at once however late)")

    def slot_ns(self, iteration: int, rank: int) -> int:
        """Start of ``iteration``'s slot on rank ``rank``'s VM clock, ns."""
        t_ref = self.start_ns + round((self.shift_s + iteration * self.period_s) * 1e9)
        est = ClockEstimate(self.offsets_ns[rank] if self.offsets_ns else 0,
                            self.drifts_ppm[rank] if self.drifts_ppm else 0.0, self.start_ns)
        return t_ref + round(est.offset_at(t_ref))

    def first_slot(self, now_ns: int, rank: int) -> int:
        """The first slot k >= 0 whose start on rank ``rank``'s VM clock is not before
        ``now_ns`` (that clock's reading now)."""
        late_s = (now_ns - self.slot_ns(0, rank)) / 1e9
        k = max(0, math.ceil(late_s / self.period_s))
        while self.slot_ns(k, rank) < now_ns:  # drift: at most a step or two
            k += 1
        return k

    def next_slot(self, now_ns: int, rank: int, last: int | None) -> int:
        """The slot of rank ``rank``'s next iteration at ``now_ns`` (its VM clock): the one
        after ``last`` (the previous iteration's; None: none yet, the first one it can catch),
        unless the rank is later than ``late_s`` for it: then the first slot it is not later
        than ``late_s`` for (with ``late_s`` None: the one after ``last`` however late)."""
        if last is not None and self.late_s is None:
            return last + 1
        catch = self.first_slot(now_ns - round((self.late_s or 0.0) * 1e9), rank)
        return catch if last is None else max(last + 1, catch)


def wait_until(clock: NowNs, target_ns: int) -> float:
    """Sleep until ``clock.now_ns() >= target_ns``; returns the seconds waited (clock time, 0
    when already past)."""
    t0 = now = clock.now_ns()
    while now < target_ns:
        time.sleep(min((target_ns - now) / 1e9, MAX_SLEEP_S))
        now = clock.now_ns()
    return (now - t0) / 1e9


class Slots:
    """A training loop's hook for its job's slots (CASSINI's time shift reaching a framework):
    ``tc = slots.wait(t0, timed)`` at the top of every iteration waits until the iteration's
    slot on the VM clock (``Schedule.next_slot``) and returns the clock after the wait (``t0``
    itself without a schedule). It keeps ``doc``'s ``first_slot`` and ``skipped_slots`` (the
    slots that timed iterations let pass, being later than ``late_s``).

    What a user's training loop adds: ``slots = Slots(schedule, rank, clock, {})`` before the
    loop and ``slots.wait(clock.now_ns())`` as its first line.
    """

    def __init__(self, schedule: Schedule | None, rank: int, clock: NowNs, doc: dict):
        self.schedule, self.rank, self.clock, self.doc = schedule, rank, clock, doc
        self.slot: int | None = None

    def wait(self, t0: int, timed: bool = True) -> int:
        """Wait for the next iteration's slot (``t0``: the VM clock now, ns); returns the VM
        clock after the wait, ns."""
        if self.schedule is None:
            return t0
        k = self.schedule.next_slot(t0, self.rank, self.slot)
        if self.slot is None:
            self.doc["first_slot"] = k
        elif k > self.slot + 1 and timed:
            self.doc["skipped_slots"] = self.doc.get("skipped_slots", 0) + k - self.slot - 1
        self.slot = k
        wait_until(self.clock, self.schedule.slot_ns(k, self.rank))
        return self.clock.now_ns()
