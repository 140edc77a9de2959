"""Lab names for tests that cannot clash: between pytest-xdist workers, between pytest runs on
one machine, and with a crashed run's leftovers.

A lab name prefixes every kernel object of the lab, so it is short (``lab.names``: at most 16
of a-z 0-9 _). The name is ``t<pid><salt>_<serial>``: the process id (unique among running
processes, so among xdist workers), two random characters drawn once per process (another PID
namespace, or a dead run's leftovers under a reused PID), and a serial per process, all in
base 36: ``t1x3fqa_1``.
"""
from __future__ import annotations

import itertools
import os
import secrets

from lab.names import check_lab_name

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_SALT = "".join(secrets.choice(_DIGITS) for _ in range(2))
_SERIAL = itertools.count(1)


def base36(n: int) -> str:
    """``n`` (>= 0) in base 36, lower case."""
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _DIGITS[r] + out
        if n == 0:
            return out


def lab_name(serial: int, pid: int, salt: str) -> str:
    """``t<pid><salt>_<serial>`` in base 36 (see the module doc).

    Raises:
        ValueError: the name would not be a valid lab name (a serial above 36**7).
    """
    return check_lab_name(f"t{base36(pid)}{salt}_{base36(serial)}")


def next_lab_name() -> str:
    """A new lab name for this process (thread-safe: ``itertools.count``)."""
    return lab_name(next(_SERIAL), os.getpid(), _SALT)
