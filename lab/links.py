"""Shaped links: a veth pair whose both directions emulate the requested rate, queue, delay and
loss (``lab.tc``). Options are Mininet's (``bw``, ``delay``, ``jitter``, ``loss``,
``max_queue_size``, plus ``reorder``), so ``addLink(..., bw=100)`` works as with ``TCLink``.

Where each direction is emulated: on the egress of the sending end, except when that end is a
VM's vNIC. A guest owns its NIC (its qdisc is the guest's, as on a cloud VM, e.g. for the
pacer), so the VM -> switch direction is emulated at the switch end instead: its ingress is
redirected (``u32`` match-all, ``mirred``) to an IFB device in the switch's namespace whose
egress carries the emulation (tc-mirred(8), ifb(4)). The VM cannot see or change it.
"""
from __future__ import annotations

from mininet.link import Intf, Link

from lab import tc

TXQUEUELEN = 1000
"""Packets: the queue of a link without ``max_queue_size`` (Linux's default for a veth)."""
LINK_KEYS = ("bw", "delay", "jitter", "loss", "reorder", "max_queue_size")


def ifb_name(ifname: str) -> str:
    """The IFB device that carries the emulation of traffic arriving on ``ifname`` (15 chars
    at most, a Linux interface name's limit)."""
    return ("i" + ifname)[:15]


def end_commands(ifname: str, shaping: tc.LinkParams, ip: str | None = None, up: bool = True,
                 shape: bool = True, mtu: int | None = None) -> dict[str, list[str]]:
    """The ``ip``, ``tc`` and ``nft`` batch lines (by tool) that configure one end of a shaped
    link in its namespace: address (``"10.254.0.0/31"``), MTU (bytes), GSO off where a queue
    limit or netem counts packets, state, and ``shaping``'s egress emulation (``shape``: False
    where it is emulated elsewhere, a VM's vNIC) and loss (``lab.tc``)."""
    lines: dict[str, list[str]] = {"ip": [], "tc": [], "nft": []}
    if ip:
        lines["ip"].append(f"addr add {ip} dev {ifname}")
    if mtu is not None:
        lines["ip"].append(f"link set dev {ifname} mtu {mtu}")
    if shaping.max_queue_size is not None or shaping.netem_fields():
        lines["ip"].append(f"link set dev {ifname} gso_max_segs 1")
    if up:
        lines["ip"].append(f"link set dev {ifname} up")
    if shape:
        lines["tc"] += tc.shape_commands(ifname, shaping)
    if shaping.loss:
        lines["nft"] += tc.drop_commands(ifname, shaping.loss)
    return lines


class ShapedIntf(Intf):
    """One end of a shaped link; ``shaping`` (a ``tc.LinkParams``) is what its outgoing
    direction emulates now, on ``shaper_node``'s interface ``shaper_name`` (this interface,
    or for a VM's vNIC the IFB at the switch end)."""

    def config(self, bw=None, delay=None, jitter=None, loss=None, reorder=None,
               max_queue_size=None, ip=None, up=True, **params):
        """Queue this end's address, state and emulation in its node's bring-up batch
        (``LabNode.flush``) instead of one shell command each."""
        self.shaping = tc.LinkParams(bw, delay, jitter, loss, reorder, max_queue_size)
        self.shaping.validate()
        self.shaper_node, self.shaper_name = self.node, self.name
        if ip:
            self.ip, self.prefixLen = ip.split("/") if "/" in ip else (ip, "8")
        lines = end_commands(self.name, self.shaping, ip and f"{self.ip}/{self.prefixLen}", up,
                             shape=not getattr(self.node, "owns_nic", False))
        for tool, batch in lines.items():
            self.node.batch[tool] += batch
        return {}

    @property
    def index(self) -> int:
        """Interface index in its namespace."""
        return self.node.ifindex(self.name)

    @property
    def shaper_index(self) -> int:
        """Index of the interface carrying this direction's emulation, in ``shaper_node``."""
        return self.shaper_node.ifindex(self.shaper_name)

    def emulate_ingress(self, guest: ShapedIntf) -> None:
        """Emulate ``guest``'s outgoing direction (a VM's vNIC) on this end's ingress: an IFB
        in this node's namespace, fed by a match-all ``mirred`` redirect."""
        ifb = ifb_name(self.name)
        # txqueuelen as the vNIC's (veth: 1000): an IFB's default of 32 would be the
        # queue limit of every link without max_queue_size
        self.node.batch["ip"] += [f"link add {ifb} type ifb",
                                  f"link set dev {ifb} txqueuelen {TXQUEUELEN} up"]
        lines = tc.shape_commands(ifb, guest.shaping)
        if lines:
            self.node.batch["tc"] += [
                f"qdisc add dev {self.name} handle ffff: ingress",
                f"filter add dev {self.name} parent ffff: protocol all prio 1 u32 match u32 0 0 "
                f"action mirred egress redirect dev {ifb}", *lines]
        guest.shaper_node, guest.shaper_name = self.node, ifb

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
        for guest, peer in ((self.intf1, self.intf2), (self.intf2, self.intf1)):
            if getattr(guest.node, "owns_nic", False):
                if getattr(peer.node, "owns_nic", False):
                    raise ValueError(f"link {guest.node.name}-{peer.node.name}: two VMs linked "
                                     "directly; connect VMs through a switch or router")
                peer.emulate_ingress(guest)

    def stop(self) -> None:
        """Links are removed with the namespaces of their nodes."""
