"""The probe wire format (agents.probe): layout, HMAC, replay, and robustness to bad input."""
import random

import pytest
from scapy.layers.inet import IP, UDP
from scapy.packet import bind_layers, fuzz

from agents.probe import (
    AUTH,
    FOLLOWUP,
    HEADER_LEN,
    REASONS,
    TAG_LEN,
    NslabProbe,
    Probe,
    ProbeError,
    ProbeFilter,
    ReplayWindow,
    decode,
    encode,
    node_id,
    parse_key,
)

KEY = bytes.fromhex("00112233445566778899aabbccddeeff")
PEERS = {"vm2": "10.0.0.2", "vm3": "10.0.0.3"}


def probe(seq=1000, src="vm2", dst="vm1", **kw):
    fields = dict(pair_id=77, idx=1, tx_ns=1_795_000_000_123_456_789, flags=FOLLOWUP,
                  fu_pair_id=76, fu_tx0_ns=1_795_000_000_100_000_000,
                  fu_tx1_ns=1_795_000_000_100_015_000)
    fields.update(kw)
    return Probe(node_id(src), node_id(dst), seq, **fields)


@pytest.mark.parametrize("key", [None, KEY])
@pytest.mark.parametrize("size", [0, 64, 200])
def test_round_trip(key, size):
    p = probe()
    data = encode(p, key, size)
    assert len(data) == max(size, HEADER_LEN + (TAG_LEN if key else 0))
    q = decode(data, key)
    assert q == Probe(p.src, p.dst, p.seq, p.pair_id, p.idx, p.tx_ns,
                      p.flags | (AUTH if key else 0), p.fu_pair_id, p.fu_tx0_ns, p.fu_tx1_ns)


def test_scapy_layer_matches_struct_layout():
    p = probe(tx_ns=-5)  # signed field
    raw = encode(p, None, 80)
    built = NslabProbe(src=p.src, dst=p.dst, seq=p.seq, pair_id=p.pair_id, idx=p.idx,
                       tx_ns=p.tx_ns, flags="FOLLOWUP", fu_pair_id=p.fu_pair_id,
                       fu_tx0_ns=p.fu_tx0_ns, fu_tx1_ns=p.fu_tx1_ns,
                       trailer=bytes(80 - HEADER_LEN))
    assert bytes(built) == raw
    # dissecting an authenticated probe: every field, the tag in the trailer
    raw = encode(p, KEY)
    d = NslabProbe(raw)
    assert (d.magic, d.version, int(d.flags)) == (0x4E53, 1, FOLLOWUP | AUTH)
    assert (d.src, d.dst, d.seq, d.pair_id, d.idx) == (p.src, p.dst, p.seq, p.pair_id, p.idx)
    assert (d.tx_ns, d.fu_pair_id, d.fu_tx0_ns, d.fu_tx1_ns) == (
        p.tx_ns, p.fu_pair_id, p.fu_tx0_ns, p.fu_tx1_ns)
    assert len(d.trailer) == TAG_LEN and d.flags.AUTH
    # as a UDP payload in a capture
    bind_layers(UDP, NslabProbe, dport=7701)
    pkt = IP(bytes(IP(src="10.0.0.2", dst="10.0.0.1") / UDP(sport=7701, dport=7701) / raw))
    assert pkt[NslabProbe].seq == p.seq


def test_hmac_rejects_tampering_and_wrong_keys():
    raw = encode(probe(), KEY)
    assert decode(raw, KEY).seq == 1000
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x01
        with pytest.raises(ProbeError) as e:
            decode(bytes(bad), KEY)
        assert e.value.reason in ("bad_magic", "bad_version", "no_auth", "bad_hmac")
    with pytest.raises(ProbeError, match="bad_hmac"):
        decode(raw, bytes(16))
    with pytest.raises(ProbeError, match="no_auth"):
        decode(encode(probe(), None), KEY)
    with pytest.raises(ProbeError, match="unexpected_auth"):
        decode(raw, None)
    # a forged tag over a modified field (attacker without the key)
    forged = bytearray(raw)
    forged[20:24] = (999).to_bytes(4, "big")
    with pytest.raises(ProbeError, match="bad_hmac"):
        decode(bytes(forged), KEY)


