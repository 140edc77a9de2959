"""The pacer's view of the clock sync (agents.pacer.Sync): open until converged, the last good
estimate held over while a window lacks one, and never longer than ``stale_s``."""
from agents.pacer import Sync
from contracts.messages import CoordinatorState, VmState

S = 1_000_000_000


def state(windows, t_ns, **vms):
    return CoordinatorState(schema="nslab.coordinator/1", time_ns=t_ns, window_s=2.0,
                            drift_windows=8, windows=windows, t_ns=t_ns,
                            vms={k: VmState(**v) for k, v in vms.items()})


GOOD = dict(offset_ns=1000.0, drift_ppm=10.0, offset_sigma_ns=50.0)


def test_open_until_converged_then_gated():
    s = Sync("vm1", sigma_ns=125_000, stale_s=10)
    assert "not yet polled" in s.why_not("vm2", 0)
    s.update(state(1, 0, vm1=GOOD, vm2=GOOD), 0)
    assert "fewer than 2 windows" in s.why_not("vm2", 0)
    s.update(state(2, 2 * S, vm1=GOOD, vm2=dict(offset_ns=5.0, offset_sigma_ns=200_000)), S)
    assert "offset of vm2 uncertain" in s.why_not("vm2", S)
    assert s.clock_of("vm2") == (0.0, 0.0, None)
    s.update(state(3, 4 * S, vm1=GOOD, vm2=GOOD), 2 * S)
    assert s.why_not("vm2", 2 * S) is None
    assert s.clock_of("vm1") == (1000.0, 10.0, 4 * S)


def test_holdover_moves_the_last_good_offset_along_its_drift_and_ends_after_stale_s():
    s = Sync("vm1", sigma_ns=125_000, stale_s=10)
    s.update(state(3, 4 * S, vm1=GOOD, vm2=GOOD), 0)
    s.update(state(4, 6 * S, vm1=GOOD, vm2={}), 2 * S)          # a window without vm2
    assert s.why_not("vm2", 2 * S) is None
    off, drift, at = s.clock_of("vm2")
    assert (drift, at) == (10.0, 6 * S) and abs(off - (1000.0 + 10e-6 * 2 * S)) < 1e-6
    assert "no offset estimate for vm2" in s.why_not("vm2", 11 * S)
    s.update(state(9, 20 * S, vm1=GOOD, vm2={}), 12 * S)
    assert "no offset estimate for vm2" in s.why_not("vm2", 12 * S)
