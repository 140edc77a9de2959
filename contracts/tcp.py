"""TCP state as a VM's kernel reports it: one connection (``struct tcp_info`` through
``sock_diag``), connections summed per destination, and the VM-wide counters ``nstat`` reads
(``/proc/net/snmp``, ``/proc/net/netstat``). Produced by ``agents.tcpsense``, carried in the
pacers' reports (``contracts.messages.PacerReport``).

Units: times us (as tcp_info gives them), rates bit/s, counts packets or segments.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    """Attribute docstrings are the JSON Schema's descriptions (the results and API docs)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class TcpConn(_Model):
    """One established TCP connection (``struct tcp_info`` fields, renamed)."""

    src: str
    sport: int
    """Local port."""
    dst: str
    dport: int
    """Remote port."""
    cc: str | None = None
    """Congestion control (``INET_DIAG_CONG``)."""
    total_retrans: int
    """Segments retransmitted over the connection's life."""
    lost: int
    """Packets currently considered lost."""
    unacked: int
    """Packets in flight."""
    reord_seen: int
    """Reordering events seen."""
    rtt_us: int
    """Smoothed RTT, us."""
    min_rtt_us: int
    """Minimum RTT seen, us."""
    rto_us: int
    """Current retransmission timeout, us."""
    backoff: int
    """Consecutive RTO backoffs now (> 0: in timeout recovery)."""
    cwnd: int
    """Congestion window, segments."""
    delivery_rate_bit_s: int
    """Most recent delivery rate sample, bit/s."""
    bytes_sent: int
    """Bytes sent, retransmissions included."""
    bytes_acked: int
    """Bytes acknowledged."""
    bytes_retrans: int
    """Bytes retransmitted."""


class DestStats(_Model):
    """Connections toward one destination address, summed (counts) or worst (times)."""

    conns: int
    """Established connections."""
    total_retrans: int
    """Segments retransmitted, summed."""
    lost: int
    """Packets considered lost now, summed."""
    unacked: int
    """Packets in flight, summed."""
    reord_seen: int
    """Reordering events, summed."""
    rtt_us_max: int
    """Largest smoothed RTT, us."""
    min_rtt_us: int
    """Smallest minimum RTT, us."""
    in_rto: int
    """Connections in RTO backoff now."""
    delivery_rate_bit_s: int
    """Delivery rates summed, bit/s."""
    bytes_acked: int
    """Bytes acknowledged, summed."""


class NetCounters(_Model):
    """VM-wide TCP counters since the namespace was made (``nstat`` names)."""

    retrans_segs: int
    """Segments retransmitted (``RetransSegs``)."""
    timeouts: int
    """Retransmission timeouts (``TcpExtTCPTimeouts``)."""
    lost_retransmit: int
    """Retransmissions lost again (``TcpExtTCPLostRetransmit``)."""
    sack_reorder: int
    """Reordering detected by SACK (``TcpExtTCPSACKReorder``)."""

    def since(self, base: NetCounters) -> NetCounters:
        """The counts between ``base`` and these."""
        return NetCounters(**{k: getattr(self, k) - getattr(base, k)
                              for k in NetCounters.model_fields})
