"""The probe packet (UDP payload), version 1: encode, decode, validate. Layout in ``PROBE.md``.

A probe is 56 bytes of header, optional zero padding, and, when a shared key is configured, a
16-byte truncated HMAC-SHA256 tag over everything before it. All integers are big-endian::

    off size field        meaning
      0   2  magic        0x4E53 ("NS")
      2   1  version      1
      3   1  flags        bit0 AUTH (tag present), bit1 FOLLOWUP (fu_* valid),
                          bit2 FU_USER (fu_* are user-space stamps: the kernel gave none)
      4   4  src          sender id (``node_id(name)``)
      8   4  dst          receiver id
     12   8  seq          sender's packet sequence (replay protection), +1 per probe
     20   4  pair_id      coded pair this probe belongs to
     24   1  idx          0 or 1: position in the pair
     25   3  reserved     0 (ignored on receipt)
     28   8  tx_ns        sender's user-space VM clock just before sending (informational)
     36   4  fu_pair_id   follow-up: the previous pair sent to this receiver ...
     40   8  fu_tx0_ns    ... and the kernel TX timestamps (VM clock, ns) of its two probes
     48   8  fu_tx1_ns
     56   .  padding      zeros up to the configured probe size
    end-16 16 tag         HMAC-SHA256(key, bytes[0:end-16])[:16], when AUTH

The hot path uses ``struct``; ``NslabProbe`` is the same layout as a scapy layer for tests,
captures and fuzzing (built on first use: the agent never loads scapy). ``ProbeFilter``
validates received datagrams in a fixed order (length, magic, version, authentication,
fields, sender, destination, replay) and counts each reject by its reason; it never raises
on bad input.

Sources: HMAC, RFC 2104; truncated HMAC-SHA256 tags, RFC 4868 (128-bit truncation); the
sliding anti-replay window, RFC 4303 section 3.4.3 (IPsec ESP).
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from collections import Counter
from typing import NamedTuple

__all__ = [  # noqa: F822 - NslabProbe comes from the module's __getattr__
    "AUTH", "FOLLOWUP", "FU_USER", "HEADER", "HEADER_LEN", "MAGIC", "REASONS", "TAG_LEN",
    "VERSION", "NslabProbe", "Probe", "ProbeError", "ProbeFilter", "ReplayWindow", "decode",
    "encode", "length", "node_id", "parse_key", "peer_ids",
]

MAGIC = 0x4E53
VERSION = 1
AUTH, FOLLOWUP, FU_USER = 0x01, 0x02, 0x04
HEADER = struct.Struct("!HBBIIQIB3xqIqq")
HEADER_LEN = HEADER.size  # 56
TAG_LEN = 16
MAX_LEN = 1472  # one Ethernet-MTU UDP payload

REASONS = ("short", "bad_magic", "bad_version", "no_auth", "unexpected_auth", "bad_hmac",
           "bad_field", "unknown_sender", "src_mismatch", "wrong_dst", "replay")
"""Every reject reason ``ProbeFilter`` counts, in the order the checks run."""


class ProbeError(ValueError):
    """A datagram that is not a valid probe; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def node_id(name: str) -> int:
    """The 32-bit id of a VM in probes: the first 4 bytes of SHA-256(name), big-endian."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


def parse_key(text: str | None) -> bytes | None:
    """A shared key given in hex (at least 16 hex digits), or None.

    Raises:
        ValueError: not hex, odd length, or shorter than 8 bytes.
    """
    if text is None or text == "":
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ValueError("--key must be hexadecimal digits (e.g. 32 of them)") from None
    if len(key) < 8:
        raise ValueError(f"--key is {len(key)} bytes; use at least 8 (16 hex digits)")
    return key


class Probe(NamedTuple):
    """One probe's fields (see the module docstring for units and meaning); a named tuple,
    cheap to build on the receive path."""

    src: int
    dst: int
    seq: int
    pair_id: int
    idx: int
    tx_ns: int
    flags: int = 0
    fu_pair_id: int = 0
    fu_tx0_ns: int = 0
    fu_tx1_ns: int = 0


def _tag(key: bytes, data: bytes | memoryview) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()[:TAG_LEN]


def length(key: bytes | None = None, size: int = 0) -> int:
    """A probe's datagram size in bytes: ``size``, at least the header (and tag, with ``key``).

    Raises:
        ValueError: ``size`` above 1472 bytes.
    """
    if size > MAX_LEN:
        raise ValueError(f"probe size {size} exceeds {MAX_LEN} bytes")
    return max(size, HEADER_LEN + (TAG_LEN if key else 0))


def encode(p: Probe, key: bytes | None = None, size: int = 0) -> bytes:
    """The datagram for probe ``p``; the AUTH flag follows ``key`` (p.flags' AUTH bit ignored).

    Args:
        p: the fields.
        key: shared HMAC key, or None for no tag.
        size: total datagram size in bytes; zero padding fills up to it (0: minimal, 56 or 72).

    Raises:
        ValueError: ``size`` above 1472 bytes; struct.error: a field out of range.
    """
    n = length(key, size)
    flags = (p.flags & ~AUTH) | (AUTH if key else 0)
    head = HEADER.pack(MAGIC, VERSION, flags, p.src, p.dst, p.seq, p.pair_id, p.idx, p.tx_ns,
                       p.fu_pair_id, p.fu_tx0_ns, p.fu_tx1_ns)
    head += bytes(n - HEADER_LEN - (TAG_LEN if key else 0))
    return head + _tag(key, head) if key else head


def decode(data: bytes, key: bytes | None = None) -> Probe:
    """Parse and authenticate one datagram (no sender, destination or replay checks).

    Raises:
        ProbeError: with ``reason`` one of ``short``, ``bad_magic``, ``bad_version``,
            ``no_auth`` (a key is configured, the probe has no tag), ``unexpected_auth``
            (a tag but no key configured), ``bad_hmac``, ``bad_field``.
    """
    n = len(data)
    if n < HEADER_LEN:
        raise ProbeError("short", f"{n} bytes < {HEADER_LEN}")
    (magic, version, flags, src, dst, seq, pair_id, idx, tx_ns, fu_pair, fu0,
     fu1) = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise ProbeError("bad_magic", f"0x{magic:04x}")
    if version != VERSION:
        raise ProbeError("bad_version", str(version))
    if key is not None:
        if not flags & AUTH:
            raise ProbeError("no_auth")
        if n < HEADER_LEN + TAG_LEN:
            raise ProbeError("short", f"{n} bytes < {HEADER_LEN + TAG_LEN} with a tag")
        view = memoryview(data)
        if not hmac.compare_digest(_tag(key, view[:n - TAG_LEN]), bytes(view[n - TAG_LEN:])):
            raise ProbeError("bad_hmac")
    elif flags & AUTH:
        raise ProbeError("unexpected_auth")
    if idx > 1:
        raise ProbeError("bad_field", f"idx={idx}")
    return Probe(src, dst, seq, pair_id, idx, tx_ns, flags, fu_pair, fu0, fu1)


class ReplayWindow:
    """Sliding anti-replay window over one sender's sequence numbers (RFC 4303, 3.4.3).

    A sequence is accepted once, and only if it is newer than ``highest - size``.
    """

    __slots__ = ("highest", "mask", "size")

    def __init__(self, size: int = 256):
        self.size = size
        self.highest = -1
        self.mask = 0  # bit i set: highest - i was seen

    def accept(self, seq: int) -> bool:
        """True (and remember ``seq``) when ``seq`` is fresh; False for a replay or a too-old
        sequence."""
        if seq > self.highest:
            shift = seq - self.highest
            self.mask = ((self.mask << shift) | 1) & ((1 << self.size) - 1) \
                if shift < self.size else 1
            self.highest = seq
            return True
        back = self.highest - seq
        if back >= self.size or self.mask >> back & 1:
            return False
        self.mask |= 1 << back
        return True


def peer_ids(me: str, peers: dict[str, str]) -> dict[int, tuple[str, str]]:
    """``{probe id: (name, ip)}`` of ``peers`` (``{name: ip}``) as seen by VM ``me``.

    Raises:
        ValueError: two of these VMs (``me`` included) hash to the same probe id.
    """
    me_id, by_id = node_id(me), {}
    for name, ip in peers.items():
        i = node_id(name)
        if i in by_id or i == me_id:
            raise ValueError(f"VM names {name!r} and {by_id.get(i, (me,))[0]!r} "
                             "hash to the same probe id; rename one")
        by_id[i] = (name, ip)
    return by_id


class ProbeFilter:
    """A receiver's validation of incoming probes; counts rejects by reason, never raises.

    Args:
        me: this VM's name (probes must carry ``node_id(me)`` as ``dst``).
        peers: ``{name: ip}`` of the VMs allowed to probe this one.
        key: shared HMAC key or None.
        window: replay window size per sender (sequences).
    """

    def __init__(self, me: str, peers: dict[str, str], key: bytes | None = None,
                 window: int = 256):
        self.me_id = node_id(me)
        self.key = key
        self.window = window
        self.by_id = peer_ids(me, peers)
        self.replay: dict[int, ReplayWindow] = {}
        self.rejects: Counter[str] = Counter()
        self.accepted = 0

    def check(self, data: bytes, src_ip: str) -> tuple[str, Probe] | None:
        """``(sender name, probe)`` for a valid probe, else None (the reason is counted)."""
        try:
            p = decode(data, self.key)
        except ProbeError as e:
            self.rejects[e.reason] += 1
            return None
        except Exception:  # noqa: BLE001 - defensive: bad input must never kill the agent
            self.rejects["bad_field"] += 1
            return None
        peer = self.by_id.get(p.src)
        if peer is None:
            self.rejects["unknown_sender"] += 1
            return None
        if peer[1] != src_ip:
            self.rejects["src_mismatch"] += 1
            return None
        if p.dst != self.me_id:
            self.rejects["wrong_dst"] += 1
            return None
        win = self.replay.get(p.src)
        if win is None:
            win = self.replay[p.src] = ReplayWindow(self.window)
        if not win.accept(p.seq):
            self.rejects["replay"] += 1
            return None
        self.accepted += 1
        return peer[0], p


def _scapy_layer() -> type:
    """Build the scapy layer (scapy is imported only when a test or a user asks for it: it
    costs an agent ~30 MB and 0.15 s at start-up)."""
    from scapy.fields import (
        ByteField,
        FlagsField,
        IntField,
        LongField,
        SignedLongField,
        StrField,
        X3BytesField,
        XIntField,
        XShortField,
    )
    from scapy.packet import Packet

    class NslabProbe(Packet):
        """Scapy layer of the probe (same layout as ``HEADER``); ``trailer`` holds padding and
        tag. Bind it to a UDP port to dissect captures:
        ``bind_layers(UDP, NslabProbe, dport=7701)``."""

        name = "nslab probe v1"
        fields_desc = [
            XShortField("magic", MAGIC),
            ByteField("version", VERSION),
            FlagsField("flags", 0, 8, ["AUTH", "FOLLOWUP", "FU_USER"]),
            XIntField("src", 0),
            XIntField("dst", 0),
            LongField("seq", 0),
            IntField("pair_id", 0),
            ByteField("idx", 0),
            X3BytesField("reserved", 0),
            SignedLongField("tx_ns", 0),
            IntField("fu_pair_id", 0),
            SignedLongField("fu_tx0_ns", 0),
            SignedLongField("fu_tx1_ns", 0),
            StrField("trailer", b""),
        ]

    NslabProbe.__module__, NslabProbe.__qualname__ = __name__, "NslabProbe"
    return NslabProbe


def __getattr__(name: str):
    """``NslabProbe``, the scapy layer, built on first use (PEP 562)."""
    if name == "NslabProbe":
        cls = globals()["NslabProbe"] = _scapy_layer()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
