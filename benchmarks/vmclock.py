"""Cost of a clock read in a VM (the vmclock preload) against the machine's, side by side in
one run: a C loop of clock_gettime (REALTIME, MONOTONIC), gettimeofday, and Python's
time.time_ns(), each without and with the preload on a VM clock file with a few segments
(offset, wander, a step, a correction). The preload's work does not depend on the namespace or
cgroup, so no lab is built.

    .venv/bin/python benchmarks/vmclock.py [--calls 2000000]

Prints ns per call and the ratio VM / machine.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from record import record

from agents.clock import ClockSpec, Oscillator, Segment
from lab import vmclock

LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
int main(int argc, char **argv) {
    long n = atol(argv[2]); struct timespec ts, a, b; struct timeval tv; long long sink = 0;
    int which = atoi(argv[1]);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        if (which == 0) { clock_gettime(CLOCK_REALTIME, &ts); sink += ts.tv_nsec; }
        else if (which == 1) { clock_gettime(CLOCK_MONOTONIC, &ts); sink += ts.tv_nsec; }
        else { gettimeofday(&tv, NULL); sink += tv.tv_usec; }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%f %lld\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n, sink & 1);
    return 0;
}
"""
PY = ("import time; n = {n}; t = time.perf_counter_ns()\nfor _ in range(n): time.time_ns()\n"
      "print((time.perf_counter_ns() - t) / n)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe, path = os.path.join(tmp, "loop"), os.path.join(tmp, "vm.clock")
        with open(exe + ".c", "w") as f:
            f.write(LOOP)
        subprocess.run(["gcc", "-O2", "-o", exe, exe + ".c"], check=True)
        t0 = time.time_ns()
        spec = ClockSpec("vm1", [Segment(t0, 7e6, "h1", Oscillator(
            t0, 23.0, ((0.1, 50.0, 0.3), (0.06, 130.0, 1.0), (0.04, 25.0, 2.0))))])
        spec.append(t0 + 1, step_ns=1e6)
        spec.append(t0 + 2, corr_ppm=-20.0, kind="vm_frequency")
        spec.write(path)
        vm_env = {**os.environ, "LD_PRELOAD": vmclock.library(), "NSLAB_CLOCK": path}
        cases = [("clock_gettime(REALTIME)", [exe, "0", str(args.calls)]),
                 ("clock_gettime(MONOTONIC)", [exe, "1", str(args.calls)]),
                 ("gettimeofday", [exe, "2", str(args.calls)]),
                 ("python time.time_ns()", [sys.executable, "-c",
                                            PY.format(n=args.calls // 4)])]
        print(f"{'call':28s} {'machine ns':>11s} {'VM ns':>9s} {'ratio':>7s}")
        rows = []
        for name, cmd in cases:
            ns = [min(float(subprocess.run(cmd, env=env, capture_output=True, text=True,
                                           check=True).stdout.split()[0]) for _ in range(3))
                  for env in (dict(os.environ), vm_env)]
            print(f"{name:28s} {ns[0]:11.1f} {ns[1]:9.1f} {ns[1] / ns[0]:7.2f}")
            rows.append({"call": name, "machine ns": round(ns[0], 1), "VM ns": round(ns[1], 1),
                         "VM / machine": round(ns[1] / ns[0], 2)})
        record("vmclock", "A clock read in a VM (the preload) against the machine's",
               ["call", "machine ns", "VM ns", "VM / machine"], rows,
               f"ns per call, the best of 3 runs of {args.calls:,} calls "
               f"({args.calls // 4:,} for Python).")


if __name__ == "__main__":
    main()
