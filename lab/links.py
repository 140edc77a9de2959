"""Shaped links: a veth pair whose both ends emulate the requested rate, queue, delay and loss
(``lab.tc``). Options are Mininet's (``bw``, ``delay``, ``jitter``, ``loss``,
``max_queue_size``, plus ``reorder``), so ``addLink(..., bw=100)`` works as with ``TCLink``.
"""
from __future__ import annotations

from mininet.link import Intf, Link

from lab import tc

LINK_KEYS = ("bw", "delay", "jitter", "loss", "reorder", "max_queue_size")


class ShapedIntf(Intf):
    """One end of a shaped link; ``params`` (a ``tc.LinkParams``) is what it emulates now."""

    def config(self, bw=None, delay=None, jitter=None, loss=None, reorder=None,
               max_queue_size=None, ip=None, up=True, **params):
        """Queue this end's address, state and emulation in its node's bring-up batch
        (``LabNode.flush``) instead of one shell command each."""
        self.shaping = tc.LinkParams(bw, delay, jitter, loss, reorder, max_queue_size)
        self.shaping.validate()
        batch = self.node.batch
        if ip:
            self.ip, self.prefixLen = ip.split("/") if "/" in ip else (ip, "8")
            batch["ip"].append(f"addr add {self.ip}/{self.prefixLen} dev {self.name}")
        if max_queue_size is not None or self.shaping.netem_fields():
            batch["ip"].append(f"link set dev {self.name} gso_max_segs 1")
        if up:
            batch["ip"].append(f"link set dev {self.name} up")
        batch["tc"] += tc.shape_commands(self.name, self.shaping)
        if loss:
            batch["nft"] += tc.drop_commands(self.name, loss)
        return {}

    @property
    def index(self) -> int:
        """Interface index in its namespace."""
        return self.node.ipr.link_lookup(ifname=self.name)[0]

    def delete(self) -> None:
        """The veth goes with its namespace; nothing to do one by one."""


class ShapedLink(Link):
    """``ShapedLink(node1, node2, bw=100, max_queue_size=50, params1={'ip': ...})``: both
    directions get the same emulation; ``params1``/``params2`` add per-end options."""

    def __init__(self, node1, node2, port1=None, port2=None, intfName1=None, intfName2=None,
                 addr1=None, addr2=None, params1=None, params2=None, **params):
        params.pop("intf", None)  # Mininet.addLink passes its default Intf class
        shaping = {k: params.pop(k) for k in LINK_KEYS if k in params}
        super().__init__(node1, node2, port1=port1, port2=port2, intfName1=intfName1,
                         intfName2=intfName2, addr1=addr1, addr2=addr2, intf=ShapedIntf,
                         params1={**shaping, **(params1 or {})},
                         params2={**shaping, **(params2 or {})}, **params)

    def stop(self) -> None:
        """Links are removed with the namespaces of their nodes."""
