"""Holding one destination's traffic on the VM's own egress: an HTB class per destination with
a TBF whose rate is switched through netlink.

Layout on the VM's interface (tc-htb(8), tc-tbf(8), tc-u32(8)):

    root 1: htb default 1
      1:ffff  rate LINE           the vNIC: everything the VM sends, together
        1:1   ceil LINE, prio 0   other traffic, and the pacer's own probes (first served)
        1:N   ceil LINE, prio 1   one per destination (u32 match ip dst A/32 -> 1:N)
          N:  tbf rate LINE       the switch: LINE when open, HELD_BIT_S when held

``hold(dst)`` changes the TBF under ``1:N`` to ``HELD_BIT_S`` with a one-packet burst (TCP's
packets wait in its queue; TCP small queues then stop the sockets: nothing is dropped and no
congestion signal is made); ``release(dst)`` restores ``LINE``. One ``RTM_NEWQDISC`` each, tens
of us in the kernel. Both messages are built once per destination (``messages``: rtnetlink(7),
``struct tcmsg``, ``TCA_TBF_PARMS`` with ``TCA_TBF_BURST``, as tc(8) sends them) and sent as
they are on a raw netlink socket, here or by the pacer's compiled loop (``agents.pacerio``):
pyroute2 took milliseconds per change in Python (it builds the TBF's rate table each time).
A TBF change keeps the queued packets (only the fifo's limit is set) but does not wake
the device: the caller sends a packet on the interface right after ``release`` (the pacer's
next probe to that destination) so the queue leaves at once, not at the TBF's next timer.

Why a TBF under the class and not the class's own rate: HTB charges a class for a packet at the
rate in force when it leaves, and lets its tokens go negative; a class switched to ~0 sends the
packet its positive tokens allowed and is then in debt for that packet's time at ~0 rate, which a
release does not clear (measured: the destination stayed blocked for about a second). Holding at
1/10 of the line avoided the debt but leaked: four held senders still sent 40 % of an incast
bottleneck's rate, so a hold of ``owd - T`` drained only 60 % of the queue (On-Ramp's rule
assumes a stop). TBF sends a packet only when its tokens cover it (never in debt) and a change
resets its tokens to the new burst, so the hold leaks one packet and then
``HELD_BIT_S`` (64 kbit/s, less on slow lines), and a release is immediate. ``plug``
(sch_plug), the qdisc made for stop-and-release, is absent from many kernels (this one included).

Why HTB classes: the kernel here and on most clouds has them (``fq``'s per-flow ``maxrate``
is not available on every kernel, and would need a socket option in every application);
they act on traffic the pacer did not write (iperf3, gloo), per destination, and the switch is
one netlink message. ``LINE`` should be the vNIC's rate (Mbit/s) so that what a release lets
go leaves at that rate, not at the veth's; the buckets are 2 packets (or 1 ms of ``LINE``)
for the same reason (``_BURST``).
"""
from __future__ import annotations

import ipaddress
import socket
import struct
import threading

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

__all__ = ["HELD_BIT_S", "Holder"]

HELD_BIT_S = 64_000
"""A held destination's rate, bit/s, after the one packet its burst lets go (module doc), or a
thousandth of the line if less (four held senders leak 0.4 % of an incast's bottleneck, not
13 % at 2 Mbit/s)."""
_ROOT, _LINE, _DEFAULT = 0x10000, 0x1FFFF, 0x10001
_ONE_PACKET = 1600
_BURST = 2 * _ONE_PACKET
"""The open buckets' least size, bytes (else 1 ms of the line): a held destination's buckets
fill during the hold, and what they hold leaves at the veth's speed on release, not the
vNIC's. With 15 kB (10 packets at 5 Mbit/s), under a 4-sender incast at 5 Mbit/s, the
bottleneck's OWD rose from 0 to 73 ms within 14 ms of a release, more than four senders at
their line rate can add (23 packets, 55 ms): the released bursts alone filled most of the
50-packet queue."""
_MAX_DESTS = 4000
_TBF_LIMIT = 4_000_000
"""Bytes a held destination may queue (TCP small queues keep it far below: nothing is dropped)."""


