"""The fidelity sampler on real CPU samples: busy loops this test starts (and ends, by PID) on
every core set the saturation flag, and a loop pinned to one core is attributed to it. No
assertion that an idle machine is not flagged: other people's work shares these cores (the
rule on known samples is in test_saturation.py)."""
import os
import subprocess
import sys
import time

import numpy as np

from lab.fidelity import FidelitySampler, cpu_interval, read_cpu_times

HOG = [sys.executable, "-c", "while True: pass"]


def sample_with_hogs(cores: list[int], seconds: float = 2.0) -> dict:
    """The sampler's summary over ``seconds`` while one busy loop runs pinned to each of
    ``cores`` (one extra loop per core when all cores are hogged)."""
    hogs = [subprocess.Popen(HOG) for _ in cores]
    try:
        for pid, core in zip([h.pid for h in hogs], cores, strict=True):
            os.sched_setaffinity(pid, {core})
        time.sleep(0.3)  # the loops are running before the first sample
        with FidelitySampler(interval_s=0.2) as sampler:
            time.sleep(seconds)
        return sampler.summary()
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def test_busy_loops_on_every_core_set_the_flag():
    cores = sorted(os.sched_getaffinity(0))
    s = sample_with_hogs(cores * 2)
    assert s["samples"] >= 5
    assert s["saturated"] is True and s["saturated_share"] >= 0.5
    by_cpu = {c["cpu"]: c for c in s["cores"]}
    assert all(by_cpu[c]["saturated"] and by_cpu[c]["busy"]["p50"] >= 0.9 for c in cores)
    assert s["queues"] is None  # no lab watched


def test_a_loop_pinned_to_one_core_is_attributed_to_it():
    core = max(os.sched_getaffinity(0))
    s = sample_with_hogs([core])
    (hot,) = [c for c in s["cores"] if c["cpu"] == core]
    assert hot["saturated"] and hot["hot_share"] >= 0.5 and hot["busy"]["p50"] >= 0.9


def test_cpu_interval_rows_and_fractions():
    a = read_cpu_times()
    time.sleep(0.05)
    b = read_cpu_times()
    assert a.shape == (1 + os.cpu_count(), 8)
    np.testing.assert_allclose(a[0], a[1:].sum(axis=0))
    busy, soft = cpu_interval(a, b)
    assert busy.shape == soft.shape == (a.shape[0],)
    assert ((busy >= 0) & (busy <= 1) & (soft >= 0) & (soft <= busy + 1e-9)).all()
    assert cpu_interval(a, a) is None
