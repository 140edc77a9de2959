"""The host layer of a running lab (``topo.hosts``): every physical host's NIC, shared by its
VMs, and the move of a VM's vNIC to another host when it migrates.

A host's NIC is its link to its leaf (``nic_bw``, ``nic_queue``). Each direction is an HTB
root ``1:`` with the NIC's rate in ``1:1`` and under it one class per VM of the host (equal
guaranteed rates, ceil the NIC's rate, each with its own queue of ``nic_queue`` packets),
chosen by the VM's subnet (``u32 match ip src`` on the host's end, ``dst`` on the leaf's),
as a NIC serves its virtual functions' or a virtual switch its vNICs' queues in turn; other
packets (ARP) take the default class ``1:10``. So VMs that send together share the NIC
evenly whatever their TCP flows do; one VM alone gets all of it (tc-htb(8), tc-u32(8)).

Names: a host's NIC is the link ``(host, leaf)``, e.g. ``link: [phys1, leaf1]`` in a fault
(``link_down``, ``rate``, ``loss``, ``queue``, ``flap``); its events' target is
``phys1-leaf1``.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lab import tc
from lab.errors import LabError
from topo.hosts import rewire
from topo.routing import HOST_ROLE

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab
    from lab.links import ShapedIntf

VM_MINOR = 0x100
"""Class ``1:<VM_MINOR + k>`` (and u32 filter ``800::<k + 1>``) is the NIC queue of the
topology's k-th VM (0-based, in ``topo.hosts()`` order)."""
OTHER_MINOR = 0x10
"""Class ``1:10``: packets of no VM's subnet (ARP, the host's own)."""


@dataclass
class Nic:
    """One host's NIC: ``up`` the host's end (host -> leaf), ``down`` the leaf's end
    (leaf -> host); ``share_mbit``: each VM class's guaranteed rate (0: an unshaped NIC,
    no classes)."""

    host: str
    leaf: str
    up: ShapedIntf
    down: ShapedIntf
    share_mbit: float = 0.0

    def directions(self) -> tuple[tuple[ShapedIntf, str], tuple[ShapedIntf, str]]:
        """(end, the u32 field that names a VM's packets there)."""
        return (self.up, "src"), (self.down, "dst")