def _htb(rate_bit_s: int, ceil_bit_s: int, prio: int = 0) -> dict:
    burst = max(_BURST, ceil_bit_s // 8 // 1000)
    return dict(rate=f"{rate_bit_s}bit", ceil=f"{ceil_bit_s}bit", burst=burst, cburst=burst,
                prio=prio, quantum=max(1600, min(200_000, ceil_bit_s // 80)))


def _tbf(rate_bit_s: int, burst: int) -> dict:
    return dict(rate=f"{rate_bit_s}bit", burst=burst, limit=_TBF_LIMIT)


_NLMSG = struct.Struct("=IHHII")         # struct nlmsghdr
_TCMSG = struct.Struct("=BxxxiIII")      # struct tcmsg
_TBF_QOPT = struct.Struct("=BBHhHI12xIII")  # struct tc_tbf_qopt: rate (tc_ratespec), peakrate
_RTM_NEWQDISC, _NLM_F_REQUEST, _NLM_F_ACK = 36, 1, 4
_TCA_KIND, _TCA_OPTIONS = 1, 2
_TCA_TBF_PARMS, _TCA_TBF_RATE64, _TCA_TBF_BURST = 1, 4, 6
_LINKLAYER_ETHERNET = 1


def _attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    head = struct.pack("=HH", 4 + len(payload), kind)
    return head + payload + b"\0" * (-len(payload) % 4)


def tbf_change(index: int, handle: int, parent: int, rate_bit_s: int, burst: int,
               limit: int = _TBF_LIMIT) -> bytes:
    """The ``RTM_NEWQDISC`` message (no create, no replace: ``tc qdisc change``) setting the TBF
    ``handle`` under ``parent`` on interface ``index`` to ``rate_bit_s`` with a ``burst``-byte
    bucket and a ``limit``-byte queue; seq 0 (the sender sets it). The kernel derives the
    bucket's time from ``TCA_TBF_BURST`` (no rate table: linux net/sched/sch_tbf.c)."""
    rate = rate_bit_s // 8
    opts = _attr(_TCA_TBF_PARMS, _TBF_QOPT.pack(0, _LINKLAYER_ETHERNET, 0, -1, 0,
                                                 min(rate, 0xFFFFFFFF), limit, 0, 0))
    if rate > 0xFFFFFFFF:
        opts += _attr(_TCA_TBF_RATE64, struct.pack("=Q", rate))
    body = _TCMSG.pack(0, index, handle, parent, 0) + _attr(_TCA_KIND, b"tbf\0") + \
        _attr(_TCA_OPTIONS, opts + _attr(_TCA_TBF_BURST, struct.pack("=I", burst)))
    return _NLMSG.pack(_NLMSG.size + len(body), _RTM_NEWQDISC, _NLM_F_REQUEST | _NLM_F_ACK,
                       0, 0) + body


class Holder:
    """Per-destination HTB classes on ``ifname`` of this namespace.

    Args:
        ifname: the VM's interface.
        line_mbit: the open rate, Mbit/s (the vNIC's).
        probe_port: UDP destination port of the pacer's OWD probes and echoes, which go by
            the default class (never held: they measure the queues, not join them).

    Raises:
        ValueError: no such interface, or ``line_mbit`` not > 0.
        pyroute2.NetlinkError: the kernel refused the qdisc (no HTB, no permission).
    """

    def __init__(self, ifname: str, line_mbit: float, probe_port: int | None = None):
        if not line_mbit > 0:
            raise ValueError(f"line rate must be > 0 Mbit/s, got {line_mbit}")
        self.ipr = IPRoute()
        idx = self.ipr.link_lookup(ifname=ifname)
        if not idx:
            self.ipr.close()
            raise ValueError(f"no interface {ifname!r} in this namespace")
        self.index, self.ifname = idx[0], ifname
        self.line = int(line_mbit * 1e6)
        self.held_bit_s = max(1_000, min(HELD_BIT_S, self.line // 1000))
        self._open = _tbf(self.line, _htb(self.line, self.line)["burst"])
        self.nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.nl.settimeout(1.0)
        self.classes: dict[str, int] = {}
        self.held: set[str] = set()
        self._lock = threading.Lock()
        self.ipr.tc("replace", "htb", self.index, _ROOT, default=1)
        self.ipr.tc("add-class", "htb", self.index, _LINE, parent=_ROOT,
                    **_htb(self.line, self.line))
        self.ipr.tc("add-class", "htb", self.index, _DEFAULT, parent=_LINE,
                    **_htb(self.line // 10, self.line, prio=0))
        if probe_port is not None:  # IPv4 without options: protocol at 9, UDP dport at 22
            self.ipr.tc("add-filter", "u32", self.index, parent=_ROOT, prio=2, protocol=0x0800,
                        target=_DEFAULT, keys=["0x00110000/0x00ff0000+8",
                                               f"0x{probe_port:08x}/0x0000ffff+20"])

    def _class(self, dst: str) -> int:
        handle = self.classes.get(dst)
        if handle is None:
            if len(self.classes) >= _MAX_DESTS:
                raise ValueError(f"more than {_MAX_DESTS} destinations")
            handle = _ROOT | (len(self.classes) + 2)
            self.ipr.tc("add-class", "htb", self.index, handle, parent=_LINE,
                        **_htb(max(8_000, self.line // 100), self.line, prio=1))
            self.ipr.tc("add", "tbf", self.index, self._leaf(handle), parent=handle,
                        **self._open)
            self.ipr.tc("add-filter", "u32", self.index, parent=_ROOT, prio=2,
                        protocol=0x0800, target=handle,
                        keys=[f"0x{int(ipaddress.IPv4Address(dst)):08x}/0xffffffff+16"])
            self.classes[dst] = handle
        return handle

    @staticmethod
    def _leaf(handle: int) -> int:
        return (handle & 0xFFFF) << 16

    def prepare(self, dst: str) -> None:
        """Make ``dst``'s class (open) ahead of the first hold."""
        with self._lock:
            self._class(dst)

    def messages(self, dst: str) -> tuple[bytes, bytes]:
        """``dst``'s hold and release messages (``tbf_change``), its class made if needed."""
        with self._lock:
            handle = self._class(dst)
        leaf = self._leaf(handle)
        return (tbf_change(self.index, leaf, handle, self.held_bit_s, _ONE_PACKET),
                tbf_change(self.index, leaf, handle, self.line, self._open["burst"]))

    def _switch(self, msg: bytes) -> None:
        self.nl.send(msg)
        ack = self.nl.recv(4096)
        err = struct.unpack_from("=i", ack, _NLMSG.size)[0]
        if err:
            raise NetlinkError(-err)

    def hold(self, dst: str) -> None:
        """Stop ``dst``'s traffic (queued in its class) until ``release``.

        Raises:
            NetlinkError: the kernel refused the change."""
        if dst not in self.held:
            self._switch(self.messages(dst)[0])
            self.held.add(dst)

    def release(self, dst: str) -> None:
        """Let ``dst``'s traffic go at the line rate (send a packet on the interface next: the
        module doc says why)."""
        if dst in self.held:
            self._switch(self.messages(dst)[1])
            self.held.discard(dst)

    def close(self) -> None:
        """Remove the qdisc (the interface is as the pacer found it) and the netlink socket."""
        with self._lock:
            try:
                self.ipr.tc("del", "htb", self.index, _ROOT)
            except NetlinkError:  # the interface may be gone with its namespace
                pass
            self.ipr.close()
            self.nl.close()
