"""Two jobs sharing one fabric link: on iteration slots shifted apart (CASSINI's time shift)
their communication phases overlap less than on the same slots, measured from the jobs' own
timestamps; a Session profiles, plans and runs a scenario's set in each mode."""
import time

from contracts.results import validate
from lab.clocks import ClockConfig
from session import jobs
from session.cassini import true_comm_phases
from session.scenario import load
from session.session import Session
from topo import LeafSpine
from workloads.config import JobConfig

S = 1_000_000_000
PERIOD_S = 0.3


def comm_phases(lab, job, vms) -> list[tuple[int, int]]:
    """A finished job's collective phases, [start, end) ns: each from its last rank's start
    (a rank woken late by a loaded machine does not stretch its peer's phase)."""
    return true_comm_phases(job.wait(), vms, lab.clocks.specs)


def overlap_s(a, b) -> float:
    return sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b) / S


def run_pair(lab, shift_s: float) -> tuple[float, list[dict]]:
    start = time.time_ns() + 2 * S  # both jobs' meshes are up by then
    cfgs = [JobConfig(collective="all_reduce", bytes=1_000_000, iterations=8, warmup=1,
                      timeout_s=30, schedule={"start_ns": start, "period_s": PERIOD_S,
                                              "shift_s": shift})
            for shift in (0.0, shift_s)]
    with jobs.launch(lab, "ja", cfgs[0], ["vm1", "vm3"]) as a, \
            jobs.launch(lab, "jb", cfgs[1], ["vm2", "vm4"]) as b:
        entries = [jobs.finish(lab, a), jobs.finish(lab, b)]
        return overlap_s(comm_phases(lab, a, ["vm1", "vm3"]),
                         comm_phases(lab, b, ["vm2", "vm4"])), entries


def test_shifted_slots_interleave_two_jobs_on_a_shared_link(nslab_lab):
    # one spine: vm1->vm3 and vm2->vm4 both cross leaf1-spine1 (100 Mbit/s): 1 MB AllReduce
    # on 2 ranks sends 1 MB each way, ~85 ms alone; clocks without offset or drift, so the
    # two jobs' VM timestamps compare directly
    topo = LeafSpine(spines=1, leaves=2, vms_per_leaf=2, host_bw=1000, fabric_bw=100)
    lab = nslab_lab(topo, name="cas_pair", clocks=ClockConfig(drift_ppm=0, offset_ms=0,
                                                              wander_ppm=0))
    aligned, e_aligned = run_pair(lab, 0.0)
    shifted, e_shifted = run_pair(lab, PERIOD_S / 2)
    for e in e_aligned + e_shifted:
        assert e["verified"] and e["error"] is None, e
    assert aligned > 8 * 0.05, aligned  # on the same slots they collide every iteration
    assert shifted < 0.3 * aligned, (aligned, shifted)
    comm = [e["comm_s"]["p50"] for e in e_aligned], [e["comm_s"]["p50"] for e in e_shifted]
    assert max(comm[1]) < 0.8 * min(comm[0]), comm  # alone on the link: faster collectives


SCENARIO = """
name: cas_sess
seed: 3
duration_s: 4.5
topology: {spines: 1, leaves: 2, vms_per_leaf: 2, host_bw: 1000, fabric_bw: 100}
placement: {vms_per_host: 1}
clocks: {drift_ppm: 100, offset_ms: 30}
agents: {enabled: true, rate: 10, window_s: 2}
jobs:
  - {name: a, bytes: 1000000, ranks: 2, iterations: 5, compute_units: 30,
     placement: [vm1, vm3]}
  - {name: b, bytes: 1000000, ranks: 2, iterations: 5, compute_units: 30,
     placement: [vm2, vm4]}
cassini: {capacity_mbit: 100, sets: [{name: pair, jobs: [a, b]}],
          modes: [fair, shifted_synced, unfair]}
"""


def test_session_profiles_plans_and_runs_a_set_in_each_mode(tmp_path):
    path = tmp_path / "cas.yaml"
    path.write_text(SCENARIO)
    sc, topo = load(str(path))
    doc = validate(Session(sc, topo, str(path)).run())
    assert doc.jobs is None  # the set's jobs ran only in the set
    (cs,) = doc.cassini.sets
    assert cs.error is None and set(cs.profiles) == {"a", "b"}
    for p in cs.profiles.values():  # measured alone: ~85 ms of 1 MB at 100 Mbit/s
        assert 0.05 < p.comm_s < 0.5 and 50 < p.demand_mbit < 110, p
    # the plan comes from the profiles: a rotation at least as good as none, slots longer
    # than an iteration alone, a shift within b's slot
    assert cs.score >= cs.unshifted_score and cs.predicted_compatible == (cs.score >= 0.95)
    assert all(cs.slots_s[n] >= cs.profiles[n].iteration_s for n in "ab")
    assert cs.shifts_s["a"] == 0 and 0 <= cs.shifts_s["b"] < cs.slots_s["b"]
    assert all(t is None or 0 < t < cs.slots_s[n] for n, t in cs.late_s.items()), cs.late_s
    assert set(cs.modes) == {"fair", "shifted_synced", "unfair"}
    for m in cs.modes.values():
        assert m.error is None and set(m.jobs) == {"a", "b"}
        assert 0 < m.mean_iteration_s <= m.p99_iteration_s and 0 <= m.comm_overlap <= 1
        thirds = m.mean_iteration_thirds_s  # 5 iterations a job: runs of 2, 2 and 1
        assert len(thirds) == len(m.comm_overlap_thirds) == 3, m
        assert min(thirds) <= m.mean_iteration_s <= max(thirds), m
    assert cs.modes["fair"].skipped_slots == cs.modes["unfair"].skipped_slots == 0  # no slots
    # the unfair mode's classes went on the fabric for its run only (a: CS1, b: CS2)
    classes = [e.params for e in doc.truth.faults if e.kind == "classes"]
    assert classes == [{"dscp": [8, 16], "share": [0.05, 0.05], "prio": [0, 1]},
                       {"dscp": [], "share": [], "prio": []}], classes
    # on its slots, an iteration ends at its slot's end (it waits out the rest), so a job's 5
    # iterations add up to 5 slots less the first one's lateness (under one slot): their mean
    # is at least 4/5 of the slot, whatever single iterations a late start shortened
    synced = cs.modes["shifted_synced"]
    least = sum(4 * cs.slots_s[n] for n in "ab") / 10
    assert synced.mean_iteration_s >= least, (synced, cs.slots_s)
