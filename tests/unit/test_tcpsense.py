"""TCP sensing parsers on captured kernel output (agents.tcpsense): a tcp_info of a loopback
connection that had sent 100000 bytes, and /proc/net/snmp and /proc/net/netstat."""
import json
import socket
from pathlib import Path

import pytest

from agents.tcpsense import (
    NetCounters,
    TcpConn,
    by_destination,
    conn_from_info,
    parse_netstat,
    sense,
)

DATA = Path(__file__).parent / "data"


def captured() -> TcpConn:
    doc = json.loads((DATA / "tcp_info.json").read_text())
    return conn_from_info(doc["msg"], doc["info"], doc["cc"])


def test_tcp_info_maps_to_a_connection():
    c = captured()
    assert c.dst == "127.0.0.1" and c.bytes_sent == 100_000 and c.cc == "bbr"
    assert 0 < c.bytes_acked <= c.bytes_sent and c.total_retrans == 0 and c.bytes_retrans == 0
    assert 0 < c.min_rtt_us <= c.rtt_us and c.rto_us >= 200_000 and c.backoff == 0
    assert c.delivery_rate_bit_s % 8 == 0 and c.delivery_rate_bit_s > 0  # bytes/s x 8


def test_missing_field_is_a_key_error():
    doc = json.loads((DATA / "tcp_info.json").read_text())
    del doc["info"]["tcpi_bytes_sent"]
    with pytest.raises(KeyError):
        conn_from_info(doc["msg"], doc["info"])


def test_by_destination_sums_and_excludes_ports():
    c = captured()
    a = c.model_copy(update={"dst": "10.0.0.2", "total_retrans": 3, "unacked": 2,
                             "rtt_us": 900, "backoff": 1})
    b = c.model_copy(update={"dst": "10.0.0.2", "total_retrans": 4, "unacked": 0,
                             "rtt_us": 300})
    coord = c.model_copy(update={"dst": "10.0.0.3", "dport": 7700})
    out = by_destination([a, b, coord], exclude_ports={7700})
    assert list(out) == ["10.0.0.2"]
    s = out["10.0.0.2"]
    assert (s.conns, s.total_retrans, s.unacked, s.rtt_us_max, s.in_rto) == (2, 7, 2, 900, 1)


def test_proc_counters_parse_and_subtract():
    t = parse_netstat((DATA / "proc_net_snmp.txt").read_text(),
                      (DATA / "proc_net_netstat.txt").read_text())
    assert t["Tcp"]["RetransSegs"] == 62 and t["TcpExt"]["TCPTimeouts"] == 3
    a = NetCounters(retrans_segs=62, timeouts=3, lost_retransmit=0, sack_reorder=0)
    b = NetCounters(retrans_segs=70, timeouts=5, lost_retransmit=1, sack_reorder=0)
    assert b.since(a) == NetCounters(retrans_segs=8, timeouts=2, lost_retransmit=1,
                                     sack_reorder=0)


def test_malformed_proc_text_is_refused():
    with pytest.raises(ValueError, match="header line"):
        parse_netstat("Tcp: A B\nTcp: 1 2\nIp: X\n")
    with pytest.raises(ValueError, match="2 names for 1 values"):
        parse_netstat("Tcp: A B\nTcp: 1\n")


def test_sense_sees_a_live_loopback_connection():
    from pyroute2 import DiagSocket
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    cl = socket.create_connection(srv.getsockname())
    peer, _ = srv.accept()
    try:
        cl.sendall(b"y" * 50_000)
        peer.recv(50_000, socket.MSG_WAITALL)
        with DiagSocket() as ds:
            ds.bind()
            mine = [c for c in sense(ds) if c.sport == cl.getsockname()[1]]
        assert len(mine) == 1 and mine[0].bytes_sent == 50_000
    finally:
        for s in (cl, peer, srv):
            s.close()
