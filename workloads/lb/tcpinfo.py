"""``TCP_INFO`` of one socket (``getsockopt``, tcp(7)): the fields a host-side load balancer
reads, without sock_diag or root.

Offsets are those of ``struct tcp_info`` in ``include/uapi/linux/tcp.h``; a field the running
kernel does not fill (its struct is shorter) reads as None.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

TCP_CA_LOSS = 4
"""``tcpi_ca_state`` after a retransmission timeout (``TCP_CA_Loss``)."""
_FIELDS = {  # name: (offset, struct format)
    "ca_state": (1, "B"), "backoff": (4, "B"), "rtt_us": (68, "I"), "total_retrans": (100, "I"),
    "bytes_acked": (120, "Q"), "min_rtt_us": (148, "I"), "reord_seen": (220, "I"),
    "total_rto": (240, "H"),
}
_SIZE = 256


@dataclass(frozen=True)
class TcpInfo:
    """The fields read (units: us, segments, bytes, events).

    Attributes:
        ca_state: congestion-avoidance state (``TCP_CA_LOSS``: in timeout recovery).
        backoff: RTO backoffs now (> 0: a retransmission timeout fired and is not over).
        rtt_us: smoothed RTT; min_rtt_us: the least RTT seen.
        total_retrans: segments retransmitted over the connection's life.
        bytes_acked: bytes the peer acknowledged.
        reord_seen: reordering events the sender saw (since 4.19).
        total_rto: retransmission timeouts over the life (since 6.7).
    """

    ca_state: int
    backoff: int
    rtt_us: int
    total_retrans: int
    bytes_acked: int | None
    min_rtt_us: int | None
    reord_seen: int | None
    total_rto: int | None

    @property
    def in_timeout(self) -> bool:
        """A retransmission timeout fired and recovery is not over."""
        return self.backoff > 0 or self.ca_state == TCP_CA_LOSS


def parse(raw: bytes) -> TcpInfo:
    """``TcpInfo`` from the bytes ``getsockopt(TCP_INFO)`` returned."""
    out = {}
    for name, (off, fmt) in _FIELDS.items():
        end = off + struct.calcsize(fmt)
        out[name] = struct.unpack_from(fmt, raw, off)[0] if len(raw) >= end else None
    return TcpInfo(**out)


def read(sock: socket.socket) -> TcpInfo:
    """The socket's ``TCP_INFO`` now.

    Raises:
        OSError: not a TCP socket, or closed.
    """
    return parse(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _SIZE))
