"""The coordinator's inbox: per-agent bookkeeping, report ingest, record buffers per window,
and the watermark that says when a window may close (step 1 of the pipeline in
``agents.coordinator``).

Records ``(src, dst, pair_id, idx, tx_ns, rx_ns)`` are put in a window by the clock of the
pair's first VM (A, the lexicographically smaller name; fwd probes by tx, rev probes by rx,
both read on A's clock), mapped to the reference clock with the latest offsets
(``offsets_ns``). A window is closed once the agents' reported clocks are past its end by a
lateness (``0.3 s + 1.5 / rate``: the follow-up of the window's last pair comes with the
next pair), for every agent that reported within ``live_s`` (an agent that only said hello
counts with its start time; one that a peer named but that has not connected holds windows
back for ``live_s``); later records are counted (``late_records``) and dropped.

Not thread-safe: the coordinator holds its lock around every call.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from agents.clock import Clock
from agents.messages import AgentStats, Hello, Report
from agents.window import Records

__all__ = ["LIVE_S", "AgentInfo", "Inbox"]

LIVE_S = 5.0
"""An agent whose last report is older than this (s) no longer holds windows open."""
_MAX_CELL = 50_000            # records per (src, dst, window)
_MAX_AHEAD = 32               # windows beyond the next one that records may open
_MAX_VMS = 4096
_MAX_REPORT_S = 60.0          # a longer report period in a hello is taken as the default


@dataclass
class AgentInfo:
    """What the coordinator knows about one agent (times ``*_mono`` are the coordinator's
    ``time.monotonic()``, s)."""

    name: str
    ip: str | None = None
    rate: float | None = None            # coded pairs/s per peer
    report_s: float = 0.5
    last_report_ns: int | None = None    # coordinator clock, ns
    last_report_mono: float = -1e9
    last_t_ns: int | None = None         # the agent's clock in its last report, ns
    start_ns: int | None = None          # the agent's clock when it started (hello), ns
    hello_mono: float = -1e9
    first_seen_mono: float = field(default_factory=time.monotonic)
    connected: int = 0                   # hellos received
    stats: AgentStats = field(default_factory=AgentStats)

    def live(self, mono: float, live_s: float) -> bool:
        """Reported within ``live_s`` of ``mono``."""
        return mono - self.last_report_mono < live_s


class Inbox:
    """Agents and their buffered records.

    Args:
        window_ns: window length, ns (reference clock).
        clock: the coordinator's clock (``last_report_ns``).
        counters: where ``late_records``, ``bad_records``, ... are counted.
        lateness_s: fixed lateness before a window closes, s (None: from the agents' rates).
        live_s: an agent silent for longer no longer holds windows open, s.
    """

    def __init__(self, window_ns: int, clock: Clock, counters: Counter[str],
                 lateness_s: float | None = None, live_s: float = LIVE_S):
        self.window_ns = window_ns
        self.clock = clock
        self.counters = counters
        self.lateness_s = lateness_s
        self.live_s = live_s
        self.vms: dict[str, AgentInfo] = {}
        self.buf: dict[tuple[str, str], dict[int, dict]] = {}
        self.offsets_ns: dict[str, float] = {}
        """VM -> its latest estimated offset to the reference VM, ns."""
        self.next_window: int | None = None

    def vm(self, name: str) -> AgentInfo:
        """The agent ``name``, added when new.

        Raises:
            ValueError: a bad name (empty, over 64 characters) or too many VMs.
        """
        vm = self.vms.get(name)
        if vm is None:
            if not isinstance(name, str) or not name or len(name) > 64:
                raise ValueError(f"bad VM name {name!r}")
            if len(self.vms) >= _MAX_VMS:
                raise ValueError("too many VMs")
            vm = self.vms[name] = AgentInfo(name)
        return vm

    def add(self, msg: Hello | Report) -> str:
        """Take one agent message; returns the VM name.

        Raises:
            ValueError: too many VMs, or a bad peer name in a hello.
        """
        vm = self.vm(msg.name)
        if isinstance(msg, Hello):
            vm.ip, vm.rate, vm.start_ns = msg.ip, msg.rate, msg.start_ns
            vm.report_s = msg.report_s if msg.report_s < _MAX_REPORT_S else 0.5
            vm.hello_mono = time.monotonic()
            for peer in msg.peers[:_MAX_VMS]:
                self.vm(peer)
            vm.connected += 1
            return vm.name
        if msg.t_ns is not None:
            vm.last_t_ns = msg.t_ns
        vm.last_report_ns = self.clock.now_ns()
        vm.last_report_mono = time.monotonic()
        if msg.stats is not None:
            vm.stats = msg.stats
        for src, rows in msg.rx.items():
            self.vm(src)
            if src == vm.name:
                self.counters["bad_records"] += 1
                continue
            self._add_rows(src, vm.name, rows)
        return vm.name

    def _add_rows(self, src: str, dst: str, rows: list) -> None:
        """Put each row ``[pair_id, idx, tx_ns, rx_ns]`` in its window's cell (a malformed
        one is counted in ``bad_records`` and skipped)."""
        first = min(src, dst)
        shift = self.offsets_ns.get(first, 0.0)
        cells = self.buf.setdefault((src, dst), {})
        w = self.window_ns
        lo = self.next_window
        counters = self.counters
        for row in rows:
            try:
                pid, idx, tx, rx = row
                if not (type(pid) is type(idx) is type(tx) is type(rx) is int
                        and 0 <= idx <= 1):
                    raise ValueError
            except (ValueError, TypeError):
                counters["bad_records"] += 1
                continue
            k = int(((tx if src == first else rx) - shift) // w)
            if lo is not None and k < lo:
                counters["late_records"] += 1
                continue
            if lo is not None and k > lo + _MAX_AHEAD:
                counters["future_records"] += 1
                continue
            cell = cells.get(k)
            if cell is None:
                if len(cells) >= _MAX_AHEAD:  # before the first window closed: stay bounded
                    counters["future_records"] += 1
                    continue
                cell = cells[k] = {}
            if len(cell) >= _MAX_CELL:
                counters["overflow_records"] += 1
                continue
            cell[(pid, idx)] = (tx, rx)

    def _lateness_s(self) -> float:
        if self.lateness_s is not None:
            return self.lateness_s
        rates = [v.rate for v in self.vms.values() if v.rate]
        return 0.3 + (1.5 / min(rates) if rates else 1.0)

    def watermark_ns(self) -> float | None:
        """The earliest of the live agents' report times on the reference clock, ns (None:
        an agent named by a peer has not been heard from yet, or no agent is live). A
        report stamped ``t_ns`` carries every record its agent emitted before ``t_ns``;
        agents silent for ``live_s`` do not hold windows back."""
        mono = time.monotonic()
        marks = []
        for v in self.vms.values():
            shift = self.offsets_ns.get(v.name, 0.0)
            if v.last_t_ns is not None and v.live(mono, self.live_s):
                marks.append(v.last_t_ns - shift)
            elif v.start_ns is not None and mono - v.hello_mono < self.live_s:
                marks.append(v.start_ns - shift)  # no record before its start
            elif v.last_t_ns is None and mono - v.first_seen_mono < self.live_s:
                return None  # named by a peer, not heard from yet: wait for it a little
        return min(marks) if marks else None

    def closable(self) -> int | None:
        """The next window that has records and may close now, or None."""
        now = self.watermark_ns()
        if now is None:
            return None
        ks = [k for cells in self.buf.values() for k in cells]
        if not ks:
            return None
        k = min(ks) if self.next_window is None else max(min(ks), self.next_window)
        if (k + 1) * self.window_ns + self._lateness_s() * 1e9 > now:
            return None
        return k

    def take(self, k: int) -> dict[tuple[str, str], Records]:
        """Close window ``k``: its records per ``(src, dst)``, sorted by ``(pair_id, idx)``;
        older cells are dropped, later records of ``k`` or before count as late."""
        data = {}
        for key, cells in self.buf.items():
            for kk in [kk for kk in cells if kk <= k]:
                cell = cells.pop(kk)
                if kk == k and cell:
                    keys = sorted(cell)
                    vals = [cell[kk] for kk in keys]
                    data[key] = Records(np.array([p for p, _ in keys], dtype=np.int64),
                                        np.array([v[0] for v in vals], dtype=np.int64),
                                        np.array([v[1] for v in vals], dtype=np.int64))
        self.buf = {key: cells for key, cells in self.buf.items() if cells}
        self.next_window = k + 1
        return data
