"""What the snapshots showed over time, for the TUI's plots and detail screens.

``History.add(snap)`` appends one sample per snapshot (a snapshot at the same ``time_s`` as the
last one, or earlier: a replay seeking back, starts over). ``series(key)`` is ``(times s,
values)`` of one quantity, samples without a value skipped. Keys (``tui.backend`` units):

- ``("vm", name, field)``: field ``err_offset_us``, ``err_drift_ppm`` (estimate minus truth),
  ``est_offset_ms`` and ``truth_offset_ms`` (the truth relative to the reference VM, as the
  estimate is: ``est_offset_ms - err_offset_us / 1000``), ``cpu_pct``;
- ``("link", "a-b", field)``: ``mbit``, ``queue_pkts``, ``drop_rate``;
- ``("owd", "a->b")``: p50 one-way delay, us.
"""
from __future__ import annotations

from collections import deque

from tui.backend import Snapshot

VM_FIELDS = ("err_offset_us", "err_drift_ppm", "est_offset_ms", "cpu_pct")
LINK_FIELDS = ("mbit", "queue_pkts", "drop_rate")


class History:
    """The last ``keep`` samples of every quantity (see the module doc)."""

    def __init__(self, keep: int = 900):
        self.keep = keep
        self.last_t: float | None = None
        self._data: dict[tuple, deque] = {}

    def _put(self, key: tuple, t: float, value) -> None:
        if value is not None:
            self._data.setdefault(key, deque(maxlen=self.keep)).append((t, float(value)))

    def add(self, snap: Snapshot) -> None:
        """Append what ``snap`` shows (skipped before bring-up and at an unchanged time)."""
        t = snap.time_s
        if not snap.nodes or (self.last_t is not None and t == self.last_t):
            return
        if self.last_t is not None and t < self.last_t:
            self._data.clear()
        self.last_t = t
        for v in snap.vms:
            for f in VM_FIELDS:
                self._put(("vm", v.name, f), t, getattr(v, f))
            if v.est_offset_ms is not None and v.err_offset_us is not None:
                self._put(("vm", v.name, "truth_offset_ms"), t,
                          v.est_offset_ms - v.err_offset_us / 1000)
        for lk in snap.links:
            for f in LINK_FIELDS:
                self._put(("link", lk.key, f), t, getattr(lk, f))
        for pair, us in snap.owd_us.items():
            self._put(("owd", pair), t, us)

    def series(self, key: tuple) -> tuple[list[float], list[float]]:
        """(times s, values) of ``key``; empty lists when nothing was seen."""
        pts = self._data.get(key, ())
        return [p[0] for p in pts], [p[1] for p in pts]
