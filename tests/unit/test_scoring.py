"""Scoring of agent estimates against the injected clock truth (known answers)."""
import pytest

from agents.clock import ClockSpec, Oscillator, Segment
from contracts.messages import Group, HistoryEntry
from session.scoring import collocation_section, sync_section, true_time, truth_at, truth_groups

S = 1_000_000_000
T0 = 1_800_000_000 * S


def clocks():
    a = Oscillator(T0, 20.0)
    b = Oscillator(T0, -30.0)
    return {"vm1": ClockSpec("vm1", [Segment(T0, 4e6, "h1", a)]),
            "vm2": ClockSpec("vm2", [Segment(T0, -1e6, "h1", a)]),
            "vm3": ClockSpec("vm3", [Segment(T0, 2e6, "h2", b)])}


def test_true_time_inverts_the_reference_clock():
    ref = clocks()["vm1"]
    t = T0 + 7 * S + 123
    assert true_time(ref, ref.to_vm_ns(t)) == pytest.approx(t, abs=1)


def test_truth_relative_to_reference():
    c = clocks()
    ref_ns = c["vm1"].to_vm_ns(T0 + 10 * S)
    truth = truth_at(c, "vm1", ref_ns)
    assert truth["vm1"] == (0.0, 0.0)
    assert truth["vm2"][0] == pytest.approx(-5e6, abs=1)  # same oscillator: constant
    assert truth["vm2"][1] == pytest.approx(0.0, abs=1e-9)
    assert truth["vm3"][1] == pytest.approx((-30e-6 - 20e-6) / (1 + 20e-6) * 1e6)


def history(c, err_ns, windows=6):
    out = []
    for k in range(windows):
        ref_ns = c["vm1"].to_vm_ns(T0 + (k + 1) * 2 * S)
        truth = truth_at(c, "vm1", ref_ns)
        vms = {vm: {"offset_ns": off + err_ns(k), "drift_ppm": d + 0.01,
                    "ntp_offset_ns": off + 50_000, "ntp_drift_ppm": d - 0.5}
               for vm, (off, d) in truth.items()}
        out.append(HistoryEntry.model_validate({"t_ns": ref_ns, "vms": vms}))
    return out


def test_sync_errors_and_convergence():
    c = clocks()
    hist = history(c, lambda k: 100_000 if k < 2 else 1_000)  # 100 us, then 1 us
    s = sync_section(hist, c, "vm1", T0, converged_us=10, skip_windows=2)
    assert s["offset_error_us"]["max"] == pytest.approx(1.0, abs=0.01)
    assert s["drift_error_ppm"]["p50"] == pytest.approx(0.01, abs=1e-6)
    assert s["baseline_ntp"]["offset_error_us"]["p50"] == pytest.approx(50.0, abs=0.01)
    assert s["converged_s"] == pytest.approx(7.0, abs=0.01)  # window 3: centre 6 s, end 7 s
    never = sync_section(history(c, lambda k: 100_000), c, "vm1", T0)
    assert never["converged_s"] is None and "series" not in never


def test_sync_series_are_the_signed_errors_per_window_and_vm():
    c = clocks()
    hist = history(c, lambda k: -3_000 * (k + 1))  # -3 us, -6 us, ...; NTP-style +50 us
    hist[2].vms["vm3"].ntp_offset_ns = None        # vm3 had no NTP-style estimate there
    s = sync_section(hist, c, "vm1", T0, t0_ns=T0 - 1 * S)
    series = s["series"]
    # window k's centre: true time when vm1's clock read T0 + (k+1)*2 s, after bring-up at
    # T0 - 1 s (vm1 runs 4 ms ahead, 20 ppm fast: 4 ms + 20 ppm of the elapsed time early)
    assert series["t_s"] == [pytest.approx(1 + 2 * (k + 1) - 0.004, abs=0.01) for k in range(6)]
    assert list(series["offset_error_us"]) == ["vm2", "vm3"]  # the reference left out
    for vm in ("vm2", "vm3"):
        assert series["offset_error_us"][vm] == pytest.approx([-3.0 * (k + 1) for k in range(6)],
                                                              abs=1e-3)
    assert series["baseline_ntp_offset_error_us"]["vm2"] == pytest.approx([50.0] * 6, abs=1e-3)
    assert series["baseline_ntp_offset_error_us"]["vm3"][2] is None


def test_collocation_against_truth():
    phys = {"vm1": "h1", "vm2": "h1", "vm3": "h2"}
    assert truth_groups(phys) == [["vm1", "vm2"], ["vm3"]]
    good = collocation_section([Group(members=["vm2", "vm1"], confidence=0.9),
                                Group(members=["vm3"], confidence=0.8)], phys, 4.0)
    assert (good["precision"], good["recall"]) == (1.0, 1.0)
    bad = collocation_section([Group(members=["vm1", "vm2", "vm3"], confidence=0.5)], phys,
                              None)
    assert bad["precision"] == pytest.approx(1 / 3, abs=1e-3) and bad["recall"] == 1.0