def test_filter_checks_sender_destination_and_replay():
    f = ProbeFilter("vm1", PEERS, KEY)
    raw = encode(probe(seq=10), KEY)
    assert f.check(raw, "10.0.0.2")[0] == "vm2"
    assert f.check(raw, "10.0.0.2") is None  # the same datagram again
    assert f.rejects["replay"] == 1
    assert f.check(encode(probe(seq=11), KEY), "10.0.0.3") is None  # vm2's id from vm3's IP
    assert f.rejects["src_mismatch"] == 1
    assert f.check(encode(probe(seq=12, dst="vm3"), KEY), "10.0.0.2") is None
    assert f.rejects["wrong_dst"] == 1
    assert f.check(encode(probe(seq=13, src="vm9"), KEY), "10.0.0.2") is None
    assert f.rejects["unknown_sender"] == 1
    # reordering inside the window is fine, once
    assert f.check(encode(probe(seq=30), KEY), "10.0.0.2")
    assert f.check(encode(probe(seq=20), KEY), "10.0.0.2")
    assert f.check(encode(probe(seq=20), KEY), "10.0.0.2") is None
    assert f.accepted == 3 and f.rejects["replay"] == 2
    # senders have separate windows
    assert f.check(encode(probe(seq=10, src="vm3"), KEY), "10.0.0.3")


def test_replay_window():
    w = ReplayWindow(size=64)
    assert w.accept(100) and not w.accept(100)
    assert w.accept(99) and w.accept(37) and not w.accept(36)  # 36 is 64 behind
    assert w.accept(10_000) and not w.accept(100)
    assert w.accept(9_999) and not w.accept(9_999)
    assert w.accept(2**63) and not w.accept(2**63 - 64) and w.accept(2**63 - 63)


def test_truncated_garbage_and_bad_fields_are_counted():
    f = ProbeFilter("vm1", PEERS, KEY)
    raw = encode(probe(seq=5), KEY)
    n = 0
    for cut in range(len(raw)):  # every truncation
        assert f.check(raw[:cut], "10.0.0.2") is None
        n += 1
    rng = random.Random(7)
    for _ in range(300):  # random bytes of random lengths
        assert f.check(rng.randbytes(rng.randrange(0, 200)), "10.0.0.2") is None
        n += 1
    assert f.check(encode(probe(seq=6, idx=2), KEY), "10.0.0.2") is None
    assert f.rejects["bad_field"] == 1
    assert sum(f.rejects.values()) == n + 1 and f.accepted == 0
    assert set(f.rejects) <= set(REASONS)
    assert f.check(raw, "10.0.0.2")  # still works


def test_scapy_fuzz_never_raises():
    f_auth = ProbeFilter("vm1", PEERS, KEY)
    f_open = ProbeFilter("vm1", PEERS, None)
    tmpl = fuzz(NslabProbe(src=node_id("vm2"), dst=node_id("vm1")))
    for _ in range(400):
        data = bytes(tmpl)
        f_auth.check(data, "10.0.0.2")
        f_open.check(data, "10.0.0.2")
    assert f_auth.accepted == 0  # nothing forged passes the HMAC
    assert sum(f_auth.rejects.values()) == 400
    assert sum(f_open.rejects.values()) + f_open.accepted == 400
    assert set(f_open.rejects) <= set(REASONS)


def test_ids_and_keys():
    assert node_id("vm1") == node_id("vm1") != node_id("vm2")
    assert 0 <= node_id("x" * 100) < 2**32
    assert parse_key(None) is None and parse_key("") is None
    assert parse_key("00" * 16) == bytes(16)
    with pytest.raises(ValueError, match="hexadecimal"):
        parse_key("zz" * 8)
    with pytest.raises(ValueError, match="at least 8"):
        parse_key("abcd")
    with pytest.raises(ValueError, match="exceeds"):
        encode(probe(), None, 2000)
