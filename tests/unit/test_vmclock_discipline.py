"""A VM's clock discipline through the preload answers as Linux's adjtimex(2) does (kernel
kernel/time/ntp.c): ``ADJ_OFFSET`` with ``STA_PLL`` (systemd-timesyncd's and ntpd's kernel
discipline) slews the VM clock by 2^-(2 + time constant) of the remaining offset a second and
moves the frequency by offset * secs / 2^(2 * (4 + constant)); ``adjtime`` slews at 500 us/s;
a read (modes 0) gives the remaining offset, maxerror grown by 500 us/s up to 16 s where the
clock becomes ``STA_UNSYNC``, and the kernel's time constant (4 more than asked without
``STA_NANO``); a step clears the NTP state (ntp_clear: maxerror at its limit, no slew left),
which chronyd checks before it steps with ``ADJ_SETOFFSET``. The child runs without
``CAP_SYS_TIME``: a call that reached the kernel could never change the machine's clock (it
fails with EPERM instead)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from agents.clock import ClockSpec, Oscillator, Segment
from lab import vmclock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = r"""
import ctypes, json, os, sys, time
sys.path[:0] = [sys.argv[2], os.path.join(sys.argv[2], "tests", "integration")]
from vmclock_probe import Timex  # struct timex of <sys/timex.h>, x86_64

libc = ctypes.CDLL(None, use_errno=True)  # the global scope: the preload comes first


class TV(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("us", ctypes.c_long)]


def adj(**fields):
    tx = Timex(**fields)
    rc = libc.clock_adjtime(0, ctypes.byref(tx))
    return {"rc": rc, "errno": ctypes.get_errno(), "offset": tx.offset, "freq": tx.freq,
            "status": tx.status, "maxerror": tx.maxerror, "constant": tx.constant,
            "vm_s": int(time.time())}


ADJ_OFFSET, ADJ_FREQUENCY, ADJ_MAXERROR, ADJ_STATUS, ADJ_TIMECONST = 1, 2, 4, 0x10, 0x20
ADJ_NANO, STA_PLL = 0x2000, 1
out = []
if sys.argv[1] == "pll":  # as systemd-timesyncd: STA_PLL, nanoseconds, time constant 0
    out.append(adj(modes=ADJ_STATUS | ADJ_NANO | ADJ_TIMECONST, status=STA_PLL, constant=0))
    out.append(adj(modes=ADJ_OFFSET | ADJ_NANO, offset=1_000_000))
    time.sleep(2)
    out.append(adj(modes=0))
    out.append(adj(modes=ADJ_OFFSET | ADJ_NANO, offset=1_000_000))
elif sys.argv[1] == "adjtime":
    old = TV()
    rc = libc.adjtime(ctypes.byref(TV(0, 3000)), ctypes.byref(old))
    out.append({"rc": rc, "errno": ctypes.get_errno(), "old_us": old.s * 10**6 + old.us})
    time.sleep(1)
    rc = libc.adjtime(None, ctypes.byref(old))
    out.append({"rc": rc, "errno": ctypes.get_errno(), "old_us": old.s * 10**6 + old.us})
elif sys.argv[1] == "step":  # chrony's probe for ADJ_SETOFFSET (sys_linux.c)
    libc.adjtime(ctypes.byref(TV(0, 3000)), None)
    out.append(adj(modes=ADJ_MAXERROR, maxerror=0))
    out.append(adj(modes=0x0100 | ADJ_NANO))  # ADJ_SETOFFSET of 0 s
    old = TV()
    libc.adjtime(None, ctypes.byref(old))
    out.append({"adjtime_left_us": old.s * 10**6 + old.us})
else:  # reads: maxerror grows to the phase limit, then STA_UNSYNC; the kernel's constant
    out.append(adj(modes=ADJ_MAXERROR | ADJ_STATUS | ADJ_TIMECONST, maxerror=15_999_800,
                   status=0, constant=3))
    time.sleep(1.2)
    out.append(adj(modes=0))
