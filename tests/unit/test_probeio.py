"""The agent's compiled datagram path and loop (agents/native/probeio.c through
agents.probeio) on real loopback sockets with real kernel timestamps, no root: the probes it
sends decode with ``agents.probe.decode`` (the documented wire format) and carry the kernel TX
stamps of the previous pair; every round sends a pair to each active peer and to no other, in
a random order, in sends spread over the round; the records it emits have the right peer,
pair, index and stamps and are packed for reports peer by peer as the wire contract says; its
validation counts exactly what ``ProbeFilter`` counts, reason by reason."""
import socket
import time
from dataclasses import replace

import numpy as np
import pytest

from agents.agent import SO_TIMESTAMPING, TS_FLAGS, RecordBuffer
from agents.probe import AUTH, FOLLOWUP, REASONS, Probe, ProbeFilter, decode, encode, node_id
from agents.probeio import ProbeIO, Record
from contracts.messages import RECORD

A, B, C = "127.0.0.1", "127.0.0.2", "127.0.0.3"
KEY = bytes.fromhex("5eed" * 8)
NEXT_BURST_S = 0.08  # at 20 bursts/s the next one is due within 1.5 / 20 s


def probe_socket(ip: str, port: int = 0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TS_FLAGS)
    s.bind((ip, port))
    s.setblocking(False)
    return s


@pytest.fixture(autouse=True, scope="module")
def rx_stamps_on():
    """Keeps a timestamping socket open and waits until loopback datagrams carry kernel RX
    stamps: the first socket asking for them switches the kernel's stamping on from a work
    item (``net_enable_timestamp``), so on an otherwise quiet machine a datagram that arrives
    first gets none (the agent then counts ``rx_user_stamps``; these tests assert zero)."""
    s = probe_socket(A)
    deadline = time.monotonic() + 5.0
    try:
        while time.monotonic() < deadline:
            s.sendto(b"warm-up", s.getsockname())
            time.sleep(0.01)
            if s.recvmsg(64, 512)[1]:
                break
        else:
            pytest.fail("the kernel gave no RX stamp on loopback within 5 s")
        yield
    finally:
        s.close()


def kernel_rx(sock: socket.socket) -> list[tuple[bytes, int]]:
    """Every datagram waiting on ``sock`` with its kernel RX stamp (ns)."""
    out = []
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            data, anc, _, _ = sock.recvmsg(2048, 512)
        except BlockingIOError:
            if out:
                return out
            time.sleep(0.01)
            continue
        sec, nsec = int.from_bytes(anc[0][2][:8], "little"), int.from_bytes(anc[0][2][8:16],
                                                                          "little")
        out.append((data, sec * 1_000_000_000 + nsec))
    return out


@pytest.mark.parametrize("key", [None, KEY], ids=["plain", "hmac"])
def test_sent_pairs_decode_and_carry_kernel_tx_stamps(key):
    a = probe_socket(A)
    port = a.getsockname()[1]
    c = probe_socket(C, port)
    io = ProbeIO(a, node_id("a"), [(node_id("c"), C)], port, 100, key, seq=5000,
                 pair_seq=0xFFFFFFFF, rate=20.0, per_send=0, seed=1, convert=None)
    try:
        io.active([0])
        t0 = time.time_ns()
        io.run(0)  # one wake-up: the first burst
        first = kernel_rx(c)
        time.sleep(NEXT_BURST_S)
        io.run(0)  # reads the TX stamps of the first pair, sends the second
        second = kernel_rx(c)
        probes = [decode(d, key) for d, _ in first + second]
        assert [len(d) for d, _ in first + second] == [100] * 4
        assert [p.seq for p in probes] == [5000, 5001, 5002, 5003]
        assert [p.pair_id for p in probes] == [0xFFFFFFFF, 0xFFFFFFFF, 0, 0]  # wraps
        assert [p.idx for p in probes] == [0, 1, 0, 1]
        assert all(p.src == node_id("a") and p.dst == node_id("c") for p in probes)
        assert all(bool(p.flags & AUTH) == bool(key) for p in probes)
        assert [p.flags & FOLLOWUP for p in probes] == [0, 0, FOLLOWUP, FOLLOWUP]
        for p in probes[2:]:  # the follow-up: the kernel TX stamps of the first pair
            assert p.fu_pair_id == 0xFFFFFFFF
            assert t0 <= p.fu_tx0_ns <= p.fu_tx1_ns
            assert p.fu_tx0_ns <= first[0][1] and p.fu_tx1_ns <= first[1][1]
            assert first[1][1] - p.fu_tx1_ns < 50_000_000
        assert io.counters.probes_tx == 4 and io.counters.tx_user_stamps == 0
    finally:
        io.close()
        a.close()
        c.close()


