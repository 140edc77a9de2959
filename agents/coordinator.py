"""The coordinator: joins the agents' probe records, fits every probed pair per window, solves
the network for each VM's clock against a reference VM, and serves the result (``API.md``).

Pipeline for each window k (``window_s`` long on the reference VM's clock; centre ``t_k``):

1. Ingest (``agents.ingest``): records from the agents' reports are put in windows by the
   reference clock; a window closes once every live agent has reported past its end plus a
   lateness.
2. Per pair: coded-pair purity, the Huygens envelope fit and the NTP-style baseline on the
   same pure probes; 3. the network solve; 5. OWD and asymmetry: ``agents.window``.
4. Drift (here): the least-squares slope of the solved offsets of the ``drift_windows``
   windows centred on a window, as far as they have closed and exist: the newest window
   first gets the slope of it and the ``drift_windows // 2`` before it, and each later
   window adds one until the span is centred (no lag behind the wander); the first windows,
   and those next to a gap, use the side that exists. A slope is used only when the offsets
   lie within ``drift_residual_ns`` of its line; otherwise (a clock step, a migration, a
   reference change) the window keeps the drift it had: at first its own slope. Measured in
   an idle 8-VM lab (software stamps): a window's own slope is off by p50 0.10 / p99
   0.55 ppm; centred slopes of 3, 5 and 7 windows' offsets by p99 0.11, 0.057 and
   0.033 ppm (the offsets' noise spread over 4, 8 and 12 s instead of the envelope's over
   2 s). Measured again side by side (``benchmarks/sync.py --cases idle --seconds 40
   --drift-windows 5,7,5,7``): 5 windows p99 0.023 / 0.025 ppm, 7 windows 0.040 /
   0.049 ppm: over 14 s the host's wander (periods of 20 s and more) bends the slope more
   than the longer span averages out, so 5 stays the default. Collocation
   keeps the windows' own slopes: independent samples, as its statistics assume. The
   NTP-style baseline gets the same.
6. Collocation (here, ``collocation.group``) over the per-window drift series of the last
   ``series_windows`` windows and, for each VM, the offsets of its latest run of
   consecutive windows (continuous: a clock step leaves a window without its estimate).

The servers (agents' TCP reports, the HTTP API) are in ``agents.api``; the documents in
``agents.messages``.

Source: Geng et al., "Exploiting a Natural Network Effect for Scalable, Fine-grained Clock
Synchronization", NSDI 2018 (coded probes, envelope fit, network effect, per-window estimates).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, deque

import numpy as np
from threadpoolctl import ThreadpoolController

from agents.clock import Clock
from agents.collocation import group
from agents.estimate import line_fits
from agents.ingest import LIVE_S, AgentInfo, Inbox
from agents.messages import (
    HEALTH_SCHEMA,
    STATE_SCHEMA,
    Collocation,
    CoordinatorState,
    Group,
    Health,
    Hello,
    HistoryEntry,
    HistoryVm,
    PacerReport,
    Report,
    VmState,
)
from agents.window import RttFloors, WindowResult, solve_window

__all__ = ["DRIFT_WINDOWS", "Coordinator"]

log = logging.getLogger("agents.coordinator")

DRIFT_WINDOWS = 5
"""Windows centred on a window whose offsets give its drift (a slope over 8 s by default)."""
OFFSET_FLOOR_NS = 150.0
"""Floor of the offsets' noise in the collocation test, ns: in the idle quickstart lab
(software stamps) the offset difference of two VMs of one host wanders by ~100 ns over
minutes, slower than white noise; 0.05 ppm between hosts is still 1 us in 20 s."""
DRIFT_RESIDUAL_NS = 1000.0
"""Largest distance (ns) of those offsets from their line for the slope to be used."""


def _f(x) -> float | None:
    """A float for JSON (None, NaN and inf become None)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


