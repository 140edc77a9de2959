"""``session.stats`` on arms drawn from known distributions: the ratio's interval covers the
true ratio of medians in about 95 % of 1000 draws, equal arms give no_difference about as
often, and the verdict follows the interval."""
import numpy as np
import pytest

from session import stats


def _coverage(n: int, ratio: float, sigma: float, draws: int = 1000, seed: int = 1):
    rng = np.random.default_rng(seed)
    covered = verdicts = 0
    for _ in range(draws):
        a = np.exp(rng.normal(np.log(ratio), sigma, n))
        b = np.exp(rng.normal(0.0, sigma * 1.5, n))
        _, (low, high), got_n = stats.ratio_ci(list(a), list(b))
        assert got_n == n
        covered += low <= ratio <= high
        verdicts += stats.verdict([low, high]) != "no_difference"
    return covered / draws, verdicts / draws


@pytest.mark.parametrize("n", [3, 5, 10])
def test_interval_covers_the_true_ratio_95_percent(n):
    cover, _ = _coverage(n, 0.7, 0.1)
    assert 0.93 <= cover <= 0.975, cover


def test_equal_arms_give_no_difference_about_95_percent():
    rng = np.random.default_rng(2)
    calls = [stats.verdict(stats.ratio_ci(list(np.exp(rng.normal(0, 0.2, 5))),
                                          list(np.exp(rng.normal(0, 0.2, 5))))[1])
             for _ in range(1000)]
    assert 0.93 <= calls.count("no_difference") / 1000 <= 0.975


def test_a_clear_difference_is_found():
    _, power = _coverage(5, 0.7, 0.05, draws=200)
    assert power > 0.95


def test_verdict_directions_and_one_run():
    assert stats.verdict([0.5, 0.9]) == "better"
    assert stats.verdict([0.5, 0.9], better="higher") == "worse"
    assert stats.verdict([1.1, 1.3]) == "worse"
    assert stats.verdict([0.9, 1.1]) == "no_difference"
    assert stats.verdict([None, None]) == "no_difference"
    c = stats.comparison("placement", "aware", "naive", "completion_s",
                         {"aware": [2.0], "naive": [4.0]})
    assert c["n"] == 1 and c["ratio_median"] == 0.5 and c["ratio_ci95"] == [None, None]
    assert c["verdict"] == "no_difference" and c["saturated_n"] == 0


def test_failed_repetitions_and_saturation_are_kept():
    c = stats.comparison("two_step", "aware", "naive", "completion_s",
                         {"aware": [2.0, None, 2.2], "naive": [4.0, 4.1, 3.9]},
                         {"aware": [False, True, False], "naive": [False, False, False]})
    assert c["n"] == 2 and c["samples"]["aware"] == [2.0, None, 2.2]
    assert c["saturated_n"] == 1
    assert c["medians"]["naive"] == 4.0
    low, high = c["medians_ci95"]["naive"]
    assert low < 4.0 < high
    assert c["verdict"] == "better"
