"""CASSINI's circles, scores and shifts (scheduler.cassini) on demand circles whose best
rotation is known by hand."""
import numpy as np
import pytest

from agents.clock import ClockSpec, Oscillator, Segment
from scheduler.cassini import Circle, best_rotation, clearance, job_shifts, score, unified_perimeter
from scheduler.plan import Profile, plan, profile, slot_s
from session.cassini import (
    by_part,
    iteration_by_part,
    overlap_fraction,
    slot_error_ms,
    true_comm_phases,
)
from workloads.schedule import Schedule

C = 100.0  # link capacity, Mbit/s


def arc(period_s, comm_s, bw=C, start_s=0.0, res=1.0):
    """A job that sends at ``bw`` for ``comm_s`` from ``start_s`` of every iteration."""
    return Circle.from_phases(period_s, [(start_s, start_s + comm_s, bw)], res)


def test_circle_from_phases_samples_arcs_and_wraps():
    c = Circle.from_phases(1.0, [(0.2, 0.5, 10.0), (0.9, 1.1, 4.0)], resolution_s=0.1)
    assert c.bins == 10 and c.period_s == pytest.approx(1.0)
    assert c.demand.tolist() == [4, 0, 10, 10, 10, 0, 0, 0, 0, 4]
    # on a unified circle of 2 iterations, delayed by 3 bins
    assert c.on(20, 3)[:6].tolist() == [0, 0, 4, 4, 0, 10]
    with pytest.raises(ValueError, match="not a multiple"):
        c.on(15)
    with pytest.raises(ValueError, match="shorter than one bin"):
        Circle.from_phases(0.01, [], resolution_s=0.1)
    with pytest.raises(ValueError, match="start <= end"):
        Circle.from_phases(1.0, [(0.5, 0.2, 1.0)], resolution_s=0.1)
    with pytest.raises(ValueError, match="finite values >= 0"):
        Circle(np.array([1.0, -1.0]))


def test_periods_40_and_60_unify_on_120():
    a, b = arc(40, 10), arc(60, 10)
    assert unified_perimeter([a, b]) == 120
    # unshifted: B's [0,10) meets A's [0,10); B's [60,70) misses A's [40,50) and [80,90):
    # 10 s of excess C in 120 s
    assert score([a, b], [0, 0], C) == pytest.approx(1 - 10 / 120)
    # B delayed by 10 s: [10,20) and [70,80) both fall in A's gaps
    assert score([a, b], [0, 10], C) == pytest.approx(1.0)
    rot = best_rotation([a, b], C)
    assert rot.perimeter_s == 120 and rot.score == pytest.approx(1.0)
    assert rot.shifts_s[0] == 0
    # the zero-excess shifts of B (mod 60) are exactly 10, 30 and 50 s
    fits = [s for s in range(60) if score([a, b], [0, s], C) == pytest.approx(1.0)]
    assert fits == [10, 30, 50] and rot.shifts_s[1] == 10


def test_half_rate_jobs_are_compatible_at_any_rotation():
    a, b = arc(40, 30, bw=C / 2), arc(60, 50, bw=C / 2)
    assert all(score([a, b], [0, s], C) == pytest.approx(1.0) for s in range(0, 60, 7))


def test_incompatible_pair_best_overlap_known():
    # two jobs of period 10 s that each send 6 s at full rate: at best 2 s of 10 overlap
    a, b = arc(10, 6), arc(10, 6)
    rot = best_rotation([a, b], C)
    assert rot.score == pytest.approx(0.8)
    assert rot.shifts_s[1] in (4.0, 5.0, 6.0)
    assert score([a, b], [0, 0], C) == pytest.approx(0.4)  # fully aligned: 6 s of excess


def test_ties_go_to_the_rotation_deepest_inside_the_best_ones():
    # period 10 s, 4 s of communication each: b fits anywhere in [4, 6]; 5 s leaves 1 s on
    # either side (the smallest fitting shift, 4, would touch a's arc)
    a = arc(10, 4)
    rot = best_rotation([a, a], C)
    assert rot.score == pytest.approx(1.0) and rot.shifts_s == (0.0, 5.0)
    assert [s for s in range(10) if score([a, a], [0, s], C) == pytest.approx(1.0)] == [4, 5, 6]
    # every rotation fits: no deeper one, the smallest shifts
    half = arc(10, 10, bw=C / 2)
    assert best_rotation([half, half], C).shifts_s == (0.0, 0.0)


