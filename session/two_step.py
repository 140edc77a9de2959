"""The two-step story of a collective job on shallow fabric buffers: naive VMs, then VMs chosen
from the agents' collocation groups, then the same VMs with the pacer on (its kernel datapath,
the scenario's ``pacer.datapath``, and then its probe datapath); beside them the baselines a
user would pick instead of the pacer (the aware VMs with BBR, with CUBIC).

Every step runs the same job; the pacers run in its VMs in every step (``sense``: measuring
only, ``pace``: On-Ramp's hold) so that each step's TCP retransmissions, RTOs and OWD p99
come from the same sensing. ``fabric_drops`` is the truth: the lab's queue drops on every
fabric and VM link during the step (tc and interface counters).

The seed's product reports 0.92 (aware) and 0.74 (aware + pacer) of the naive completion on a
16-host cluster; the scenario prints the ratios measured here beside them.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lab.errors import LabError
from session import incast, jobs
from session.edge import job_edge

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab
    from session.daemons import AgentMesh, PacerSpec
    from session.scenario import JobSpec

STEPS = (  # name, placement policy, pacer mode, congestion control (None: the job's own),
    # pacer datapath (None: the scenario's)
    ("naive", "naive", "sense", None, None),
    ("aware", "collocation_aware", "sense", None, None),
    ("aware_paced", "collocation_aware", "pace", None, None),
    ("aware_probe", "collocation_aware", "pace", None, "probe"),
    ("aware_bbr", "collocation_aware", "sense", "bbr", None),
    ("aware_cubic", "collocation_aware", "sense", "cubic", None),
)
SEED_RATIOS = {"aware": 0.92, "aware_paced": 0.74}
"""The seed product's two-step result (fractions of the naive completion)."""


def step_job_name(job: str, step: str) -> str:
    """The name a step's run of ``job`` has in the timeline (``job_start``/``job_end``)."""
    return f"{job}_{step}"


def drops(lab: Lab) -> int:
    """Queue drops so far on every link of the lab, both ends (``incast.drops`` summed)."""
    return sum(incast.drops(lab).values())


COMPARISONS = (("aware", "naive"), ("aware_paced", "naive"), ("aware_probe", "naive"),
               ("aware_bbr", "naive"), ("aware_cubic", "naive"), ("aware_paced", "aware"),
               ("aware_paced", "aware_cubic"), ("aware_paced", "aware_bbr"),
               ("aware_paced", "aware_probe"))
"""(arm, baseline) pairs compared on completion over the repetitions."""


def run_step(lab: Lab, mesh: AgentMesh, spec: JobSpec, pacer: PacerSpec, step: tuple,
             vms_for: Callable[[str], list[str]], count_drops: Callable[[], int],
             progress: Callable[[str], None]) -> tuple[dict, dict]:
    """Run one step (a ``STEPS`` entry) of ``spec``'s job: its entry (name, vms,
    completion_s, fabric_drops, probes_lost, retransmits, rtos, owd_p99_us, verified, pacer,
    datapath, cc, error) and, for the paced step on the scenario's datapath, its last pacer
    reports (VM -> ``PacerReport``).

    Args:
        vms_for: placement policy -> the job's VMs (the study asks ``Session.choose`` once a
            policy: the aware steps run on the same VMs even when the agents' groups change
            between steps, so the story compares the steps on one placement).
        count_drops: the lab's queue drops so far (``drops``, run on the lab's thread).
    """
    name, policy, mode, cc, datapath = step
    edge = pacer.model_copy(update={"datapath": datapath}) if datapath and pacer else pacer
    entry = {"name": name, "pacer": mode, "cc": cc or spec.cc, "vms": [], "completion_s": None,
             "datapath": datapath or (pacer.datapath if pacer else None),
             "fabric_drops": None, "probes_lost": None, "retransmits": None, "rtos": None,
             "owd_p99_us": None, "verified": False, "error": None}
    reports = {}
    try:
        vms = entry["vms"] = list(vms_for(policy))
        progress(f"two_step {name}: {spec.collective} on {' '.join(vms)}, pacer {mode}"
                 + (f", {cc}" if cc else ""))
        config = spec.config().model_copy(update={"cc": cc} if cc else {})
        with job_edge(lab, mesh, vms, mode, edge) as sensed:  # drops while the step runs
            before = count_drops()
            job = jobs.run(lab, step_job_name(spec.name, name), config, vms)
            dropped = count_drops() - before
        entry.update(completion_s=job["completion_s"], verified=job["verified"],
                     error=job["error"], fabric_drops=dropped,
                     retransmits=sensed.retransmits, rtos=sensed.rtos,
                     owd_p99_us=sensed.owd_p99_us, probes_lost=sensed.probes_lost)
        if mode == "pace" and datapath is None:
            reports = sensed.reports
    except (LabError, ValueError) as e:  # the story goes on; the step says what failed
        entry["error"] = str(e)
    progress(f"two_step {name}: completion {entry['completion_s']} s, drops "
             f"{entry['fabric_drops']}, retransmits {entry['retransmits']}")
    return entry, reports


def section(job: str, steps: list[dict]) -> dict:
    """The results' ``two_step`` section from one round of steps: the steps, and the aware
    and aware_paced completions as fractions of naive's (null when a step has none) beside
    the seed product's."""
    base = next((s["completion_s"] for s in steps if s["name"] == "naive"), None)
    ratios = {s["name"]: (round(s["completion_s"] / base, 3) if base and s["completion_s"]
                          else None) for s in steps if s["name"] in SEED_RATIOS}
    return {"job": job, "steps": steps, "ratios": ratios, "seed_ratios": SEED_RATIOS}
