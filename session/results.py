"""The results document (schema ``nslab.results/1``): its typed models and its printed report.

``Results`` is the one definition of the document ``nslab run SCENARIO --json PATH`` writes;
``results_schema()`` is its JSON Schema (``nslab schema results``), from which the docs'
results reference is generated, with each field's units.

Sections always present: ``scenario``, ``lab``, ``truth``, ``teardown``. ``load``, ``agents``,
``sync``, ``owd_us``, ``collocation``, ``jobs``, ``placement_comparison``, ``cassini``,
``two_step``, ``pacer`` and ``lb`` appear when a scenario runs load, agents, jobs, CASSINI's
job sets, the two-step story and the load-balancer comparison: an absent section
means "not measured", never a placeholder, so ``dump`` and ``write`` leave it out. A None
*inside* a present section is written as null (a value that could not be measured this
time, e.g. a job's ``completion_s`` when a rank failed).

Units are in the field names and descriptions: ns, us, s; bit/s, Mbit/s; ppm; bytes, MiB;
fractions (0.03 = 3 %) and percent are said so.
"""
from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agents.messages import PacerReport
from lab.capabilities import as_json
from lab.events import Source, describe
from lab.links import LINK_KEYS

SCHEMA = "nslab.results/1"

OPTIONAL_SECTIONS = ("load", "agents", "sync", "owd_us", "collocation", "jobs",
                     "placement_comparison", "cassini", "two_step", "pacer", "lb")
"""Top-level sections present only when measured (absent otherwise, never null)."""


class _Model(BaseModel):
    # extra="forbid": a producer's new field must be added here first.
    # from_attributes: producers may hand in their own models/dataclasses (e.g. lab.events).
    model_config = ConfigDict(extra="forbid", from_attributes=True)


# -- scenario, lab ---------------------------------------------------------------------------
class ScenarioSection(_Model):
    """Which scenario ran."""

    name: str = Field(description="scenario name")
    source: str = Field(description="scenario file (path) or built-in name")
    seed: int = Field(description="random seed (placements, clocks)")
    duration_s: float = Field(description="timeline duration, s after bring-up")


class VmEntry(_Model):
    """One VM of the lab."""

    name: str
    ip: str | None = Field(description="IPv4 address (no prefix); null when it has none")
    leaf: str | None = Field(description="its leaf switch; null in a custom topology "
                                         "without leaves")
    phys: str = Field(description="physical host at the end of the run")


class LinkEntry(_Model):
    """One link and its emulation; an option the topology did not set is null."""

    a: str = Field(description="one end node")
    b: str = Field(description="the other end node")
    bw: float | None = Field(None, description="rate, Mbit/s (HTB)")
    delay: str | None = Field(None, description="one-way delay with its unit, e.g. '2ms' "
                                                "(netem)")
    jitter: str | None = Field(None, description="delay variation with its unit, e.g. "
                                                 "'50us' (netem)")
    loss: float | None = Field(None, description="random loss, percent")
    reorder: float | None = Field(None, description="reordering, percent (netem)")
    max_queue_size: int | None = Field(None, description="queue limit, packets")


class Capability(_Model):
    """One probed host feature (``nslab doctor``)."""

    name: str
    ok: bool
    detail: str = Field(description="what the probe saw")
    disables: str = Field(description="what a missing feature disables")
    fix: str = Field("", description="the command or package that brings a missing feature; "
                     "empty when ok")


class P50Max(_Model):
    """Median and maximum of a series; both null when the series is empty."""

    p50: float | None = Field(description="median, in the unit of the field")
    max: float | None = Field(description="maximum, in the unit of the field")


class Fraction(_Model):
    """Median and maximum of a fraction (0.5 = 50 %)."""

    p50: float = Field(description="median, fraction 0-1")
    max: float = Field(description="maximum, fraction 0-1")


class CoreLoad(_Model):
    """One CPU core over the run (``lab.saturation``)."""

    cpu: int = Field(description="core number, as in /proc/stat (cpuN)")
    busy: Fraction = Field(description="busy fraction (all but idle and iowait)")
    softirq: Fraction = Field(description="softirq fraction (veth forwarding, qdiscs)")
    hot_share: float = Field(description="fraction of the samples with this core >= 90 % "
                                         "busy")
    saturated: bool = Field(description="hot_share >= 0.25")


class QueueLoad(_Model):
    """One shaped link direction whose queue held packets at both ends of a sample
    (``lab.saturation``)."""

    link: str = Field(description="direction, `a->b` (a sends)")
    bw_mbit: float = Field(description="configured rate in its last queued sample, Mbit/s")
    queued_samples: int = Field(description="samples whose queue held packets at both ends")
    rate_ratio: Fraction = Field(description="rate sent / configured rate in those samples "
                                             "(Ethernet headers counted, as HTB does)")
    starved_samples: int = Field(description="queued samples with a core >= 90 % busy in "
                                             "which it sent < 80 % of its rate")
    cpu_limited: bool = Field(description="probably limited by the CPU, not its rate: "
                                          "starved in >= 2 samples and in >= half of those "
                                          "queued while a core was >= 90 % busy")


