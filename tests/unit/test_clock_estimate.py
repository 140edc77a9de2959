"""The estimated clock (offset + drift x elapsed) is written once: ``ClockEstimate``; the
compiled pacer's ``npc_offset_at_vm`` gives the same numbers, and the CASSINI slots and the
pacer's ``Sync`` use it."""
import pytest

from agents import pacerio
from contracts.messages import ClockEstimate, CoordinatorState
from workloads.schedule import Schedule

CASES = [(1_500_000.0, 12.5, 10**18, 10**18 + 7 * 10**9),
         (-2_000_000.0, -40.0, 5 * 10**17, 5 * 10**17 + 10**9 + 123),
         (0.0, 0.0, 0, 3)]


@pytest.mark.parametrize("off,drift,ref,at", CASES)
def test_offset_at_known_values(off, drift, ref, at):
    est = ClockEstimate(off, drift, ref)
    assert est.offset_at(at) == pytest.approx(off + drift * 1e-6 * (at - ref))
    assert est.offset_at_vm(at) == pytest.approx(off + drift * 1e-6 * (at - off - ref))
    assert ClockEstimate(off, drift, None).offset_at(at) == off


@pytest.mark.parametrize("off,drift,ref,at", CASES)
def test_compiled_pacer_mirrors_offset_at_vm(off, drift, ref, at):
    lib = pacerio.load()
    assert lib.npc_offset_at_vm(off, drift, ref, at) == pytest.approx(
        ClockEstimate(off, drift, ref).offset_at_vm(at), abs=1e-3)


def test_moved_to_keeps_the_line():
    est = ClockEstimate(1000.0, 20.0, 10**9)
    moved = est.moved_to(3 * 10**9)
    assert moved.ref_ns == 3 * 10**9
    for t in (10**9, 5 * 10**9):
        assert moved.offset_at(t) == pytest.approx(est.offset_at(t))


def test_state_estimate_and_schedule_slots():
    state = CoordinatorState.model_validate({
        "schema": "nslab.coordinator/1", "time_ns": 10**9, "window_s": 1.0,
        "drift_windows": 4, "t_ns": 10**9,
        "vms": {"vm1": {"offset_ns": 2e6, "drift_ppm": 10.0}, "vm2": {}}})
    assert state.estimate("vm2") is None and state.estimate("vm9") is None
    est = state.estimate("vm1")
    assert est == ClockEstimate(2e6, 10.0, 10**9)
    sched = Schedule(start_ns=10**9, period_s=1.0, offsets_ns=[2_000_000], drifts_ppm=[10.0])
    # slot 3 at reference 4 s: on vm1's clock 2 ms + 10 ppm x 3 s = 2.03 ms later
    assert sched.slot_ns(3, 0) == 4 * 10**9 + 2_030_000
