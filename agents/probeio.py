"""The agent's datagram path, compiled: ``libnslabprobeio.so`` (``agents/native/probeio.c``,
compiled at first use into nslab's cache: ``agents.native.PROBEIO``), loaded with ctypes.

Why compiled: an agent at its default rate should cost at most 1 % of a core, and per-datagram
Python costs more than the kernel's work (``benchmarks/agent_cost.py`` measures both). So
everything done per datagram is in C: encoding (and the HMAC tag), sending, matching TX
stamps from the error queue, validating received probes (``agents.probe.ProbeFilter``'s
checks, in its order), pairing them with their follow-ups. The loop is in C too (``run``):
it sleeps to the next send of pairs (a round gives every active peer a pair, ``rate`` rounds a
second, in sends of at most ``per_send`` pairs spread over the round: one wake-up per send,
not per pair) and returns to Python once per report period with the finished
records; a Python pass per 20 ms tick cost more than the datagrams' system calls. Peers,
clock, reports and the counters' meaning stay in ``agents.agent``.

Stamps: the C side turns kernel stamps into the VM clock with ``convert`` (here: a ctypes
callback into ``agents.clock``'s formula), or takes them as they are when ``convert`` is None,
which is the case in a lab VM (``vmclock`` preloaded: the kernel's stamps and the system clock
already are the VM clock) and on a real VM.
"""
from __future__ import annotations

import ctypes
import errno
import socket
import struct
from collections.abc import Callable

from agents import native
from agents.probe import REASONS

__all__ = ["ProbeIO", "ProbeIOError", "Record", "load"]

RECORDS = 8192      # records per ``run`` call (it returns early when fewer than 128 are left)
MAX_ERRNO = 256
Record = struct.Struct("=iIiiqq")
"""``struct nsp_record``: peer index, pair_id, idx, (pad), tx_ns, rx_ns."""

_CONV = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)
_u32p = ctypes.POINTER(ctypes.c_uint32)
_intp = ctypes.POINTER(ctypes.c_int)
_lib: ctypes.CDLL | None = None


class Counters(ctypes.Structure):
    """``struct nsp_counters`` (probeio.c): what the C side counted since the start."""

    _fields_ = [("probes_tx", ctypes.c_int64), ("probes_rx", ctypes.c_int64),
                ("tx_user_stamps", ctypes.c_int64), ("rx_user_stamps", ctypes.c_int64),
                ("tx_stamps_missing", ctypes.c_int64), ("errqueue_errors", ctypes.c_int64),
                ("recv_errors", ctypes.c_int64), ("rejects", ctypes.c_int64 * len(REASONS)),
                ("send_errors", ctypes.c_int64 * MAX_ERRNO)]


class ProbeIOError(RuntimeError):
    """The compiled datagram path cannot be built or does not load."""


def load() -> ctypes.CDLL:
    """``libnslabprobeio.so``, built at first use (``agents.native.build``) and loaded once.

    Raises:
        ProbeIOError: it cannot be built (the message names the missing compiler, header or
            library and its Debian package) or does not load.
    """
    global _lib
    if _lib is not None:
        return _lib
    try:
        path = native.build(native.PROBEIO)
        lib = ctypes.CDLL(path)
    except (native.NativeError, OSError) as e:
        raise ProbeIOError(f"the agent's compiled datagram path cannot be used: {e}") from e
    lib.nsp_new.restype = ctypes.c_void_p
    lib.nsp_new.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.c_int, _u32p, _u32p,
                            ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                            ctypes.c_uint64, ctypes.c_uint32, ctypes.c_double, ctypes.c_int,
                            ctypes.c_uint64, _CONV]
    lib.nsp_free.argtypes = [ctypes.c_void_p]
    lib.nsp_free.restype = None
    lib.nsp_counters.argtypes = [ctypes.c_void_p]
    lib.nsp_counters.restype = ctypes.POINTER(Counters)
    lib.nsp_check.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32]
    lib.nsp_check.restype = ctypes.c_int
    lib.nsp_active.argtypes = [ctypes.c_void_p, _intp, ctypes.c_int]
    lib.nsp_active.restype = ctypes.c_int
    lib.nsp_rate.argtypes = [ctypes.c_void_p, ctypes.c_double]
    lib.nsp_rate.restype = ctypes.c_int
    lib.nsp_run.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int,
                            _intp, _intp]
    lib.nsp_run.restype = ctypes.c_int
    lib.nsp_pack.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_int32)]
    lib.nsp_pack.restype = ctypes.c_int
    _lib = lib
    return lib


def _ip(text: str) -> int:
    """IPv4 address as the C side holds it (network order in a native uint32)."""
    return struct.unpack("=I", socket.inet_aton(text))[0]