def test_records_round_trip_between_two_agents():
    a, b = probe_socket(A), probe_socket(B)
    port = a.getsockname()[1]
    b.close()
    b = probe_socket(B, port)
    shift = 10**9  # B's VM clock: the machine's + 1 s (through the conversion callback)
    ia = ProbeIO(a, node_id("a"), [(node_id("x"), C), (node_id("b"), B)], port, 56, None,
                 seq=1, pair_seq=7, rate=20.0, per_send=0, seed=2, convert=None)
    ib = ProbeIO(b, node_id("b"), [(node_id("a"), A)], port, 56, None, seq=1, pair_seq=0,
                 rate=20.0, per_send=0, seed=3, convert=lambda ns: ns + shift)
    try:
        ia.active([1])
        records = []
        t0 = time.time_ns()
        for _ in range(3):  # pairs 7, 8, 9 from a to b: 7 and 8 are completed
            ia.run(0)
            time.sleep(NEXT_BURST_S)
            got, heard = ib.run(0)
            records += Record.iter_unpack(got)
            assert heard == [0]
        assert [r[:3] for r in records] == [(0, 7, 0), (0, 7, 1), (0, 8, 0), (0, 8, 1)]
        for _, _, _, _, tx, rx in records:
            assert t0 <= tx < rx - shift <= time.time_ns()
            assert rx - shift - tx < 50_000_000  # loopback: kernel stamps us apart
        assert ib.counters.probes_rx == 6 and ib.counters.rx_user_stamps == 0
        assert ia.counters.probes_rx == 0 and ib.rejects() == {}
    finally:
        ia.close()
        ib.close()
        a.close()
        b.close()


def run_rounds(per_send: int, seed: int) -> tuple[list[list[tuple[bytes, int]]], int]:
    """2 s of rounds at 20/s to three active peers of four (``per_send`` pairs per send):
    what each peer received, with its kernel RX stamps, and the rounds."""
    a = probe_socket(A)
    port = a.getsockname()[1]
    ips = ["127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"]
    socks = [probe_socket(ip, port) for ip in ips]
    io = ProbeIO(a, node_id("a"), [(node_id(f"p{k}"), ip) for k, ip in enumerate(ips)], port,
                 56, None, seq=0, pair_seq=0, rate=20.0, per_send=per_send, seed=seed,
                 convert=None)
    try:
        with pytest.raises(ValueError):
            io.active([0, 0])
        with pytest.raises(ValueError):
            io.active([4])
        io.active([0, 1, 2])
        start = time.monotonic()
        io.run(2.0)
        assert time.monotonic() - start >= 2.0
        got = [kernel_rx(s) for s in socks[:3]]
        with pytest.raises(BlockingIOError):  # the inactive peer got nothing
            socks[3].recv(2048)
        seqs = [[decode(d, None).seq for d, _ in g] for g in got]
        rounds = min(len(s) for s in seqs) // 2  # the last may have ended part-sent
        assert all(2 * rounds <= len(s) <= 2 * rounds + 2 for s in seqs) and 20 <= rounds <= 81
        assert sorted(sum(seqs, [])) == list(range(sum(map(len, seqs))))  # a pair each a round
        return got, rounds
    finally:
        io.close()
        a.close()
        for s in socks:
            s.close()


def test_rounds_reach_every_active_peer_in_random_order():
    """Each active peer gets one pair per round (as many pairs as there were rounds, 40 on
    average), the inactive one none, and each active peer is first in some rounds (a fixed
    order would queue the same peer last every time); with ``per_send`` 0 a round leaves at
    once (its pairs within a millisecond)."""
    got, rounds = run_rounds(0, 6)
    seqs = [[decode(d, None).seq for d, _ in g] for g in got]
    firsts = {min(range(3), key=lambda k: seqs[k][2 * b]) for b in range(rounds)}
    assert firsts == {0, 1, 2}
    spans = [max(g[2 * b][1] for g in got) - min(g[2 * b][1] for g in got)
             for b in range(rounds)]
    assert np.median(spans) < 1e6, spans


def test_a_round_leaves_in_sends_spread_over_it():
    """``per_send`` 1: a round of three pairs leaves in three sends a third of the round
    apart (1/(3 x 20) s on average, at least half of it with the jitter), so no two pairs
    leave together: the agent's own queue holds one pair at a time."""
    got, _ = run_rounds(1, 6)
    starts = np.sort([t for g in got for t in (t for _, t in g[0::2])])
    gaps_ms = np.diff(starts) / 1e6
    assert np.percentile(gaps_ms, 5) > 5.0, np.sort(gaps_ms)[:10]
    assert 12.0 < np.median(gaps_ms) < 22.0, np.median(gaps_ms)


