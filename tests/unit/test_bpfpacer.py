"""The kernel datapath's pure parts: the clock anchor the daemon writes, the histograms' buckets
and quantiles it reads, and the configuration it refuses."""
import pytest

from agents.bpfpacer import anchor, bucket_bounds_ns, quantile_ns
from agents.pacer import PacerConfig


def _ref(k0, ref0, ppb, k):  # pacer.bpf.c's to_ref
    return ref0 + (k - k0) + (k - k0) * ppb / 1e9


def test_anchor_maps_the_kernel_clock_to_the_reference_with_the_rate_between_anchors():
    # the reference runs 50 ppm fast against the kernel clock, 7 ms ahead
    truth = lambda k: 7_000_000 + k * (1 + 50e-6)  # noqa: E731
    k0, ref0, ppb = anchor(1_000_000_000, int(truth(1_000_000_000)), None)
    assert ppb == 0 and (k0, ref0) == (1_000_000_000, int(truth(1_000_000_000)))
    prev = (k0, ref0)
    k1 = 1_050_000_000
    k0, ref0, ppb = anchor(k1, int(truth(k1)), prev)
    assert ppb == pytest.approx(50_000, abs=20)
    # 50 ms on, the map is off by less than a nanosecond per ms
    assert _ref(k0, ref0, ppb, k1 + 50_000_000) == pytest.approx(truth(k1 + 50_000_000), abs=50)


def test_anchor_takes_no_rate_from_a_step_or_a_stopped_clock():
    assert anchor(2_000_000, 10_000_000, (1_000_000, 0))[2] == 0    # 9 ms in 1 ms: a step
    assert anchor(1_000_000, 5, (1_000_000, 0))[2] == 0              # no time passed


def test_buckets_tile_the_line_eight_per_power_of_two():
    bounds = [bucket_bounds_ns(b) for b in range(192)]
    assert bounds[0] == (0, 1024) and bounds[8] == (8192, 9216)
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(191))
    # relative width at most 1/8 above the linear part: the quantiles' resolution
    assert all((hi - lo) / lo <= 0.125 for lo, hi in bounds[8:])
    assert bounds[-1][1] > 400e6  # the largest OWD the stamps tell apart fits


def test_quantiles_are_the_middle_of_the_bucket_holding_the_rank():
    counts = [0] * 192
    assert quantile_ns(counts, 0.5) is None
    counts[8] = 99       # 8.192-9.216 us
    counts[100] = 1      # one sample far above
    assert quantile_ns(counts, 0.5) == (8192 + 9216) / 2
    lo, hi = bucket_bounds_ns(100)
    assert quantile_ns(counts, 1.0) == (lo + hi) / 2
    with pytest.raises(ValueError):
        quantile_ns(counts, 1.5)


def test_pacer_config_refuses_an_unknown_datapath_hold_or_quantum():
    base = dict(name="vm1", bind="10.0.0.1", ifname="eth0", peers={"vm2": "10.0.0.2"},
                coordinator=("10.0.0.1", 7700), api=("10.0.0.1", 7780))
    assert PacerConfig(**base).datapath == "bpf"
    for bad in ({"datapath": "xdp"}, {"hold": "plug"}, {"quantum_ns": -1.0}):
        with pytest.raises(ValueError):
            PacerConfig(**base, **bad)
