"""TCP sensing at the VM: what the kernel knows about this VM's connections, per connection and
per destination, plus the VM-wide TCP counters.

Sources (a VM's own view, nothing of the lab):

* ``sock_diag`` (``NETLINK_SOCK_DIAG``, ``INET_DIAG_INFO``: ``struct tcp_info``, linux
  ``include/uapi/linux/tcp.h``) through pyroute2's ``DiagSocket``, for every established IPv4
  TCP socket of the VM's namespace: retransmitted segments, lost and in-flight packets,
  reordering seen, smoothed and minimum RTT, delivery rate, cwnd, congestion control.
* ``/proc/net/snmp`` and ``/proc/net/netstat`` (per network namespace; what ``nstat`` reads):
  ``Tcp: RetransSegs``, ``TcpExt: TCPTimeouts`` (RTOs), ``TCPLostRetransmit``,
  ``TCPSACKReorder``: counters that survive closed connections.

Units: times us (as tcp_info gives them), rates bit/s, counts packets or segments.
"""
from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping

from contracts.tcp import DestStats, NetCounters, TcpConn

__all__ = ["DestStats", "NetCounters", "TcpConn", "by_destination", "conn_from_info",
           "netstat", "parse_netstat", "sense"]

_ESTABLISHED = 1 << 1          # 1 << TCP_ESTABLISHED
_EXT_INFO, _EXT_CONG = 1 << 1, 1 << 3  # 1 << (INET_DIAG_INFO - 1), 1 << (INET_DIAG_CONG - 1)


def conn_from_info(msg: Mapping, info: Mapping, cc: str | None = None) -> TcpConn:
    """A ``TcpConn`` from a sock_diag message's header fields (``idiag_src``, ...) and its
    ``tcp_info`` (``tcpi_*`` keys).

    Raises:
        KeyError: a field missing (a kernel older than 4.19 lacks ``tcpi_bytes_sent``).
    """
    return TcpConn(
        src=msg["idiag_src"], sport=msg["idiag_sport"], dst=msg["idiag_dst"],
        dport=msg["idiag_dport"], cc=cc, total_retrans=info["tcpi_total_retrans"],
        lost=info["tcpi_lost"], unacked=info["tcpi_unacked"],
        reord_seen=info["tcpi_reord_seen"], rtt_us=info["tcpi_rtt"],
        min_rtt_us=info["tcpi_min_rtt"], rto_us=info["tcpi_rto"], backoff=info["tcpi_backoff"],
        cwnd=info["tcpi_snd_cwnd"], delivery_rate_bit_s=info["tcpi_delivery_rate"] * 8,
        bytes_sent=info["tcpi_bytes_sent"], bytes_acked=info["tcpi_bytes_acked"],
        bytes_retrans=info["tcpi_bytes_retrans"])


def sense(diag) -> list[TcpConn]:
    """Every established IPv4 TCP connection of this namespace.

    Args:
        diag: a bound ``pyroute2.DiagSocket``.
    """
    out = []
    for m in diag.get_sock_stats(family=socket.AF_INET, states=_ESTABLISHED,
                                 extensions=_EXT_INFO | _EXT_CONG):
        info = m.get_attr("INET_DIAG_INFO")
        if info is not None:
            out.append(conn_from_info(m, info, m.get_attr("INET_DIAG_CONG")))
    return out


def by_destination(conns: Iterable[TcpConn], exclude_ports: set[int] = frozenset()) -> \
        dict[str, DestStats]:
    """Connections grouped by destination address (connections whose either port is in
    ``exclude_ports`` left out, e.g. the coordinator's)."""
    groups: dict[str, list[TcpConn]] = {}
    for c in conns:
        if c.sport in exclude_ports or c.dport in exclude_ports:
            continue
        groups.setdefault(c.dst, []).append(c)
    return {dst: DestStats(
        conns=len(cs), total_retrans=sum(c.total_retrans for c in cs),
        lost=sum(c.lost for c in cs), unacked=sum(c.unacked for c in cs),
        reord_seen=sum(c.reord_seen for c in cs), rtt_us_max=max(c.rtt_us for c in cs),
        min_rtt_us=min(c.min_rtt_us for c in cs), in_rto=sum(c.backoff > 0 for c in cs),
        delivery_rate_bit_s=sum(c.delivery_rate_bit_s for c in cs),
        bytes_acked=sum(c.bytes_acked for c in cs)) for dst, cs in sorted(groups.items())}


def parse_netstat(*texts: str) -> dict[str, dict[str, int]]:
    """``/proc/net/snmp``-style text (pairs of header and value lines) as
    ``{"Tcp": {"RetransSegs": n, ...}, "TcpExt": {...}}``.

    Raises:
        ValueError: a header line without its value line, or counts that do not match.
    """
    out: dict[str, dict[str, int]] = {}
    for text in texts:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) % 2:
            raise ValueError("header line without its value line")
        for head, vals in zip(lines[::2], lines[1::2], strict=True):
            name, _, keys = head.partition(":")
            vname, _, values = vals.partition(":")
            k, v = keys.split(), values.split()
            if name != vname or len(k) != len(v):
                raise ValueError(f"section {name!r}: {len(k)} names for {len(v)} values")
            out[name] = {key: int(val) for key, val in zip(k, v, strict=True)}
    return out


def netstat() -> NetCounters:
    """This namespace's TCP counters (``/proc/net/snmp`` and ``/proc/net/netstat``)."""
    with open("/proc/net/snmp") as a, open("/proc/net/netstat") as b:
        t = parse_netstat(a.read(), b.read())
    ext = t.get("TcpExt", {})
    return NetCounters(retrans_segs=t["Tcp"]["RetransSegs"], timeouts=ext.get("TCPTimeouts", 0),
                       lost_retransmit=ext.get("TCPLostRetransmit", 0),
                       sack_reorder=ext.get("TCPSACKReorder", 0))