def test_clearance_is_how_late_a_job_can_run_before_the_score_falls():
    # period 10 s, 4 s of communication each, b at 5 s: either job may run 1 s late ([6, 10)
    # still misses [0, 4) of the next turn); 2 s late they meet
    a = arc(10, 4)
    assert [clearance([a, a], [0.0, 5.0], C, j) for j in (0, 1)] == [1.0, 1.0]
    assert clearance([a, a], [0.0, 4.0], C, 1) == 2.0  # at the early edge: 2 s
    assert clearance([a, a], [0.0, 6.0], C, 1) == 0.0  # at the late edge: none
    # a score below 1 that a delay leaves unchanged still counts (the excess stays the same)
    b = arc(10, 6)
    assert clearance([b, b], [0.0, 5.0], C, 1) == 1.0


def test_three_jobs_interleave_on_one_link():
    # three jobs of period 12 s, 4 s of communication each: rotations 0, 4, 8 tile the circle
    circles = [arc(12, 4)] * 3
    rot = best_rotation(circles, C)
    assert rot.score == pytest.approx(1.0)
    assert sorted(rot.shifts_s) == [0.0, 4.0, 8.0]


def test_rotation_grid_limits_and_errors():
    a, b = arc(40, 10), arc(60, 10)
    # a 20 s grid cannot reach the fitting shifts 10/30/50: best is 0, 20 or 40, all 10/120
    assert best_rotation([a, b], C, step_s=20).score == pytest.approx(1 - 10 / 120)
    with pytest.raises(ValueError, match="60 rotations on the grid, more than"):
        best_rotation([a, b], C, max_candidates=59)
    with pytest.raises(ValueError, match="capacity"):
        score([a, b], [0, 0], 0)
    with pytest.raises(ValueError, match="one resolution_s"):
        unified_perimeter([a, arc(60, 10, res=0.5)])


def test_affinity_graph_chains_shifts_across_links():
    periods = {"j1": 40.0, "j2": 60.0, "j3": 30.0}
    # link l1: j1 at 0, j2 at 10; link l2: j2 at 0 (its reference), j3 at 5
    shifts = job_shifts({"l1": {"j1": 0.0, "j2": 10.0}, "l2": {"j2": 0.0, "j3": 5.0}}, periods)
    assert shifts == {"j1": 0.0, "j2": 10.0, "j3": 15.0}
    # a shift is kept modulo the job's period; a separate part starts at 0
    shifts = job_shifts({"l1": {"j1": 0.0, "j2": 10.0}, "l2": {"j2": 40.0, "j3": 5.0},
                         "l3": {"j4": 3.0}}, {**periods, "j4": 7.0})
    assert shifts == {"j1": 0.0, "j2": 10.0, "j3": pytest.approx((10 - 40 + 5) % 30),
                      "j4": 0.0}


def test_affinity_graph_refuses_loops():
    periods = {"j1": 40.0, "j2": 60.0, "j3": 30.0}
    with pytest.raises(ValueError, match="loop"):
        job_shifts({"l1": {"j1": 0, "j2": 10}, "l2": {"j2": 0, "j3": 5},
                    "l3": {"j3": 0, "j1": 1}}, periods)
    with pytest.raises(ValueError, match="loop"):  # two links share the same two jobs
        job_shifts({"l1": {"j1": 0, "j2": 10}, "l2": {"j1": 0, "j2": 20}}, periods)
    with pytest.raises(ValueError, match="no period for job 'j9'"):
        job_shifts({"l1": {"j9": 0}}, periods)


def summary(compute, comm, nbytes=1_000_000, bus_factor=1.0, ranks=2):
    """A job's nslab.job/1 summary as far as the scheduler reads it; rank r is r ms slower."""
    workers = [{"compute_s": [c + r / 1000 for c in compute], "comm_s": list(comm)}
               for r in range(ranks)]
    return {"name": "j", "error": None, "bytes": nbytes, "bus_factor": bus_factor,
            "workers": workers}