class FidelitySeries(_Model):
    """The fidelity samples over time, from bring-up on; at most 240 points, each the mean
    of a run of consecutive samples (``lab.fidelity.series``)."""

    t_s: list[float] = Field(description="end of each point, s after bring-up")
    cpu_busy: list[float | None] = Field(description="busy fraction of all cores, 0-1")
    busiest_core: list[float | None] = Field(description="busy fraction of the busiest core, "
                                                         "0-1")
    links: dict[str, list[float | None]] = Field(
        description='by shaped direction "a->b": rate sent / configured rate (utilization, '
                    "0-1, Ethernet headers counted; a point may read a little above 1 when "
                    "the counters were read late); null where not read; directions below "
                    "1 % throughout left out")


class Fidelity(_Model):
    """Was the machine saturated while the scenario ran, and where? With no sample only
    ``samples`` (0) is set; the rest is null. Rules: ``lab/saturation.py``."""

    samples: int = Field(description="CPU samples taken")
    interval_s: float | None = Field(None, description="sampling interval, s")
    cpu_busy: Fraction | None = Field(None, description="busy fraction of all cores")
    busiest_core: Fraction | None = Field(None, description="busy fraction of the busiest "
                                                            "core")
    softirq: Fraction | None = Field(None, description="softirq fraction of all cores")
    saturated_share: float | None = Field(None, description="fraction of the samples with "
                                                            "all cores >= 90 % busy")
    cores: list[CoreLoad] | None = Field(None, description="per core")
    queues: list[QueueLoad] | None = Field(None, description="shaped link directions that "
                                                             "queued; null when the link "
                                                             "queues were not read")
    queues_error: str | None = Field(None, description="why reading the link queues "
                                                       "stopped; null when it did not")
    saturated: bool | None = Field(description="saturated_share >= 0.25 or a queue "
                                               "cpu_limited: timing results are not "
                                               "trustworthy; null without samples")
    series: FidelitySeries | None = Field(None, description="the samples over time (CPU, "
                                          "link utilization); null when not kept")


class LabSection(_Model):
    """The lab that was built."""

    name: str = Field(description="lab name (prefix of its kernel objects)")
    bringup_s: float = Field(description="bring-up time, s")
    teardown_s: float = Field(description="teardown time, s")
    nodes: int = Field(description="nodes (VMs, switches, routers)")
    fabric: str = Field("ecmp", description="fabric mode: ecmp, spray or entropy (lab.fabric)")
    vms: list[VmEntry]
    links: list[LinkEntry]
    capabilities: dict[str, Capability] = Field(description="by capability name")
    fidelity: Fidelity


# -- truth -----------------------------------------------------------------------------------
class Wander(_Model):
    """One cosine of an oscillator's frequency wander."""

    amplitude_ppm: float = Field(description="ppm")
    period_s: float = Field(description="s")
    phase_rad: float = Field(description="rad")


class Oscillator(_Model):
    """A physical host's oscillator: base drift plus wander."""

    base_ppm: float = Field(description="base frequency error, ppm")
    wander: list[Wander]


class Segment(_Model):
    """A stretch of a VM's clock (a new one starts at a clock step, a migration, or a
    correction the VM made to its own clock: adjtimex, settimeofday)."""

    start_ns: int = Field(description="true time the segment starts, ns (CLOCK_REALTIME)")
    offset_ns: float = Field(description="t_vm - t at the start, ns")
    host: str = Field(description="physical host whose oscillator drives it")
    kind: Literal["start", "step", "migrate", "vm_frequency", "vm_step"] = Field(
        "start", description="what started it: the lab (start, step, migrate) or the VM's own "
        "discipline (vm_frequency: adjtimex frequency/tick; vm_step: settimeofday, "
        "clock_settime, ADJ_SETOFFSET)")
    corr_ppm: float = Field(0.0, description="the VM's own frequency correction in force, ppm "
                                             "(on top of its host's oscillator)")


class Clocks(_Model):
    oscillators: dict[str, Oscillator] = Field(description="by physical host")
    vms: dict[str, list[Segment]] = Field(description="by VM: its clock segments")


class FaultEvent(_Model):
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


class TruthSection(_Model):
    """What really happened (the lab injected it), to score the agents against."""

    placements: dict[str, str] = Field(description="VM -> physical host at the start")
    placements_end: dict[str, str] = Field(description="VM -> physical host at the end")
    clocks: Clocks
    faults: list[FaultEvent] = Field(description="the fault timeline, in time order")


# -- measured sections -----------------------------------------------------------------------
class LoadEntry(_Model):
    """One iperf3 flow: ``mbit`` and ``retransmits`` (TCP) or ``lost_percent`` (UDP), or an
    ``error`` (then ``mbit`` is null)."""

    src: str = Field(description="sending VM")
    dst: str = Field(description="receiving VM")
    at_s: float = Field(description="start, s after bring-up")
    duration_s: float = Field(description="s")
    protocol: Literal["tcp", "udp"]
    requested_mbit: float | None = Field(description="requested rate, Mbit/s; null: as fast "
                                                     "as TCP goes")
    mbit: float | None = Field(None, description="receiver goodput, Mbit/s (UDP: sent rate "
                                                 "less loss); null on error")
    retransmits: int | None = Field(None, description="TCP retransmissions (null for UDP)")
    lost_percent: float | None = Field(None, description="UDP datagrams lost, percent (null "
                                                         "for TCP)")
    error: str | None = Field(None, description="iperf3's error, null when it ran")


