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
router's namespace, so both directions are shaped where a veth link would be; each end is a
``TunnelEnd``, read and changed at run time (state, rate, queue, loss, captures, counters)
as a veth link's end is, in its router's namespace on its server. The VNI is the lab's (a
hash of its name) plus the link's index, so labs sharing servers do not collide.
"""
from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lab import tc
from lab.errors import LabError
from lab.links import end_commands
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


@dataclass
class TunnelEnd:
    """One end of a cut link as faults, captures and counters read a link's end
    (``lab.links.ShapedIntf``): its router (``node``, a ``lab.nodes.Router`` on its server),
    its VXLAN device (``name``), the link's address there (``ip``) and the emulation on its
    egress now (``shaping``), which that device carries itself."""

    node: Any
    name: str
    ip: str | None
    shaping: tc.LinkParams

    @property
    def shaper_node(self):
        return self.node

    @property
    def shaper_name(self) -> str:
        return self.name

    @property
    def shaper_index(self) -> int:
        return self.node.ifindex(self.name)


class VxlanLink:
    """``VxlanLink(lab, cut, nodes)``: the tunnel of ``cut`` between its routers
    (``nodes``: node name -> ``lab.nodes.LabNode``, each on its server).

    Attributes:
        ends: a ``TunnelEnd`` for node_a then node_b; the interface is ``<node>-vx<index>``
            (15 characters at most).
        mtu: the tunnel's MTU, bytes (set by ``up``).
    """

    def __init__(self, lab: str, cut: CutLink, nodes: Mapping[str, Any]):
        self.cut = cut
        self.vni = vni(lab, cut.index)
        addr = [cut.opts.get(p, {}).get("ip") for p in ("params1", "params2")]
        self.ends = [TunnelEnd(nodes[node], f"{node}-vx{cut.index}"[:15], ip,
                               tc.LinkParams.from_opts(dict(cut.opts)))
                     for node, ip in ((cut.node_a, addr[0]), (cut.node_b, addr[1]))]
        self.mtu: int | None = None

    def up(self) -> None:
        """Create both ends, address, MTU and shaping them.

        Raises:
            LabError: a server refused a step (its command and message).
        """
        addrs = [end.node.on.server.address for end in self.ends]
        self.mtu = min(underlay_mtu(end.node.on, addrs[1 - i])
                       for i, end in enumerate(self.ends)) - VXLAN_OVERHEAD
        for i, end in enumerate(self.ends):
            end.node.on.run(["ip", "link", "add", end.name, "netns", end.node.netns,
                             "type", "vxlan", "id", str(self.vni), "local", addrs[i],
                             "remote", addrs[1 - i], "dstport", str(VXLAN_PORT)])
            for tool, lines in end_commands(end.name, end.shaping, end.ip, mtu=self.mtu).items():
                end.node.run_batch(tool, lines)
