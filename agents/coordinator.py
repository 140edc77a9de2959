"""The coordinator: joins the agents' probe records, fits every probed pair per window, solves
the network for each VM's clock against a reference VM, and serves the result (``API.md``).

Pipeline for each window k (``window_s`` long on the reference VM's clock; centre ``t_k``):

1. Records ``(src, dst, pair_id, idx, tx_ns, rx_ns)`` from the agents' reports are put in a
   window by the clock of the pair's first VM (A, the lexicographically smaller name; fwd
   probes by tx, rev probes by rx, both read on A's clock), mapped to the reference clock
   with the previous window's offsets. A window is closed once the agents' reported clocks
   is past its end by a lateness (``0.3 s + 1.5 / rate``: the follow-up of the window's last
   pair comes with the next pair), for every agent that reported within ``LIVE_S`` (an
   agent that only said hello counts with its start time; one that a peer named but that
   has not connected holds windows back for ``LIVE_S``); later records are counted
   (``late_records``) and dropped.
2. Per unordered pair: coded-pair purity (``estimate.pure_pairs``, guard band ``guard_ns``),
   then the Huygens envelope fit (``estimate.fit_pair``) and the NTP-style baseline
   (``estimate.ntp_pair``) on the very same pure probes. A pair needs ``MIN_PURE`` pure probes
   each way, and is dropped (``pairs_inconsistent``) when the fitted line leaves a direction
   a minimum delay below ``-INCONSISTENT_NS``: a clock step inside the window.
3. Network effect (``network.solve``): both fits are evaluated at ``t_k`` (read on A's clock:
   ``t_k + theta_A``) and solved over the graph of pairs, weights ``1 / (residual_ns**2 +
   floor**2)``, twice (the second pass evaluates at the first pass's offsets). Only the VMs
   connected to the reference get an estimate.
4. Drift: the least-squares slope of the solved offsets of the ``drift_windows`` windows
   centred on a window, as far as they have closed and exist: the newest window first gets
   the slope of it and the ``drift_windows // 2`` before it, and each later window adds one
   until the span is centred (no lag behind the wander); the first windows, and those next
   to a gap, use the side that exists. A slope is used only when the offsets lie within
   ``drift_residual_ns`` of its line; otherwise (a clock step, a migration, a reference
   change) the window keeps the drift it had: at first its own slope. Measured in an idle 8-VM lab
   (software stamps): a window's own slope is off by p50 0.10 / p99 0.55 ppm; centred
   slopes of 3, 5 and 7 windows' offsets by p99 0.11, 0.057 and 0.033 ppm (the offsets'
   noise spread over 4, 8 and 12 s instead of the envelope's over 2 s; the wander, periods
   of 20 s and more, hardly bends a centred slope). Collocation keeps the windows' own slopes:
   independent samples, as its statistics assume. The NTP-style baseline gets the same.
5. OWD per ordered pair on all of the window's probes (pure or not) with the network-corrected
   relative clock (``owd.owd_stats``); asymmetry per pair (``owd.asymmetry_us``).
6. Collocation (``collocation.group``) over the per-window drift series of the last
   ``series_windows`` windows and, for each VM, the offsets of its latest run of
   consecutive windows (continuous: a clock step leaves a window without its estimate).

Source: Geng et al., "Exploiting a Natural Network Effect for Scalable, Fine-grained Clock
Synchronization", NSDI 2018 (coded probes, envelope fit, network effect, per-window estimates).
"""
from __future__ import annotations

import json
import logging
import math
import socket
import socketserver
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np

from agents.clock import Clock
from agents.collocation import group
from agents.estimate import fit_pair, ntp_pair, pure_pairs
from agents.network import solve
from agents.owd import asymmetry_us, owd_stats

__all__ = ["HEALTH_SCHEMA", "INCONSISTENT_NS", "MIN_PURE", "SCHEMA", "Coordinator", "Service",
           "serve"]

log = logging.getLogger("agents.coordinator")

