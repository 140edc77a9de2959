"""The preload (vmclock/vmclock.c) and agents/clock.py are one formula: the same offsets, bit
for bit, for every clock and segment kind; a rewritten file reaches a running process; which
programs bypass the preload. No clock is set here: only reads (the discipline calls are
tested inside a VM, without CAP_SYS_TIME, in tests/integration/test_vmclock.py)."""
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from agents.clock import ClockSpec, Oscillator, Segment, update
from lab import vmclock

S = 1_000_000_000
T0 = 1_700_000_000 * S
# in a process running with the preload: for each line "t" on stdin, the C offsets (REALTIME,
# MONOTONIC, RAW) at true time t, as float.hex
READER = """
import ctypes, sys
f = ctypes.CDLL(None).nslab_vmclock_offset_ns
f.restype, f.argtypes = ctypes.c_double, [ctypes.c_int, ctypes.c_int64]
for line in sys.stdin:
    t = int(line)
    print(" ".join(f(w, t).hex() for w in range(3)), flush=True)
"""


def clock_spec() -> ClockSpec:
    osc = Oscillator(T0, 37.25, ((0.11, 53.0, 0.3), (0.05, 127.0, 2.1), (0.04, 21.0, 5.9)))
    c = ClockSpec("vm1", [Segment(T0, 6.5e6, "h1", osc)])
    c.append(T0 + 7 * S, step_ns=2e6)
    c.append(T0 + 19 * S + 123, host="h2", oscillator=Oscillator(T0, -12.0, ((0.2, 40.0, 1),)))
    c.append(T0 + 31 * S, corr_ppm=-41.5, kind="vm_frequency")
    c.append(T0 + 45 * S, step_ns=-3.3e6, kind="vm_step")
    # slews (the kernel PLL's ADJ_OFFSET, adjtime), carried on into the next segment
    c.append(T0 + 50 * S, kind="vm_slew")
    c.segments[-1] = replace(c.segments[-1], pll_ns=-370_123.5, pll_rate=-math.log1p(-2 ** -6),
                             adj_ns=2.2e6)
    c.append(T0 + 53 * S + 77, corr_ppm=3.25, kind="vm_frequency")
    return c


@pytest.fixture
def reader(tmp_path):
    path = str(tmp_path / "vm1.clock")
    clock_spec().write(path)
    env = {**os.environ, "LD_PRELOAD": vmclock.library(), "NSLAB_CLOCK": path}
    proc = subprocess.Popen([sys.executable, "-c", READER], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def read(t: int) -> list[float]:
        proc.stdin.write(f"{t}\n")
        proc.stdin.flush()
        return [float.fromhex(x) for x in proc.stdout.readline().split()]
    yield path, read
    proc.stdin.close()
    proc.wait(timeout=5)


def python_offsets(spec: ClockSpec, t: int) -> list[float]:
    seg = spec.segment_at(t)
    return [seg.offset_at(t), seg.monotonic_offset_at(t), seg.raw_offset_at(t)]


def test_c_and_python_agree_bit_for_bit_on_every_segment(reader):
    path, read = reader
    spec = clock_spec()
    times = [T0 - S, T0, T0 + 7 * S - 1, T0 + 7 * S, T0 + 19 * S + 123, T0 + 31 * S + 5,
             T0 + 45 * S, T0 + 51 * S + 3, T0 + 53 * S + 77, T0 + 55 * S,
             T0 + 600 * S + 987_654_321] + [T0 + k * 3_141_592_653 for k in range(20)]
    for t in times:
        assert read(t) == python_offsets(spec, t), t


def test_a_rewritten_clock_reaches_a_running_process(reader):
    path, read = reader
    t = T0 + 100 * S
    before = read(t)
    spec = update(path, lambda s: s.append(T0 + 90 * S, step_ns=1e6))
    assert read(t) == python_offsets(spec, t)
    assert read(t)[0] == pytest.approx(before[0] + 1e6)


def test_programs_read_the_vm_clock(tmp_path):
    """date and Python (time.time_ns through libc's clock_gettime) see the formula's time."""
    path = str(tmp_path / "vm1.clock")
    t0 = time.time_ns()
    ClockSpec("vm1", [Segment(t0, 7e6, "h1", Oscillator(t0, 0.0))]).write(path)
    env = {**os.environ, "LD_PRELOAD": vmclock.library(), "NSLAB_CLOCK": path}
    for cmd in (["date", "+%s%N"], [sys.executable, "-c", "import time; print(time.time_ns())"]):
        a = time.time_ns()
        v = int(subprocess.run(cmd, env=env, capture_output=True, text=True).stdout)
        b = time.time_ns()
        assert a + 7_000_000 <= v <= b + 7_000_000, cmd


def test_bypass_detection(tmp_path):
    assert vmclock.bypass_reason(shutil.which("date")) is None  # dynamic: preloaded
    assert vmclock.bypass_reason(__file__) is None  # a script: its interpreter decides
    static = str(tmp_path / "static")
    src = tmp_path / "s.c"
    src.write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-static", "-o", static, str(src)], check=True)
    assert "statically linked" in vmclock.bypass_reason(static)


def test_clock_is_the_system_clock_under_the_preload(tmp_path):
    """agents.clock.Clock() in a preloaded process: no second conversion, still emulated."""
    path = str(tmp_path / "vm1.clock")
    clock_spec().write(path)
    env = {**os.environ, "LD_PRELOAD": vmclock.library(), "NSLAB_CLOCK": path}
    out = subprocess.run([sys.executable, "-c", "from agents.clock import Clock; c = Clock(); "
                          "print(c.path, c.emulated, c.to_vm_ns(123))"], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["None", "True", "123"]
