"""On-Ramp's gate on synthetic OWD series with known truth (agents.gate)."""
import pytest

from agents.gate import Gate, GateConfig

MS = 1_000_000
T = 500_000  # ns


def gate(fresh=False, spread=False, **kw):
    """On-Ramp's rule as published unless ``fresh``; a fresh release at once unless
    ``spread``."""
    return Gate(GateConfig(threshold_ns=T, max_hold_ns=5 * MS, max_age_ns=20 * MS,
                           max_continuous_ns=20 * MS, fresh=fresh, spread=spread, **kw))


def test_below_threshold_never_holds():
    g = gate()
    for i in range(1000):
        d = g.decide("vm2", owd_ns=T - 1, sent_ns=i * MS, now_ns=i * MS + 200_000)
        assert d.hold_ns == 0 and d.reason == "below threshold"
    assert g.stats("vm2") == (0, 0.0)


def test_hold_is_the_excess_and_ends():
    g = gate()
    d = g.decide("vm2", owd_ns=T + 2 * MS, sent_ns=0, now_ns=3 * MS)
    assert d.hold_ns == 2 * MS and d.until_ns == 5 * MS
    assert g.held("vm2", 4 * MS) and not g.held("vm2", 5 * MS)
    assert not g.held("vm3", 4 * MS)


def test_hold_is_bounded_by_max_hold():
    g = gate()
    d = g.decide("vm2", owd_ns=T + 50 * MS, sent_ns=0, now_ns=51 * MS)
    assert d.hold_ns == 5 * MS


def test_a_sample_sent_before_the_hold_does_not_extend_it():
    g = gate()
    g.decide("vm2", owd_ns=T + 2 * MS, sent_ns=0, now_ns=3 * MS)       # hold 3..5 ms
    d = g.decide("vm2", owd_ns=T + 4 * MS, sent_ns=2 * MS, now_ns=4 * MS)
    assert d.hold_ns == 0 and d.until_ns == 5 * MS
    d = g.decide("vm2", owd_ns=T + 3 * MS, sent_ns=3 * MS + 1, now_ns=4 * MS)  # after: extends
    assert d.until_ns == 7 * MS and g.stats("vm2") == (1, 4 * MS)


def test_a_continuous_hold_is_bounded_then_open():
    g = gate()
    t, held = 0, []
    while t < 60 * MS:  # the queue never drains: every sample is far above T
        g.decide("vm2", owd_ns=T + 10 * MS, sent_ns=t, now_ns=t + 100_000)
        held.append(g.held("vm2", t + 100_000))
        t += MS // 10
    runs, run = [], 0
    for h in held + [False]:
        if h:
            run += 1
        elif run:
            runs.append(run)
            run = 0
    assert max(runs) * 0.1 <= 20.0 + 0.1         # never more than max_continuous in one piece
    assert len(runs) >= 2                        # open for max_hold, then gated again
    assert held.count(False) * 0.1 >= 2 * 5.0    # the open spells last max_hold


def test_stale_and_unsynced_samples_are_ignored():
    g = gate()
    d = g.decide("vm2", owd_ns=T + MS, sent_ns=0, now_ns=T + MS + 21 * MS)
    assert d.hold_ns == 0 and d.reason == "stale sample"
    d = g.decide("vm2", owd_ns=T + MS, sent_ns=0, now_ns=2 * MS, synced=False)
    assert d.hold_ns == 0 and "not synchronized" in d.reason


@pytest.mark.parametrize("field", ["threshold_ns", "max_hold_ns", "max_age_ns",
                                   "max_continuous_ns"])
def test_bad_parameters_are_refused(field):
    with pytest.raises(ValueError, match=field):
        GateConfig(**{field: 0})
    with pytest.raises(ValueError, match=field):  # the compiled gate's int64 ns would wrap
        GateConfig(**{field: 1e18})


def test_spread_without_fresh_is_refused():
    """Only a fresh release is put off: ``spread`` alone would be accepted and do nothing."""
    with pytest.raises(ValueError, match="spread needs fresh"):
        GateConfig(fresh=False, spread=True)