class HostLayer:
    """The NICs of a running lab's hosts (``Lab.host_layer``); empty without a host layer."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.nics: dict[str, Nic] = {}
        self.moves = 0
        self._frozen: list[dict] = []
        """vNICs moved to another host so far (readers of the links resolve them again)."""
        vms = list(lab.topo.hosts())
        self._index = {vm: k for k, vm in enumerate(vms)}

    def start(self) -> None:
        """Find every host's NIC and give each VM its class there (after the links exist).

        Raises:
            LabError: tc refused.
        """
        topo = self.lab.topo
        for a, b in topo.links():
            roles = {n: topo.nodeInfo(n).get("role") for n in (a, b)}
            if HOST_ROLE not in roles.values() or "vm" in roles.values():
                continue
            host, leaf = (a, b) if roles[a] == HOST_ROLE else (b, a)
            ends = self.lab.faults.ends(host, leaf)
            up, down = ends if ends[0].node.name == host else ends[::-1]
            members = self.members(host)
            self.nics[host] = nic = Nic(host, leaf, up, down)
            if up.shaping.bw is not None:
                nic.share_mbit = up.shaping.bw / max(1, len(members))
                for intf, field in nic.directions():
                    intf.node.run_batch("tc", [f"qdisc del dev {intf.name} root",
                                               *self._root_lines(intf)]
                                        + [line for vm in members
                                           for line in self._vm_lines(nic, intf, field, vm)])

    def members(self, host: str) -> list[str]:
        """The VMs on ``host`` now, in topology order."""
        return [vm for vm in self._index if self.lab.phys[vm] == host]

    def nic_of(self, a: str, b: str) -> Nic | None:
        """The NIC that is the link between nodes ``a`` and ``b``, or None."""
        for nic in self.nics.values():
            if {nic.host, nic.leaf} == {a, b}:
                return nic
        return None

    def _subnet(self, vm: str) -> str:
        return str(ipaddress.ip_interface(self.lab.topo.nodeInfo(vm)["ip"]).network)

    def _root_lines(self, intf: ShapedIntf) -> list[str]:
        p = intf.shaping
        return [f"qdisc add dev {intf.name} root handle 1: htb default {OTHER_MINOR:x}",
                tc.htb_line(intf.name, "1:", "1:1", p.bw),
                tc.htb_line(intf.name, "1:1", f"1:{OTHER_MINOR:x}", p.bw, p.bw),
                *tc.leaf_line(intf.name, f"parent 1:{OTHER_MINOR:x}", f"{OTHER_MINOR:x}:", p)]

    def _vm_lines(self, nic: Nic, intf: ShapedIntf, field: str, vm: str,
                  verb: str = "add") -> list[str]:
        k = self._index[vm]
        minor = f"{VM_MINOR + k:x}"
        lines = [tc.htb_line(intf.name, "1:1", f"1:{minor}", nic.share_mbit, intf.shaping.bw,
                             verb=verb)]
        if verb == "add":
            lines += [*tc.leaf_line(intf.name, f"parent 1:{minor}", f"{minor}:", intf.shaping),
                      f"filter add dev {intf.name} parent 1: protocol ip prio 1 handle "
                      f"800::{k + 1:x} u32 match ip {field} {self._subnet(vm)} "
                      f"flowid 1:{minor}"]
        return lines

    # -- run time --------------------------------------------------------------------------
    def set_rate(self, nic: Nic, mbit: float) -> None:
        """The NIC's rate, both directions, now (its ``shaping`` already changed): every
        class's ceil follows it.

        Raises:
            LabError: tc refused.
        """
        for intf, field in nic.directions():
            lines = [tc.htb_line(intf.name, "1:", "1:1", mbit, verb="change"),
                     tc.htb_line(intf.name, "1:1", f"1:{OTHER_MINOR:x}", mbit, verb="change")]
            for vm in self.members(nic.host):
                lines += self._vm_lines(nic, intf, field, vm, verb="change")
            intf.node.run_batch("tc", lines)

    def set_queue(self, nic: Nic) -> None:
        """Every queue of the NIC to its ``shaping``'s limit now (both directions).

        Raises:
            LabError: tc refused.
        """
        for intf, _ in nic.directions():
            minors = [OTHER_MINOR] + [VM_MINOR + self._index[vm] for vm in self.members(nic.host)]
            intf.node.run_batch("tc", [
                line for m in minors for line in tc.leaf_line(
                    intf.name, f"parent 1:{m:x}", f"{m:x}:", intf.shaping, verb="replace")])

    def migrate(self, vm: str, old: str, new: str) -> None:
        """Move ``vm``'s vNIC from host ``old``'s virtual switch to ``new``'s, and its NIC
        queues with it; the caller then sets ``Lab.phys`` and reroutes (the leaf routes the
        VM's subnet to its new host). Without a host layer nothing is done.

        Raises:
            LabError: the hosts hang under different leaves (the VM's subnet is its leaf's),
                or a kernel change failed.
        """
        if old not in self.nics or new not in self.nics:
            return
        nic_old, nic_new = self.nics[old], self.nics[new]
        if nic_old.leaf != nic_new.leaf:
            raise LabError(f"{vm} cannot move from {old} (under {nic_old.leaf}) to {new} "
                           f"(under {nic_new.leaf}): with the host layer a VM keeps its "
                           "leaf's subnet, so it migrates to hosts of its own leaf")
        net = self.lab.net
        (vm_end,) = [i for i in net[vm].intfList() if i.link is not None]
        end = vm_end.link.intf2 if vm_end.link.intf1 is vm_end else vm_end.link.intf1
        src, dst = net[old], net[new]
        port = dst.newPort()
        name = f"{new}-eth{port}"
        if nic_old.up.shaping.bw is not None:
            self._drop_vm(nic_old, vm)
        src.run_batch("ip", [f"link del {vm_end.shaper_name}", f"link set dev {end.name} down",
                             f"link set dev {end.name} netns {dst.netns} name {name}"])
        src.delIntf(end)
        end.node, end.name = dst, name
        dst.addIntf(end, port=port, moveIntfFn=lambda *args: None)
        dst.batch["ip"] += [f"addr add {end.ip}/{end.prefixLen} dev {name}",
                            f"link set dev {name} up"]
        dst.batch["tc"] += tc.shape_commands(name, end.shaping)
        end.shaper_node, end.shaper_name = dst, name
        end.emulate_ingress(vm_end)
        dst.flush()
        rewire(self.lab.topo, vm, old, new)
        self.moves += 1
        if nic_new.up.shaping.bw is not None:
            for intf, field in nic_new.directions():
                intf.node.run_batch("tc", self._vm_lines(nic_new, intf, field, vm))

    def _drop_vm(self, nic: Nic, vm: str) -> None:
        k = self._index[vm]
        for intf, _ in nic.directions():
            intf.node.run_batch("tc", [
                f"filter del dev {intf.name} parent 1: protocol ip prio 1 handle 800::{k + 1:x} "
                "u32", f"class del dev {intf.name} classid 1:{VM_MINOR + k:x}"])

    def read(self) -> list[dict]:
        """Every host's NIC now (running lab), or as ``freeze`` kept it (stopped lab):
        host, leaf, vms (on it now), bw_mbit (None: unshaped), queue_packets (each VM's
        queue there; None: the kernel's), link_up, and per direction (``to_leaf``,
        ``from_leaf``) its sent_bytes, drops and backlog_packets: the root qdisc's counters
        since bring-up (all its classes; zeros when unshaped)."""
        if self.lab.net is None:
            return self._frozen
        out = []
        for host, nic in sorted(self.nics.items()):
            doc = {"host": host, "leaf": nic.leaf, "vms": self.members(host),
                   "bw_mbit": nic.up.shaping.bw, "queue_packets": nic.up.shaping.max_queue_size,
                   "link_up": frozenset((host, nic.leaf)) not in self.lab.down_links}
            for label, intf in (("to_leaf", nic.up), ("from_leaf", nic.down)):
                st = intf.node.qdisc_stats().get(intf.index,
                                                 dict.fromkeys(tc.QDISC_COUNTERS, 0))
                doc[label] = {k: st[k] for k in ("sent_bytes", "drops", "backlog_packets")}
            out.append(doc)
        return out

    def freeze(self) -> None:
        """Keep ``read()`` for after the lab stops (teardown calls it first)."""
        self._frozen = self.read()
