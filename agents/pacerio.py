"""The pacer's control loop, compiled: ``libnslabpacer.so`` (``agents/native/pacer.c``, compiled
at first use into nslab's cache: ``agents.native.PACER``), loaded with ctypes.

Why compiled: On-Ramp's rule is drop-free only when the loop from an echo's arrival
to the hold is well under a millisecond (``benchmarks/pacer_model.py``), and the Python loop
took 2 ms (median) to 19 ms (p99) to see an echo and 4 ms (median) to 450 ms (p99) to switch
the hold through pyroute2 under a 4-sender incast on 2 saturated cores: its tc calls build
each message in Python and wait behind the sensing thread's ``sock_diag`` parsing for the
GIL. So one native thread, which never takes the GIL, sends and answers the probes, computes
the OWD, runs the gate and sends the hold's prebuilt netlink message (``agents.hold``);
Python sets the destinations and clock parameters and drains the samples for its reports.

``CGate`` is the same gate (``agents.gate.Gate``'s ``decide`` and ``overdue`` in C), for the
tests that hold it to the Python gate on the same inputs.
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct
from collections.abc import Callable

import numpy as np

from agents import native
from agents.gate import Decision, GateConfig

__all__ = ["CGate", "Engine", "PacerIOError", "load"]

REASONS = ("clock not synchronized: gate open", "stale sample",
           "held: sample predates the hold", "open after the longest continuous hold",
           "below threshold", "above threshold",
           "released: a sample sent in the hold is below threshold", "probe not late",
           "destination silent: gate open", "held: the hold goes on",
           "probe overdue: held until a fresh sample")
"""``npc_gate_decide``'s and ``npc_gate_overdue``'s return codes, as
``agents.gate.Decision.reason`` words them."""
RECORD = np.dtype([("dst", "<i4"), ("held", "<i4"), ("owd_ns", "<f8"), ("tx_ns", "<i8"),
                   ("wake_ns", "<i8"), ("react_ns", "<i8")])
"""``struct npc_rec``: one OWD sample (``held``: it started or extended a hold; from the
echo's kernel arrival to the loop handling it, ``wake_ns``, and to the hold applied,
``react_ns``)."""
RING = 65536
_CONV = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)
_i64, _f64 = ctypes.c_int64, ctypes.c_double
_lib: ctypes.CDLL | None = None


class _GateCfg(ctypes.Structure):
    _fields_ = [("threshold_ns", _f64), ("max_hold_ns", _f64), ("max_age_ns", _f64),
                ("max_continuous_ns", _f64), ("max_slope", _f64), ("predict", ctypes.c_int32),
                ("fresh", ctypes.c_int32), ("spread", ctypes.c_int32), ("seed", ctypes.c_uint64)]

    @classmethod
    def of(cls, c: GateConfig) -> _GateCfg:
        return cls(c.threshold_ns, c.max_hold_ns, c.max_age_ns, c.max_continuous_ns,
                   c.max_slope, int(c.predict), int(c.fresh), int(c.spread),
                   c.seed & (1 << 64) - 1)


class DestStats(ctypes.Structure):
    """``struct npc_dstats``: one destination's counters since the start (``echoed``: echoes
    that answered an unanswered probe, by its sequence number; ``stale``: the others,
    duplicates or a previous pacer's, ignored)."""

    _fields_ = [(n, _i64) for n in ("sent", "echoed", "samples", "above", "switches",
                                    "switch_errors", "stale", "holds", "overdue")]


class Counters(ctypes.Structure):
    """``struct npc_counters``: the engine's own counters since the start."""

    _fields_ = [(n, _i64) for n in ("echoes_tx", "recv_errors", "dropped_records",
                                    "netlink_errors", "unprepared")] + \
               [("send_errors", _i64 * 256)]


class PacerIOError(RuntimeError):
    """The compiled control loop cannot be built or does not load."""


def load() -> ctypes.CDLL:
    """``libnslabpacer.so``, built at first use (``agents.native.build``) and loaded once.

    Raises:
        PacerIOError: it cannot be built (the message names the missing compiler, header or
            library and its Debian package) or does not load.
    """
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL(native.build(native.PACER))
        except (native.NativeError, OSError) as e:
            raise PacerIOError(f"the pacer's compiled control loop cannot be used: {e}") from e
        p, i, u32p = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint32)
        sigs = {"npc_gate_new": (p, [ctypes.POINTER(_GateCfg), i]),
                "npc_gate_free": (None, [p]),
                "npc_gate_decide": (i, [p, i, _f64, _i64, _i64, i, ctypes.POINTER(_f64),
                                        ctypes.POINTER(_i64)]),
                "npc_gate_overdue": (i, [p, i, _i64, _i64, _i64, i, i, ctypes.POINTER(_f64),
                                         ctypes.POINTER(_i64)]),
                "npc_gate_stats": (None, [p, i, ctypes.POINTER(_i64), ctypes.POINTER(_f64)]),
                "npc_new": (p, [i, i, i, u32p, i, ctypes.POINTER(_GateCfg), _i64, i, _CONV]),
                "npc_set_switch": (i, [p, i, ctypes.c_char_p, i, ctypes.c_char_p, i]),
                "npc_set_dest": (None, [p, i, i, i, _f64, _f64, _i64]),
                "npc_watch_syn": (i, [p, i, _i64]),
                "npc_start": (i, [p]), "npc_stop": (None, [p]), "npc_free": (None, [p]),
                "npc_drain": (i, [p, p, i]),
                "npc_stats": (None, [p, i, ctypes.POINTER(DestStats), ctypes.POINTER(_f64)]),
                "npc_counters": (None, [p, ctypes.POINTER(Counters)])}
        for name, (res, args) in sigs.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        _lib = lib
    return _lib


