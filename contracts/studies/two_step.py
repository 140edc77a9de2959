"""The two-step story's results sections: its steps and the pacers' parameters and reports.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from contracts.base import Model
from contracts.enums import ActivePacerMode, PacerDatapath, PacerHold, TwoStepName
from contracts.messages import PacerReport


class TwoStepStep(Model):
    """One step of the two-step story (``session.two_step``)."""

    name: TwoStepName
    vms: list[str] = Field(description="the job's VMs, rank order")
    pacer: ActivePacerMode = Field(description="sense: measuring only; pace: "
                                                        "On-Ramp's hold")
    datapath: PacerDatapath | None = Field(None, description="the pacers' datapath (bpf: in "
                                           "the kernel; probe: UDP probes and HTB switches; "
                                           "absent before it existed)")
    cc: str | None = Field(description="congestion control set for the step; null: the "
                                       "VMs' own")
    completion_s: float | None = Field(description="the job's completion, s (VM clocks)")
    fabric_drops: int | None = Field(description="queue drops on every fabric and VM link "
                                                 "during the step, packets (the truth)")
    drops_by_round: list[int | None] | None = Field(
        None, description="fabric_drops of this step in each round, with repeat above 1 (the "
        "step's other fields are the first round's; null with one round)")
    probes_lost: int | None = Field(None, description="the pacers' own OWD probes between the "
                                    "job's VMs that never came back: part of fabric_drops")
    retransmits: int | None = Field(description="TCP segments retransmitted in the job's "
                                                "VMs (the pacers' sensing)")
    rtos: int | None = Field(description="TCP retransmission timeouts in the job's VMs")
    owd_p99_us: float | None = Field(description="largest OWD p99 between the job's VMs, us")
    verified: bool = Field(description="every rank verified every iteration")
    error: str | None = Field(description="null, or why the step failed")


class TwoStepSection(Model):
    """Naive -> collocation-aware -> aware + pacer, with the BBR and CUBIC baselines."""

    job: str = Field(description="the scenario's job the steps run")
    steps: list[TwoStepStep]
    ratios: dict[str, float | None] = Field(description="aware and aware_paced completion as "
                                                        "fractions of naive")
    seed_ratios: dict[str, float] = Field(description="the seed product's ratios (0.92, 0.74)")


class PacerSection(Model):
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
    datapath: PacerDatapath = Field("probe", description="bpf: OWD and holds in the kernel; "
                                    "probe: UDP probes and HTB switches (absent before it "
                                    "existed: probe)")
    hold: PacerHold = Field("auto", description="bpf: how a destination is held "
                            "(agents/bpfpacer.py)")
    quantum_us: float = Field(0.0, description="bpf: holds rounded up to a multiple of this, "
                                               "us (0: not)")
    threshold_from: Literal["base", "zero"] = Field(
        "zero", description="bpf: T counts from each destination's base OWD or from 0 (absent "
                            "before it existed: zero)")
    window_clamp: bool = Field(False, description="bpf: receivers clamp their advertised "
                                                  "windows (absent before it existed: False)")
    window_queue: int = Field(2, description="bpf, window clamp: packets of the bottleneck's "
                                             "queue the clamped senders may fill together")
    ack_pace: float = Field(0.0, description="bpf: receivers' pure ACKs paced at this "
                                             "fraction of their line (0: off; absent before "
                                             "it existed: 0)")
    reports: dict[str, PacerReport] = Field(description="by VM: its last PacerReport "
                                                        "(agents/API.md)")


SECTIONS = {"two_step": TwoStepSection, "pacer": PacerSection}
"""Its results sections by key."""


def report_lines(doc) -> list[str]:
    """Its lines of the printed report (none without its section)."""
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
        if st.drops_by_round:
            probes += " [rounds " + " ".join(str(d) for d in st.drops_by_round) + "]"
        lines.append(f"    {st.name:12s} {st.completion_s:7.3f} s  drops {st.fabric_drops:5d}"
                     f"{probes}  "
                     f"retrans {st.retransmits if st.retransmits is not None else '-':>5}  "
                     f"RTOs {st.rtos if st.rtos is not None else '-':>3}  OWD p99 {owd:>9s}"
                     f"  {' '.join(st.vms)}{'' if st.verified else '  NOT VERIFIED'}")
    got = ", ".join(f"{k} {v if v is not None else '-'} (seed {ts.seed_ratios.get(k)})"
                    for k, v in ts.ratios.items())
    lines.append(f"    completion as a fraction of naive: {got}")
    return lines
