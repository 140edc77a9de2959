"""The pacer's compiled gate (agents/native/pacer.c through agents.pacerio.CGate) against the
Python gate (agents.gate.Gate, the oracle) on the same synthetic OWD series: the same decision,
hold end and reason on every sample, the same holds and hold time per destination."""
import numpy as np
import pytest

from agents.gate import Gate, GateConfig
from agents.pacerio import REASONS, CGate

MS = 1_000_000


def series(seed: int, n: int = 4000):
    """Samples of 3 destinations: incast-like ramps and drains around T, noise, reordered and
    stale echoes, unsynchronized stretches; (dest, owd_ns, sent_ns, now_ns, synced); one in
    five is a missing echo instead (owd_ns None: a probe sent at sent_ns unanswered at now_ns,
    the last echo at now_ns - owd-ish, or never)."""
    rng = np.random.default_rng(seed)
    t, q = 0, np.zeros(3)
    for _ in range(n):
        t += int(rng.integers(20_000, 400_000))
        dst = int(rng.integers(3))
        # a queue grows to ~8 ms (long enough to reach the longest continuous hold), drains
        q[dst] = max(0.0, q[dst] + rng.normal(100_000, 300_000)) if q[dst] < 8 * MS else 0.0
        owd = 60_000 + q[dst] + rng.normal(0, 20_000)
        sent = t - int(rng.integers(0, 3 * MS)) if rng.random() < 0.1 else t
        age = int(rng.integers(10_000, 30 * MS)) if rng.random() < 0.05 else \
            int(rng.integers(10_000, 500_000))
        now, synced = int(sent + owd + age), bool(rng.random() > 0.03)
        if rng.random() < 0.2:
            answered = None if rng.random() < 0.1 else now - int(rng.integers(0, 30 * MS))
            yield dst, None, now - int(rng.integers(0, 12 * MS)), now, synced, answered
        else:
            yield dst, float(owd), sent, now, synced, None


@pytest.mark.parametrize(("fresh", "spread"), [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("predict", [True, False])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_compiled_gate_matches_the_python_gate(seed, predict, fresh, spread):
    """Also the release spread's draws (``spread``, a seed past 2**63 on the C side's
    unsigned arithmetic)."""
    cfg = GateConfig(threshold_ns=500_000, max_hold_ns=5 * MS, max_age_ns=20 * MS,
                     max_continuous_ns=20 * MS, predict=predict, max_slope=8.0, fresh=fresh,
                     spread=spread, seed=-seed)
    py, c = Gate(cfg), CGate(cfg, 3)
    reasons = set()
    for dst, owd, sent, now, synced, answered in series(seed):
        if owd is None:
            a = py.overdue(f"vm{dst}", sent, now, answered, synced)
            b = c.overdue(dst, sent, now, answered, synced)
        else:
            a = py.decide(f"vm{dst}", owd, sent, now, synced)
            b = c.decide(dst, owd, sent, now, synced)
        assert (b.hold_ns, b.until_ns, b.reason) == (a.hold_ns, a.until_ns, a.reason)
        reasons.add(a.reason)
    for dst in range(3):
        assert c.stats(dst) == py.stats(f"vm{dst}")
    # the series reaches every branch of the gate (a fresh release and a missing echo's
    # holds only with ``fresh``)
    assert reasons == set(REASONS) - (set() if fresh else set(REASONS[6:]) - {REASONS[7]}), \
        reasons
    assert py.stats("vm0")[0] > 10