class ProbeIO:
    """One agent's probe socket driven from C.

    Args:
        sock: bound, non-blocking UDP socket with ``SO_TIMESTAMPING`` set (kept open by the
            caller while this object lives).
        me: this VM's probe id (``agents.probe.node_id``).
        peers: ``[(probe id, IPv4 address)]``; peers are named by their index in this list.
        port: the peers' UDP port.
        size: probe datagram size, bytes (56..1472; with a key, the last 16 are the tag).
        key: HMAC key or None.
        seq: first probe sequence; pair_seq: first pair id.
        rate: rounds per second (pairs/s to each active peer); per_send: the most pairs sent
            together (0: a whole round at once); seed: the rounds' jitter and order (64 bits).
        convert: CLOCK_REALTIME ns -> VM clock ns, or None for the identity.

    Raises:
        ProbeIOError: see ``load``; ValueError: bad size, key (longer than 256 bytes), rate or
            per_send.
    """

    def __init__(self, sock: socket.socket, me: int, peers: list[tuple[int, str]], port: int,
                 size: int, key: bytes | None, seq: int, pair_seq: int, rate: float,
                 per_send: int, seed: int, convert: Callable[[int], int] | None):
        self.lib = load()
        n = len(peers)
        ids = (ctypes.c_uint32 * max(n, 1))(*(i for i, _ in peers))
        ips = (ctypes.c_uint32 * max(n, 1))(*(_ip(ip) for _, ip in peers))
        self._conv = _CONV(convert) if convert is not None else _CONV()  # kept alive here
        key = key or b""
        self.h = self.lib.nsp_new(sock.fileno(), me, n, ids, ips, port, size, key, len(key),
                                  seq, pair_seq, rate, per_send, seed, self._conv)
        if not self.h:
            raise ValueError(f"probe size {size} outside 56..1472, key over 256 bytes, rate "
                             f"{rate} not > 0 or pairs per send {per_send} < 0")
        self.counters = self.lib.nsp_counters(self.h).contents
        self._rec = ctypes.create_string_buffer(RECORDS * Record.size)
        self._peers = (ctypes.c_int * max(n, 1))()
        self._nrx = ctypes.c_int()
        self._counts = (ctypes.c_int32 * max(n, 1))()
        self.npeers = n

    def active(self, peers: list[int]) -> None:
        """The peers (indices) that get a pair in every round from now on (a changed set
        starts a new round).

        Raises:
            ValueError: an index out of range or repeated."""
        for k, p in enumerate(peers):
            self._peers[k] = p
        if self.lib.nsp_active(self.h, self._peers, len(peers)) < 0:
            raise ValueError(f"bad peer indices {peers}")

    def rate(self, rate: float) -> None:
        """Rounds per second (pairs/s to each active peer) from the next round on.

        Raises:
            ValueError: ``rate`` is not > 0."""
        if self.lib.nsp_rate(self.h, rate) < 0:
            raise ValueError(f"rate {rate} not > 0")

    def run(self, seconds: float) -> tuple[bytes, list[int]]:
        """Probe for ``seconds`` (0: one wake-up's work): drain both queues at every wake-up,
        send the pairs that fall due, sleep in between (the GIL released). Returns early
        when the record buffer is nearly full or a signal arrived. Returns the finished
        records, ``Record`` each (``(peer, pair_id, idx, pad, tx_ns, rx_ns)``: tx on the
        sender's VM clock, rx on this VM's), and the peers that sent a valid probe."""
        n = self.lib.nsp_run(self.h, int(seconds * 1e9), self._rec, RECORDS, self._peers,
                             ctypes.byref(self._nrx))
        return ctypes.string_at(self._rec, n * Record.size), self._peers[:self._nrx.value]

    def pack(self, records: bytes) -> tuple[list[int], bytes]:
        """Records for a report: ``records`` (``Record`` each, as ``run`` returns them, any
        number of runs' joined) grouped by peer. Returns how many each peer index has and the
        records as four little-endian int64 each (``pair_id, idx, tx_ns, rx_ns``:
        ``contracts.messages.RECORD``), peer by peer in index order.

        Raises:
            ValueError: ``records`` is not whole records, or one names no peer.
        """
        n, rest = divmod(len(records), Record.size)
        out = ctypes.create_string_buffer(4 * 8 * n)
        if rest or self.lib.nsp_pack(self.h, records, n, out, self._counts) < 0:
            raise ValueError(f"{len(records)} bytes are not records of this agent's peers")
        return self._counts[:self.npeers], out.raw

    def check(self, data: bytes, ip: str) -> int:
        """Validate one datagram as the receive path does: the sender's peer index, or -1
        (the reason counted in ``counters.rejects``). For tests: it updates replay windows."""
        return self.lib.nsp_check(self.h, data, len(data), _ip(ip))

    def rejects(self) -> dict[str, int]:
        """Rejected datagrams by reason (``agents.probe.REASONS``), non-zero ones."""
        return {r: n for r, n in zip(REASONS, self.counters.rejects, strict=True) if n}

    def send_errors(self) -> dict[str, int]:
        """Failed sends by errno name, non-zero ones."""
        counts = memoryview(self.counters.send_errors).cast("B").cast("q")  # no ctypes ints
        if not any(counts):
            return {}
        return {errno.errorcode.get(e, str(e)): n for e, n in enumerate(counts) if n}

    def close(self) -> None:
        """Free the C side (the socket is the caller's); ``counters`` keep their last values."""
        if self.h:
            self.counters = Counters.from_buffer_copy(self.counters)
            self.lib.nsp_free(self.h)
            self.h = None
