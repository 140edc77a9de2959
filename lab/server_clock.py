"""The servers' clocks against each other, measured at bring-up and during the run: the bound
on every score that compares events on different servers.

Each server's CLOCK_REALTIME is the truth of what runs on it, so two servers' truths agree only
as well as the servers are synchronized (PTP with hardware timestamps: well under 1 us;
chrony over NTP on a LAN: tens of us). nslab does not synchronize them; it measures how far
apart they are, NTP-style (RFC 5905's on-wire offset with one server stamp): over the server's
SSH control connection one long-lived ``bash`` answers each line with ``$EPOCHREALTIME`` (a
builtin: no fork, microsecond resolution); with t0 and t1 read here around the exchange and
r the server's stamp, offset = r - (t0 + t1) / 2 and the true offset lies within
(t1 - t0) / 2 of it. The sample of least round trip is kept (``samples`` tries).

``ServerClocks`` measures every server at bring-up (``SAMPLES`` tries), then every
``INTERVAL_S`` from a background thread until the lab stops (``RUN_SAMPLES`` tries each, over
the same ``bash``), so the bound covers the whole run and a server's drift shows as a series.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence

from contracts.results.truth import ServerClock, ServerClockSample
from lab.errors import LabError
from lab.servers import Servers, ServerShell

SAMPLES = 16
RUN_SAMPLES = 8
INTERVAL_S = 2.0
_ECHO = 'while read -r _; do echo "$EPOCHREALTIME"; done'


class ClockProbe:
    """An open clock exchange with ``shell``'s server (none for the local one: one clock)."""

    def __init__(self, shell: ServerShell):
        self.shell = shell
        self.proc = None if shell.local else shell.popen(["env", "LC_ALL=C", "bash", "-c",
                                                          _ECHO])

    def measure(self, samples: int = SAMPLES) -> ServerClock:
        """The server's clock against this one's, the least round trip of ``samples``
        exchanges (offset 0, round trip 0 for the local server).

        Raises:
            LabError: the server did not answer with a time.
        """
        name = self.shell.server.name
        if self.proc is None:
            return ServerClock(server=name, offset_us=0.0, rtt_us=0.0)
        best: tuple[float, float] | None = None
        for _ in range(samples):
            t0 = time.clock_gettime_ns(time.CLOCK_REALTIME)
            try:
                self.proc.stdin.write("\n")
                self.proc.stdin.flush()
            except OSError as e:
                raise LabError(f"server {name}: clock exchange ended: {e}") from e
            line = self.proc.stdout.readline()
            t1 = time.clock_gettime_ns(time.CLOCK_REALTIME)
            try:
                remote_ns = round(float(line) * 1e9)
            except ValueError as e:
                raise LabError(f"server {name}: clock exchange got {line!r}, not a time (does "
                               "it run bash >= 5?)") from e
            rtt = (t1 - t0) / 1e3
            if best is None or rtt < best[1]:
                best = ((remote_ns - (t0 + t1) / 2) / 1e3, rtt)
        return ServerClock(server=name, offset_us=best[0], rtt_us=best[1])

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
            self.proc = None


class ServerClocks:
    """Every server's clock against the first's over a lab's life: ``bringup`` (``measure``),
    then a round every ``interval_s`` between ``start`` and ``stop`` (``rounds``: the
    CLOCK_REALTIME here in ns, every server's clock). A server that stops answering ends the
    rounds; ``error`` says why."""

    def __init__(self, servers: Servers, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self.servers = servers
        self.probes: list[ClockProbe] = []
        self.bringup: list[ServerClock] = []
        self.rounds: list[tuple[int, list[ServerClock]]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="nslab-servers")

    def measure(self) -> list[ServerClock]:
        """Open an exchange with every server and measure it now (``SAMPLES`` each): the
        bring-up figures.

        Raises:
            LabError: a server did not answer with a time.
        """
        self.probes = [ClockProbe(shell) for shell in self.servers.shells.values()]
        self.bringup = [p.measure(SAMPLES) for p in self.probes]
        return self.bringup

    def start(self) -> None:
        """Measure a round every ``interval_s`` in a background thread."""
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                now = time.clock_gettime_ns(time.CLOCK_REALTIME)
                self.rounds.append((now, [p.measure(RUN_SAMPLES) for p in self.probes]))
            except LabError as e:
                self.error = str(e)
                return

    def stop(self) -> None:
        """End the rounds and the exchanges (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for p in self.probes:
            p.close()

    def sync_us(self) -> float:
        """us: ``sync_bound_us`` at its worst, at bring-up or in any round."""
        return max([sync_bound_us(c) for c in (self.bringup, *(r for _, r in self.rounds))])

    def truth(self, t0_ns: int) -> list[ServerClock]:
        """Each server at bring-up with its rounds as ``series`` (``t_s`` after ``t0_ns``)."""
        return [c.model_copy(update={"series": [
            ServerClockSample(t_s=(at - t0_ns) / 1e9, offset_us=r[i].offset_us,
                              rtt_us=r[i].rtt_us) for at, r in self.rounds]})
            for i, c in enumerate(self.bringup)]


def sync_bound_us(clocks: Sequence[ServerClock]) -> float:
    """us: the largest |offset_i - offset_j| + (rtt_i + rtt_j) / 2 over pairs of servers (0
    with one server): how far two servers' truths may disagree."""
    return max((abs(a.offset_us - b.offset_us) + (a.rtt_us + b.rtt_us) / 2
                for a, b in itertools.combinations(clocks, 2)), default=0.0)
