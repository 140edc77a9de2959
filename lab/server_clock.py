"""The servers' clocks against each other, measured at bring-up: the bound on every score that
compares events on different servers.

Each server's CLOCK_REALTIME is the truth of what runs on it, so two servers' truths agree only
as well as the servers are synchronized (PTP with hardware timestamps: well under 1 us;
chrony over NTP on a LAN: tens of us). nslab does not synchronize them; it measures how far
apart they are, NTP-style (RFC 5905's on-wire offset with one server stamp): over the server's
SSH control connection one long-lived ``bash`` answers each line with ``$EPOCHREALTIME`` (a
builtin: no fork, microsecond resolution); with t0 and t1 read here around the exchange and
r the server's stamp, offset = r - (t0 + t1) / 2 and the true offset lies within
(t1 - t0) / 2 of it. The sample of least round trip is kept (``samples`` tries).
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from contracts.results.truth import ServerClock
from lab.errors import LabError
from lab.servers import Servers, ServerShell

SAMPLES = 16
_ECHO = 'while read -r _; do echo "$EPOCHREALTIME"; done'


def measure(shell: ServerShell, samples: int = SAMPLES) -> ServerClock:
    """``shell``'s server's clock against this one's (offset 0, round trip 0 for the local
    server: one clock).

    Raises:
        LabError: the server did not answer with a time.
    """
    if shell.local:
        return ServerClock(server=shell.server.name, offset_us=0.0, rtt_us=0.0)
    proc = shell.popen(["env", "LC_ALL=C", "bash", "-c", _ECHO])
    best: tuple[float, float] | None = None
    try:
        for _ in range(samples):
            t0 = time.clock_gettime_ns(time.CLOCK_REALTIME)
            proc.stdin.write("\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            t1 = time.clock_gettime_ns(time.CLOCK_REALTIME)
            try:
                remote_ns = round(float(line) * 1e9)
            except ValueError as e:
                raise LabError(f"server {shell.server.name}: clock exchange got {line!r}, not "
                               "a time (does it run bash >= 5?)") from e
            rtt = (t1 - t0) / 1e3
            if best is None or rtt < best[1]:
                best = ((remote_ns - (t0 + t1) / 2) / 1e3, rtt)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    return ServerClock(server=shell.server.name, offset_us=best[0], rtt_us=best[1])


def measure_all(servers: Servers, samples: int = SAMPLES) -> list[ServerClock]:
    """Every server's clock against the first's, in server order."""
    return [measure(shell, samples) for shell in servers.shells.values()]


def sync_bound_us(clocks: Sequence[ServerClock]) -> float:
    """us: the largest |offset_i - offset_j| + (rtt_i + rtt_j) / 2 over pairs of servers (0
    with one server): how far two servers' truths may disagree."""
    return max((abs(a.offset_us - b.offset_us) + (a.rtt_us + b.rtt_us) / 2
                for a, b in itertools.combinations(clocks, 2)), default=0.0)