SCHEMA = "nslab.coordinator/1"
HEALTH_SCHEMA = "nslab.coordinator.health/1"
REPORT_SCHEMA = "nslab.report/1"
MIN_PURE = 4
"""Fewest pure probes per direction for a pair to be fitted in a window."""
INCONSISTENT_NS = 1000.0
"""A pair fit whose implied minimum one-way delay is below minus this (ns) is dropped."""
DRIFT_WINDOWS = 5
"""Windows centred on a window whose offsets give its drift (a slope over 8 s by default)."""
OFFSET_FLOOR_NS = 150.0
"""Floor of the offsets' noise in the collocation test, ns: in the idle quickstart lab
(software stamps) the offset difference of two VMs of one host wanders by ~100 ns over
minutes, slower than white noise; 0.05 ppm between hosts is still 1 us in 20 s."""
DRIFT_RESIDUAL_NS = 1000.0
"""Largest distance (ns) of those offsets from their line for the slope to be used."""

_MAX_LINE = 16 << 20          # bytes per report line
_MAX_CELL = 50_000            # records per (src, dst, window)
_MAX_AHEAD = 32               # windows beyond the next one that records may open
_MAX_VMS = 4096
LIVE_S = 5.0
"""An agent whose last report is older than this (s) no longer holds windows open."""