class AgentsCost(_Model):
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


class Stats(_Model):
    """Absolute errors against the truth; p50/p99/max null when ``n`` is 0."""

    p50: float | None = Field(description="median |error|, in the unit of the field")
    p99: float | None = Field(description="99th percentile |error|")
    max: float | None = Field(description="largest |error|")
    n: int = Field(description="errors scored (VM x window)")


class SyncErrors(_Model):
    offset_error_us: Stats = Field(description="|offset error|, us")
    drift_error_ppm: Stats = Field(description="|drift error|, ppm")


class ChronySync(SyncErrors):
    """Real chronyd in every VM (``session.chrony``): what its clients achieved, from the
    truth: |client clock - server clock| (``offset_error_us``) and |frequency difference|
    (``drift_error_ppm``) sampled every 0.5 s after ``chrony.warmup_s``."""

    server: str = Field(description="the VM serving NTP from its own clock")
    converged_us: float = Field(description="the offset bound that defines convergence, us")
    converged_s: float | None = Field(description="s after chronyd started from which every "
                                                  "client stays within converged_us; null: "
                                                  "never")


class SyncSeries(_Model):
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
    converged_us: float = Field(description="the offset bound that defines convergence, us")
    converged_s: float | None = Field(description="s after the agents started to the end of "
                                                  "the first window from which every window's "
                                                  "offset errors stay within converged_us; "
                                                  "null: never")
    series: SyncSeries | None = Field(None, description="offset errors over time, per VM; "
                                      "null when not kept")


class OwdPair(_Model):
    """One-way delay of one direction, corrected with the estimated clocks; delays null when
    no probe crossed (``n`` 0)."""

    min_us: float | None = Field(description="us")
    p50_us: float | None = Field(description="us")
    p99_us: float | None = Field(description="us")
    n: int = Field(description="probes")


class OwdSection(_Model):
    pairs: dict[str, OwdPair] = Field(description='by direction "a->b"')
    asymmetry_us: dict[str, float | None] = Field(
        description='by pair "a|b": p50(a->b) - p50(b->a), us (> 0: a->b is slower); null '
                    "when a direction has no median")


class Group(_Model):
    members: list[str] = Field(description="VMs the agents found on one physical host")
    confidence: float = Field(description="0-1")


class CollocationSection(_Model):
    """The agents' collocation groups against the truth."""

    groups: list[Group] = Field(description="found by the agents, sorted")
    truth_groups: list[list[str]] = Field(description="VMs by physical host (singletons "
                                                      "included), sorted")
    precision: float = Field(description="pairwise precision, 0-1")
    recall: float = Field(description="pairwise recall, 0-1")
    detected_after_s: float | None = Field(description="s after the agents started from which "
                                                       "the groups equalled the truth to the "
                                                       "end; null: never")


class Percentiles(_Model):
    """Over iterations (each counts as its slowest rank's duration), s."""

    p50: float = Field(description="s")
    p90: float = Field(description="s")
    p99: float = Field(description="s")
    max: float = Field(description="s")
    mean: float = Field(description="s")


class Placement(_Model):
    """Where a job's ranks ran (rank order) and what the truth says about it."""

    vms: list[str] = Field(description="VM of each rank")
    phys: list[str] = Field(description="physical host of each rank (truth)")
    shared_host_ranks: int = Field(description="ranks sharing their physical host with "
                                               "another rank (truth)")
    policy: Literal["naive", "collocation_aware", "explicit"]


class JobEdge(_Model):
    """A job's edge (``session.edge``): the pacer mode and congestion control in its VMs, and
    what the pacers sensed over the job (null without pacers)."""

    pacer: Literal["off", "sense", "pace"]
    cc: str | None = Field(description="congestion control set for the job; null: the VMs' "
                                       "own")
    retransmits: int | None = Field(description="TCP segments retransmitted in its VMs")
    rtos: int | None = Field(description="TCP retransmission timeouts in its VMs")
    owd_p99_us: float | None = Field(description="largest OWD p99 from one of its VMs toward "
                                                 "another, us (the pacers' probes)")


class JobEntry(_Model):
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
    completion_s: float | None = Field(description="slowest rank's first-to-last timed "
                                                   "iteration, s (VM clocks)")
    iteration_s: Percentiles | None = Field(None, description="iteration time, s")
    comm_s: Percentiles | None = Field(None, description="collective time, s")
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


class PlacementComparison(_Model):
    """Naive vs collocation-aware completion, when both jobs completed."""

    naive_s: float = Field(description="naive job's completion, s")
    aware_s: float = Field(description="collocation-aware job's completion, s")
    ratio: float = Field(description="aware_s / naive_s")
    aware_avoided_shared_hosts: bool
    naive_shared_host_ranks: int = Field(description="ranks of the naive job sharing a host")


class CassiniJobTimes(_Model):
    """One job's iteration times in one mode (an iteration counts as its slowest rank's)."""

    p50_s: float = Field(description="median iteration time, s")
    p99_s: float = Field(description="99th percentile iteration time, s")


