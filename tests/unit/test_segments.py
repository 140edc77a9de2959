"""agents.segments: reductions over segments of flat arrays against numpy on each segment."""
import numpy as np

from agents import segments


def test_sort_within_segments_as_lexsort():
    rng = np.random.default_rng(3)
    for _ in range(50):
        counts = rng.integers(1, 30, int(rng.integers(1, 3000)))
        seg = segments.ids(segments.starts_of(counts))
        v = rng.normal(0.0, 10.0 ** rng.uniform(-3, 8), seg.size)
        v[rng.random(seg.size) < 0.1] = 0.0
        v[rng.random(seg.size) < 0.05] *= -1e-300  # negative, subnormal
        order = segments.sort(v, seg)
        assert np.array_equal(seg[order], seg)  # segments stay in place
        assert np.array_equal(v[order], v[np.lexsort((v, seg))])
    assert segments.sort(np.zeros(0), np.zeros(0, np.int64)).size == 0


def test_percentile_and_argmin_as_numpy_per_segment():
    rng = np.random.default_rng(4)
    starts = segments.starts_of(rng.integers(1, 40, 500))
    seg = segments.ids(starts)
    v = rng.exponential(30.0, seg.size)
    srt = v[segments.sort(v, seg)]
    for q in (0, 50, 99, 100):
        want = [np.percentile(v[a:b], q) for a, b in zip(starts[:-1], starts[1:], strict=True)]
        assert np.allclose(segments.percentile(srt, starts, q), want, rtol=1e-12, atol=0)
    want = [a + np.argmin(v[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert np.array_equal(segments.argmin(v, starts, seg), want)
