"""Holding one destination's traffic on the VM's own egress: an HTB class per destination whose
rate is switched through netlink.

Layout on the VM's interface (tc-htb(8), tc-u32(8)):

    root 1: htb default 1
      1:1   rate LINE            other traffic, and the pacer's own probes (filter prio 1)
      1:N   rate LINE            one per destination (u32 match ip dst A/32 -> 1:N, prio 2)

``hold(dst)`` changes class ``1:N`` to ``LINE / HELD_DIVISOR`` with a one-packet burst (TCP's
packets wait in the class queue; TCP small queues then slow the sockets: nothing is dropped and
no congestion signal is made); ``release(dst)`` restores ``LINE``. One ``RTM_NEWTCLASS`` each,
tens of us.

Why not a full stop: HTB charges a class for a packet at the rate in force when it leaves, in
time units that do not change with the rate. A class switched to ~0 still sends the packet it
was allowed (its tokens were positive) and is then in debt for that packet's time at ~0 rate
(1.5 s for 1500 bytes at 8 kbit/s), and a release to the line rate does not clear the debt:
measured, the destination then stayed blocked for about a second. At 1/10 of the line rate the
debt is at most ten packet times (1.2 ms at 100 Mbit/s), and the held class leaks 10 % of the
line. ``plug`` (sch_plug), the qdisc made for stop-and-release, is absent from many kernels
(this one included).

Why HTB classes: the kernel here and on most clouds has them (``fq``'s per-flow ``maxrate``
is not available on every kernel, and would need a socket option in every application);
they act on traffic the pacer did not write (iperf3, gloo), per destination, and the switch is
one netlink message. ``LINE`` should be the vNIC's rate (Mbit/s) so that what a release lets
go leaves at that rate, not at the veth's.
"""
from __future__ import annotations

import ipaddress
import threading

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

__all__ = ["HELD_DIVISOR", "Holder"]

HELD_DIVISOR = 10
"""A held class sends at the line rate divided by this (see the module doc)."""
_ROOT, _DEFAULT = 0x10000, 0x10001
_ONE_PACKET = 1600
_MAX_DESTS = 4000


def _htb(rate_bit_s: int, burst: int | None = None) -> dict:
    burst = burst or max(15_000, rate_bit_s // 8 // 1000)
    return dict(rate=f"{rate_bit_s}bit", ceil=f"{rate_bit_s}bit", burst=burst, cburst=burst,
                quantum=max(1600, min(200_000, rate_bit_s // 80)))


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
        self.classes: dict[str, int] = {}
        self.held: set[str] = set()
        self._lock = threading.Lock()
        self.ipr.tc("replace", "htb", self.index, _ROOT, default=1)
        self.ipr.tc("add-class", "htb", self.index, _DEFAULT, parent=_ROOT, **_htb(self.line))
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
            self.ipr.tc("add-class", "htb", self.index, handle, parent=_ROOT,
                        **_htb(self.line))
            self.ipr.tc("add-filter", "u32", self.index, parent=_ROOT, prio=2,
                        protocol=0x0800, target=handle,
                        keys=[f"0x{int(ipaddress.IPv4Address(dst)):08x}/0xffffffff+16"])
            self.classes[dst] = handle
        return handle

    def prepare(self, dst: str) -> None:
        """Make ``dst``'s class (open) ahead of the first hold."""
        with self._lock:
            self._class(dst)

    def hold(self, dst: str) -> None:
        """Stop ``dst``'s traffic (queued in its class) until ``release``."""
        with self._lock:
            if dst in self.held:
                return
            handle = self._class(dst)
            self.ipr.tc("change-class", "htb", self.index, handle, parent=_ROOT,
                        **_htb(self.line // HELD_DIVISOR, burst=_ONE_PACKET))
            self.held.add(dst)

    def release(self, dst: str) -> None:
        """Let ``dst``'s traffic go at the line rate."""
        with self._lock:
            if dst not in self.held:
                return
            self.ipr.tc("change-class", "htb", self.index, self.classes[dst], parent=_ROOT,
                        **_htb(self.line))
            self.held.discard(dst)

    def close(self) -> None:
        """Remove the qdisc (the interface is as the pacer found it) and the netlink socket."""
        with self._lock:
            try:
                self.ipr.tc("del", "htb", self.index, _ROOT)
            except NetlinkError:  # the interface may be gone with its namespace
                pass
            self.ipr.close()