class CassiniMode(_Model):
    """A set's jobs run together in one mode; times over every iteration of every job."""

    mean_iteration_s: float | None = Field(description="mean iteration time, s")
    p99_iteration_s: float | None = Field(description="99th percentile iteration time, s")
    jobs: dict[str, CassiniJobTimes] = Field(default_factory=dict, description="per job")
    comm_overlap: float | None = Field(None, description="fraction of the jobs' collective "
                                       "time during which another job of the set was in its "
                                       "collective too (true time, from the ranks' own "
                                       "timestamps and the lab's clock truth); 0 = fully "
                                       "interleaved")
    comm_overlap_thirds: list[float | None] = Field(
        default_factory=list, description="comm_overlap in each third of the run (by the "
        "collectives' start, true time): how the interleaving held as the clocks drifted; "
        "null for a third without collectives")
    mean_iteration_thirds_s: list[float | None] = Field(
        default_factory=list, description="mean iteration time in each third of the run "
        "(each job's iterations cut in three runs of consecutive ones, pooled over the set), "
        "s")
    skipped_slots: int | None = Field(None, description="slots the jobs let pass, being later "
                                      "for them than their late_s (per job its slowest rank's "
                                      "count, summed; 0 without slots)")
    slot_error_ms: list[float] | None = Field(None, description="on slots: how far apart in "
                                              "true time the ranks' clocks start a slot the "
                                              "plan puts at one time (largest minus smallest "
                                              "error over the set's ranks), at the first and at "
                                              "the last nominal slot, ms: what the agents' "
                                              "correction leaves, or the raw clocks' offsets "
                                              "and drift; null without slots")
    error: str | None = Field(None, description="why the mode has no times")


class CassiniProfile(_Model):
    """A job's iteration measured alone (``scheduler.plan.Profile``)."""

    iteration_s: float = Field(description="p50 iteration time alone, s")
    compute_s: float = Field(description="p50 compute phase, s")
    comm_s: float = Field(description="p50 collective phase, s")
    demand_mbit: float = Field(description="bus bandwidth while communicating, Mbit/s")


class CassiniSet(_Model):
    """One set of jobs sharing a link: its CASSINI plan and the modes it ran in."""

    name: str
    score: float | None = Field(description="compatibility score at the best rotation (1 = "
                                            "fully compatible); null when it could not be "
                                            "planned")
    unshifted_score: float | None = Field(None, description="score with every shift 0")
    predicted_compatible: bool | None = Field(description="score >= the scenario's threshold")
    perimeter_s: float | None = Field(None, description="unified circle's perimeter, s")
    slots_s: dict[str, float] | None = Field(None, description="per job: its slot period, s")
    shifts_s: dict[str, float] | None = Field(description="per job: its time shift, s")
    late_s: dict[str, float | None] | None = Field(None, description="per job: its clearance, "
                                                   "how much later than its slot it may start "
                                                   "(later: it waits for the next slot), s; "
                                                   "null: starts at once however late")
    profiles: dict[str, CassiniProfile] | None = Field(None, description="per job, alone")
    error: str | None = Field(None, description="why the set could not be planned")
    modes: dict[str, CassiniMode] = Field(description="fair, shifted_synced, shifted_raw, "
                                                      "unfair (those that ran)")


class CassiniSection(_Model):
    """CASSINI's sets (``session.cassini``)."""

    sets: list[CassiniSet]
    score_ranks_gains: bool | None = Field(description="the scores rank the sets in the "
                                                       "order of their measured gains (fair / "
                                                       "shifted_synced mean); null with fewer "
                                                       "than two")


class TwoStepStep(_Model):
    """One step of the two-step story (``session.two_step``)."""

    name: Literal["naive", "aware", "aware_paced", "aware_bbr", "aware_cubic"]
    vms: list[str] = Field(description="the job's VMs, rank order")
    pacer: Literal["sense", "pace"] = Field(description="sense: measuring only; pace: "
                                                        "On-Ramp's hold")
    cc: str | None = Field(description="congestion control set for the step; null: the "
                                       "VMs' own")
    completion_s: float | None = Field(description="the job's completion, s (VM clocks)")
    fabric_drops: int | None = Field(description="queue drops on every fabric and VM link "
                                                 "during the step, packets (the truth)")
    probes_lost: int | None = Field(None, description="the pacers' own OWD probes between the "
                                    "job's VMs that never came back: part of fabric_drops")
    retransmits: int | None = Field(description="TCP segments retransmitted in the job's "
                                                "VMs (the pacers' sensing)")
    rtos: int | None = Field(description="TCP retransmission timeouts in the job's VMs")
    owd_p99_us: float | None = Field(description="largest OWD p99 between the job's VMs, us")
    verified: bool = Field(description="every rank verified every iteration")
    error: str | None = Field(description="null, or why the step failed")


class TwoStepSection(_Model):
    """Naive -> collocation-aware -> aware + pacer, with the BBR and CUBIC baselines."""

    job: str = Field(description="the scenario's job the steps run")
    steps: list[TwoStepStep]
    ratios: dict[str, float | None] = Field(description="aware and aware_paced completion as "
                                                        "fractions of naive")
    seed_ratios: dict[str, float] = Field(description="the seed product's ratios (0.92, 0.74)")


