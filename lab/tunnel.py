"""A link cut between servers (``topo.split.CutLink``) as a shaped VXLAN tunnel between the
two routers' namespaces.

Why a new link class: Mininet Cluster Edition's ``RemoteLink`` carries a cut link over an SSH
tap tunnel (``ssh -w``, one TCP connection per link: TCP in TCP, and a user-space hop) or
``RemoteGRELink`` (gretap, which this kernel lacks), and neither applies tc shaping: a remote
link there is a plain ``Link``. Here each end is a VXLAN device (RFC 7348, UDP port 4789)
created by ``ip link add NAME netns ROUTER type vxlan ... local A remote B`` run on its server:
the device appears directly in the router's namespace while its UDP socket stays in the
server's own (the device's link-netns), so nothing is left in a server's namespace to clean,
and it goes when the router's namespace is deleted.

Each end gets the link's address, an MTU lowered by the encapsulation (``VXLAN_OVERHEAD``
below the smaller of the two servers' underlay MTUs towards each other) and the link's
emulation on its egress (``lab.links.end_commands``: HTB rate, queue, netem, loss), in the
router's namespace, so both directions are shaped where a veth link would be. The VNI is the
lab's (a hash of its name) plus the link's index, so labs sharing servers do not collide.
"""
from __future__ import annotations

import re
import zlib
from collections.abc import Mapping

from lab import tc
from lab.errors import LabError
from lab.links import end_commands
from lab.servers import Servers
from topo.split import CutLink

VXLAN_PORT = 4789
VXLAN_OVERHEAD = 50
"""Bytes: outer IPv4 (20) + UDP (8) + VXLAN (8) headers + the inner Ethernet header (14)."""
MAX_LINKS = 4095


def vni(lab: str, index: int) -> int:
    """The VXLAN network identifier (24 bits) of cut link ``index`` of lab ``lab``.

    Raises:
        ValueError: ``index`` is not in [0, MAX_LINKS).
    """
    if not 0 <= index < MAX_LINKS:
        raise ValueError(f"cut link index {index}: at most {MAX_LINKS} cut links per lab")
    return (zlib.crc32(lab.encode()) % 4096) * 4096 + index + 1


def underlay_mtu(shell, remote: str) -> int:
    """MTU, bytes, of the interface ``shell``'s server routes ``remote`` through.

    Raises:
        LabError: no route to ``remote`` there.
    """
    route = shell.run(["ip", "-o", "route", "get", remote])
    dev = re.search(r"\bdev (\S+)", route)
    mtu = dev and re.search(r"\bmtu (\d+)", shell.run(["ip", "-o", "link", "show", "dev",
                                                        dev.group(1)]))
    if not mtu:
        raise LabError(f"server {shell.server.name}: no route to {remote}: {route.strip()}")
    return int(mtu.group(1))


class VxlanLink:
    """``VxlanLink(lab, cut, servers, netns)``: the tunnel of ``cut`` between its routers'
    namespaces (``netns``: node -> namespace name, on ``cut.server_a``/``server_b``).

    Attributes:
        ends: ``(node, server, interface, address)`` for node_a then node_b; the interface is
            ``<node>-vx<index>`` (15 characters at most).
        shaping: the ``tc.LinkParams`` emulated on each end's egress.
        mtu: the tunnel's MTU, bytes (set by ``up``).
    """

    def __init__(self, lab: str, cut: CutLink, servers: Servers, netns: Mapping[str, str]):
        self.cut, self.servers, self.netns = cut, servers, netns
        self.vni = vni(lab, cut.index)
        self.shaping = tc.LinkParams.from_opts(dict(cut.opts))
        addr = [cut.opts.get(p, {}).get("ip") for p in ("params1", "params2")]
        self.ends = [(node, srv, f"{node}-vx{cut.index}"[:15], ip) for node, srv, ip in
                     ((cut.node_a, cut.server_a, addr[0]), (cut.node_b, cut.server_b, addr[1]))]
        self.mtu: int | None = None

    def up(self) -> None:
        """Create both ends, address, MTU and shaping them.

        Raises:
            LabError: a server refused a step (its command and message).
        """
        addrs = [self.servers[srv].server.address for _, srv, _, _ in self.ends]
        self.mtu = min(underlay_mtu(self.servers[srv], addrs[1 - i])
                       for i, (_, srv, _, _) in enumerate(self.ends)) - VXLAN_OVERHEAD
        for i, (node, srv, ifname, ip) in enumerate(self.ends):
            shell, ns = self.servers[srv], self.netns[node]
            shell.run(["ip", "link", "add", ifname, "netns", ns, "type", "vxlan",
                       "id", str(self.vni), "local", addrs[i], "remote", addrs[1 - i],
                       "dstport", str(VXLAN_PORT)])
            for tool, lines in end_commands(ifname, self.shaping, ip, mtu=self.mtu).items():
                if lines:
                    shell.run(tc.batch_argv(ns, tool), input="\n".join(lines) + "\n")

    def set_up(self, up: bool) -> None:
        """Bring both ends up or down (the cut link's ``link_down``/``link_up`` fault)."""
        for node, srv, ifname, _ in self.ends:
            self.servers[srv].run(["ip", "-n", self.netns[node], "link", "set", "dev", ifname,
                                   "up" if up else "down"])
