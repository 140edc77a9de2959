"""Timed waits under the VM clock preload last their timeout on the VM's clock, whatever the
VM's offset: a deadline a program computes from the VM clock is converted to the machine's
before the kernel sees it (``vmclock.c``: ``true_deadline``). Before, a VM 200 ms behind the
machine returned from ``Event.wait(0.3)`` after 0.1 s and spun through ``Queue.get(timeout)``
(Python re-waits the remainder, whose deadline had already passed on the machine's clock),
and a VM 200 ms ahead waited 0.5 s. A deadline meaning "never" stays never (its conversion
must not overflow into one already past)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agents.clock import ClockSpec, Oscillator, Segment
from lab import vmclock

TIMEOUT_S = 0.3
LATE_S = 0.1
"""How late a wait may end (the machine's scheduling), well under the offsets tried."""

CHILD = r"""
import ctypes, queue, sys, threading, time
kind, timeout = sys.argv[1], float(sys.argv[2])
libc = ctypes.CDLL(None)  # the global scope: the preload comes first


class TS(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]


def cond_wait(clock, forever=False):
    attr, cond, mtx = (ctypes.create_string_buffer(64) for _ in range(3))
    libc.pthread_condattr_init(attr)
    if clock is not None:
        libc.pthread_condattr_setclock(attr, clock)
    libc.pthread_cond_init(cond, attr)
    libc.pthread_mutex_init(mtx, None)
    libc.pthread_mutex_lock(mtx)
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC if clock is not None
                                else time.CLOCK_REALTIME)
    if forever:  # "never" as a huge tv_sec (C++'s time_point::max()): signalled after timeout
        def signal():
            time.sleep(timeout)
            libc.pthread_mutex_lock(mtx)
            libc.pthread_cond_signal(cond)
            libc.pthread_mutex_unlock(mtx)
        threading.Thread(target=signal, daemon=True).start()
        assert libc.pthread_cond_timedwait(cond, mtx, ctypes.byref(TS(2**62, 0))) == 0
        return
    d = now + int(timeout * 1e9)
    assert libc.pthread_cond_timedwait(cond, mtx, ctypes.byref(TS(d // 10**9, d % 10**9))) == 110


c0, t0 = time.process_time(), time.monotonic()
if kind == "event":
    threading.Event().wait(timeout)
elif kind == "queue":
    try:
        queue.Queue().get(timeout=timeout)
    except queue.Empty:
        pass
elif kind == "cond_monotonic":
    cond_wait(time.CLOCK_MONOTONIC)
elif kind == "cond_realtime":
    cond_wait(None)
elif kind == "cond_forever":
    cond_wait(None, forever=True)
else:  # a mutex this thread holds: the timed lock waits out its deadline
    mtx = ctypes.create_string_buffer(64)
    libc.pthread_mutex_init(mtx, None)
    libc.pthread_mutex_lock(mtx)
    d = time.clock_gettime_ns(time.CLOCK_REALTIME) + int(timeout * 1e9)
    assert libc.pthread_mutex_timedlock(mtx, ctypes.byref(TS(d // 10**9, d % 10**9))) == 110
print(time.monotonic() - t0, time.process_time() - c0)
"""


@pytest.fixture
def clock_file(tmp_path):
    def make(offset_ms: float) -> str:
        path = str(tmp_path / f"vm{offset_ms:+.0f}.clock")
        t0 = time.time_ns()
        ClockSpec("vm1", [Segment(t0, offset_ms * 1e6, "h1", Oscillator(t0, 0.0))]).write(path)
        return path
    return make


@pytest.mark.parametrize("offset_ms", [-200.0, 200.0])
@pytest.mark.parametrize("kind", ["event", "queue", "cond_monotonic", "cond_realtime",
                                  "cond_forever", "mutex"])
def test_a_timed_wait_lasts_its_timeout_on_the_vm_clock(clock_file, kind, offset_ms):
    """Measured on the VM's own clock (the child's ``time.monotonic``): not early by the
    offset, not late by it; the wait sleeps (its CPU is a fraction of the wait)."""
    env = {**os.environ, "LD_PRELOAD": vmclock.library(), "NSLAB_CLOCK": clock_file(offset_ms)}
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(TIMEOUT_S)], env=env,
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    waited, cpu = map(float, out.stdout.split())
    assert TIMEOUT_S - 0.002 <= waited <= TIMEOUT_S + LATE_S, (kind, offset_ms, waited)
    assert cpu < TIMEOUT_S / 3, (kind, offset_ms, cpu)
