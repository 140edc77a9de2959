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

Records stay numpy arrays from the report on: a report's records become one int64 array
(packed records, ``nslab.report/2``: straight from their bytes; JSON rows: one conversion per
sender), wait until the coordinator looks for a window to close, are then put in windows
with every other report's at once, and a window's are sorted and joined per direction in
one pass when it closes (a per-record Python object per step cost 4 us a record:
2.5 s of CPU per window at 256 VMs).

Not thread-safe: the coordinator holds its lock around every call.
"""
from __future__ import annotations

import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from agents.clock import Clock
from agents.segments import starts_of
from agents.window import Records
from contracts.messages import RECORD, AgentStats, Hello, PackedRecords, Report

__all__ = ["LIVE_S", "AgentInfo", "Inbox"]

_RECORD = np.dtype([("pair_id", "<i8"), ("idx", "<i8"), ("tx_ns", "<i8"), ("rx_ns", "<i8")])
"""A record row ``[pair_id, idx, tx_ns, rx_ns]`` as one item."""
LIVE_S = 5.0
"""An agent whose last report is older than this (s) no longer holds windows open."""
_MAX_CELL = 500_000           # records per (receiving VM, window)
_MAX_AHEAD = 32               # windows beyond the next one that records may open
_MAX_PENDING = 2_000_000      # rows of reports waiting to be put in windows
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
        self.buf: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        """Window -> chunks ``(receivers, senders, rows)``: VM indices into ``names``, rows
        (n, 4) int64 ``[pair_id, idx, tx_ns, rx_ns]``, in arrival order."""
        self.cell_rows: dict[int, np.ndarray] = {}  # window -> rows per receiver (_MAX_VMS,)
        self.pending: list[tuple] = []
        """Reports' rows not yet in ``buf``, put in windows all at once when a window may
        close: ``(rows, counts, senders, by_tx, shift, own, receiver)``, per sender (arrays,
        counts a list; ``add``)."""
        self.pending_rows = 0
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.offsets_ns: dict[str, float] = {}
        """VM -> its latest estimated offset to the reference VM, ns (``set_offsets``)."""
        self._offsets = np.zeros(_MAX_VMS, np.int64)  # the same by VM index, rounded to ns
        self._senders: dict[tuple, tuple] = {}
        """(receiver, its report's senders) -> per sender its VM index, whether it is the
        pair's first VM, that VM's index and whether it is the receiver (``add``)."""
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
            self.index[name] = len(self.names)
            self.names.append(name)
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
        senders, counts, parts = [], [], []
        for src, part in msg.rx.items():
            arr = self._rows(part)
            senders.append(src)
            counts.append(arr.shape[0])
            parts.append(arr)
        if msg.rx_packed is not None:
            arr = self._unpack(msg.rx_packed)
            if arr is not None:
                senders += msg.rx_packed.senders
                counts += msg.rx_packed.counts
                parts.append(arr)
        # per sender: its VM index, whether it is the pair's first VM (whose clock, tx or rx,
        # puts the rows in windows), that VM's offset now, and whether it is this VM itself
        # (its own records are bad); per row in _flush. An agent's senders are the same
        # report after report: worked out once.
        key = (vm.name, *senders)
        per_sender = self._senders.get(key)
        if per_sender is None:
            for src in senders:
                self.vm(src)
            if len(self._senders) >= _MAX_VMS:
                self._senders.clear()
            per_sender = self._senders[key] = (
                np.array([self.index[x] for x in senders], dtype=np.int64),
                np.array([x < vm.name for x in senders], dtype=bool),
                np.array([self.index[min(x, vm.name)] for x in senders], dtype=np.int64),
                np.array([x == vm.name for x in senders], dtype=bool))
        n = sum(counts)
        if not n:
            return vm.name
        src_i, by_tx, first_i, own = per_sender
        self.pending.append((np.concatenate(parts) if len(parts) > 1 else parts[0], counts,
                             src_i, by_tx, self._offsets[first_i], own, self.index[vm.name]))
        self.pending_rows += n
        if self.pending_rows > _MAX_PENDING:
            self._flush()
        return vm.name

    def _rows(self, rows: list) -> np.ndarray:
        """JSON rows ``[pair_id, idx, tx_ns, rx_ns]`` as an (n, 4) int64 array; a malformed
        row (not 4 integers of int64) is counted in ``bad_records`` and left out."""
        try:
            arr = np.array(rows)
        except (ValueError, TypeError, OverflowError):
            arr = None
        if arr is None or arr.dtype != np.int64 or arr.ndim != 2 or arr.shape[1] != 4:
            arr = np.array([row for row in rows if isinstance(row, list) and len(row) == 4
                            and all(type(x) is int and -2 ** 63 <= x < 2 ** 63 for x in row)],
                           dtype=np.int64).reshape(-1, 4)
            self.counters["bad_records"] += len(rows) - arr.shape[0]
        return arr

    def _unpack(self, packed: PackedRecords) -> np.ndarray | None:
        """``Report.rx_packed`` as an (n, 4) int64 array (decompressed first when its
        ``encoding`` is zlib); records that are not ``sum(counts)`` records of ``senders``
        (``contracts.messages.pack_records``), or a zlib stream that does not hold exactly
        them, are counted
        in ``bad_records`` as the records their length would hold (at least one) and left out
        (None)."""
        raw, size = packed.records, sum(packed.counts) * RECORD.size
        if packed.encoding == "zlib":
            try:  # at most the size the counts give, so a small line cannot expand unbounded
                z = zlib.decompressobj()
                raw = z.decompress(raw, size + 1) if size >= 0 else b""
                if not z.eof:
                    raw = b""
            except zlib.error:
                raw = b""
        if (len(packed.counts) != len(packed.senders) or min(packed.counts, default=0) < 0
                or len(raw) != size):
            self.counters["bad_records"] += max(1, len(raw) // RECORD.size)
            return None
        return np.frombuffer(raw, dtype="<i8").reshape(-1, 4).astype(np.int64, copy=False)

    def _flush(self) -> None:
        """Put the pending rows in their windows, all reports at once: each row that VM
        ``dst`` received from ``src`` by the ``tx`` (``by_tx``) or ``rx`` stamp of the pair's
        first VM, less that VM's offset to the reference (``shift``, whole ns, as it was when the
        report came). Rows a VM sent itself or whose idx is not 0 or 1 count as bad, rows
        of a closed window as late, rows beyond ``_MAX_AHEAD`` as future, rows beyond
        ``_MAX_CELL`` per receiver and window as overflow (the first ones kept)."""
        if not self.pending:
            return
        chunks, self.pending, self.pending_rows = self.pending, [], 0
        rows = np.concatenate([c[0] for c in chunks])
        counts = np.fromiter(chain.from_iterable(c[1] for c in chunks), np.int64)
        # per sender to per row: np.repeat (a third of the CPU of a gather by row)
        src, by_tx, shift, own = (np.repeat(np.concatenate([c[i] for c in chunks]), counts)
                                  for i in range(2, 6))
        dst = np.repeat(np.repeat([c[6] for c in chunks], [len(c[1]) for c in chunks]), counts)
        bad = own | (rows[:, 1] < 0) | (rows[:, 1] > 1)
        if bad.any():
            self.counters["bad_records"] += int(bad.sum())
            ok = ~bad
            rows, src, by_tx, shift, dst = rows[ok], src[ok], by_tx[ok], shift[ok], dst[ok]
        t = np.where(by_tx, rows[:, 2], rows[:, 3])
        k = (t - shift) // self.window_ns  # int64: exact (a float difference of ~1.8e18 ns
        # is good to 256 ns) and 3x cheaper than a float floor division
        lo = self.next_window
        counters = self.counters
        if lo is not None:
            late, future = k < lo, k > lo + _MAX_AHEAD
            counters["late_records"] += int(late.sum())
            counters["future_records"] += int(future.sum())
            keep = ~late & ~future
            if not keep.all():
                dst, src, rows, k = dst[keep], src[keep], rows[keep], k[keep]
        if not k.size:
            return
        kmin, kmax = int(k.min()), int(k.max())
        # by window, arrival order kept within: a mask per window (a report's rows span one
        # or two), not a sort of all rows; windows with a record only if they are many
        # (before the first window closed, nothing bounds them)
        for kk in range(kmin, kmax + 1) if kmax - kmin <= _MAX_AHEAD else np.unique(k).tolist():
            sel = slice(None) if kmin == kmax else np.flatnonzero(k == kk)
            d = dst[sel]
            if not d.size:
                continue
            if kk not in self.buf and len(self.buf) >= _MAX_AHEAD:
                counters["future_records"] += d.size  # before the first window closed: bounded
                continue
            cell = self.cell_rows.setdefault(kk, np.zeros(_MAX_VMS, np.int64))
            n = np.bincount(d, minlength=_MAX_VMS)
            if (cell + n > _MAX_CELL).any():  # keep each receiver's first rows that fit
                rank = np.empty(d.size, np.int64)
                by_d = np.argsort(d, kind="stable")
                first = np.searchsorted(d[by_d], d[by_d])
                rank[by_d] = np.arange(d.size) - first
                fit = rank < (_MAX_CELL - cell[d])
                counters["overflow_records"] += int((~fit).sum())
                sel, d = np.arange(k.size)[sel][fit], d[fit]
                n = np.bincount(d, minlength=_MAX_VMS)
            cell += n
            self.buf.setdefault(kk, []).append((d, src[sel], rows[sel] if isinstance(
                sel, slice) else np.take(rows, sel, axis=0)))

    def set_offsets(self, offsets_ns: dict[str, float]) -> None:
        """Update the VMs' offsets to the reference VM, ns (``offsets_ns``)."""
        self.offsets_ns.update(offsets_ns)
        for v, x in offsets_ns.items():
            self._offsets[self.index[v]] = round(x)

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
        self._flush()
        now = self.watermark_ns()
        if now is None:
            return None
        if not self.buf:
            return None
        ks = list(self.buf)
        k = min(ks) if self.next_window is None else max(min(ks), self.next_window)
        if (k + 1) * self.window_ns + self._lateness_s() * 1e9 > now:
            return None
        return k

    def take(self, k: int) -> Records:
        """Close window ``k``: its records, sorted by direction (names) and ``(pair_id,
        idx)``, the last copy of a record received twice kept; older windows are dropped,
        later records of ``k`` or before count as late."""
        self._flush()
        chunks = self.buf.pop(k, [])
        for kk in [kk for kk in self.buf if kk < k]:
            del self.buf[kk]
        self.cell_rows = {kk: n for kk, n in self.cell_rows.items() if kk > k}
        self.next_window = k + 1
        if not chunks:
            return Records([], *(np.zeros(0, np.int64),) * 2, np.zeros(1, np.int64),
                           *(np.zeros(0, np.int64),) * 4)
        rank = np.empty(len(self.names), np.int64)
        rank[sorted(range(len(self.names)), key=self.names.__getitem__)] = \
            np.arange(len(self.names))
        src = np.concatenate([c[1] for c in chunks])
        dst = np.concatenate([c[0] for c in chunks])
        rows = np.concatenate([c[2] for c in chunks])
        direction = rank[src] * len(rank) + rank[dst]
        pid = rows[:, 0]
        if pid.size and pid.min() >= 0 and pid.max() < 1 << 32:  # the agents' 32-bit ids:
            # one int64 key, sorted stably by radix sort (arrival order kept among equals)
            key = (direction << 33) | (pid << 1) | rows[:, 1]
            order = np.argsort(key, kind="stable")
            key = key[order]
            same = key[1:] == key[:-1]
        else:
            order = np.lexsort((rows[:, 1], pid, direction))  # stable as well
            so, sr = direction[order], rows[order]
            same = (so[1:] == so[:-1]) & (sr[1:, 0] == sr[:-1, 0]) & (sr[1:, 1] == sr[:-1, 1])
        sel = order[np.r_[~same, True]]  # each record's last copy, in order
        direction = direction[sel]
        first = np.flatnonzero(np.r_[True, direction[1:] != direction[:-1]])
        # the directions' VMs by rank (name order), numbered among the window's VMs
        d_src, d_dst = rank[src[sel[first]]], rank[dst[sel[first]]]
        present = np.unique(np.concatenate([d_src, d_dst]))
        by_rank = sorted(self.names)
        starts = starts_of(np.diff(np.r_[first, direction.size]))
        # each record a 32-byte item: np.take gathers them 3x faster than rows of (n, 4), and
        # a 2-D fancy index 6x slower still (numpy 2.x)
        kept = np.take(rows.view(_RECORD).ravel(), sel).view(np.int64).reshape(-1, 4)
        return Records([by_rank[i] for i in present.tolist()], np.searchsorted(present, d_src),
                       np.searchsorted(present, d_dst), starts, *kept.T.copy())