def test_pack_groups_records_by_peer_as_the_wire_record():
    sock = probe_socket(A)
    io = ProbeIO(sock, node_id("me"), [(node_id(f"p{k}"), f"127.0.0.{20 + k}") for k in range(3)],
                 7701, 56, None, seq=0, pair_seq=0, rate=20.0, per_send=0, seed=7, convert=None)
    try:
        recs = [(2, 10, 0, 0, -5, 7), (0, 0xFFFFFFFF, 1, 0, 2**62, 3), (2, 12, 1, 0, 8, 9)]
        counts, packed = io.pack(b"".join(Record.pack(*r) for r in recs))
        assert counts == [1, 0, 2]
        assert list(RECORD.iter_unpack(packed)) == [(0xFFFFFFFF, 1, 2**62, 3), (10, 0, -5, 7),
                                                    (12, 1, 8, 9)]
        assert io.pack(b"") == ([0, 0, 0], b"")
        with pytest.raises(ValueError):
            io.pack(Record.pack(3, 1, 0, 0, 1, 2))  # no peer 3
        with pytest.raises(ValueError):
            io.pack(bytes(Record.size - 1))
    finally:
        io.close()
        sock.close()


def test_record_buffer_keeps_the_newest_and_counts_the_dropped():
    buf = RecordBuffer(5)
    recs = [Record.pack(0, k, 0, 0, k, k) for k in range(8)]
    for chunk in (recs[:3], recs[3:4], [], recs[4:]):
        buf.add(b"".join(chunk))
    assert len(buf) == 5 and buf.dropped == 3
    assert buf.take() == b"".join(recs[3:])
    assert len(buf) == 0 and buf.take() == b""


def test_validation_counts_what_probefilter_counts():
    sock = probe_socket(A)
    peers = {"p1": B, "p2": C}
    flt = ProbeFilter("me", peers, KEY)
    io = ProbeIO(sock, node_id("me"), [(node_id(n), ip) for n, ip in peers.items()], 7701, 72,
                 KEY, seq=0, pair_seq=0, rate=20.0, per_send=0, seed=4, convert=None)

    def probe(seq, src="p1", dst="me", idx=0, key=KEY, size=72):
        return encode(Probe(node_id(src), node_id(dst), seq, 3, idx, 5), key, size)

    good = probe(1000)
    tampered = bytearray(good)
    tampered[30] ^= 1
    bad_version = bytearray(good)
    bad_version[2] = 2
    cases = [(good, B), (good, B), (probe(999), B), (probe(1000 - 256), B), (probe(1001), C),
             (probe(1002, src="zz"), B), (probe(1003, dst="p2"), B), (probe(1004, idx=2), B),
             (probe(1005, key=None), B), (bytes(tampered), B), (bytes(bad_version), B),
             (b"NS" + bytes(60), B), (good[:40], B), (b"\x00" * 72, B), (probe(1006), B),
             (probe(1005, src="p2"), C), (probe(990), B)]
    try:
        for data, ip in cases:
            want = flt.check(data, ip)
            got = io.check(data, ip)
            assert (got == -1) == (want is None), (data, ip)
            if want is not None:
                assert list(peers)[got] == want[0]
        assert io.rejects() == dict(flt.rejects)
        assert set(io.rejects()) == set(REASONS) - {"unexpected_auth"}
        assert io.counters.probes_rx == flt.accepted
        noauth = ProbeIO(sock, node_id("me"), [(node_id("p1"), B)], 7701, 56, None, seq=0,
                         pair_seq=0, rate=20.0, per_send=0, seed=5, convert=None)
        assert noauth.check(good, B) == -1 and noauth.rejects() == {"unexpected_auth": 1}
        noauth.close()
    finally:
        io.close()
        sock.close()


def test_an_agent_that_cannot_build_its_datagram_path_names_the_package(tmp_path, monkeypatch):
    from agents import native, probeio
    from agents.agent import Agent, AgentConfig

    monkeypatch.setattr(probeio, "_lib", None)
    monkeypatch.setenv("NSLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "PROBEIO", replace(native.PROBEIO, compiler="nslab-no-cc"))
    cfg = AgentConfig(name="vm1", bind=A, peers={"vm2": B}, coordinator=(A, 9), port=0)
    with pytest.raises(probeio.ProbeIOError, match="compiler nslab-no-cc, which is not in PATH"):
        Agent(cfg)


def test_an_agent_bursts_at_its_start_then_probes_at_its_rate():
    import threading

    from agents.agent import Agent, AgentConfig

    b = probe_socket(B)
    port = b.getsockname()[1]
    cfg = AgentConfig(name="vm1", bind=A, peers={"vm2": B}, coordinator=(A, 9), port=port,
                      rate=10.0, burst_rate=200.0, burst_s=0.3, report_s=0.1)
    agent, stop = Agent(cfg), threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,))
    try:
        loop.start()
        time.sleep(0.9)
        stop.set()
        loop.join(5.0)
        # 0.3 s at 200 pairs/s, then 0.6 s at 10: 66 pairs (all at 200: 180; none: 9)
        assert 2 * 50 <= agent.io.counters.probes_tx <= 2 * 80, agent.io.counters.probes_tx
    finally:
        stop.set()
        b.close()
