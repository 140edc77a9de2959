"""What a running lab can tell about itself now: its links' counters and state, its VMs' host,
CPU and clock (truth). Read through netlink and cgroups; the TUI and the session poll these
instead of reaching into Mininet objects.

Call these on one thread per lab (the session's lab thread): the nodes' pyroute2 sockets are
opened per thread.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab

TIERS = {"vm": 0, "host": 0.5, "leaf": 1, "spine": 2, "superspine": 3}
"""Tier of a node by its role: VMs 0, the host layer's physical hosts 0.5 (between their VMs
and their leaf), up to super-spines 3 (other switches count as leaves)."""


@dataclass(frozen=True)
class LinkState:
    """A link between nodes ``a`` and ``b`` (``a`` the lower tier), now.

    ``tx_bytes``: bytes sent by ``a``'s end and by ``b``'s end since bring-up; ``drops``:
    packets dropped on both ends (qdiscs and interfaces); ``bw_mbit``: the rate, Mbit/s
    (None: unshaped); ``loss_percent``: injected loss; ``max_queue_size``: packets.
    """

    a: str
    b: str
    up: bool
    bw_mbit: float | None
    loss_percent: float
    max_queue_size: int | None
    tx_bytes: tuple[int, int]
    drops: int


@dataclass(frozen=True)
class VmState:
    """A VM now: its physical host and leaf, whether it is paused or runs a CPU hog, the CPU
    time its processes used (ns, cgroup), and its clock's truth: ``offset_ns`` = t_v - t and
    ``drift_ppm`` (the frequency error of its host's oscillator)."""

    name: str
    phys: str
    leaf: str
    paused: bool
    hog: bool
    cpu_ns: int | None
    offset_ns: float
    drift_ppm: float


def tier(lab: Lab, node: str) -> float:
    """The tier of ``node`` (``TIERS``; hosts are VMs)."""
    role = lab.topo.nodeInfo(node).get("role") or ("leaf" if lab.topo.isSwitch(node) else "vm")
    return TIERS.get(role, TIERS["leaf"])


def _counters(node, ifname: str, shaper, shaper_ifname: str) -> tuple[int, int]:
    """(tx bytes, drops) of one direction: interface ``ifname``'s link counters plus the drops
    of the root qdisc emulating that direction on ``shaper``'s ``shaper_ifname`` (the IFB's for
    a VM's vNIC; the guest's own qdisc on its vNIC is the guest's and not counted)."""
    st = node.link_stats(ifname)
    qdisc = shaper.qdisc_stats().get(shaper.ifindex(shaper_ifname), {"drops": 0})
    return st["tx_bytes"], st["tx_dropped"] + st["rx_dropped"] + qdisc["drops"]


def link_states(lab: Lab) -> list[LinkState]:
    """Every link of the topology, in topology order (a cut link: its tunnel's two ends)."""
    out = []
    for a, b in lab.topo.links():
        if tier(lab, b) < tier(lab, a):
            a, b = b, a
        intf_a, intf_b = lab.faults.ends(a, b)
        if intf_a.node.name != a:
            intf_a, intf_b = intf_b, intf_a
        (tx_a, drops_a), (tx_b, drops_b) = (
            _counters(i.node, i.name, i.shaper_node, i.shaper_name) for i in (intf_a, intf_b))
        shaping = intf_a.shaping
        out.append(LinkState(a=a, b=b, up=frozenset((a, b)) not in lab.down_links,
                             bw_mbit=shaping.bw, loss_percent=shaping.loss or 0.0,
                             max_queue_size=shaping.max_queue_size, tx_bytes=(tx_a, tx_b),
                             drops=drops_a + drops_b))
    return out


def vm_states(lab: Lab) -> list[VmState]:
    """Every VM, in natural name order (vm2 before vm10)."""
    now_ns = time.time_ns()
    specs = lab.clocks.specs
    out = []
    for vm in sorted(lab.phys, key=lambda v: (len(v), v)):
        phys = lab.phys[vm]
        try:
            cpu = lab.cgroups.cpu_usage_ns(phys, vm)
        except OSError:
            cpu = None
        spec = specs[vm]
        out.append(VmState(name=vm, phys=phys, leaf=lab.topo.nodeInfo(vm).get("leaf", ""),
                           paused=vm in lab.faults.paused, hog=vm in lab.faults.hogs,
                           cpu_ns=cpu, offset_ns=spec.offset_at(now_ns),
                           drift_ppm=spec.frequency_ppm(now_ns)))
    return out
