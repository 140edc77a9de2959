"""The results' sections about the agents: their cost, clock sync against the truth (and the
baselines on the same lab), one-way delays and collocation.

Units: us, ppm, s, bit/s, MiB.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from contracts.base import Model
from contracts.results.lab import P50Max


class AgentsCost(Model):
    """What the agents cost while they ran. A p50/max is null when no agent was measured;
    the coordinator's figures are null when its process was not found."""

    run_s: float = Field(description="agents' run time, s")
    agent_cpu_core: P50Max = Field(description="over agents: CPU time / run time, fraction "
                                               "of a core (0.03 = 3 %), from the end of "
                                               "start-up (the coordinator's first window) "
                                               "when the run lasted past it")
    agent_startup_cpu_s: P50Max = Field(default_factory=lambda: P50Max(p50=None, max=None),
                                        description="over agents: "
                                        "CPU seconds of start-up (imports, connecting), "
                                        "left out of agent_cpu_core; null if not marked")
    coordinator_cpu_core: float | None = Field(description="fraction of a core")
    probe_bit_s: P50Max = Field(description="over agents: probes sent, bit/s on the wire "
                                            "(Ethernet/IP/UDP headers counted)")
    probe_bytes: int = Field(description="one probe on the wire, bytes")
    agent_rss_mb: P50Max = Field(description="over agents: resident memory at the end, MiB")
    coordinator_rss_mb: float | None = Field(description="resident memory at the end, MiB")
    error: str | None = Field(None, description="set when the coordinator never answered "
                                                "(then sync, owd_us, collocation are absent)")


class Stats(Model):
    """Absolute errors against the truth; p50/p99/max null when ``n`` is 0."""

    p50: float | None = Field(description="median |error|, in the unit of the field")
    p99: float | None = Field(description="99th percentile |error|")
    max: float | None = Field(description="largest |error|")
    n: int = Field(description="errors scored (VM x window)")


class SyncErrors(Model):
    offset_error_us: Stats = Field(description="|offset error|, us")
    drift_error_ppm: Stats = Field(description="|drift error|, ppm")


class ChronySync(SyncErrors):
    """Real chronyd in every VM (``session.chrony``): what its clients achieved, from the
    truth: |client clock - server clock| (``offset_error_us``) and |frequency difference|
    (``drift_error_ppm``) sampled every 0.5 s after ``chrony.warmup_s``."""

    server: str = Field(description="the VM serving NTP from its own clock")
    by_vm: dict[str, Stats] = Field(default_factory=dict, description="|offset error| (us) of "
                                    "each client alone")
    converged_us: float = Field(description="the offset bound that defines convergence, us")
    converged_s: float | None = Field(description="s after chronyd started from which every "
                                                  "client stays within converged_us; null: "
                                                  "never")


class ClockDaemonRow(SyncErrors):
    """One client VM of the clock-daemon matrix (``session.clockd``): what its daemon
    achieved, from the truth: |client clock - reference clock| and |frequency difference|
    sampled every 0.5 s after ``clock_daemons.warmup_s``."""

    vm: str
    daemon: Literal["chrony", "ntpsec", "ptp4l"]
    converged_s: float | None = Field(description="s after the daemons started from which "
                                                  "every sample is within converged_us; "
                                                  "null: never")
    synced_log: str | None = Field(description="the daemon's first log line saying it "
                                               "synchronized; null: none")


class ClockDaemons(Model):
    """The clock-daemon matrix: unmodified daemons in VMs against one reference VM."""

    server: str = Field(description="the reference VM (NTP server, PTP grandmaster)")
    converged_us: float = Field(description="the offset bound that defines convergence, us")
    rows: list[ClockDaemonRow]


class SyncSeries(Model):
    """The offset errors per estimation window, by VM (the reference left out); at most 150
    windows (the last of each run of windows when more)."""

    t_s: list[float] = Field(description="window centre, true time, s after bring-up")
    offset_error_us: dict[str, list[float | None]] = Field(
        description="by VM: nslab's offset estimate - truth, us (signed); null where the VM "
                    "had no estimate")
    baseline_ntp_offset_error_us: dict[str, list[float | None]] = Field(
        description="by VM: the NTP-style estimate - truth, us (signed), same probes")


class SyncSection(SyncErrors):
    """nslab's clock estimates (Huygens) against the truth, and an NTP-style baseline on the
    same probes. Drift of the last ``drift_windows // 2`` windows (provisional in the
    coordinator) is not scored."""

    reference: str = Field(description="the coordinator's reference VM")
    windows: int = Field(description="estimation windows reported")
    baseline_ntp: SyncErrors = Field(description="NTP-style estimator, same probes")
    chrony: ChronySync | None = Field(None, description="real chronyd on the same lab (the "
                                      "scenario's chrony section); absent without it")
    clock_daemons: ClockDaemons | None = Field(None, description="the clock-daemon matrix on "
                                               "the same lab (the scenario's clock_daemons "
                                               "section); absent without it")
    converged_us: float = Field(description="the offset bound that defines convergence, us")
    converged_s: float | None = Field(description="s after the agents started to the end of "
                                                  "the first window from which every window's "
                                                  "offset errors stay within converged_us; "
                                                  "null: never")
    series: SyncSeries | None = Field(None, description="offset errors over time, per VM; "
                                      "null when not kept")


class OwdPair(Model):
    """One-way delay of one direction, corrected with the estimated clocks; delays null when
    no probe crossed (``n`` 0)."""

    min_us: float | None = Field(description="us")
    p50_us: float | None = Field(description="us")
    p99_us: float | None = Field(description="us")
    n: int = Field(description="probes")


class OwdSection(Model):
    pairs: dict[str, OwdPair] = Field(description='by direction "a->b"')
    asymmetry_us: dict[str, float | None] = Field(
        description='by pair "a|b": p50(a->b) - p50(b->a), us (> 0: a->b is slower); null '
                    "when a direction has no median")


class Group(Model):
    members: list[str] = Field(description="VMs the agents found on one physical host")
    confidence: float = Field(description="0-1")


class CollocationSection(Model):
    """The agents' collocation groups against the truth."""

    groups: list[Group] = Field(description="found by the agents, sorted")
    truth_groups: list[list[str]] = Field(description="VMs by physical host (singletons "
                                                      "included), sorted")
    precision: float = Field(description="pairwise precision, 0-1")
    recall: float = Field(description="pairwise recall, 0-1")
    detected_after_s: float | None = Field(description="s after the agents started from which "
                                                       "the groups equalled the truth to the "
                                                       "end; null: never")