def queue_owd(t_ns: float, slope: float = 0.5) -> float:
    """A synthetic incast queue: empty at t = 0, the OWD grows by ``slope`` per unit time."""
    return T / 2 + slope * t_ns


def test_prediction_extrapolates_a_growing_queue_to_now():
    """Truth: OWD(t) = T/2 + t / 2; a sample sent at 1 ms and seen one OWD + 0.1 ms later
    holds for the OWD a packet sent *now* would see, minus T (On-Ramp alone: the stale one)."""
    for predict, expected_owd in ((True, None), (False, queue_owd(1 * MS))):
        g = gate(predict=predict)
        g.decide("vm2", owd_ns=queue_owd(0.5 * MS), sent_ns=MS // 2, now_ns=MS // 2 + 1)
        now = int(1 * MS + queue_owd(1 * MS) + 0.1 * MS)
        d = g.decide("vm2", owd_ns=queue_owd(1 * MS), sent_ns=1 * MS, now_ns=now)
        truth = queue_owd(now) if predict else expected_owd
        assert truth - T < 5 * MS
        assert d.hold_ns == pytest.approx(truth - T, abs=2)


def test_prediction_never_extrapolates_a_draining_queue_down_nor_beyond_max_slope():
    g = gate(max_slope=2.0)
    g.decide("vm2", owd_ns=T + 3 * MS, sent_ns=0, now_ns=4 * MS)
    d = g.decide("vm3", owd_ns=T + 1 * MS, sent_ns=0, now_ns=2 * MS)  # other destination
    assert d.hold_ns == 1 * MS
    g2 = gate(max_slope=2.0)
    g2.decide("vm2", owd_ns=T, sent_ns=0, now_ns=1 * MS)                # below T, recorded
    d = g2.decide("vm2", owd_ns=T + 100_000, sent_ns=10_000, now_ns=2 * MS)
    # slope 10 clipped to 2: 0.1 ms + 2 x (2 ms - 10 us)
    assert d.hold_ns == pytest.approx(100_000 + 2 * (2 * MS - 10_000), abs=2)
    g3 = gate()
    g3.decide("vm2", owd_ns=T + 2 * MS, sent_ns=0, now_ns=3 * MS)       # hold until 5 ms
    d = g3.decide("vm2", owd_ns=T + 1 * MS, sent_ns=4 * MS, now_ns=6 * MS)  # draining
    assert d.hold_ns == 1 * MS


def test_prediction_never_starts_a_hold_below_threshold():
    g = gate()
    g.decide("vm2", owd_ns=T - 200_000, sent_ns=0, now_ns=1 * MS)
    d = g.decide("vm2", owd_ns=T - 1, sent_ns=10_000, now_ns=3 * MS)   # steep trend, below T
    assert d.hold_ns == 0 and d.reason == "below threshold"


def test_for_hold_keeps_the_defaults_and_scales_the_bounds_with_the_hold():
    assert GateConfig.for_hold(500_000, 5 * MS) == GateConfig()
    g = GateConfig.for_hold(5 * MS, 50 * MS, predict=False, fresh=False)
    assert (g.max_age_ns, g.max_continuous_ns, g.predict, g.fresh) == \
        (200 * MS, 500 * MS, False, False)


def test_fresh_hold_lasts_until_a_sample_sent_in_it_is_below_threshold():
    """Truth: a queue of 60 ms (OWD far above T) seen by a sample sent at 0 and back at 61 ms;
    the hold starts at 61 ms. On-Ramp ends it at 66 ms (max_hold 5 ms); fresh waits for a
    sample sent at or after 61 ms: the one sent at 62 ms still sees 1 ms (extends the wait;
    its own OWD - T ends before 66 ms), the one sent at 64 ms sees 0.2 ms and releases the
    hold at 66 ms (the first sample's OWD - T still runs at its return, 65 ms)."""
    g = gate(fresh=True)
    d = g.decide("vm2", owd_ns=60 * MS, sent_ns=0, now_ns=61 * MS)
    assert d.reason == "above threshold" and d.until_ns == 81 * MS   # waits, up to the cap
    assert g.held("vm2", 70 * MS)
    d = g.decide("vm2", owd_ns=50 * MS, sent_ns=10 * MS, now_ns=61 * MS + 10)  # predates
    assert d.hold_ns == 0 and d.until_ns == 81 * MS
    d = g.decide("vm2", owd_ns=MS, sent_ns=62 * MS, now_ns=65 * MS - 10)
    assert d.reason == "above threshold" and g.held("vm2", 80 * MS)
    d = g.decide("vm2", owd_ns=200_000, sent_ns=64 * MS, now_ns=65 * MS)
    assert d.reason.startswith("released") and d.until_ns == 66 * MS  # OWD - T still runs
    assert g.held("vm2", 66 * MS - 1) and not g.held("vm2", 66 * MS)
    assert g.stats("vm2") == (1, 5 * MS)
    g2 = gate(fresh=True)
    g2.decide("vm2", owd_ns=T + MS, sent_ns=0, now_ns=2 * MS)            # until >= 3 ms
    d = g2.decide("vm2", owd_ns=T - 1, sent_ns=8 * MS, now_ns=9 * MS)     # past owd - T
    assert d.until_ns == 9 * MS and not g2.held("vm2", 9 * MS)


def test_fresh_hold_without_a_fresh_sample_ends_at_the_cap_then_opens():
    g = gate(fresh=True)
    g.decide("vm2", owd_ns=T + MS, sent_ns=0, now_ns=2 * MS)             # every later probe lost
    assert g.held("vm2", 22 * MS - 1) and not g.held("vm2", 22 * MS)    # max_continuous
    d = g.decide("vm2", owd_ns=T + 9 * MS, sent_ns=21 * MS, now_ns=23 * MS)
    assert d.hold_ns == 0 and d.reason == "open after the longest continuous hold"
    d = g.decide("vm2", owd_ns=T + 9 * MS, sent_ns=26 * MS, now_ns=28 * MS)  # max_hold later
    assert d.reason == "above threshold" and g.stats("vm2")[0] == 2


def test_a_late_echo_holds_until_a_fresh_sample_then_only_while_the_destination_answers():
    """Truth: a probe sent at 0 toward a destination that answered at 0 has no echo (the
    receiver's pacer waits for a CPU, or its queue is long). ``late_ns`` is T + max_hold (5.5
    ms): at 5.5 ms it is not late, just after it the destination is held until a sample sent
    in the hold comes back at or below T (at most max_continuous); a destination that never
    answered, or whose last echo is older than max_age (20 ms), is not held; On-Ramp as
    published (fresh off) never holds on a missing echo."""
    late = T + 5 * MS
    g = gate(fresh=True)
    assert g.overdue("vm2", 0, late, answered_ns=0).hold_ns == 0
    d = g.overdue("vm2", 0, late + 1, answered_ns=0)
    assert d.reason.startswith("probe overdue") and d.until_ns == late + 1 + 20 * MS
    assert g.held("vm2", late + 10 * MS)
    assert g.overdue("vm2", 0, late + 2 * MS, answered_ns=0).reason == "held: the hold goes on"
    d = g.decide("vm2", owd_ns=T + MS, sent_ns=0, now_ns=late + 3 * MS)   # the late echo
    assert d.reason == "held: sample predates the hold" and g.held("vm2", late + 10 * MS)
    d = g.decide("vm2", owd_ns=T - 1, sent_ns=late + 4 * MS, now_ns=late + 5 * MS)
    assert d.reason.startswith("released") and not g.held("vm2", late + 5 * MS)
    assert g.stats("vm2") == (1, 5 * MS - 1)
    assert g.overdue("vm3", 0, late + 1, answered_ns=None).hold_ns == 0
    assert g.overdue("vm3", 0, 30 * MS, answered_ns=30 * MS - 20 * MS - 1).reason == \
        "destination silent: gate open"
    assert g.overdue("vm3", 0, 30 * MS, answered_ns=None, synced=False).hold_ns == 0
    assert gate(fresh=False).overdue("vm2", 0, late + 1, answered_ns=0).hold_ns == 0


def test_senders_held_together_release_apart_within_the_holds_largest_excess():
    """Truth: four senders into one queue see the same samples: a queue of 3 ms over T (a hold,
    excess 3 ms), then one of 1.5 ms, then a fresh sample below T. Without ``spread`` all four
    release when it returns (10 ms); with it each one (its own seed, as each VM's pacer has)
    a draw in [0, 3 ms) later: apart, none before 10 ms nor at 13 ms or after, the hold time
    counted to each one's release. The same seed draws the same."""
    def run(**kw):
        g = gate(fresh=True, **kw)
        g.decide("vm5", owd_ns=T + 3 * MS, sent_ns=0, now_ns=4 * MS)
        g.decide("vm5", owd_ns=T + 1.5 * MS, sent_ns=5 * MS, now_ns=7 * MS)
        d = g.decide("vm5", owd_ns=T - 1, sent_ns=9 * MS, now_ns=10 * MS)
        assert d.reason.startswith("released")
        assert g.stats("vm5") == (1, d.until_ns - 4 * MS)
        return d.until_ns

    assert {run(seed=s) for s in range(4)} == {10 * MS}
    ends = [run(spread=True, seed=s) for s in range(4)]
    assert len(set(ends)) == 4 and all(10 * MS <= e < 13 * MS for e in ends), ends
    assert max(ends) - min(ends) > MS, ends
    assert run(spread=True, seed=2) == ends[2]


def test_a_sample_above_threshold_while_a_release_waits_rearms_the_wait():
    """Truth: a fresh sample below T puts the release off (the excess was 5 ms, the longest
    hold: the draw of seed 3 is most of it); before it comes, another sender's release shows
    in a sample above T: held again until a fresh sample below T (up to the cap, 24 ms), which
    puts the release off once more, no later than the cap."""
    g = gate(fresh=True, spread=True, seed=3)
    g.decide("vm5", owd_ns=T + 9 * MS, sent_ns=0, now_ns=4 * MS)        # excess 9, spread 5 ms
    d = g.decide("vm5", owd_ns=T - 1, sent_ns=5 * MS, now_ns=6 * MS)
    assert d.reason.startswith("released") and 6 * MS < d.until_ns < 11 * MS, d
    wait = d.until_ns
    d = g.decide("vm5", owd_ns=T + MS, sent_ns=6 * MS, now_ns=6 * MS + 1)
    assert d.reason == "above threshold" and d.until_ns == 24 * MS
    assert g.held("vm5", wait) and g.held("vm5", 20 * MS)
    d = g.decide("vm5", owd_ns=T - 1, sent_ns=8 * MS, now_ns=9 * MS)
    assert d.reason.startswith("released") and 9 * MS <= d.until_ns < 14 * MS
    assert g.stats("vm5")[0] == 1


def test_a_missing_echos_hold_that_saw_no_queue_is_released_at_once():
    """A late echo's hold (``overdue``) whose fresh samples never showed a queue above T has
    nothing to spread, even after an earlier hold that had: the first fresh sample below T
    releases it at once."""
    g = gate(fresh=True, spread=True, seed=1)
    g.decide("vm2", owd_ns=T + 4 * MS, sent_ns=0, now_ns=MS)             # a queue: 4 ms over
    first = g.decide("vm2", owd_ns=T - 1, sent_ns=2 * MS, now_ns=6 * MS)
    assert first.reason.startswith("released") and first.until_ns > 6 * MS  # spread
    sent = 10 * MS
    now = sent + T + 5 * MS + 1                                          # late: T + max_hold
    assert g.overdue("vm2", sent, now, answered_ns=6 * MS).reason.startswith("probe overdue")
    d = g.decide("vm2", owd_ns=T - 1, sent_ns=now + 1, now_ns=now + MS)
    assert d.reason.startswith("released") and d.until_ns == now + MS