def _f(x) -> float | None:
    """A float for JSON (NaN/inf become null)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass
class _Vm:
    """What the coordinator knows about one agent."""

    name: str
    ip: str | None = None
    rate: float | None = None
    report_s: float = 0.5
    last_report_ns: int | None = None   # coordinator clock
    last_report_mono: float = -1e9
    last_t_ns: int | None = None        # the agent's clock in its last report
    start_ns: int | None = None         # the agent's clock when it started (hello)
    hello_mono: float = -1e9
    first_seen_mono: float = field(default_factory=time.monotonic)
    connected: int = 0
    stats: dict = field(default_factory=dict)


@dataclass
class _Window:
    """The result of one window."""

    k: int
    t_ns: int
    est: dict            # vm -> NodeEstimate (Huygens)
    ntp: dict            # vm -> NodeEstimate (NTP-style)
    owd: dict            # "a->b" -> owd_stats
    asym: dict           # "a|b" -> us
    pairs: int
    drift: dict = field(default_factory=dict)      # vm -> reported drift, ppm (Huygens)
    ntp_drift: dict = field(default_factory=dict)  # vm -> reported drift, ppm (NTP-style)


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
        self.lateness_s = lateness_s
        self.live_s = live_s
        self.clock = clock or Clock()
        self.lock = threading.RLock()
        self.vms: dict[str, _Vm] = {}
        self.buf: dict[tuple[str, str], dict[int, dict]] = {}
        self.coarse: dict[str, float] = {}
        self.next_window: int | None = None
        self.history: deque[_Window] = deque(maxlen=max(history, 1))
        self.series: deque[_Window] = deque(maxlen=max(series_windows, 1))
        self.latest: _Window | None = None
        self.first_k: dict[str, int] = {}  # each VM's first window with an estimate
        self.groups: list = []
        self.groups_windows = 0
        self.counters: Counter[str] = Counter()
        self.started_ns = self.clock.now_ns()

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to counter ``key`` (served under ``counters``)."""
        with self.lock:
            self.counters[key] += n

    # ---- ingest ------------------------------------------------------------------------
    def _vm(self, name) -> _Vm:
        if not isinstance(name, str) or not name or len(name) > 64:
            raise ValueError(f"bad VM name {name!r}")
        vm = self.vms.get(name)
        if vm is None:
            if len(self.vms) >= _MAX_VMS:
                raise ValueError("too many VMs")
            vm = self.vms[name] = _Vm(name)
        return vm

    def ingest(self, msg: dict) -> str:
        """Take one agent message (``hello`` or ``report``, API.md); returns the VM name.

        Raises:
            ValueError: a malformed message (nothing of it is kept).
        """
        if not isinstance(msg, dict):
            raise ValueError("message is not an object")
        kind = msg.get("type")
        with self.lock:
            vm = self._vm(msg.get("name"))
            if kind == "hello":
                if msg.get("schema") != REPORT_SCHEMA:
                    raise ValueError(f"unknown report schema {msg.get('schema')!r}")
                vm.ip = str(msg.get("ip")) if msg.get("ip") is not None else None
                rate = msg.get("rate")
                vm.rate = float(rate) if isinstance(rate, (int, float)) and rate > 0 else None
                rs = msg.get("report_s", 0.5)
                vm.report_s = float(rs) if isinstance(rs, (int, float)) and 0 < rs < 60 else 0.5
                start = msg.get("start_ns")
                vm.start_ns = start if isinstance(start, int) else None
                vm.hello_mono = time.monotonic()
                for peer in msg.get("peers", [])[:_MAX_VMS]:
                    self._vm(peer)
                vm.connected += 1
                return vm.name
            if kind != "report":
                raise ValueError(f"unknown message type {kind!r}")
            t_ns = msg.get("t_ns")
            rx = msg.get("rx", {})
            if not (t_ns is None or isinstance(t_ns, int)) or not isinstance(rx, dict):
                raise ValueError("report needs an integer (or null) t_ns and an rx object")
            if t_ns is not None:
                vm.last_t_ns = t_ns
            vm.last_report_ns = self.clock.now_ns()
            vm.last_report_mono = time.monotonic()
            if isinstance(msg.get("stats"), dict):
                vm.stats = msg["stats"]
            dst = vm.name
            for src, rows in rx.items():
                self._vm(src)
                if src == dst or not isinstance(rows, list):
                    self.counters["bad_records"] += 1
                    continue
                self._add_rows(src, dst, rows)
            return vm.name

    def _add_rows(self, src: str, dst: str, rows: list) -> None:
        first = min(src, dst)
        shift = self.coarse.get(first, 0.0)
        cells = self.buf.setdefault((src, dst), {})
        w = self.window_ns
        lo = self.next_window
        for row in rows:
            try:
                pid, idx, tx, rx = row
                if not (isinstance(tx, int) and isinstance(rx, int) and isinstance(pid, int)
                        and idx in (0, 1)):
                    raise ValueError
            except (ValueError, TypeError):
                self.counters["bad_records"] += 1
                continue
            t_first = tx if src == first else rx
            k = int((t_first - shift) // w)
            if lo is not None and k < lo:
                self.counters["late_records"] += 1
                continue
            if lo is not None and k > lo + _MAX_AHEAD:
                self.counters["future_records"] += 1
                continue
            cell = cells.get(k)
            if cell is None:
                if len(cells) >= _MAX_AHEAD:  # before the first window closed: stay bounded
                    self.counters["future_records"] += 1
                    continue
                cell = cells[k] = {}
            if len(cell) >= _MAX_CELL:
                self.counters["overflow_records"] += 1
                continue
            cell[(pid, idx)] = (tx, rx)

    # ---- windows -----------------------------------------------------------------------
    def _lateness_s(self) -> float:
        if self.lateness_s is not None:
            return self.lateness_s
        rates = [v.rate for v in self.vms.values() if v.rate]
        return 0.3 + (1.5 / min(rates) if rates else 1.0)

    def _data_now(self) -> float | None:
        """Watermark: the earliest of the live agents' report times, on the reference clock
        (ns). A report stamped ``t_ns`` carries every record its agent emitted before
        ``t_ns``; agents silent for ``live_s`` do not hold windows back."""
        mono = time.monotonic()
        marks = []
        for v in self.vms.values():
            if v.last_t_ns is not None and mono - v.last_report_mono < self.live_s:
                marks.append(v.last_t_ns - self.coarse.get(v.name, 0.0))
            elif v.start_ns is not None and mono - v.hello_mono < self.live_s:
                marks.append(v.start_ns - self.coarse.get(v.name, 0.0))  # no record before
            elif v.last_t_ns is None and mono - v.first_seen_mono < self.live_s:
                return None  # named by a peer, not heard from yet: wait for it a little
        return min(marks) if marks else None

    def reference_name(self) -> str | None:
        if self.reference is not None:
            return self.reference
        return min(self.vms) if self.vms else None

    def step(self) -> int:
        """Process every window that can be closed; returns how many produced a result."""
        done = 0
        while True:
            with self.lock:
                now = self._data_now()
                if now is None:
                    return done
                ks = [k for cells in self.buf.values() for k in cells]
                if not ks:
                    return done
                k = min(ks)
                if self.next_window is not None:
                    k = max(k, self.next_window)
                if (k + 1) * self.window_ns + self._lateness_s() * 1e9 > now:
                    return done
                data = {}
                for key, cells in self.buf.items():
                    for kk in [kk for kk in cells if kk <= k]:
                        cell = cells.pop(kk)
                        if kk == k and cell:
                            data[key] = cell
                self.buf = {key: cells for key, cells in self.buf.items() if cells}
                self.next_window = k + 1
                ref = self.reference_name()
                coarse = dict(self.coarse)
            res = self._window(k, data, ref, coarse) if ref is not None and data else None
            with self.lock:
                if res is None:
                    self.counters["windows_skipped"] += 1
                    continue
                for v in res.est:
                    self.first_k.setdefault(v, res.k)
                self._revise_drift(res)
                self.latest = res
                self.history.append(res)
                self.series.append(res)
                for v, e in res.est.items():
                    self.coarse[v] = e.offset_ns
                self._collocation()
                done += 1

    def _window(self, k: int, data: dict, ref: str, coarse: dict) -> _Window | None:
        w = self.window_ns
        t_k = k * w + w // 2
        arrays = {}
        for (src, dst), cell in data.items():
            keys = sorted(cell)
            vals = [cell[kk] for kk in keys]
            arrays[(src, dst)] = (np.array([kk[0] for kk in keys], dtype=np.int64),
                                  np.array([v[0] for v in vals], dtype=np.int64),
                                  np.array([v[1] for v in vals], dtype=np.int64))
        fits = {}
        for (a, b) in arrays:
            if a > b or (b, a) not in arrays:
                continue
            fp, ft, fr = arrays[(a, b)]
            rp, rt, rr = arrays[(b, a)]
            fm = pure_pairs(ft, fr, fp, self.guard_ns)
            rm = pure_pairs(rt, rr, rp, self.guard_ns)
            if fm.sum() < MIN_PURE or rm.sum() < MIN_PURE:
                self.count("pairs_too_few_pure")
                continue
            try:
                h = fit_pair(ft[fm], fr[fm], rt[rm], rr[rm])
            except ValueError as e:
                log.debug("window %d pair %s|%s: %s", k, a, b, e)
                self.count("pair_fit_failures")
                continue
            d_min = _min_delays_ns(h, ft[fm], fr[fm], rt[rm], rr[rm])
            if d_min < -INCONSISTENT_NS:
                # no line leaves both directions a non-negative delay: a clock step or a
                # bad timestamp inside the window
                self.count("pairs_inconsistent")
                continue
            try:
                # RFC 5905's clock filter keeps 1 sample in 8; fewer in a sparse window
                n = ntp_pair(ft[fm], fr[fm], rt[rm], rr[rm],
                             filter_n=max(1, min(8, int(fm.sum()) // 4)))
            except ValueError:
                n = None
                self.count("ntp_fit_failures")
            fits[(a, b)] = (h, n)
        if not fits:
            return None
        nodes = _component(ref, list(fits))
        if len(nodes) < 2:
            self.count("windows_without_reference")
            return None
        pairs = {ab: f for ab, f in fits.items() if ab[0] in nodes}
        floor2 = self.weight_floor_ns ** 2

        def edges(which: int, theta: dict) -> list:
            out = []
            for (a, b), f in pairs.items():
                fit = f[which]
                if fit is None:
                    continue
                t_a = t_k + int(round(theta.get(a, 0.0)))
                out.append((a, b, fit.offset_at(t_a), fit.drift_ppm,
                            1.0 / (fit.residual_ns ** 2 + floor2)))
            return out

        names = sorted(nodes)
        try:
            est = solve(names, edges(0, coarse), ref)
            theta = {v: e.offset_ns for v, e in est.items()}
            est = solve(names, edges(0, theta), ref)
            theta = {v: e.offset_ns for v, e in est.items()}
        except ValueError as e:  # non-finite fits: skip the window, keep running
            log.warning("window %d: solve failed: %s", k, e)
            self.count("solve_failures")
            return None
        ntp_edges = edges(1, theta)
        ntp_nodes = sorted(_component(ref, [(a, b) for a, b, *_ in ntp_edges]))
        try:
            ntp = solve(ntp_nodes, [e for e in ntp_edges if e[0] in ntp_nodes], ref) \
                if len(ntp_nodes) > 1 else {}
        except ValueError as e:
            log.warning("window %d: NTP solve failed: %s", k, e)
            self.count("solve_failures")
            ntp = {}
        owd = {}
        for (src, dst), (_p, tx, rx) in arrays.items():
            if src not in est or dst not in est:
                continue
            rel_off = est[dst].offset_ns - est[src].offset_ns
            rel_drift = est[dst].drift_ppm - est[src].drift_ppm
            owd[f"{src}->{dst}"] = owd_stats(tx, rx, rel_off, rel_drift,
                                             t_k + int(round(est[src].offset_ns)))
        asym = {}
        for key in owd:
            a, b = key.split("->")
            if a < b and f"{b}->{a}" in owd:
                asym[f"{a}|{b}"] = asymmetry_us(owd[key], owd[f"{b}->{a}"])
        return _Window(k, t_k, est, ntp, owd, asym, len(pairs))

    def _revise_drift(self, res: _Window) -> None:
        """Drift of the last ``drift_windows // 2 + 1`` windows now that ``res`` closed: each
        gets the slope of the consecutive windows within ``drift_windows // 2`` of it, as far
        as they have closed, when they are at least ``drift_windows // 2 + 1`` (step 4 of
        the pipeline)."""
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

    def _line_slopes(self, target: _Window, wins: list[_Window]) -> None:
        """Set ``target``'s drift (and NTP drift) per VM to the least-squares slope of the
        VM's offsets in ``wins`` (its first window left out: it started inside it, a partial
        window) when it has at least ``drift_windows // 2 + 1`` of them and they lie within
        ``drift_residual_ns`` of the line."""
        need = self.drift_windows // 2 + 1
        for which, out in (("est", target.drift), ("ntp", target.ntp_drift)):
            for v in getattr(target, which):
                pts = [(w.t_ns - target.t_ns, getattr(w, which)[v].offset_ns)
                       for w in wins if v in getattr(w, which) and w.k != self.first_k.get(v)]
                if len(pts) < need:
                    continue
                x = np.array([p[0] for p in pts], dtype=np.float64) / 1e9
                y = np.array([p[1] for p in pts], dtype=np.float64)
                slope, icept = np.polyfit(x, y, 1)
                if np.abs(y - (icept + slope * x)).max() <= self.drift_residual_ns:
                    out[v] = float(slope) / 1e3  # ns/s -> ppm

    def _collocation(self) -> None:
        wins = list(self.series)
        names = sorted({v for w in wins for v in w.est})
        if len(wins) < 1 or not names:
            return
        series = {v: np.array([w.est[v].drift_ppm if v in w.est else np.nan for w in wins])
                  for v in names}
        offsets = {v: _latest_run([w.est[v].offset_ns if v in w.est else np.nan
                                   for w in wins], [w.k for w in wins]) for v in names}
        sig = [w.est[v].drift_sigma_ppm for w in wins[-10:] for v in w.est if v in w.est]
        sig = [s for s in sig if math.isfinite(s) and s > 0]
        sigma = max(float(np.median(sig)) if sig else 0.0, 0.01)
        osig = [w.est[v].offset_sigma_ns for w in wins[-10:] for v in w.est if v in w.est]
        osig = [s for s in osig if math.isfinite(s) and s > 0]
        try:
            self.groups = group(series, sigma, offset_series=offsets, offset_sigma_ns=max(
                float(np.median(osig)) if osig else 0.0, OFFSET_FLOOR_NS))
            self.groups_windows = len(wins)
        except ValueError as e:
            log.warning("collocation failed: %s", e)

    # ---- API ---------------------------------------------------------------------------
    def _vm_doc(self, name: str, vm: _Vm | None) -> dict:
        lat = self.latest
        e = lat.est.get(name) if lat else None
        n = lat.ntp.get(name) if lat else None
        st = vm.stats if vm else {}
        return {
            "offset_ns": _f(e.offset_ns) if e else None,
            "drift_ppm": _f(lat.drift[name]) if e else None,
            "offset_sigma_ns": _f(e.offset_sigma_ns) if e else None,
            "drift_sigma_ppm": _f(e.drift_sigma_ppm) if e else None,
            "ntp_offset_ns": _f(n.offset_ns) if n else None,
            "ntp_drift_ppm": _f(lat.ntp_drift[name]) if n else None,
            "last_report_ns": vm.last_report_ns if vm else None,
            "connected": bool(vm and time.monotonic() - vm.last_report_mono < self.live_s),
            "ip": vm.ip if vm else None,
            "probes_tx": int(st.get("probes_tx", 0)),
            "probes_rx": int(st.get("probes_rx", 0)),
            "rejects": dict(st.get("rejects", {})),
            "records_dropped": int(st.get("records_dropped", 0)),
            "peers_active": list(st.get("peers_active", [])),
        }

    def state(self, history: int | None = None) -> dict:
        """The ``nslab.coordinator/1`` document (API.md); ``history`` limits the entries."""
        with self.lock:
            lat = self.latest
            names = sorted(set(self.vms) | (set(lat.est) if lat else set()))
            hist = list(self.history)
            if history is not None:
                hist = hist[-history:] if history > 0 else []
            wins = list(self.series)
            return {
                "schema": SCHEMA,
                "time_ns": self.clock.now_ns(),
                "reference": self.reference_name(),
                "window_s": self.window_s,
                "drift_windows": self.drift_windows,
                "windows": len(self.history),
                "t_ns": lat.t_ns if lat else None,
                "vms": {v: self._vm_doc(v, self.vms.get(v)) for v in names},
                "owd_us": {k: {"min_us": _f(s["min_us"]), "p50_us": _f(s["p50_us"]),
                               "p99_us": _f(s["p99_us"]), "n": int(s["n"])}
                           for k, s in sorted(lat.owd.items())} if lat else {},
                "asymmetry_us": {k: _f(x) for k, x in sorted(lat.asym.items())} if lat else {},
                "collocation": {"groups": [{"members": g.members,
                                            "confidence": _f(g.confidence)}
                                           for g in self.groups],
                                "windows_used": self.groups_windows},
                "drift_series": {v: [_f(w.est[v].drift_ppm) if v in w.est else None
                                     for w in wins] for v in names},
                "drift_series_t_ns": [w.t_ns for w in wins],
                "history": [{"t_ns": w.t_ns,
                             "vms": {v: {"offset_ns": _f(e.offset_ns),
                                         "drift_ppm": _f(w.drift[v]),
                                         "ntp_offset_ns": _f(w.ntp[v].offset_ns)
                                         if v in w.ntp else None,
                                         "ntp_drift_ppm": _f(w.ntp_drift[v])
                                         if v in w.ntp else None}
                                     for v, e in sorted(w.est.items())}}
                            for w in hist],
                "counters": dict(self.counters),
            }

    def health(self) -> dict:
        """The ``nslab.coordinator.health/1`` document."""
        with self.lock:
            mono = time.monotonic()
            return {"schema": HEALTH_SCHEMA, "ok": True, "time_ns": self.clock.now_ns(),
                    "agents": len(self.vms),
                    "agents_connected": sum(mono - v.last_report_mono < self.live_s
                                            for v in self.vms.values()),
                    "windows": len(self.history), "reference": self.reference_name()}


def _min_delays_ns(fit, ftx, frx, rtx, rrx) -> float:
    """The smaller of the two directions' minimum one-way delays implied by ``fit`` (ns)."""
    base = round(fit.offset_ns)  # remove the integer part before float, as in agents.owd
    fwd = (frx - ftx - base).astype(np.float64) - (fit.offset_at(ftx) - base)
    rev = (rrx - rtx + base).astype(np.float64) + (fit.offset_at(rrx) - base)
    return float(min(fwd.min(), rev.min()))


def _latest_run(values: list[float], ks: list[int]) -> np.ndarray:
    """``values`` (one per window ``ks``) with NaN before the latest run of consecutive
    windows that all have a value: a clock step leaves its window without an estimate, so
    the run holds continuous offsets only."""
    out = np.array(values, dtype=np.float64)
    start = len(out)
    while start > 0 and np.isfinite(out[start - 1]) and (
            start == len(out) or ks[start] == ks[start - 1] + 1):
        start -= 1
    out[:start] = np.nan
    return out


def _component(ref: str, pairs: list[tuple[str, str]]) -> set[str]:
    adj: dict[str, set[str]] = {}
    for a, b in pairs:
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    seen, todo = {ref}, [ref]
    while todo:
        u = todo.pop()
        for v in adj.get(u, ()):
            if v not in seen:
                seen.add(v)
                todo.append(v)
    return seen


# ---- servers ---------------------------------------------------------------------------
class _ReportHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        coord: Coordinator = self.server.coordinator  # type: ignore[attr-defined]
        name = None
        while True:
            try:
                line = self.rfile.readline(_MAX_LINE)
            except OSError:
                break
            if not line:
                break
            if not line.endswith(b"\n"):
                coord.count("bad_messages")
                break  # over-long line: drop the connection, the agent reconnects
            try:
                name = coord.ingest(json.loads(line))
            except (ValueError, TypeError, KeyError) as e:
                coord.count("bad_messages")
                log.debug("bad message from %s: %s", self.client_address, e)
        if name:
            log.info("agent %s disconnected", name)


class _ReportServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.conns: set = set()
        self.conns_lock = threading.Lock()

    def process_request_thread(self, request, client_address):
        with self.conns_lock:
            self.conns.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.conns_lock:
                self.conns.discard(request)

    def close_connections(self) -> None:
        with self.conns_lock:
            for c in list(self.conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class _ApiHandler(BaseHTTPRequestHandler):
    server_version = "nslab-coordinator/1"

    def log_message(self, fmt, *args) -> None:  # quiet
        log.debug("http %s " + fmt, self.client_address[0], *args)

    def _send(self, code: int, doc: dict) -> None:
        body = json.dumps(doc, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        coord: Coordinator = self.server.coordinator  # type: ignore[attr-defined]
        url = urlparse(self.path)
        if url.path == "/api/v1/state":
            q = parse_qs(url.query)
            try:
                hist = int(q["history"][0]) if "history" in q else None
            except ValueError:
                self._send(400, {"error": "history must be an integer"})
                return
            self._send(200, coord.state(hist))
        elif url.path == "/api/v1/health":
            self._send(200, coord.health())
        else:
            self._send(404, {"error": f"no such path {url.path}",
                             "paths": ["/api/v1/state", "/api/v1/health"]})


class _ApiServer(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


class Service:
    """The coordinator's servers: report listener (TCP), HTTP API and window processing, each
    in a daemon thread. Port 0 picks a free port (``report_port``/``http_port`` tell which).

    Raises (``start``):
        OSError: a port cannot be bound.
    """

    def __init__(self, coord: Coordinator, bind: str, port: int, http_port: int,
                 http_bind: str | None = None, period_s: float = 0.2):
        self.coord, self.period_s = coord, period_s
        self.addr = (bind, port)
        self.http_addr = (http_bind or bind, http_port)
        self.stop_event = threading.Event()
        self.servers: list = []
        self.threads: list[threading.Thread] = []
        self.report_port = port
        self.http_port = http_port

    def start(self) -> Service:
        reports = _ReportServer(self.addr, _ReportHandler)
        reports.coordinator = self.coord  # type: ignore[attr-defined]
        try:
            api = _ApiServer(self.http_addr, _ApiHandler)
        except OSError:
            reports.server_close()
            raise
        api.coordinator = self.coord  # type: ignore[attr-defined]
        self.servers = [reports, api]
        self.report_port = reports.server_address[1]
        self.http_port = api.server_address[1]
        self.threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.2},
                                         daemon=True, name=n)
                        for s, n in ((reports, "nslab-reports"), (api, "nslab-api"))]
        self.threads.append(threading.Thread(target=self._process, daemon=True,
                                             name="nslab-windows"))
        for t in self.threads:
            t.start()
        log.info("coordinator: reports on %s:%d, API on http://%s:%d/api/v1/state",
                 self.addr[0], self.report_port, self.http_addr[0], self.http_port)
        return self

    def _process(self) -> None:
        while not self.stop_event.wait(self.period_s):
            try:
                self.coord.step()
            except Exception:  # noqa: BLE001 - one bad window must not stop the service
                log.exception("window processing failed")
                self.coord.count("step_errors")

    def stop(self) -> None:
        """Stop the threads and close the listening sockets (open report connections end
        when their agents notice)."""
        self.stop_event.set()
        for s in self.servers:
            s.shutdown()
            s.server_close()
            if isinstance(s, _ReportServer):
                s.close_connections()
        for t in self.threads:
            t.join(timeout=2.0)


def serve(coord: Coordinator, bind: str, port: int, http_port: int,
          stop: threading.Event, http_bind: str | None = None) -> None:
    """Run ``Service`` until ``stop`` is set.

    Raises:
        OSError: a port cannot be bound.
    """
    svc = Service(coord, bind, port, http_port, http_bind).start()
    try:
        while not stop.is_set():  # sleep, not stop.wait(): see agents.agent.Agent.run
            time.sleep(0.2)
    finally:
        svc.stop()
