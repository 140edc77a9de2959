"""The vocabularies the scenario and the results share, each written once.

A scenario field and the results field that reports it use the same type from here, so a value
the scenario accepts is one the results can carry (``nslab schema scenario|results``).
"""
from __future__ import annotations

from typing import Literal, get_args

Collective = Literal["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                     "gather", "scatter", "all_to_all"]
"""NCCL's collective operations, snake case (NCCL: AllReduce, Broadcast, ...)."""
COLLECTIVES: tuple[str, ...] = get_args(Collective)

PacerMode = Literal["off", "sense", "pace"]
"""A job's pacers: none, measuring only, or holding (On-Ramp's rule)."""
ActivePacerMode = Literal["sense", "pace"]
"""A running pacer's mode (``PacerMode`` but ``off``)."""

PlacementPolicy = Literal["naive", "collocation_aware"]
"""How a job's VMs are chosen: in name order, or one per collocation group."""
PLACEMENT_POLICIES: tuple[str, ...] = get_args(PlacementPolicy)
PlacementKind = Literal[PlacementPolicy, "explicit"]
"""How a job's VMs were chosen (``explicit``: the scenario listed them)."""

BalancerMode = Literal["ecmp", "spray", "reps", "ethereal"]
"""ECMP and packet spraying (the fabric alone); REPS and Ethereal (the hosts' balancer)."""
LbCollective = Literal["all_to_all", "halving_doubling", "ring", "trace"]
"""The load-balancer comparison's jobs: AllToAll, an AllReduce algorithm, or the section's
trace replayed."""
AllReduceAlgo = Literal["ring", "halving_doubling"]
"""AllReduce algorithms."""
LbCase = Literal["symmetric", "link_down", "degraded"]
"""The load-balancer comparison's fabric conditions."""

CassiniModeName = Literal["fair", "shifted_synced", "shifted_raw", "unfair"]
"""CASSINI modes: fair sharing, time shifts on synced or raw clocks, unfair shares."""

TwoStepName = Literal["naive", "aware", "aware_paced", "aware_probe", "aware_bbr", "aware_cubic"]
"""The two-step story's steps."""

PacerDatapath = Literal["bpf", "probe"]
"""The pacer's datapath: ``bpf`` in the kernel (tc programs), ``probe`` UDP probes and HTB
switches from user space."""

PacerHold = Literal["auto", "edt", "refuse", "none"]
"""How the kernel datapath holds a destination: ``edt`` (sch_fq), ``refuse`` (TCP keeps the
segment), ``auto`` (edt where the kernel has sch_fq), ``none`` (no hold: the receivers'
window clamp alone)."""

SegmentKind = Literal["start", "step", "migrate", "vm_frequency", "vm_step", "vm_slew"]
"""Why a VM clock segment began (``agents.clock``)."""
SEGMENT_KINDS: tuple[str, ...] = get_args(SegmentKind)

CongestionControl = Literal["cubic", "bbr", "reno"]
"""TCP congestion control set on a job's connections (``TCP_CONGESTION``, tcp(7))."""
HostBalancer = Literal["none", "ethereal", "reps"]
"""The balancer inside a job's transport (``workloads.lb``)."""
ComputeKind = Literal["accelerator", "cpu", "both", "none"]
"""What a job's ranks compute every iteration (``workloads.config.JobConfig.compute``)."""

DdpModel = Literal["mlp", "transformer", "moe"]
"""The model a ddp job trains (``workloads.ddp_models``)."""

TraceFormat = Literal["auto", "astra", "chakra"]
"""A trace job's file format: told by its content, an ASTRA-sim text workload, or Chakra
execution traces (``workloads.traces``)."""

Protocol = Literal["tcp", "udp"]
"""A load flow's transport."""
