"""The emulated queues of a running lab, read from the kernel: for every rate-shaped direction
of every link, its configured rate and its root qdisc's counters (bytes dequeued, packets
queued now, drops). The fidelity sampler reads them to tell a link limited by its rate from
one limited by the CPU (``lab.saturation``).

One netlink dump per namespace carrying emulation (``tc.root_qdisc_stats``), through the
node's socket of the calling thread: 24 directions in 4 namespaces cost about 5 ms of CPU per
read on this machine. A node on a remote server is read with ``ip -j``/``tc -j`` there
(``LabNode.qdisc_stats``), and a cut link's two directions on its tunnel's ends.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab


@dataclass(frozen=True)
class QueueReading:
    """One direction's queue at one instant.

    ``t_s``: ``time.monotonic()`` when read, s; ``bw_mbit``: its configured rate now,
    Mbit/s; ``sent_bytes``: bytes dequeued (sent) since bring-up, Ethernet headers counted as
    HTB counts them; ``backlog_packets``: packets queued now; ``drops``: packets dropped since
    bring-up.
    """

    t_s: float
    bw_mbit: float
    sent_bytes: int
    backlog_packets: int
    drops: int


class QueueReader:
    """``QueueReader(lab)()`` -> {``"a->b"``: ``QueueReading``} for every direction with a
    rate (``bw``) of the lab's links, ``a`` the sending node. Callable from any one thread
    (the nodes keep a netlink socket per thread); call it while the lab runs.

    Raises (when called):
        OSError, pyroute2.NetlinkError: a namespace or interface is gone (the lab stopped).
    """

    def __init__(self, lab: Lab):
        self.lab = lab
        self._dirs: list[tuple[str, object, int, object]] | None = None
        self._moves = 0

    def _directions(self) -> list[tuple[str, object, int, object]]:
        """(label ``a->b``, the node whose interface shapes it, that interface's index, the
        link end whose ``shaping`` is the direction's emulation now: ``lab.links.ShapedIntf``
        or a cut link's ``lab.tunnel.TunnelEnd``) of every shaped direction, resolved once and
        again after a vNIC moved to another host (``lab.hostnic``)."""
        if self._dirs is None or self.lab.host_layer.moves != self._moves:
            dirs = []
            for a, b in self.lab.topo.links():
                ends = self.lab.faults.ends(a, b)
                for intf, peer in (ends, ends[::-1]):
                    if intf.shaping.bw is not None:
                        dirs.append((f"{intf.node.name}->{peer.node.name}", intf.shaper_node,
                                     intf.shaper_index, intf))
            self._dirs, self._moves = dirs, self.lab.host_layer.moves
        return self._dirs

    def __call__(self) -> dict[str, QueueReading]:
        dirs = self._directions()
        stats = {id(node): node.qdisc_stats() for node in {id(n): n for _, n, _, _ in dirs}
                 .values()}
        now = time.monotonic()
        out = {}
        for label, node, index, shaped in dirs:
            st = stats[id(node)].get(index)
            if st is not None and shaped.shaping.bw is not None:
                out[label] = QueueReading(t_s=now, bw_mbit=shaped.shaping.bw,
                                          sent_bytes=st["sent_bytes"],
                                          backlog_packets=st["backlog_packets"],
                                          drops=st["drops"])
        return out
