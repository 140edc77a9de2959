"""The results' ``jobs[].trace``: what ``workloads.traces.summary`` writes for a trace job.

Times of an operation are seconds from its pass's start on each rank's own VM clock; sizes
are nccl-tests sizes in bytes; bandwidths bit/s (nccl-tests, doc/PERFORMANCE.md).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from contracts.base import Model as _Model


class TracePass(_Model):
    """One timed training pass, over the ranks."""

    iteration_s: float = Field(description="the slowest rank's pass, s: from its first "
                               "operation's start to the next pass's (the last pass: to its "
                               "last operation's end)")
    compute_s: float = Field(description="the largest accelerator time of a rank in the "
                             "pass, s")
    exposed_comm_s: float = Field(description="the largest time a rank's pass was not "
                                  "computing: communication not hidden behind compute, s")


class TraceOp(_Model):
    """One operation of a pass (medians over the timed passes)."""

    name: str
    kind: Literal["compute", "delay", "collective", "send", "recv"]
    layer: str | None = Field(description="ASTRA-sim: the layer; Chakra: null")
    phase: str | None = Field(description="ASTRA-sim: fwd, ig, wg or update; Chakra: null")
    collective: str | None = Field(description="collectives: snake-case name")
    bytes: int | None = Field(description="communication: nccl-tests size (send/recv: the "
                              "message), bytes")
    group_size: int | None = Field(description="collectives: ranks in the group")
    peer: int | None = Field(description="send/recv: the other rank")
    start_s: float = Field(description="earliest start over the ranks, s from the pass start")
    end_s: float = Field(description="latest end over the ranks, s from the pass start")
    duration_s: float = Field(description="the slowest rank's duration, s")
    algbw_bit_s: float | None = Field(description="collectives: bytes / duration_s, bit/s")
    busbw_bit_s: float | None = Field(description="collectives: algbw times nccl-tests' bus "
                                      "factor of the group, bit/s")


class TraceLayer(_Model):
    """One layer's share of a pass (ASTRA-sim traces)."""

    layer: str
    compute_s: float = Field(description="its compute operations' durations, s")
    comm_s: float = Field(description="its collectives' durations (overlapped or not), s")
    bytes: int = Field(description="its collectives' sizes, bytes")


class TraceTimeline(_Model):
    """One rank's last timed pass: ``[op index, start_s, end_s]`` per operation."""

    rank: int = Field(description="the job's rank")
    ops: list[tuple[int, float, float]] = Field(description="[index in ops, start_s, end_s] "
                                                "per operation, s from the pass start")


class TraceResult(_Model):
    """A replayed trace: what it is, how it was scaled, and its passes and operations."""

    file: str = Field(description="the trace's file name (Chakra: the prefix)")
    format: Literal["astra", "chakra"]
    parallelism: str | None = Field(description="ASTRA-sim: DATA, HYBRID_TRANSFORMER or "
                                    "HYBRID_DLRM")
    model_parallel_group: int | None = Field(description="HYBRID_TRANSFORMER: ranks per "
                                             "model-parallel group")
    layers: int | None = Field(description="ASTRA-sim: layers in the file")
    clock_ghz: float = Field(description="the accelerator clock cycles were read at, GHz")
    compute_scale: float = Field(description="factor on every compute time and delay")
    bytes_scale: float = Field(description="factor on every size")
    compute_s_per_pass: float = Field(description="rank 0's scaled compute in one pass, s")
    passes: list[TracePass]
    ops: list[TraceOp]
    by_layer: list[TraceLayer]
    timeline: list[TraceTimeline]
