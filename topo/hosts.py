"""The host layer: every physical host as a node between its VMs and its leaf.

A GPU cloud's host shares one NIC among its VMs and switches traffic between them in its
virtual switch. With the host layer a topology has one node per physical host (role
``host``, a Linux router: the virtual switch): its VMs' vNICs end on it, and its NIC is its
link to its leaf, with the host's rate (``nic_bw``, Mbit/s) and queue (``nic_queue``,
packets) under the VMs' own vNIC rates. Traffic between two VMs of one host turns in the
host and never reaches the NIC or the fabric; ``vswitch_delay_us`` delays every packet the
virtual switch delivers to a VM (netem on the host's end of each vNIC).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from mininet.topo import Topo

NIC_KEYS = ("nic_bw", "nic_queue", "vswitch_delay_us")
MAX_HOST_NAME = 8
"""Characters: a host's interfaces are ``<host>-ethN`` and their IFBs ``i<host>-ethN``,
within Linux's 15 characters up to 99 ports."""


@dataclass(frozen=True)
class HostNic:
    """One physical host's NIC and virtual switch.

    Attributes:
        nic_bw: the NIC's rate, Mbit/s, each direction (None: unshaped).
        nic_queue: the NIC's queue limit, packets, each direction (None: the kernel's).
        vswitch_delay_us: delay of the virtual switch toward each VM, us (None: none;
            needs the kernel's sch_netem).
    """

    nic_bw: float | None = None
    nic_queue: int | None = None
    vswitch_delay_us: float | None = None

    def __post_init__(self) -> None:
        if self.nic_bw is not None and not self.nic_bw > 0:
            raise ValueError(f"nic_bw must be > 0 Mbit/s, got {self.nic_bw}")
        if self.nic_queue is not None and self.nic_queue < 1:
            raise ValueError(f"nic_queue must be >= 1 packet, got {self.nic_queue}")
        if self.vswitch_delay_us is not None and self.vswitch_delay_us < 0:
            raise ValueError(f"vswitch_delay_us must be >= 0, got {self.vswitch_delay_us}")

    def vswitch_opts(self) -> dict:
        """Link options of the host's end of a vNIC (its direction toward the VM)."""
        return {"delay": f"{self.vswitch_delay_us:g}us"} if self.vswitch_delay_us else {}


def host_nics(phys: Mapping[str, str], leaf_of: Mapping[str, str],
              options: Mapping) -> dict[str, HostNic]:
    """Every physical host's ``HostNic``: ``options``' ``nic_bw``, ``nic_queue`` and
    ``vswitch_delay_us`` (None or absent: not emulated), each overridden per host by
    ``options["overrides"][host]``.

    Args:
        phys: VM -> physical host (``topo.placement.place``).
        leaf_of: VM -> its leaf.
        options: the host layer's options.

    Raises:
        ValueError: a value out of range, an override for a host that has no VM, a host
            name longer than ``MAX_HOST_NAME`` or equal to a VM's or leaf's, or unknown keys.
    """
    overrides = dict(options.get("overrides") or {})
    unknown = set(options) - {*NIC_KEYS, "overrides"}
    unknown |= {k for o in overrides.values() for k in o if k not in NIC_KEYS}
    if unknown:
        raise ValueError(f"host layer: unknown keys {sorted(unknown)}; expected {NIC_KEYS}")
    hosts = sorted(set(phys.values()))
    stray = sorted(set(overrides) - set(hosts))
    if stray:
        raise ValueError(f"host layer: overrides for hosts without VMs: {stray}")
    taken = set(phys) | set(leaf_of.values())
    for h in hosts:
        if len(h) > MAX_HOST_NAME or h in taken:
            raise ValueError(f"physical host name {h!r}: with the host layer a host is a node; "
                             f"use at most {MAX_HOST_NAME} characters, not a VM's or leaf's "
                             "name")
    base = HostNic(**{k: options.get(k) for k in NIC_KEYS})
    return {h: replace(base, **{f.name: overrides[h][f.name] for f in fields(HostNic)
                                if overrides.get(h, {}).get(f.name) is not None})
            for h in hosts}


def rewire(topo: Topo, vm: str, old: str, new: str) -> None:
    """Move ``vm``'s link from node ``old`` to node ``new`` in ``topo`` (a live migration in
    the host layer), keeping the link's options; ``vm``'s ``phys`` becomes ``new``.

    Raises:
        ValueError: no link between ``vm`` and ``old``, or ``new`` is not a node.
    """
    if new not in topo.g.node:
        raise ValueError(f"no node {new!r}")
    entry = topo.g.edge.get(vm, {}).get(old)
    if not entry:
        raise ValueError(f"no link between {vm} and {old}")
    key, info = next(iter(entry.items()))
    del entry[key]
    if not entry:
        del topo.g.edge[vm][old]
        del topo.g.edge[old][vm]
    end = "1" if info["node1"] == old else "2"
    info = {**info, f"node{end}": new, f"port{end}": None}
    topo.g.add_edge(vm, new, key, info)
    topo.nodeInfo(vm)["phys"] = new