class PacerSection(_Model):
    """The pacers' parameters and their last reports in the paced step."""

    threshold_us: float = Field(description="On-Ramp's threshold T, us")
    max_hold_us: float = Field(description="longest single hold, us")
    probe_us: float = Field(description="OWD probe period per active destination, us")
    predict: bool = Field(description="holds on the OWD extrapolated to now (agents/gate.py)")
    fresh: bool = Field(description="a hold lasts until a sample sent during it is below T "
                                    "(agents/gate.py)")
    spread: bool = Field(False, description="a fresh release waits a per-VM draw in [0, the "
                                            "hold's largest OWD - T) (agents/gate.py; absent "
                                            "before it existed: False)")
    reports: dict[str, PacerReport] = Field(description="by VM: its last PacerReport "
                                                        "(agents/API.md)")


class LbRun(_Model):
    """One run of the load-balancer comparison (``session.lb``)."""

    mode: Literal["ecmp", "spray", "reps", "ethereal"] = Field(
        description="ecmp, spray: the fabric alone; reps, ethereal: the hosts' balancer on the "
        "entropy fabric")
    collective: Literal["all_to_all", "halving_doubling", "ring"] = Field(
        description="all_to_all, or an AllReduce algorithm")
    case: Literal["symmetric", "link_down", "degraded"]
    oversubscription: float = Field(description="a leaf's VM rate / its uplink rate (1: 1:1)")
    completion_s: float | None = Field(description="the job's completion, s (VM clocks); "
                                                   "null when it did not finish")
    imbalance: float | None = Field(description="max / mean of the bytes on the leaf-spine "
                                                "links (both directions, the lab's counters; "
                                                "link_down: the failed link's spine left out); "
                                                "1.0 is perfect")
    retransmits: int | None = Field(description="TCP segments the ranks retransmitted "
                                                "(TCP_INFO, warm-up included)")
    rtos: int | None = Field(description="the ranks' TCP retransmission timeouts (TCP_INFO; "
                                         "null before Linux 6.7)")
    reordering: int | None = Field(description="reordering events the ranks' TCP senders "
                                               "detected (TCP_INFO reord_seen; losses are not "
                                               "counted)")
    finished: bool = Field(description="every rank verified every iteration in time")
    fault_at_s: float | None = Field(description="link_down: when the link went down, s after "
                                                 "the job's launch")
    link_bytes: dict[str, int] = Field(description="bytes per leaf-spine link (leaf-spine) "
                                                   "during the run")
    link_bytes_at_fault: dict[str, int] = Field(description="link_down: bytes per leaf-spine "
                                                "link from the run's start until the link was "
                                                "down and the routes around it (empty "
                                                "otherwise)")
    balancer_events: dict[str, int] = Field(description="the ranks' balancer counters summed: "
                                            "ethereal failed_marks, moves, path_changes; reps "
                                            "clean_acks, marked_acks, freezes (empty for "
                                            "ecmp, spray)")
    error: str | None = Field(description="null, or why the run failed")


class LbRatio(_Model):
    """Every mode's completion as a fraction of ECMP's in the same conditions."""

    oversubscription: float = Field(description="a leaf's VM rate / its uplink rate")
    collective: str
    case: str
    ecmp_s: float | None = Field(description="ECMP's completion, s")
    to_ecmp: dict[str, float | None] = Field(description="mode -> completion / ECMP's")


class LbSection(_Model):
    """ECMP, packet spraying, REPS and Ethereal compared (``session.lb``)."""

    runs: list[LbRun]
    ratios: list[LbRatio]
    paper: dict[str, float] = Field(description="Ethereal's completion as a fraction of "
                                                "spraying's and REPS's at best, in the paper")


class Teardown(_Model):
    clean: bool = Field(description="nothing of the lab was left")
    leftovers: list[str] = Field(description="kernel objects or processes left")
    seconds: float = Field(description="teardown time, s")


class Results(_Model):
    """The ``nslab.results/1`` document. Optional sections are absent when not measured."""

    # ``schema`` would shadow a BaseModel attribute: the field is ``schema_``, written
    # ``schema`` (its alias); both names are accepted on input.
    model_config = ConfigDict(title="nslab.results/1", populate_by_name=True)

    schema_: Literal["nslab.results/1"] = Field(alias="schema",
                                                description="document schema and version")
    created: str = Field(description="ISO 8601 time (UTC) the document was made")
    scenario: ScenarioSection
    lab: LabSection
    truth: TruthSection
    teardown: Teardown
    load: list[LoadEntry] | None = Field(None, description="per iperf3 flow")
    agents: AgentsCost | None = None
    sync: SyncSection | None = None
    owd_us: OwdSection | None = None
    collocation: CollocationSection | None = None
    jobs: list[JobEntry] | None = Field(None, description="per job, in scenario order")
    placement_comparison: PlacementComparison | None = None
    cassini: CassiniSection | None = None
    two_step: TwoStepSection | None = None
    pacer: PacerSection | None = None
    lb: LbSection | None = None


def results_schema() -> dict:
    """The JSON Schema of ``nslab.results/1`` (``nslab schema results``)."""
    return Results.model_json_schema(by_alias=True)


def validate(doc: Results | Mapping) -> Results:
    """``doc`` as a ``Results``.

    Raises:
        pydantic.ValidationError: a field missing or of the wrong type (with its path).
    """
    return doc if isinstance(doc, Results) else Results.model_validate(dict(doc))


