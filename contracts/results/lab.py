"""The results' ``scenario``, ``lab`` and ``teardown`` sections: what ran, on what, and how
faithfully (the fidelity check), and what teardown left.

Units: s; Mbit/s; packets; fractions 0-1.
"""
from __future__ import annotations

from pydantic import Field

from contracts.base import Model


class ScenarioSection(Model):
    """Which scenario ran."""

    name: str = Field(description="scenario name")
    source: str = Field(description="scenario file (path) or built-in name")
    seed: int = Field(description="random seed (placements, clocks)")
    duration_s: float = Field(description="timeline duration, s after bring-up")


class VmEntry(Model):
    """One VM of the lab."""

    name: str
    ip: str | None = Field(description="IPv4 address (no prefix); null when it has none")
    leaf: str | None = Field(description="its leaf switch; null in a custom topology "
                                         "without leaves")
    phys: str = Field(description="physical host at the end of the run")


class LinkEntry(Model):
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


class Capability(Model):
    """One probed host feature (``nslab doctor``)."""

    name: str
    ok: bool
    detail: str = Field(description="what the probe saw")
    disables: str = Field(description="what a missing feature disables")
    fix: str = Field("", description="the command or package that brings a missing feature; "
                     "empty when ok")


class P50Max(Model):
    """Median and maximum of a series; both null when the series is empty."""

    p50: float | None = Field(description="median, in the unit of the field")
    max: float | None = Field(description="maximum, in the unit of the field")


class Fraction(Model):
    """Median and maximum of a fraction (0.5 = 50 %)."""

    p50: float = Field(description="median, fraction 0-1")
    max: float = Field(description="maximum, fraction 0-1")


class CoreLoad(Model):
    """One CPU core over the run (``lab.saturation``)."""

    cpu: int = Field(description="core number, as in /proc/stat (cpuN)")
    busy: Fraction = Field(description="busy fraction (all but idle and iowait)")
    softirq: Fraction = Field(description="softirq fraction (veth forwarding, qdiscs)")
    hot_share: float = Field(description="fraction of the samples with this core >= 90 % "
                                         "busy")
    saturated: bool = Field(description="hot_share >= 0.25")


class QueueLoad(Model):
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


class FidelitySeries(Model):
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


class Fidelity(Model):
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


class LabSection(Model):
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


class Teardown(Model):
    clean: bool = Field(description="nothing of the lab was left")
    leftovers: list[str] = Field(description="kernel objects or processes left")
    seconds: float = Field(description="teardown time, s")


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
