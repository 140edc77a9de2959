"""The VM clock formula (agents.clock) against hand-computed truth."""
import math

import pytest

from agents.clock import STALE_OFFSET, Clock, ClockSpec, Oscillator, Segment, update

S = 1_000_000_000
T0 = 1_700_000_000 * S


def spec(base=10.0, wander=(), offset=5e6):
    osc = Oscillator(T0, base, tuple(wander))
    return ClockSpec("vm1", [Segment(T0, offset, "h1", osc)])


def test_constant_drift_accumulates_linearly():
    c = spec(base=10.0, offset=5e6)
    # 10 ppm over 100 s = 1 ms on top of the 5 ms offset
    assert c.to_vm_ns(T0 + 100 * S) == T0 + 100 * S + 5_000_000 + 1_000_000


def test_wander_integral_matches_numeric_integration():
    w = ((0.1, 50.0, 0.3), (0.05, 120.0, 1.0))
    c = spec(base=-3.0, wander=w, offset=0)
    t = 77.7
    steps = 200_000
    dt = t / steps
    numeric = sum(c.frequency_ppm(T0 + int((i + 0.5) * dt * S)) for i in range(steps)) * dt * 1e3
    assert c.offset_at(T0 + int(t * S)) == pytest.approx(numeric, abs=0.5)  # ns


def test_wander_is_bounded_by_sum_of_amplitudes():
    w = ((0.1, 50.0, 0.3), (0.05, 120.0, 1.0))
    c = spec(base=2.0, wander=w)
    ys = [c.frequency_ppm(T0 + k * S) for k in range(0, 600, 3)]
    assert max(abs(y - 2.0) for y in ys) <= 0.15 + 1e-12
    assert max(ys) - min(ys) > 0.1  # it does wander


def test_step_and_migration_segments():
    c = spec(base=10.0, offset=0)
    t1 = T0 + 10 * S
    before = c.offset_at(t1)
    c.append(t1, step_ns=2e6)
    assert c.offset_at(t1) == pytest.approx(before + 2e6)
    other = Oscillator(T0, -20.0)
    t2 = T0 + 20 * S
    at_migration = c.offset_at(t2)
    c.append(t2, host="h2", oscillator=other)
    assert c.offset_at(t2) == pytest.approx(at_migration)  # continuous
    assert c.frequency_ppm(t2 + S) == pytest.approx(-20.0)
    # after migration the offset moves at -20 ppm: 10 s -> -200 us
    assert c.offset_at(t2 + 10 * S) - at_migration == pytest.approx(-200_000, abs=1)
    with pytest.raises(ValueError):
        c.append(t1, step_ns=1)


def test_binary_roundtrip_and_format_check():
    c = spec(wander=((0.1, 50.0, 0.3),))
    c.append(T0 + S, step_ns=7)
    c.append(T0 + 2 * S, corr_ppm=12.5, kind="vm_frequency")
    back = ClockSpec.from_bytes(c.to_bytes())
    assert back == c
    assert back.to_vm_ns(T0 + 5 * S) == c.to_vm_ns(T0 + 5 * S)
    with pytest.raises(ValueError, match="nslab.clock/3"):
        ClockSpec.from_bytes(b'{"schema": "nslab.clock/1"}')
    with pytest.raises(ValueError, match="truncated"):
        ClockSpec.from_bytes(c.to_bytes()[:-1])


def test_corrections_and_steps_in_realtime_monotonic_and_raw():
    c = spec(base=10.0, offset=1e6)
    t1, t2, t3 = T0 + 10 * S, T0 + 20 * S, T0 + 30 * S
    c.append(t1, corr_ppm=-10.0, kind="vm_frequency")  # the VM cancels its drift
    c.append(t2, step_ns=-500_000, kind="vm_step")
    seg = c.segments[-1]
    # 10 ppm for 10 s, then flat; the step moves REALTIME only
    assert c.offset_at(t3) == pytest.approx(1e6 + 100_000 - 500_000)
    assert seg.monotonic_offset_at(t3) == pytest.approx(1e6 + 100_000)
    # RAW is the oscillator alone: 10 ppm for 30 s
    assert seg.raw_offset_at(t3) == pytest.approx(1e6 + 300_000)
    assert c.frequency_ppm(t3) == pytest.approx(0.0)
    assert seg.corr_ns == pytest.approx(-100_000) and seg.steps_ns == -500_000


def test_clock_reads_file_and_sees_updates(tmp_path):
    path = str(tmp_path / "vm1.clock")
    c = spec(base=0.0, offset=3e6)
    c.write(path)
    clock = Clock(path)
    assert clock.to_vm_ns(T0 + S) - (T0 + S) == 3_000_000
    old = open(path, "rb")
    update(path, lambda s: s.append(T0 + S, step_ns=1e6))
    assert clock.to_vm_ns(T0 + 2 * S) - (T0 + 2 * S) == 4_000_000
    # the replaced file is marked stale for the processes that mapped it (vmclock)
    assert int.from_bytes(old.read()[STALE_OFFSET:STALE_OFFSET + 4], "little") == 1
    assert ClockSpec.read(path).segments[-1].kind == "step"


def test_without_env_it_is_the_system_clock(monkeypatch):
    monkeypatch.delenv("NSLAB_CLOCK", raising=False)
    clock = Clock()
    assert not clock.emulated
    assert clock.to_vm_ns(123) == 123


def test_nanosecond_precision_far_from_epoch():
    c = spec(base=math.pi, offset=0)
    t = T0 + 3600 * S + 1
    assert c.to_vm_ns(t) - c.to_vm_ns(t - 1) in (1, 2)  # no float truncation of true time
