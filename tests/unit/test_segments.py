"""agents.segments: reductions over segments of flat arrays against numpy on each segment."""
import numpy as np

from agents import segments


def test_sorted_values_within_segments_as_numpy_per_segment():
    rng = np.random.default_rng(3)
    for i in range(50):
        counts = rng.integers(1, 30, int(rng.integers(1, 3000)))
        if i % 2:  # ragged: one long segment among short ones (the lexsort path)
            counts[0] = 20 * counts.sum()
        starts = segments.starts_of(counts)
        seg = segments.ids(starts)
        v = rng.normal(0.0, 10.0 ** rng.uniform(-3, 8), seg.size)
        v[rng.random(seg.size) < 0.1] = 0.0
        v[rng.random(seg.size) < 0.05] *= -1e-300  # negative, subnormal
        v[rng.random(seg.size) < 0.01] = np.inf
        want = np.concatenate([np.sort(v[a:b]) for a, b in zip(starts[:-1], starts[1:],
                                                                strict=True)])
        assert np.array_equal(segments.sorted_values(v, starts, seg), want)
    assert segments.sorted_values(np.zeros(0), np.zeros(1, np.int64),
                                  np.zeros(0, np.int64)).size == 0


def test_percentile_and_argmin_as_numpy_per_segment():
    rng = np.random.default_rng(4)
    starts = segments.starts_of(rng.integers(1, 40, 500))
    seg = segments.ids(starts)
    v = rng.exponential(30.0, seg.size)
    srt = segments.sorted_values(v, starts, seg)
    for q in (0, 50, 99, 100):
        want = [np.percentile(v[a:b], q) for a, b in zip(starts[:-1], starts[1:], strict=True)]
        assert np.allclose(segments.percentile(srt, starts, q), want, rtol=1e-12, atol=0)
    want = [a + np.argmin(v[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert np.array_equal(segments.argmin(v, starts), want)
    assert np.array_equal(segments.spread(v[starts[:-1]], starts), v[starts[:-1]][seg])