def dump(results: Results | Mapping) -> dict:
    """The JSON-ready document: every field (None as null), minus absent optional sections."""
    res = validate(results)
    absent = {k for k in OPTIONAL_SECTIONS if getattr(res, k) is None}
    return res.model_dump(mode="json", by_alias=True, exclude_none=False, exclude=absent)


# -- building it -----------------------------------------------------------------------------
def lab_section(lab, caps: dict, fidelity: dict) -> LabSection:
    """``lab``: bring-up/teardown seconds, VMs, links, capabilities, fidelity."""
    topo = lab.topo
    vms = [{"name": vm, "ip": topo.nodeInfo(vm).get("ip", "").split("/")[0] or None,
            "leaf": topo.nodeInfo(vm).get("leaf"), "phys": lab.phys[vm]} for vm in topo.hosts()]
    links = [{"a": a, "b": b, **{k: info[k] for k in LINK_KEYS if k in info}}
             for a, b, info in topo.links(withInfo=True)]
    return LabSection(name=lab.name, bringup_s=round(lab.bringup_s or 0, 3),
                      teardown_s=round(lab.teardown_s or 0, 3), nodes=len(topo.nodes()),
                      fabric=lab.fabric, vms=vms, links=links, capabilities=as_json(caps),
                      fidelity=fidelity)


def truth_section(lab, placements_at_start: dict) -> TruthSection:
    """``truth``: placements (at start and at the end), clocks, fault timeline."""
    return TruthSection(placements=placements_at_start, placements_end=dict(lab.phys),
                        clocks=lab.clocks.truth(), faults=list(lab.timeline))


def build(scenario, source: str, lab, caps: dict, fidelity: dict, placements: dict,
          **sections) -> Results:
    """The typed document of a finished run.

    Args:
        scenario: the ``Scenario`` (name, seed, duration_s).
        source: the scenario file.
        lab: the stopped ``Lab`` (topo, phys, clocks, timeline, bring-up/teardown times).
        caps: ``lab.capabilities.probe()``.
        fidelity: ``FidelitySampler.summary()``.
        placements: VM -> physical host at the start.
        sections: optional sections by name (``OPTIONAL_SECTIONS``); None means absent.

    Raises:
        pydantic.ValidationError: a section that does not fit the model (field path named).
        TypeError: an unknown section name.
    """
    unknown = set(sections) - set(OPTIONAL_SECTIONS)
    if unknown:
        raise TypeError(f"unknown results sections: {', '.join(sorted(unknown))}")
    return Results.model_validate({
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "scenario": {"name": scenario.name, "source": source, "seed": scenario.seed,
                     "duration_s": scenario.duration_s},
        "lab": lab_section(lab, caps, fidelity),
        "truth": truth_section(lab, placements),
        "teardown": {"clean": not lab.leftovers, "leftovers": lab.leftovers,
                     "seconds": round(lab.teardown_s or 0, 3)},
        **sections,
    })


def document(scenario, source: str, lab, caps: dict, fidelity: dict, placements: dict,
             **sections) -> dict:
    """``build(...)`` as the JSON-ready dict (``dump``): validated by ``Results``; callers
    may still add optional sections to it, ``report`` and ``write`` validate again."""
    return dump(build(scenario, source, lab, caps, fidelity, placements, **sections))


def write(results: Results | Mapping, path: str) -> None:
    """Write the document as JSON to ``path`` (``-``: stdout).

    Raises:
        pydantic.ValidationError: a dict that is not a valid document.
    """
    text = json.dumps(dump(results), indent=1) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    with open(path, "w") as f:
        f.write(text)


# -- the printed report ----------------------------------------------------------------------
def report(results: Results | Mapping) -> str:
    """A human-readable summary of a results document (what ``nslab run`` prints).

    Raises:
        pydantic.ValidationError: a dict that is not a valid document.
    """
    doc = validate(results)
    lab, truth, sc = doc.lab, doc.truth, doc.scenario
    fid = lab.fidelity
    lines = [f"nslab run: {sc.name} (seed {sc.seed}, {sc.duration_s} s)",
             f"  lab {lab.name}: {lab.nodes} nodes, {len(lab.vms)} VMs, "
             f"{len(lab.links)} links; up in {lab.bringup_s} s, "
             f"down in {lab.teardown_s} s",
             "  physical hosts:"]
    by_host: dict[str, list[str]] = {}
    for vm, host in truth.placements.items():
        by_host.setdefault(host, []).append(vm)
    oscs = truth.clocks.oscillators
    for host, members in sorted(by_host.items()):
        osc = oscs.get(host)
        drift = f"{osc.base_ppm:+8.3f}" if osc else f"{'?':>8s}"
        lines.append(f"    {host:8s} drift {drift} ppm  VMs {' '.join(members)}")
    lines.append("  timeline:")
    for ev in truth.faults:
        lines.append(f"    {ev.t_s:7.2f} s  {ev.kind:11s} {describe('', ev.target, ev.params)}")
    if fid.samples and fid.cpu_busy and fid.softirq:
        lines.append("  " + fidelity_line(fid))
    for f in doc.load or []:
        got = f"{f.mbit} Mbit/s" if f.mbit is not None else f"error: {f.error}"
        lines.append(f"  load {f.protocol} {f.src}->{f.dst} at {f.at_s} s for "
                     f"{f.duration_s} s: {got}")
    lines += _agents_report(doc)
    for j in doc.jobs or []:
        where = " ".join(j.placement.vms) if j.placement else ""
        shared = j.placement.shared_host_ranks if j.placement else None
        if j.error:
            lines.append(f"  job {j.name} ({j.collective}) on {where or '-'}: "
                         f"ERROR {j.error}")
            continue
        p50 = j.iteration_s.p50 if j.iteration_s else 0
        completion = f"{j.completion_s:.3f}" if j.completion_s is not None else "-"
        lines.append(f"  job {j.name} ({j.collective}, {j.bytes} B) on {where} "
                     f"[{shared} ranks share a host]: completion {completion} s, "
                     f"iteration p50 {p50:.4f} s, verified {j.verified}")
    cmp_ = doc.placement_comparison
    if cmp_:
        lines.append(f"  collocation-aware placement: {cmp_.aware_s:.3f} s vs naive "
                     f"{cmp_.naive_s:.3f} s (ratio {cmp_.ratio}); avoided shared hosts: "
                     f"{cmp_.aware_avoided_shared_hosts}")
    lines += _cassini_report(doc)
    lines += _two_step_report(doc)
    lines += _lb_report(doc)
    td = doc.teardown
    state = "clean" if td.clean else "LEFTOVERS " + ", ".join(td.leftovers)
    lines.append(f"  teardown: {state}")
    return "\n".join(lines)