def test_profile_takes_the_slowest_rank_and_the_median():
    p = profile(summary([0.1, 0.1, 0.5], [0.08, 0.08, 0.3]))
    assert p.compute_s == pytest.approx(0.101) and p.comm_s == pytest.approx(0.08)
    assert p.iteration_s == pytest.approx(0.181)
    assert p.demand_mbit == pytest.approx(8 * 1e6 / 0.08 / 1e6)  # 100 Mbit/s
    assert slot_s(p, margin=0.1, quantum_s=0.05) == pytest.approx(0.2)  # 0.199 up to 0.2
    with pytest.raises(ValueError, match="no timings"):
        profile({**summary([0.1], [0.1]), "error": "rank 1: lost"})


def test_plan_shifts_two_half_duty_jobs_apart():
    # both: 0.1 s compute then 0.1 s at 100 Mbit/s on a 100 Mbit/s link: aligned they
    # collide half of the time (score 0.5), shifted by half a period they fit (score 1)
    p = Profile(iteration_s=0.2, compute_s=0.1, comm_s=0.1, demand_mbit=100.0)
    got = plan({"a": p, "b": p}, capacity_mbit=100, margin=0.0, quantum_s=0.05)
    assert got.slots_s == {"a": pytest.approx(0.2), "b": pytest.approx(0.2)}
    assert got.score == pytest.approx(1.0) and got.unshifted_score == pytest.approx(0.5)
    assert got.shifts_s == {"a": 0.0, "b": pytest.approx(0.1)}
    assert got.late_s == {"a": None, "b": None}  # they fit exactly: no time to spare
    # 10 % more: slots of 0.22 s, b shifted by 0.11 s leaves each job 10 ms of clearance
    spare = plan({"a": p, "b": p}, capacity_mbit=100, margin=0.1, quantum_s=0.01)
    assert spare.shifts_s["b"] == pytest.approx(0.11)
    assert spare.late_s == {"a": pytest.approx(0.01), "b": pytest.approx(0.01)}
    # three such jobs cannot fit: at best two of three collide a third of the time; late
    # jobs start at once (no rotation to restore)
    three = plan({"a": p, "b": p, "c": p}, capacity_mbit=100, margin=0.0, quantum_s=0.05)
    assert three.score == pytest.approx(0.5)
    assert three.late_s == {"a": None, "b": None, "c": None}


def test_plan_gives_close_slots_the_longest_one():
    a = Profile(iteration_s=0.19, compute_s=0.1, comm_s=0.09, demand_mbit=100.0)
    b = Profile(iteration_s=0.21, compute_s=0.11, comm_s=0.1, demand_mbit=100.0)
    c = Profile(iteration_s=0.5, compute_s=0.4, comm_s=0.1, demand_mbit=100.0)
    got = plan({"a": a, "b": b, "c": c}, capacity_mbit=100, margin=0.1, quantum_s=0.05)
    # 0.209 -> 0.25 and 0.231 -> 0.25; c's 0.55 is far from both
    assert got.slots_s == {"a": pytest.approx(0.25), "b": pytest.approx(0.25),
                           "c": pytest.approx(0.55)}
    a, b = Profile(0.22, 0.12, 0.1, 100.0), Profile(0.235, 0.135, 0.1, 100.0)
    near = plan({"a": a, "b": b}, 100, margin=0.1, quantum_s=0.05)
    # 0.242 -> 0.25 and 0.2585 -> 0.3, but a's 0.242 reaches b's 0.235: one slot, 0.3
    assert near.slots_s == {"a": pytest.approx(0.3), "b": pytest.approx(0.3)}
    assert near.score == pytest.approx(1.0) and near.perimeter_s == pytest.approx(0.3)


