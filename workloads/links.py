"""The collective mesh's wire format and per-connection state (``workloads.transport``):
the 20-byte hello, the 16-byte frame header (``!IQI``), addresses, path hints, and one TCP
connection's receive/send progress (``Link``).

Sources: ``socket(7)``, ``tcp(7)``, ``ip(7)`` (``IP_TOS``).
"""
from __future__ import annotations

import hashlib
import socket
import struct
from collections import deque
from dataclasses import dataclass

import numpy as np

from workloads.lb.balancer import FRAME_BYTES

HELLO = struct.Struct("!4sBBHHH8s")
MAGIC = b"NSLB"
VERSION = 1
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
FRAME = struct.Struct("!IQI")  # message sequence number, offset, length
RETRY_S = 0.05
LOST_ERRNOS = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def parse_address(text: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6addr]:port"`` -> ``(host, port)``.

    Raises:
        ValueError: no port, or a port outside 0..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"address {text!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"address {text!r}: port {port!r} is not a number") from None
    if not 0 <= p <= 65535:
        raise ValueError(f"address {text!r}: port {p} is outside 0..65535")
    return host, p


def format_address(host: str, port: int) -> str:
    """Inverse of ``parse_address`` (brackets IPv6 literals)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def job_key(job_id: str) -> bytes:
    """The 8-byte key of a job name carried in the hello (SHA-256 prefix)."""
    return hashlib.sha256(job_id.encode()).digest()[:8]


@dataclass(frozen=True)
class PathHints:
    """Per-connection hints that make flows steerable (see the module docstring).

    Attributes:
        src_port_base: first local port of the connector side, or None for ephemeral ports.
        dscp: DSCP code points (0..63) cycled over connection indices; empty for no marking.
    """

    src_port_base: int | None = None
    dscp: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for d in self.dscp:
            if not 0 <= d <= 63:
                raise ValueError(f"DSCP {d} is outside 0..63")
        if self.src_port_base is not None and not 1 <= self.src_port_base <= 65535:
            raise ValueError(f"source port base {self.src_port_base} is outside 1..65535")

    def src_port(self, rank: int, peer: int, conn: int, world: int, conns: int) -> int | None:
        """Local port of connection ``conn`` from ``rank`` to ``peer`` (None: ephemeral).

        Raises:
            ValueError: the port would exceed 65535.
        """
        if self.src_port_base is None:
            return None
        port = self.src_port_base + (rank * world + peer) * conns + conn
        if port > 65535:
            raise ValueError(f"source port base {self.src_port_base} too high: rank {rank} "
                             f"-> {peer} connection {conn} would need port {port} > 65535")
        return port

    def tos(self, conn: int) -> int | None:
        """The ``IP_TOS`` byte of connection ``conn`` (DSCP << 2), or None."""
        return self.dscp[conn % len(self.dscp)] << 2 if self.dscp else None


class Frame:
    """A piece of one message on one connection: its 16-byte header (sequence number of the
    message between the two ranks, offset in it, length) and its bytes."""

    __slots__ = ("data", "hdr", "sent", "total")

    def __init__(self, seq: int, offset: int, data: memoryview):
        self.hdr = FRAME.pack(seq, offset, len(data))
        self.data = data
        self.sent = 0
        self.total = FRAME.size + len(data)


class Msg:
    """A posted receive: where its bytes go and how many are still missing."""

    __slots__ = ("left", "view")

    def __init__(self, view: memoryview):
        self.view = view
        self.left = len(view)


class Link:
    """One established TCP connection: frames queued to send, the frame being received, and
    what the balancer tracks (stream position written, frames not yet acknowledged)."""

    __slots__ = ("conn", "eof", "in_rto", "initiator", "mask", "parked", "peer", "retrans",
                 "rx_hdr", "rx_hlen", "rx_msg", "rx_view", "sendq", "sock", "unacked",
                 "written")

    def __init__(self, sock: socket.socket, peer: int, conn: int, initiator: bool):
        self.sock = sock
        self.peer = peer
        self.conn = conn
        self.initiator = initiator
        self.sendq: deque[Frame] = deque()
        self.mask = 0
        self.rx_hdr = bytearray(FRAME.size)
        self.rx_hlen = 0
        self.rx_view: memoryview | None = None
        self.rx_msg: Msg | None = None
        self.parked = False  # holding the header of a message not posted yet
        self.eof = False  # the peer closed its side (after whole frames)
        self.written = HELLO.size  # stream bytes written: the hello, then frames
        self.unacked: deque[tuple[int, int]] = deque()  # (stream end, retransmits then)
        self.retrans = 0
        self.in_rto = False


def set_cc(sock: socket.socket, cc: str | None) -> None:
    if cc is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())


def set_tos(sock: socket.socket, tos: int | None) -> None:
    if tos is None:
        return
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
    else:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)


def frames(seq: int, view: memoryview, start: int, stop: int) -> list[Frame]:
    """Bytes [start, stop) of message ``seq`` as frames of at most ``FRAME_BYTES``."""
    return [Frame(seq, a, view[a:min(a + FRAME_BYTES, stop)])
            for a in range(start, stop, FRAME_BYTES)]


def byte_view(arr: np.ndarray) -> memoryview:
    if not arr.flags.c_contiguous:
        raise ValueError("transfer buffers must be C-contiguous")
    return memoryview(arr.reshape(-1).view(np.uint8))


def describe(hello) -> str:
    """A peer's hello for an error message: a reason string or (rank, connection)."""
    return hello if isinstance(hello, str) else f"rank {hello[0]} connection {hello[1]}"