def fidelity_line(fid: Fidelity) -> str:
    """The fidelity section in one line: saturated or not, which cores were (busy >= 90 % in
    >= 25 % of the samples, with their softirq share), which link directions the CPU
    probably limited, e.g. ``fidelity: SATURATED - cpu1 busy >= 90% for 62% of the run
    (softirq p50 41%); links probably CPU-limited: leaf1->spine1 (sent 55% of its rate while
    queued); distrust timings``. Needs a section with samples (``cpu_busy`` set)."""
    hot = [f"cpu{c.cpu} busy >= 90% for {c.hot_share:.0%} of the run (softirq p50 "
           f"{c.softirq.p50:.0%})" for c in fid.cores or [] if c.saturated]
    parts = [f"CPU busy p50 {fid.cpu_busy.p50:.0%} max {fid.cpu_busy.max:.0%}, softirq max "
             f"{fid.softirq.max:.0%}"]
    if fid.cores is not None:
        parts = [", ".join(hot)] if hot and fid.saturated else parts + [
            ", ".join(hot) if hot else "no core saturated"]
    if fid.queues is not None:
        limited = [f"{q.link} (sent {q.rate_ratio.p50:.0%} of its rate while queued)"
                   for q in fid.queues if q.cpu_limited]
        parts.append("links probably CPU-limited: " + ", ".join(limited) if limited
                     else "no link queue limited by the CPU")
    if fid.queues_error:
        parts.append(f"link queues not read: {fid.queues_error}")
    if fid.saturated:
        return f"fidelity: SATURATED - {'; '.join(parts)}; distrust timings"
    return f"fidelity: ok - {'; '.join(parts)}"


def _cassini_report(doc: Results) -> list[str]:
    if doc.cassini is None:
        return []
    lines = []
    for cs in doc.cassini.sets:
        if cs.score is None:
            lines.append(f"  cassini {cs.name}: not planned ({cs.error})")
            continue
        shifts = " ".join(f"{j} {t:.3f}" for j, t in (cs.shifts_s or {}).items())
        lines.append(f"  cassini {cs.name}: score {cs.score:.3f} (unshifted "
                     f"{cs.unshifted_score:.3f}), compatible {cs.predicted_compatible}, "
                     f"shifts s: {shifts}")
        fair = cs.modes.get("fair")
        for name, m in cs.modes.items():
            if m.mean_iteration_s is None:
                lines.append(f"    {name:15s} {m.error}")
                continue
            ratio = (f" (fair / this: mean {fair.mean_iteration_s / m.mean_iteration_s:.2f}, "
                     f"p99 {fair.p99_iteration_s / m.p99_iteration_s:.2f})"
                     if fair and fair.mean_iteration_s and name != "fair" else "")
            overlap = ("" if m.comm_overlap is None else
                       f", collectives overlapping {m.comm_overlap:.0%}")
            lines.append(f"    {name:15s} iteration mean {m.mean_iteration_s:.3f} s, p99 "
                         f"{m.p99_iteration_s:.3f} s{ratio}{overlap}")
    lines.append(f"  cassini: scores rank the sets' gains: {doc.cassini.score_ranks_gains}")
    return lines


def _two_step_report(doc: Results) -> list[str]:
    ts = doc.two_step
    if ts is None:
        return []
    lines = [f"  two_step (job {ts.job}):"]
    for st in ts.steps:
        if st.completion_s is None:
            lines.append(f"    {st.name:12s} ERROR {st.error}")
            continue
        owd = f"{st.owd_p99_us:.0f} us" if st.owd_p99_us is not None else "-"
        probes = f" ({st.probes_lost} probes)" if st.probes_lost is not None else ""
        lines.append(f"    {st.name:12s} {st.completion_s:7.3f} s  drops {st.fabric_drops:5d}"
                     f"{probes}  "
                     f"retrans {st.retransmits if st.retransmits is not None else '-':>5}  "
                     f"RTOs {st.rtos if st.rtos is not None else '-':>3}  OWD p99 {owd:>9s}"
                     f"  {' '.join(st.vms)}{'' if st.verified else '  NOT VERIFIED'}")
    got = ", ".join(f"{k} {v if v is not None else '-'} (seed {ts.seed_ratios.get(k)})"
                    for k, v in ts.ratios.items())
    lines.append(f"    completion as a fraction of naive: {got}")
    return lines