class CGate:
    """The compiled gate over destinations ``0..n-1`` (``Gate``'s ``decide`` and ``stats``
    with an index for the name).

    Raises:
        PacerIOError: see ``load``.
    """

    def __init__(self, cfg: GateConfig, n: int):
        self.lib = load()
        self.h = self.lib.npc_gate_new(ctypes.byref(_GateCfg.of(cfg)), n)

    def decide(self, dest: int, owd_ns: float, sent_ns: int, now_ns: int,
               synced: bool = True) -> Decision:
        hold, until = _f64(), _i64()
        r = self.lib.npc_gate_decide(self.h, dest, owd_ns, sent_ns, now_ns, int(synced),
                                     ctypes.byref(hold), ctypes.byref(until))
        return Decision(hold.value, until.value, REASONS[r])

    def overdue(self, dest: int, sent_ns: int, now_ns: int, answered_ns: int | None,
                synced: bool = True) -> Decision:
        hold, until = _f64(), _i64()
        r = self.lib.npc_gate_overdue(self.h, dest, sent_ns, now_ns, answered_ns or 0,
                                      int(answered_ns is not None), int(synced),
                                      ctypes.byref(hold), ctypes.byref(until))
        return Decision(hold.value, until.value, REASONS[r])

    def stats(self, dest: int) -> tuple[int, float]:
        holds, held = _i64(), _f64()
        self.lib.npc_gate_stats(self.h, dest, ctypes.byref(holds), ctypes.byref(held))
        return holds.value, held.value

    def __del__(self):
        if getattr(self, "h", None):
            self.lib.npc_gate_free(self.h)
            self.h = None


def _ip(text: str) -> int:
    """IPv4 address as the C side holds it (network order in a native uint32)."""
    return struct.unpack("=I", socket.inet_aton(text))[0]


class Engine:
    """The native control loop on ``sock`` (bound UDP, ``SO_TIMESTAMPING`` set, kept open by
    the caller) toward ``peers`` (IPv4 addresses; destination ``i`` is ``peers[i]``).

    Args:
        pace: run the gate and switch holds (False: measure only).
        probe_s: probe period per active destination, s.
        convert: CLOCK_REALTIME ns -> VM clock ns, or None for the identity (module doc of
            ``agents/native/pacer.c``).

    Raises:
        PacerIOError: see ``load``; OSError: no netlink socket.
    """

    def __init__(self, sock: socket.socket, port: int, peers: list[str], pace: bool,
                 gate: GateConfig, probe_s: float, convert: Callable[[int], int] | None):
        self.lib, self.n = load(), len(peers)
        ips = (ctypes.c_uint32 * max(self.n, 1))(*(_ip(ip) for ip in peers))
        self._conv = _CONV(convert) if convert is not None else _CONV()  # kept alive here
        self.h = self.lib.npc_new(sock.fileno(), port, self.n, ips, int(pace),
                                  ctypes.byref(_GateCfg.of(gate)), int(probe_s * 1e9), RING,
                                  self._conv)
        if not self.h:
            raise OSError("the pacer's engine found no memory or netlink socket")
        self._buf = np.empty(RING, RECORD)

    def set_switch(self, i: int, hold: bytes, release: bytes) -> None:
        """Destination ``i``'s prebuilt hold and release messages (``Holder.messages``)."""
        if self.lib.npc_set_switch(self.h, i, hold, len(hold), release, len(release)):
            raise ValueError(f"switch messages of destination {i} refused")

    def set_dest(self, i: int, active: bool, synced: bool, offset_ns: float, drift_ppm: float,
                 t_ref_ns: int) -> None:
        """Destination ``i`` (``i == len(peers)``: this VM): probed, gated, and its clock's
        offset and drift against the reference at ``t_ref_ns`` (``Sync.theta_ns``)."""
        self.lib.npc_set_dest(self.h, i, int(active), int(synced), offset_ns, drift_ppm,
                              t_ref_ns)

    def watch_syn(self, ifindex: int, active_s: float) -> None:
        """Probe a destination as soon as this VM sends it a TCP SYN on interface ``ifindex``,
        and for ``active_s`` after (``npc_watch_syn``); before ``start``.

        Raises:
            OSError: no packet socket (CAP_NET_RAW) or the filter was refused."""
        e = self.lib.npc_watch_syn(self.h, ifindex, int(active_s * 1e9))
        if e:
            raise OSError(-e, os.strerror(-e))

    def start(self) -> None:
        """Start the native thread.

        Raises:
            OSError: it could not be created."""
        e = self.lib.npc_start(self.h)
        if e:
            raise OSError(-e, os.strerror(-e))

    def drain(self) -> np.ndarray:
        """The samples since the last drain (``RECORD`` array, oldest first)."""
        n = self.lib.npc_drain(self.h, self._buf.ctypes.data, RING)
        return self._buf[:n].copy()

    def stats(self, i: int) -> tuple[DestStats, float]:
        """Destination ``i``'s counters (``DestStats``; ``holds``: those that held it,
        ``overdue`` of them started by a late echo) and the gate's total hold time (ns)."""
        st, held = DestStats(), _f64()
        self.lib.npc_stats(self.h, i, ctypes.byref(st), ctypes.byref(held))
        return st, held.value

    def counters(self) -> Counters:
        c = Counters()
        self.lib.npc_counters(self.h, ctypes.byref(c))
        return c

    def close(self) -> None:
        """Stop the thread, release every held destination, free the C side."""
        if self.h:
            self.lib.npc_free(self.h)
            self.h = None
