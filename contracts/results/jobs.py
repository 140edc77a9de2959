"""The results' ``load`` and ``jobs`` sections: iperf3 flows and collective jobs as they ran.

Units: s, bytes, bit/s, Mbit/s, us.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from contracts.base import Model
from contracts.enums import ComputeKind, PacerMode, PlacementKind, Protocol
from contracts.results.trace import TraceResult


class LoadEntry(Model):
    """One iperf3 flow: ``mbit`` and ``retransmits`` (TCP) or ``lost_percent`` (UDP), or an
    ``error`` (then ``mbit`` is null)."""

    src: str = Field(description="sending VM")
    dst: str = Field(description="receiving VM")
    at_s: float = Field(description="start, s after bring-up")
    duration_s: float = Field(description="s")
    protocol: Protocol
    requested_mbit: float | None = Field(description="requested rate, Mbit/s; null: as fast "
                                                     "as TCP goes")
    mbit: float | None = Field(None, description="receiver goodput, Mbit/s (UDP: sent rate "
                                                 "less loss); null on error")
    retransmits: int | None = Field(None, description="TCP retransmissions (null for UDP)")
    lost_percent: float | None = Field(None, description="UDP datagrams lost, percent (null "
                                                         "for TCP)")
    error: str | None = Field(None, description="iperf3's error, null when it ran")


class Percentiles(Model):
    """Over iterations (each counts as its slowest rank's duration), s."""

    p50: float = Field(description="s")
    p90: float = Field(description="s")
    p99: float = Field(description="s")
    max: float = Field(description="s")
    mean: float = Field(description="s")


class Placement(Model):
    """Where a job's ranks ran (rank order) and what the truth says about it."""

    vms: list[str] = Field(description="VM of each rank")
    phys: list[str] = Field(description="physical host of each rank (truth)")
    shared_host_ranks: int = Field(description="ranks sharing their physical host with "
                                               "another rank (truth)")
    policy: PlacementKind


class JobEdge(Model):
    """A job's edge (``session.edge``): the pacer mode and congestion control in its VMs, and
    what the pacers sensed over the job (null without pacers)."""

    pacer: PacerMode
    cc: str | None = Field(description="congestion control set for the job; null: the VMs' "
                                       "own")
    retransmits: int | None = Field(description="TCP segments retransmitted in its VMs")
    rtos: int | None = Field(description="TCP retransmission timeouts in its VMs")
    owd_p99_us: float | None = Field(description="largest OWD p99 from one of its VMs toward "
                                                 "another, us (the pacers' probes)")


class Compute(Model):
    """A rank's compute every iteration (``JobConfig.compute``)."""

    kind: ComputeKind = Field(description="accelerator: gpu_s of accelerator time on the VM "
                              "clock (the host's CPU load does not slow it); cpu: "
                              "compute_units of CPU work; both; none")
    s_per_iteration: float | None = Field(description="accelerator time per iteration, s (VM "
                                          "clock); null without an accelerator, and for a "
                                          "trace job (per operation: its trace)")
    units: int = Field(description="compute_units: 128x128 matrix products per iteration")


class BalancerDestination(Model):
    """What a balancer daemon found towards one destination by its probes."""

    leaf: list[str] | None = Field(description="the routers before it (its leaf); null: in "
                                   "the daemon's own leaf, never pinned")
    dscp: list[int] = Field(description="one entropy value (DSCP) per distinct spine")


class BalancerDaemon(Model):
    """The report of one VM's balancer daemon (``workloads.lb.daemon``, schema nslab.balancer/1)
    when it stopped."""

    schema_: Literal["nslab.balancer/1"] = Field(alias="schema")
    polls: int = Field(description="sampling rounds of the VM's sockets")
    destinations: dict[str, BalancerDestination] = Field(description="by address")
    connections: int = Field(description="connections it pinned (towards other leaves)")
    moves: int = Field(description="idle connections moved to a less loaded path")
    bytes_by_path: dict[str, dict[str, int]] = Field(
        description="per destination leaf (the daemon's number for it), per DSCP: bytes "
        "its connections sent while pinned there (payload acknowledged and every segment's "
        "headers)")


class JobEntry(Model):
    """One job run. A job that failed before starting (no VMs could be chosen) has only
    ``name``, ``collective``, ``error``, ``verified`` false and ``completion_s`` null; every
    other field is then null. Timings need every rank: null when any rank failed."""

    name: str
    collective: str = Field(description="collective name, or the DDP workload")
    nccl_name: str | None = Field(None, description="NCCL's name of the collective")
    world: int | None = Field(None, description="ranks")
    bytes: int | None = Field(None, description="nccl-tests size, bytes")
    dtype: str | None = Field(None, description="element type, e.g. float32")
    iterations: int | None = Field(None, description="timed iterations")
    compute_units: int | None = Field(None, description="matrix products per iteration's "
                                                        "compute phase")
    compute: Compute | None = Field(None, description="what a rank computes every iteration")
    completion_s: float | None = Field(description="slowest rank's first-to-last timed "
                                                   "iteration, s (VM clocks)")
    iteration_s: Percentiles | None = Field(None, description="iteration time, s")
    comm_s: Percentiles | None = Field(None, description="collective time (trace jobs: "
                                       "communication not hidden behind compute), s")
    iteration_times_s: list[float] | None = Field(
        None, description="per timed iteration in order, its slowest rank's time, s; at most "
        "1000 points (each the largest of a run of consecutive iterations when more)")
    comm_times_s: list[float] | None = Field(
        None, description="per timed iteration, its slowest rank's collective time, s; "
        "points as iteration_times_s")
    algbw_bit_s: float | None = Field(None, description="nccl-tests algbw, bit/s")
    busbw_bit_s: float | None = Field(None, description="nccl-tests busbw, bit/s")
    wall_s: float | None = Field(None, description="launch to last exit, s (host clock)")
    verified: bool = Field(description="every rank verified every iteration")
    error: str | None = Field(None, description="null, or the ranks' errors, root causes "
                                                "first")
    failed_ranks: list[int] | None = Field(None, description="ranks that failed")
    placement: Placement | None = Field(None, description="null when it never started")
    edge: JobEdge | None = Field(None, description="its pacer and congestion control, and "
                                 "what the pacers sensed (null when it never started)")
    fabric_drops: int | None = Field(None, description="the lab's queue drops on every link "
                                     "(both ends) while the job ran, packets: the truth, "
                                     "whoever's packets (null when it never started)")
    drops_by_link: dict[str, int] | None = Field(
        None, description="fabric_drops per link ('a-b', both ends), links without drops left "
        "out (null when it never started)")
    balancer_daemons: dict[str, BalancerDaemon | None] | None = Field(
        None, description="a ddp job with a balancer: each VM's balancer daemon's report (null "
        "where it gave none); null for other jobs")
    trace: TraceResult | None = Field(None, description="a trace job's passes and operations "
                                      "(null for other jobs, or when a rank failed)")