def _lb_report(doc: Results) -> list[str]:
    if doc.lb is None:
        return []
    lines = ["  load balancers (completion s / ECMP's, imbalance max/mean, retransmits, "
             "reordering):"]
    by_key = {(r.oversubscription, r.collective, r.case, r.mode): r for r in doc.lb.runs}
    for ratio in doc.lb.ratios:
        cells = []
        for mode, x in ratio.to_ecmp.items():
            r = by_key[(ratio.oversubscription, ratio.collective, ratio.case, mode)]
            if not r.finished:
                cells.append(f"{mode} FAILED")
                continue
            imb = f"{r.imbalance:.2f}" if r.imbalance is not None else "-"
            cells.append(f"{mode} {r.completion_s:.3f} ({x if x is not None else '-'}) {imb} "
                         f"{r.retransmits} {r.reordering}")
        lines.append(f"    1:{ratio.oversubscription:g} {ratio.collective:16s} {ratio.case:9s} "
                     + "  ".join(cells))
    errors = [f"{r.mode} {r.collective} {r.case}: {r.error}" for r in doc.lb.runs if r.error]
    lines += [f"    error {e}" for e in errors]
    lines.append(f"    paper (Astra-Sim): Ethereal at best {doc.lb.paper['ethereal_vs_spray']} "
                 f"of spraying, {doc.lb.paper['ethereal_vs_reps']} of REPS")
    return lines


def _fmt(stats: Stats, unit: str) -> str:
    if not stats.n:
        return "no data"
    return f"p50 {stats.p50} p99 {stats.p99} max {stats.max} {unit}"


def _vm_order(name: str) -> tuple:
    return len(name), name


def _agents_report(doc: Results) -> list[str]:
    lines = []
    cost = doc.agents
    if cost:
        cpu, bits = cost.agent_cpu_core, cost.probe_bit_s
        if cpu.p50 is not None:
            boot = cost.agent_startup_cpu_s.p50
            after = f" after start-up ({boot:.2f} s)" if boot is not None else ""
            lines.append(f"  agents: CPU per agent p50 {cpu.p50:.1%} max {cpu.max:.1%} of "
                         f"a core{after}, coordinator {cost.coordinator_cpu_core or 0:.1%}; "
                         f"probes p50 {(bits.p50 or 0) / 1e3:.1f} kbit/s per agent; RSS agent p50 "
                         f"{cost.agent_rss_mb.p50} MiB, coordinator "
                         f"{cost.coordinator_rss_mb} MiB")
        if cost.error:
            lines.append(f"  agents: {cost.error}")
    sync = doc.sync
    if sync:
        conv = f"{sync.converged_s} s" if sync.converged_s is not None else "not reached"
        lines += [f"  clock sync vs truth (reference {sync.reference}, "
                  f"{sync.windows} windows; within {sync.converged_us} us after {conv}):",
                  f"    nslab (Huygens)  offset |err| {_fmt(sync.offset_error_us, 'us')}",
                  f"                     drift  |err| {_fmt(sync.drift_error_ppm, 'ppm')}",
                  f"    NTP-style        offset |err| "
                  f"{_fmt(sync.baseline_ntp.offset_error_us, 'us')}",
                  f"                     drift  |err| "
                  f"{_fmt(sync.baseline_ntp.drift_error_ppm, 'ppm')}"]
        if sync.chrony:
            c = sync.chrony
            conv = f"{c.converged_s} s" if c.converged_s is not None else "not reached"
            lines += [f"    chrony (server {c.server}; within {c.converged_us} us after "
                      f"{conv})",
                      f"                     offset |err| {_fmt(c.offset_error_us, 'us')}",
                      f"                     drift  |err| {_fmt(c.drift_error_ppm, 'ppm')}"]
    owd = doc.owd_us
    if owd and owd.pairs:
        vms = sorted({v for k in owd.pairs for v in k.split("->")}, key=_vm_order)
        lines.append("  one-way delay p50, us (row -> column):")
        lines.append("    " + "".join(f"{v:>8s}" for v in ["", *vms]))
        for a in vms:
            cells = []
            for b in vms:
                p = owd.pairs.get(f"{a}->{b}")
                cells.append(f"{p.p50_us:8.1f}" if p and p.p50_us is not None
                             else f"{'-':>8s}")
            lines.append(f"    {a:>8s}" + "".join(cells))
    col = doc.collocation
    if col:
        found = ", ".join("{" + " ".join(g.members) + f"}} {g.confidence:.2f}"
                          for g in col.groups if len(g.members) > 1) or "none"
        truth = ", ".join("{" + " ".join(g) + "}" for g in col.truth_groups if len(g) > 1)
        lines += [f"  collocation: found {found}",
                  f"               truth {truth or 'none'}",
                  f"               precision {col.precision} recall {col.recall}, "
                  f"held since {col.detected_after_s} s"]
    return lines