print(json.dumps(out))
"""


def run(tmp_path, case: str) -> tuple[list[dict], ClockSpec]:
    """``case`` in a child on a VM clock 5 ms ahead: its calls' results, and the clock after."""
    path = str(tmp_path / "vm1.clock")
    t0 = time.time_ns()
    ClockSpec("vm1", [Segment(t0, 5e6, "h1", Oscillator(t0, 0.0))]).write(path)
    env = {**os.environ, "LD_PRELOAD": vmclock.library(), "NSLAB_CLOCK": path}
    out = subprocess.run([sys.executable, "-c", CHILD, case, REPO], env=env,
                         capture_output=True, text=True, timeout=20,
                         preexec_fn=vmclock.drop_capabilities if os.geteuid() == 0 else None)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), ClockSpec.read(path)


def test_adj_offset_is_the_kernel_pll(tmp_path):
    (on, first, read, second), spec = run(tmp_path, "pll")
    assert on["rc"] >= 0 and first["rc"] >= 0 and on["status"] & 1, (on, first)  # STA_PLL
    # 1 ms to slew, 2^-2 of the rest a second: 0.75^2 left after 2 s (+- 0.1 s of scheduling)
    assert 0.75 ** 2.1 * 1e6 <= read["offset"] <= 0.75 ** 2 * 1e6, read
    slews = [s for s in spec.segments if s.kind == "vm_slew"]
    assert [s.pll_ns for s in slews[:1]] == [1e6], spec.segments
    # what the PLL added to the VM clock by the second update (corr_ns: corrections so far)
    assert 1e6 - 0.75 ** 1.9 * 1e6 <= slews[1].corr_ns <= 1e6 - 0.75 ** 2.1 * 1e6, slews[1]
    # the frequency: offset * secs / 2^(2 * (SHIFT_PLL + 2 + constant)) ns/s per update, secs
    # the VM's whole seconds since the last (the first: since STA_PLL was set)
    secs = [first["vm_s"] - on["vm_s"], second["vm_s"] - first["vm_s"]]
    expect = sum(1e6 * s / 2 ** 8 for s in secs) / 1000 * 65536  # scaled ppm
    assert second["freq"] == pytest.approx(expect, abs=2), (secs, second)  # rounded per update
    assert second["freq"] > 0 and slews[-1].corr_ppm == pytest.approx(second["freq"] / 65536)


def test_adjtime_slews_at_500_us_a_second(tmp_path):
    (first, later), spec = run(tmp_path, "adjtime")
    assert (first["rc"], first["old_us"]) == (0, 0), first
    assert later["rc"] == 0 and 2400 <= later["old_us"] <= 2500, later  # 1 s (+0.2) at 500 us/s
    seg = spec.segments[-1]
    assert (seg.kind, seg.adj_ns) == ("vm_slew", 3e6)
    assert spec.offset_at(seg.start_ns + 2 * 10**9) - seg.offset_ns == pytest.approx(1e6)
    assert spec.offset_at(seg.start_ns + 9 * 10**9) - seg.offset_ns == pytest.approx(3e6)


def test_reads_answer_as_the_kernel(tmp_path):
    (set_, read), _ = run(tmp_path, "reads")
    assert set_["rc"] == 0 and set_["status"] == 0, set_  # TIME_OK: synchronized
    assert set_["constant"] == 7 and set_["maxerror"] == 15_999_800, set_
    assert read["maxerror"] == 16_000_000 and read["status"] & 0x40, read  # STA_UNSYNC
    assert read["rc"] == 5, read  # TIME_ERROR


def test_a_step_clears_the_ntp_state(tmp_path):
    """chronyd's test of ADJ_SETOFFSET (maxerror 0, then a zero step must reset it): without
    it chronyd logs "adjtimex() doesn't support ADJ_SETOFFSET" and steps another way."""
    (zero, stepped, left), spec = run(tmp_path, "step")
    assert zero["rc"] >= 0 and zero["maxerror"] == 0, zero
    assert stepped["rc"] == 5 and stepped["maxerror"] >= 100_000, stepped  # STA_UNSYNC
    assert left["adjtime_left_us"] == 0 and spec.segments[-1].kind == "vm_step", left
