"""agents.heap: a daemon's freed memory stays mapped for its next allocations (real page
faults of this kernel, in a child process so that the test run's allocator is untouched)."""
import json
import subprocess
import sys

import pytest

from agents.heap import keep_freed_memory

_CHILD = """
import json, resource, sys
import numpy as np
from agents.heap import settle
took = settle() if sys.argv[1] == "settle" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def window():  # as a window: arrays of a few MB made from each other, then dropped
    a = np.arange(700_000) * 2
    b = np.concatenate([a, a, a])
    return b.reshape(-1, 3).T.copy().sum()
window()
before = faults()
for _ in range(20):
    window()
print(json.dumps({"took": took, "faults": faults() - before}))
"""


def _child(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def test_settled_process_reuses_freed_memory_without_page_faults():
    settled = _child("settle")
    assert settled["took"] is True
    plain = _child("plain")  # glibc's defaults: arrays mapped or trimmed, faulted in anew
    # 20 windows of ~45 MB (11 000 pages) each: glibc's defaults faulted 27 000-37 000 pages
    # in here, the settled process none
    assert settled["faults"] * 10 < plain["faults"], (settled, plain)


def test_keep_freed_memory_refuses_a_size_not_above_zero():
    with pytest.raises(ValueError, match="> 0"):
        keep_freed_memory(0)
