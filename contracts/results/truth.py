"""The results' ``truth`` section: what the lab injected, against which every estimate is
scored (placements, the hosts' NICs, the VM clocks' parameters, the fault timeline, the
servers' clocks).

Units: ns, s, ppm.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from contracts.base import Model
from contracts.enums import SegmentKind
from contracts.events import Source


class Wander(Model):
    """One cosine of an oscillator's frequency wander."""

    amplitude_ppm: float = Field(description="ppm")
    period_s: float = Field(description="s")
    phase_rad: float = Field(description="rad")


class Oscillator(Model):
    """A physical host's oscillator: base drift plus wander."""

    base_ppm: float = Field(description="base frequency error, ppm")
    wander: list[Wander]


class Segment(Model):
    """A stretch of a VM's clock (a new one starts at a clock step, a migration, or a
    correction the VM made to its own clock: adjtimex, settimeofday)."""

    start_ns: int = Field(description="true time the segment starts, ns (CLOCK_REALTIME)")
    offset_ns: float = Field(description="t_vm - t at the start, ns")
    host: str = Field(description="physical host whose oscillator drives it")
    kind: SegmentKind = Field(
        "start", description="what started it: the lab (start, step, migrate) or the VM's own "
        "discipline (vm_frequency: adjtimex frequency/tick; vm_step: settimeofday, "
        "clock_settime, ADJ_SETOFFSET; vm_slew: ADJ_OFFSET, the kernel PLL, or adjtime)")
    corr_ppm: float = Field(0.0, description="the VM's own frequency correction in force, ppm "
                                             "(on top of its host's oscillator)")


class Clocks(Model):
    oscillators: dict[str, Oscillator] = Field(description="by physical host")
    vms: dict[str, list[Segment]] = Field(description="by VM: its clock segments")


class ServerClockSample(Model):
    """One server's clock against the first's at one moment of the run (``lab.server_clock``:
    the sample of least round trip of a few)."""

    t_s: float = Field(description="s after bring-up (the first server's true time)")
    offset_us: float = Field(description="its CLOCK_REALTIME - the first server's, us")
    rtt_us: float = Field(description="round trip of that sample, us: the offset is within "
                                      "half of it")


class ServerClock(Model):
    """One server's clock against the first server's, from an NTP-style exchange at bring-up
    (``lab.server_clock``): the sample of least round trip of several; then the same every
    few seconds of the run (``series``)."""

    server: str
    offset_us: float = Field(description="its CLOCK_REALTIME - the first server's at "
                                         "bring-up, us")
    rtt_us: float = Field(description="round trip of that sample, us: the offset is within "
                                      "half of it")
    series: list[ServerClockSample] = Field(default_factory=list, description="the same "
                                            "measured during the run, in time order")


class FaultEvent(Model):
    """One entry of the ground-truth timeline: a fault applied, or a note (job_start, load,
    a flap's transitions, ...)."""

    t_s: float = Field(description="s after bring-up (true time)")
    true_ns: int = Field(description="ns, the machine's CLOCK_REALTIME")
    kind: str = Field(description="a fault kind, or a note: job_start, job_end, load, ...")
    target: str = Field(description="a-b for a link, a VM, a job or a flow (src->dst)")
    params: dict[str, Any] = Field(description="the fault's or note's parameters (units in "
                                               "their names: mbit Mbit/s, percent, step_ms)")
    source: Source = Field("lab", description="who caused it: lab (the lab itself: notes, "
                           "jobs, load, a flap's transitions), timeline (the scenario at its "
                           "time), step (a timeline entry played early), tui (a person in the "
                           "TUI), test (a test, through nslab_pytest.inject)")


class NicDirection(Model):
    """One direction of a host's NIC: its root qdisc's counters since bring-up."""

    sent_bytes: int = Field(description="bytes sent, Ethernet headers counted")
    drops: int = Field(description="packets dropped at its queues")
    backlog_packets: int = Field(description="packets queued at the end")


class HostNic(Model):
    """A physical host's NIC, shared by its VMs (``lab.hostnic``); its fault name is the link
    ``[host, leaf]``."""

    host: str
    leaf: str
    vms: list[str] = Field(description="VMs on the host at the end")
    bw_mbit: float | None = Field(description="rate at the end, Mbit/s (null: unshaped)")
    queue_packets: int | None = Field(description="each VM's queue at the NIC, packets (null: "
                                                  "the kernel's)")
    link_up: bool = Field(description="the NIC's link was up at the end")
    to_leaf: NicDirection
    from_leaf: NicDirection


class TruthSection(Model):
    """What really happened (the lab injected it), to score the agents against."""

    placements: dict[str, str] = Field(description="VM -> physical host at the start")
    placements_end: dict[str, str] = Field(description="VM -> physical host at the end")
    host_nics: list[HostNic] = Field(default_factory=list, description="every host's NIC "
                                     "(empty without a host layer: hosts.nic_bw, nic_queue, "
                                     "vswitch_delay_us or vswitch)")
    clocks: Clocks
    faults: list[FaultEvent] = Field(description="the fault timeline, in time order")
    servers: list[ServerClock] = Field(
        default_factory=list, description="a lab split across servers: each server's clock "
        "against the first's (empty on one server)")
    server_sync_us: float = Field(
        0.0, description="us: how far two servers' truths may disagree at any time of the run "
        "(the largest |offset_i - offset_j| + (rtt_i + rtt_j) / 2 over server pairs, at "
        "bring-up and in every round of ``servers``' series); a score comparing "
        "events on different servers is good to this bound. 0 on one server: one clock")
