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
               max_queue_size=None, **params):
        result = super().config(**params)
        self.shaping = tc.LinkParams(bw, delay, jitter, loss, reorder, max_queue_size)
        self.shaping.validate()
        self.index = self.node.ipr.link_lookup(ifname=self.name)[0]
        tc.shape(self.node.ipr, self.index, self.shaping)
        if loss:
            tc.set_drop(self.node.netns, self.name, loss)
        return result

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