def test_overlap_fraction_of_known_phases():
    # a: [0,10) [20,30); b: [5,15) [40,50); c: [8,12). With b alone a shares [5,10), b the
    # same. With c: a still 5 s, b [5,12) = 7 s (a and c counted once), c all 4 s
    a, b, c = [(0, 10), (20, 30)], [(5, 15), (40, 50)], [(8, 12)]
    assert overlap_fraction([a, b]) == pytest.approx(10 / 40)
    assert overlap_fraction([a, b, c]) == pytest.approx((5 + 7 + 4) / 44)
    assert overlap_fraction([a, [(10, 20), (30, 40)]]) == 0  # interleaved: touching only
    assert overlap_fraction([[], []]) is None
    # counted only from [0, 20): a's [0,10) and b's [5,15), each sharing 5 s
    assert overlap_fraction([a, b, c], (0, 8)) == pytest.approx((5 + 7) / 20)
    # quarters of [0, 50): a, b and c start in the first two, b's second in the last
    assert by_part([a, b], 4) == [pytest.approx(10 / 20), 0.0, None, 0.0]
    # thirds of [0, 50): [0, 16.7) holds a's and b's first phases, [16.7, 33.3) a's second
    assert by_part([a, b]) == [pytest.approx(10 / 20), 0.0, 0.0]


def test_iteration_by_part_pools_each_jobs_consecutive_runs():
    # a's 7 iterations cut 3, 2, 2; b's 3 one each: the k-th runs pooled
    a, b = [1, 1, 1, 2, 2, 5, 5], [3, 6, 9]
    assert iteration_by_part([a, b]) == [pytest.approx(6 / 4), pytest.approx(10 / 3),
                                         pytest.approx(19 / 3)]
    assert iteration_by_part([[4.0]]) == [4.0, None, None]


def test_true_comm_phases_map_each_rank_through_its_clock():
    # vm1 runs 2 ms ahead of true time, vm2 at 100 ppm from +1 ms (+1.1005 ms at 1.005 s):
    # a phase spans from the later rank's true start to the later rank's true end
    t0 = 10**18
    spec = {vm: ClockSpec(vm=vm, segments=[Segment(t0, off, "h", Oscillator(t0, ppm))])
            for vm, off, ppm in (("vm1", 2e6, 0.0), ("vm2", 1e6, 100.0))}
    s = 10**9
    summary = {"error": None, "workers": [
        {"comm_start_ns": [t0 + s + 2_000_000], "comm_s": [0.1]},       # true [t0+1 s, +0.1)
        {"comm_start_ns": [t0 + s + 5_000_000 + 1_100_500], "comm_s": [0.2]}]}  # true +5 ms
    (phase,) = true_comm_phases(summary, ["vm1", "vm2"], spec)
    assert abs(phase[0] - (t0 + s + 5_000_000)) < 200  # 100 ppm of 1.1 ms read at VM time
    # 0.2 s on a clock 100 ppm fast are 20 us less in true time
    assert abs(phase[1] - (t0 + s + 205_000_000 - 20_000)) < 200
    assert true_comm_phases({"error": "lost", "workers": []}, [], spec) == []


def test_slot_error_spreads_the_ranks_clock_errors_at_a_slot():
    # vm1 2 ms ahead, vm2 1 ms ahead and 1000 ppm fast: on raw clocks the first slot starts
    # 1 ms apart in true time; 10 slots of 1 s later vm2's clock has gained 10 ms more
    t0 = 10**18
    spec = {vm: ClockSpec(vm=vm, segments=[Segment(t0, off, "h", Oscillator(t0, ppm))])
            for vm, off, ppm in (("vm1", 2e6, 0.0), ("vm2", 1e6, 1000.0))}
    raw = Schedule(start_ns=t0, period_s=1.0)
    got = [slot_error_ms([(raw, ["vm1", "vm2"], 10)], spec, last) for last in (False, True)]
    assert got == [pytest.approx(1.0, abs=1e-3), pytest.approx(9.0, abs=0.02)]
    # corrected by the true offsets and drift, the ranks agree
    fixed = raw.model_copy(update={"offsets_ns": [2_000_000, 1_000_000],
                                   "drifts_ppm": [0.0, 1000.0]})
    assert slot_error_ms([(fixed, ["vm1", "vm2"], 10)], spec, True) == pytest.approx(0, abs=0.02)
