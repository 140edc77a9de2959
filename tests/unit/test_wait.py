"""``lab.wait.wait_until``: returns the predicate's first true value, or its last value at the
deadline, calling it at least once; its exceptions propagate."""
import time

import pytest

from lab.wait import wait_until


def test_returns_the_first_true_value():
    calls = iter([0, None, "", 7, 8])
    assert wait_until(lambda: next(calls), 5.0, 0.001) == 7


def test_times_out_with_the_last_value():
    n = []
    t0 = time.monotonic()
    assert wait_until(lambda: n.append(1) or [], 0.1, 0.01) == []
    assert 0.1 <= time.monotonic() - t0 < 1.0
    assert len(n) >= 3


def test_called_once_even_with_no_time():
    n = []
    assert wait_until(lambda: n.append(1) or False, 0.0) is False
    assert len(n) == 1


def test_exceptions_propagate():
    def boom():
        raise RuntimeError("exited")
    with pytest.raises(RuntimeError, match="exited"):
        wait_until(boom, 1.0)
