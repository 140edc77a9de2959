"""The one percentile helper (workloads.stats) against numpy and hand-computed values."""
import numpy as np
import pytest

from workloads.stats import percentiles


def test_known_values_with_linear_interpolation():
    # 1..10: position p/100*9; p50 at 4.5 -> 5.5 (mean of the middle pair, not the upper 6),
    # p90 at 8.1 -> 9.1, p99 at 8.91 -> 9.91
    got = percentiles(range(10, 0, -1))
    assert got == pytest.approx({"p50": 5.5, "p90": 9.1, "p99": 9.91, "max": 10.0,
                                 "mean": 5.5})
    assert list(got) == ["p50", "p90", "p99", "max", "mean"]


def test_matches_numpy_on_random_samples():
    rng = np.random.default_rng(7)
    x = rng.lognormal(size=1001)
    got = percentiles(x, keys=("p0", "p25", "p99.9", "p100", "min", "n"))
    want = np.percentile(x, [0, 25, 99.9, 100])
    assert [got["p0"], got["p25"], got["p99.9"], got["p100"]] == pytest.approx(want, rel=1e-12)
    assert got["min"] == x.min() and got["n"] == 1001 and isinstance(got["n"], int)


def test_rounding_empty_and_errors():
    assert percentiles([0.123456, 0.2], keys=("p50", "max"), digits=3) == {"p50": 0.162,
                                                                            "max": 0.2}
    assert percentiles([]) is None and percentiles(np.array([])) is None
    assert percentiles([[1, 2], [3, 4]], keys=("mean",)) == {"mean": 2.5}
    with pytest.raises(ValueError, match="unknown statistic 'median'"):
        percentiles([1.0], keys=("median",))
    with pytest.raises(ValueError, match="unknown statistic 'p101'"):
        percentiles([], keys=("p101",))
    with pytest.raises(ValueError, match="1 of 2 samples are NaN"):
        percentiles([1.0, float("nan")])