class Coordinator:
    """Network-wide clock sync, OWD and collocation from agents' reports (thread-safe).

    Args:
        window_s: window length, s (on the reference VM's clock).
        reference: the reference VM; None: the lexicographically first VM known.
        guard_ns: coded-pair guard band, ns. The default, 20 us, suits software timestamps
            on emulated multi-hop paths: measured in the quickstart lab, the receive gap of
            back-to-back probes differs from the send gap by 3-20 us (median) without any
            load, from softirq scheduling; a 5 us guard kept 5-80% of the pairs and doubled
            the offset error (p99 0.94 us against 0.23 us at 20 us).
        history: windows kept in ``history`` of the state document.
        series_windows: windows of drift and offset series used for collocation (drift served).
        weight_floor_ns: floor added to the fits' residuals in the solve weights, ns.
        lateness_s: fixed lateness before a window closes, s (None: from the agents' rates).
        live_s: an agent silent for longer no longer holds windows open, s.
        clock: the coordinator's own clock (``time_ns`` and ``last_report_ns`` in the API).
        drift_windows: odd number of consecutive windows, centred on a window, whose
            offsets give its drift as they close (1: each window's own slope).
        drift_residual_ns: largest distance of those offsets from their line, ns, for their
            slope to be used.

    Raises:
        ValueError: ``window_s`` not > 0, ``drift_windows`` even or < 1.
    """

    def __init__(self, window_s: float = 2.0, reference: str | None = None,
                 guard_ns: float = 20_000.0, history: int = 300, series_windows: int = 150,
                 weight_floor_ns: float = 100.0, lateness_s: float | None = None,
                 live_s: float = LIVE_S, clock: Clock | None = None,
                 drift_windows: int = DRIFT_WINDOWS,
                 drift_residual_ns: float = DRIFT_RESIDUAL_NS):
        if not window_s > 0:
            raise ValueError(f"window must be > 0 s, got {window_s}")
        if drift_windows < 1 or drift_windows % 2 == 0:
            raise ValueError(f"drift_windows must be odd and >= 1, got {drift_windows}")
        self.drift_windows = drift_windows
        self.drift_residual_ns = drift_residual_ns
        self.window_ns = int(round(window_s * 1e9))
        self.window_s = window_s
        self.reference = reference
        self.guard_ns = guard_ns
        self.weight_floor_ns = weight_floor_ns
        self.floors = RttFloors()  # pairs' round-trip floors, across windows (solve_window)
        self.live_s = live_s
        self.clock = clock or Clock()
        self.lock = threading.RLock()
        self.counters: Counter[str] = Counter()
        self.pacers: dict[str, PacerReport] = {}
        self.inbox = Inbox(self.window_ns, self.clock, self.counters, lateness_s, live_s)
        self.history: deque[WindowResult] = deque(maxlen=max(history, 1))
        self.series: deque[WindowResult] = deque(maxlen=max(series_windows, 1))
        self.latest: WindowResult | None = None
        self.first_k: dict[str, int] = {}  # each VM's first window with an estimate
        self.groups: list = []
        self.groups_windows = 0
        self._cols: dict[int, tuple] = {}  # window -> its columns of the series (_columns)
        # the windows' linear algebra runs on one BLAS thread: its matrices are small (a few
        # hundred nodes), where OpenBLAS's threads spin on a loaded machine: a Cholesky and
        # inverse of 255 nodes took 66 ms of CPU with them against 5 ms on one thread
        self.blas = ThreadpoolController()

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to counter ``key`` (served under ``counters``)."""
        with self.lock:
            self.counters[key] += n

    def ingest(self, msg: Hello | Report | PacerReport) -> str:
        """Take one agent message (``agents.messages.parse_message`` reads a line); returns
        the VM name.

        Raises:
            ValueError: a bad VM name among a hello's peers or a report's senders, or too
                many VMs (the rows before it are kept).
        """
        with self.lock:
            if isinstance(msg, PacerReport):
                self.pacers[msg.name] = msg
                return msg.name
            return self.inbox.add(msg)

    def reference_name(self) -> str | None:
        """The reference VM: ``reference``, else the lexicographically first VM known."""
        if self.reference is not None:
            return self.reference
        return min(self.inbox.vms) if self.inbox.vms else None

    def step(self) -> int:
        """Process every window that can be closed; returns how many produced a result."""
        done = 0
        while True:
            with self.lock:
                k = self.inbox.closable()
                if k is None:
                    return done
                records = self.inbox.take(k)
                ref = self.reference_name()
                offsets = dict(self.inbox.offsets_ns)
            counts: Counter[str] = Counter()
            with self.blas.limit(limits=1, user_api="blas"):
                res = solve_window(k, records, ref, offsets, window_ns=self.window_ns,
                                   guard_ns=self.guard_ns,
                                   weight_floor_ns=self.weight_floor_ns,
                                   counts=counts, floors=self.floors
                                   ) if ref is not None and records.src.size else None
            with self.lock:
                self.counters.update(counts)
                if res is None:
                    self.counters["windows_skipped"] += 1
                    continue
                for v in res.est:
                    self.first_k.setdefault(v, res.k)
                self._revise_drift(res)
                if self.latest is not None:  # only the latest window's OWD is served: at 256
                    # VMs 8000 directions, 5.5 MB a window, 1.6 GB over a full history
                    self.latest.owd, self.latest.asym = {}, {}
                self.latest = res
                self.history.append(res)
                self.series.append(res)
                self.inbox.set_offsets({v: e.offset_ns for v, e in res.est.items()})
                with self.blas.limit(limits=1, user_api="blas"):
                    self._collocation()
                done += 1

    # ---- drift (step 4) ----------------------------------------------------------------
    def _revise_drift(self, res: WindowResult) -> None:
        """Drift of the last ``drift_windows // 2 + 1`` windows now that ``res`` closed: each
        gets the slope of the consecutive windows within ``drift_windows // 2`` of it, as far
        as they have closed, when they are at least ``drift_windows // 2 + 1``."""
        res.drift = {v: e.drift_ppm for v, e in res.est.items()}
        res.ntp_drift = {v: e.drift_ppm for v, e in res.ntp.items()}
        h = self.drift_windows // 2
        wins = {w.k: w for w in self.history if w.k >= res.k - 2 * h}
        wins[res.k] = res
        for j in range(res.k - h, res.k + 1) if h else ():
            if j not in wins:
                continue
            lo = hi = j  # the run of consecutive windows around j, at most h either side
            while lo - 1 >= j - h and lo - 1 in wins:
                lo -= 1
            while hi + 1 <= min(j + h, res.k) and hi + 1 in wins:
                hi += 1
            if hi - lo >= h:  # at least h + 1 windows (the first ones, after a gap)
                self._line_slopes(wins[j], [wins[i] for i in range(lo, hi + 1)])

    def _line_slopes(self, target: WindowResult, wins: list[WindowResult]) -> None:
        """Set ``target``'s drift (and NTP drift) per VM to the least-squares slope of the
        VM's offsets in ``wins`` (its first window left out: it started inside it, a partial
        window) when it has at least ``drift_windows // 2 + 1`` of them and they lie within
        ``drift_residual_ns`` of the line."""
        need = self.drift_windows // 2 + 1
        x = np.array([w.t_ns - target.t_ns for w in wins], dtype=np.float64) / 1e9
        for which, out in (("est", target.drift), ("ntp", target.ntp_drift)):
            names = list(getattr(target, which))
            if not names:
                continue
            # (VMs, windows) offsets, NaN where a VM has none: every VM's line at once
            y = np.array([[e.offset_ns if (e := getattr(w, which).get(v)) is not None
                           and w.k != self.first_k.get(v) else np.nan for w in wins]
                          for v in names], dtype=np.float64)
            n = np.isfinite(y).sum(axis=1)
            slope, icept = line_fits(x, y)
            with np.errstate(invalid="ignore"):
                resid = np.nanmax(np.abs(y - (icept[:, None] + slope[:, None] * x)), axis=1,
                                  initial=0.0)
            for i in np.flatnonzero((n >= need) & np.isfinite(slope)
                                    & (resid <= self.drift_residual_ns)):
                out[names[i]] = float(slope[i]) / 1e3  # ns/s -> ppm

    # ---- collocation (step 6) ----------------------------------------------------------
    def _collocation(self) -> None:
        wins = list(self.series)
        if not wins:
            return
        cols = [self._columns(w) for w in wins]
        names = np.unique(np.concatenate([c[0] for c in cols]))
        if not names.size:
            return
        drift = np.full((names.size, len(wins)), np.nan)
        offset = np.full((names.size, len(wins)), np.nan)
        for j, (vms, d, o) in enumerate(cols):
            at = np.searchsorted(names, vms)
            drift[at, j], offset[at, j] = d, o
        held = np.zeros(offset.shape, dtype=bool)  # queued windows: holes, not clock steps
        for j, w in enumerate(wins):
            if w.queued:
                held[np.searchsorted(names, w.queued), j] = True
        offset = _latest_run(offset, [w.k for w in wins], held)
        names = names.tolist()
        recent = [e for w in wins[-10:] for e in w.est.values()]
        try:
            self.groups = group(dict(zip(names, drift, strict=True)), max(_median_positive(
                [e.drift_sigma_ppm for e in recent]), 0.01),
                offset_series=dict(zip(names, offset, strict=True)),
                offset_sigma_ns=max(_median_positive([e.offset_sigma_ns for e in recent]),
                                    OFFSET_FLOOR_NS))
            self.groups_windows = len(wins)
        except ValueError as e:
            log.warning("collocation failed: %s", e)

    def _columns(self, w: WindowResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Window ``w``'s VMs (sorted), their own drifts (ppm) and offsets (ns): worked out
        once per window while it is in the series."""
        col = self._cols.get(w.k)
        if col is None:
            vms = sorted(w.est)
            col = self._cols[w.k] = (np.array(vms, dtype=str),
                                     np.array([w.est[v].drift_ppm for v in vms]),
                                     np.array([w.est[v].offset_ns for v in vms]))
            keep = {x.k for x in self.series}
            for k in [k for k in self._cols if k not in keep]:
                del self._cols[k]
        return col

    # ---- API documents -----------------------------------------------------------------
    def _vm_state(self, name: str, vm: AgentInfo | None) -> VmState:
        lat = self.latest
        e = lat.est.get(name) if lat else None
        n = lat.ntp.get(name) if lat else None
        out = VmState()
        if e is not None:
            out.offset_ns, out.drift_ppm = _f(e.offset_ns), _f(lat.drift[name])
            out.offset_sigma_ns, out.drift_sigma_ppm = (_f(e.offset_sigma_ns),
                                                        _f(e.drift_sigma_ppm))
        if n is not None:
            out.ntp_offset_ns, out.ntp_drift_ppm = _f(n.offset_ns), _f(lat.ntp_drift[name])
        if vm is not None:
            st = vm.stats
            out.last_report_ns, out.ip = vm.last_report_ns, vm.ip
            out.connected = vm.live(time.monotonic(), self.live_s)
            out.probes_tx, out.probes_rx = st.probes_tx, st.probes_rx
            out.rejects, out.records_dropped = dict(st.rejects), st.records_dropped
            out.peers_active = list(st.peers_active)
        return out

    def state(self, history: int | None = None) -> CoordinatorState:
        """The ``nslab.coordinator/1`` document (API.md); ``history`` limits the entries
        (0: none)."""
        with self.lock:
            lat = self.latest
            names = sorted(set(self.inbox.vms) | (set(lat.est) if lat else set()))
            hist = list(self.history)
            if history is not None:
                hist = hist[-history:] if history > 0 else []
            wins = list(self.series)
            return CoordinatorState(
                schema=STATE_SCHEMA, time_ns=self.clock.now_ns(),
                reference=self.reference_name(), window_s=self.window_s,
                drift_windows=self.drift_windows, windows=len(self.history),
                t_ns=lat.t_ns if lat else None,
                vms={v: self._vm_state(v, self.inbox.vms.get(v)) for v in names},
                owd_us=dict(lat.owd) if lat else {},
                asymmetry_us={k: _f(x) for k, x in lat.asym.items()} if lat else {},
                collocation=Collocation(
                    groups=[Group(members=g.members, confidence=_f(g.confidence))
                            for g in self.groups], windows_used=self.groups_windows),
                drift_series={v: [_f(w.est[v].drift_ppm) if v in w.est else None
                                  for w in wins] for v in names},
                drift_series_t_ns=[w.t_ns for w in wins],
                history=[HistoryEntry(t_ns=w.t_ns, vms={v: HistoryVm(
                    offset_ns=_f(e.offset_ns), drift_ppm=_f(w.drift[v]),
                    ntp_offset_ns=_f(w.ntp[v].offset_ns) if v in w.ntp else None,
                    ntp_drift_ppm=_f(w.ntp_drift[v]) if v in w.ntp else None)
                    for v, e in sorted(w.est.items())}) for w in hist],
                pacers=dict(self.pacers), counters=dict(self.counters))

    def health(self) -> Health:
        """The ``nslab.coordinator.health/1`` document."""
        with self.lock:
            mono = time.monotonic()
            vms = self.inbox.vms.values()
            return Health(schema=HEALTH_SCHEMA, time_ns=self.clock.now_ns(), agents=len(vms),
                          agents_connected=sum(v.live(mono, self.live_s) for v in vms),
                          windows=len(self.history), reference=self.reference_name())


def _median_positive(xs: list[float]) -> float:
    """Median of the finite, positive ``xs`` (0 without any)."""
    ok = [x for x in xs if math.isfinite(x) and x > 0]
    return float(np.median(ok)) if ok else 0.0


def _latest_run(values: np.ndarray, ks: list[int], held: np.ndarray | None = None
                ) -> np.ndarray:
    """``values``, shape (VMs, windows ``ks``), with NaN in each row before its latest run
    of consecutive windows that all have a value: a clock step leaves its window without an
    estimate, so the run holds continuous offsets only. ``held`` (same shape): windows where
    a VM was left out as queued (``WindowResult.queued``): a hole in its run, not an end."""
    # a window ends the run before it when it has no value or the next window is not k + 1
    ends = ~np.isfinite(values)
    if held is not None:
        ends &= ~held
    ends[:, :-1] |= (np.diff(np.asarray(ks)) != 1)[None, :]
    last = values.shape[1] - 1 - np.argmax(ends[:, ::-1], axis=1)
    start = np.where(ends.any(axis=1), last + 1, 0)
    return np.where(np.arange(values.shape[1]) < start[:, None], np.nan, values)
