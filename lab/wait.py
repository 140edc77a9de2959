"""``wait_until``: the one polling loop of the lab, the session and the pytest plugin."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.05) -> T:
    """Call ``predicate`` every ``interval_s`` s until it returns a true value or ``timeout_s``
    s have passed; its last value either way (a false one: the time ran out). It is called at
    least once, and once more at the deadline. An exception from it propagates."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        left = deadline - time.monotonic()
        if value or left <= 0:
            return value
        time.sleep(min(interval_s, left))
