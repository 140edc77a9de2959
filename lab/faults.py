"""The mechanisms of the faults injected at run time; each stamps an ``Event`` into the lab's
ground-truth timeline. The vocabulary (kinds and their parameters) is ``contracts.events``;
each fault is checked first (``lab.fault_rules``: what the lab refuses), and a refused one
changes nothing.

Links are named by their two end nodes (``"leaf1", "spine1"``); changes apply to both
directions. Rates are Mbit/s, loss percent, queue limits packets, clock steps ms.

In a lab split across servers, every link fault reaches both ends on their servers (a cut
link's ends are its VXLAN tunnel's, ``lab.tunnel.TunnelEnd``: state, rate, queue and loss
changed in each router's namespace there), and CPU hogs and pause/resume reach VMs on any
server; a clock step or migration of a remote VM is refused (``LabError``, saying so) rather
than applied to this machine's files.
"""
from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from pydantic import ValidationError

from contracts.base import reasons
from contracts.events import (
    ClockStep,
    CpuHog,
    Event,
    Fault,
    Flap,
    LinkDown,
    LinkUp,
    Loss,
    Migrate,
    Pause,
    Queue,
    Rate,
    Resume,
    kind_of,
)
from lab import qos, tc
from lab.errors import LabError
from lab.fault_rules import LabFacts, check, check_link

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab

HOG = ["sh", "-c", "while :; do :; done"]


class Faults:
    """Fault injection on a running ``Lab`` (``lab.faults``)."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.hogs: dict[str, object] = {}
        self.paused: set[str] = set()
        self._cancel = threading.Event()  # set at teardown: pending flap transitions end
        self._flaps: list[threading.Thread] = []

    # -- lookups ---------------------------------------------------------------------------
    def facts(self) -> LabFacts:
        """What ``lab.fault_rules`` reads of the lab now."""
        net = self.lab.net
        if net is None:
            return LabFacts(self.lab.name, running=False)
        links: dict[frozenset[str], bool] = {}
        for link in net.links:
            ends = (link.intf1, link.intf2)
            links.setdefault(frozenset(i.node.name for i in ends),
                             all(i.shaping.bw is not None for i in ends))
        for pair, tunnel in self.lab.tunnels.items():
            links[pair] = all(end.shaping.bw is not None for end in tunnel.ends)
        return LabFacts(self.lab.name, nodes=frozenset(net.nameToNode), links=links,
                        vms=dict(self.lab.phys), paused=frozenset(self.paused))

    def _allowed(self, fault_type: type[Fault], **fields) -> Fault:
        """The fault ``fault_type(**fields)``, once the lab accepts it now.

        Raises:
            LabError: its parameters do not fit its model, or ``lab.fault_rules.check``
                refuses it.
        """
        try:
            fault = fault_type(**fields)
        except ValidationError as e:
            raise LabError(f"{kind_of(fault_type)}: {reasons(e)}") from e
        check(fault, self.facts())
        return fault

    def ends(self, a: str, b: str):
        """The two ends of the link between nodes ``a`` and ``b``: ``lab.links.ShapedIntf``,
        or a cut link's ``lab.tunnel.TunnelEnd`` (in no fixed order).

        Raises:
            LabError: no such node or link.
        """
        check_link(self.facts(), a, b)
        tunnel = self.lab.tunnels.get(frozenset((a, b)))
        if tunnel is not None:
            return tuple(tunnel.ends)
        net = self.lab.net
        link = net.linksBetween(net[a], net[b])[0]
        return link.intf1, link.intf2

    def _local(self, vm: str) -> None:
        """Refuse a clock change of a VM that runs on a remote server.

        Raises:
            LabError: naming the VM and its server.
        """
        node = self.lab.net[vm]
        if node.remote:
            raise LabError(f"{vm} runs on server {node.on.server.name}: a VM's clock is "
                           "changed on this machine only")

    # -- links -----------------------------------------------------------------------------
    def _set_state(self, a: str, b: str, state: str) -> None:
        for intf in self.ends(a, b):
            intf.node.run_batch("ip", [f"link set dev {intf.name} {state}"])

    def link_down(self, a: str, b: str) -> Event:
        """Take a link down; fabric routes converge around it."""
        fault = self._allowed(LinkDown, link=(a, b))
        self._set_state(a, b, "down")
        self.lab.down_links.add(frozenset((a, b)))
        self.lab.reroute()
        return self.lab.stamp_fault(fault)

    def link_up(self, a: str, b: str) -> Event:
        """Bring a link back; fabric routes use it again."""
        fault = self._allowed(LinkUp, link=(a, b))
        self._set_state(a, b, "up")
        self.lab.down_links.discard(frozenset((a, b)))
        self.lab.reroute()
        return self.lab.stamp_fault(fault)

    def flap(self, a: str, b: str, down_s: float = 1.0, up_s: float = 1.0, count: int = 3) -> Event:
        """Take the link down for ``down_s`` then up for ``up_s``, ``count`` times, in the
        background (each transition is stamped). The transitions run in order in one thread,
        each at its time after the flap's start or, when the one before it (its reroute)
        took longer, right after it: with a timer each, a slow reroute on a loaded machine
        let the next transition overtake it."""
        ev = self.lab.stamp_fault(self._allowed(Flap, link=(a, b), down_s=down_s, up_s=up_s,
                                                count=count))
        start = time.monotonic()
        steps = [(i * (down_s + up_s) + at, fn) for i in range(count)
                 for at, fn in ((0.0, self.link_down), (down_s, self.link_up))]
        t = threading.Thread(target=self._transitions, args=(start, steps, a, b), daemon=True,
                             name="nslab-flap")
        self._flaps.append(t)
        t.start()
        return ev

    def _transitions(self, start: float, steps: list, a: str, b: str) -> None:
        for at, fn in steps:
            if self._cancel.wait(max(0.0, start + at - time.monotonic())):
                return
            fn(a, b)

    def _reshape(self, a: str, b: str, **change):
        for intf in self.ends(a, b):
            intf.shaping = replace(intf.shaping, **change)
            yield intf

    def loss(self, a: str, b: str, percent: float) -> Event:
        """Random loss of ``percent`` % in both directions (0 removes it)."""
        fault = self._allowed(Loss, link=(a, b), percent=percent)
        for intf in self._reshape(a, b, loss=percent or None):
            intf.node.run_batch("nft", tc.drop_commands(intf.name, percent))
        return self.lab.stamp_fault(fault)

    def rate(self, a: str, b: str, mbit: float) -> Event:
        """Change the link rate (Mbit/s) of a shaped link."""
        fault = self._allowed(Rate, link=(a, b), mbit=mbit)
        ends = list(self._reshape(a, b, bw=mbit))
        nic = self.lab.host_layer.nic_of(a, b)
        if nic is not None:  # a host's NIC: every VM's class follows
            self.lab.host_layer.set_rate(nic, mbit)
        elif self.lab.classes:  # the rate is every class's ceil too: re-install them
            qos.reshape(ends, self.lab.classes)
        else:
            for intf in ends:
                intf.shaper_node.run_batch("tc", tc.rate_change(intf.shaper_name, mbit))
        return self.lab.stamp_fault(fault)

    def queue(self, a: str, b: str, packets: int) -> Event:
        """Change the queue limit (packets) of a link."""
        fault = self._allowed(Queue, link=(a, b), packets=packets)
        ends = list(self._reshape(a, b, max_queue_size=packets))
        nic = self.lab.host_layer.nic_of(a, b)
        if nic is not None and nic.share_mbit:  # a shaped host NIC: every VM's queue there
            self.lab.host_layer.set_queue(nic)
        elif self.lab.classes:  # every class has the link's queue
            qos.reshape(ends, self.lab.classes)
        else:
            for intf in ends:
                intf.shaper_node.run_batch("tc", tc.queue_change(intf.shaper_name,
                                                                 intf.shaping))
        return self.lab.stamp_fault(fault)

    # -- VMs -------------------------------------------------------------------------------
    def cpu_hog(self, vm: str, enable: bool = True) -> Event:
        """Start (or stop) a busy loop inside ``vm``: a noisy neighbour for its host."""
        fault = self._allowed(CpuHog, vm=vm, enable=enable)
        node = self.lab.net[vm]
        if enable and vm not in self.hogs:
            self.hogs[vm] = node.popen(HOG)
        elif not enable and vm in self.hogs:
            proc = self.hogs.pop(vm)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        return self.lab.stamp_fault(fault, phys=node.phys)

    def _vm_wire(self, node, percent: float) -> None:
        """Drop everything to and from ``node`` (a paused VM's vNIC) or stop dropping."""
        for intf in node.intfList():
            if intf.link is None:
                continue
            for end in (intf.link.intf1, intf.link.intf2):
                end.node.run_batch("nft", tc.drop_commands(end.name, percent, tag="pause"))

    def pause(self, vm: str) -> Event:
        """Freeze every process of ``vm`` and silence its network (its kernel no longer
        answers, as a paused VM's would not)."""
        fault = self._allowed(Pause, vm=vm)
        node = self.lab.net[vm]
        self.lab.cgroups.freeze(node.phys, vm, True)
        self._vm_wire(node, 100)
        self.paused.add(vm)
        return self.lab.stamp_fault(fault)

    def resume(self, vm: str) -> Event:
        fault = self._allowed(Resume, vm=vm)
        node = self.lab.net[vm]
        self._vm_wire(node, 0)
        self.lab.cgroups.freeze(node.phys, vm, False)
        self.paused.discard(vm)
        return self.lab.stamp_fault(fault)

    def clock_step(self, vm: str, step_ms: float) -> Event:
        """Step ``vm``'s clock by ``step_ms`` (the VM's processes see it at once)."""
        fault = self._allowed(ClockStep, vm=vm, step_ms=step_ms)
        self._local(vm)
        now = time.time_ns()
        self.lab.clocks.step(vm, now, step_ms * 1e6)
        return self.lab.stamp_fault(fault, at_ns=now)

    def migrate(self, vm: str, to: str) -> Event:
        """Live-migrate ``vm`` to physical host ``to``: its processes move to that host's
        cgroup, its clock follows that host's oscillator from now on (continuous), and with a
        host layer its vNIC moves to that host's virtual switch, its traffic to that host's
        NIC, and the lab's ``topo`` is rewired to match (``lab.hostnic``).

        Raises:
            LabError: unknown host, same host, a paused VM, or (host layer) a host under
                another leaf.
        """
        fault = self._allowed(Migrate, vm=vm, to=to)
        self._local(vm)
        old = self.lab.phys[vm]
        self.lab.host_layer.migrate(vm, old, to)
        self.lab.cgroups.move_vm(vm, old, to)
        now = time.time_ns()
        self.lab.clocks.migrate(vm, now, to)
        self.lab.phys[vm] = to
        if self.lab.host_layer.nics:
            self.lab.reroute()
        self.lab.publish_state()
        return self.lab.stamp_fault(fault, src=old, at_ns=now)

    def apply(self, fault: Fault) -> Event:
        """Apply a typed fault (``contracts.events``) through the method of its kind.

        Raises:
            LabError: the lab refused it (unknown node or link, a state that forbids it).
        """
        args = fault.params()
        if hasattr(fault, "link"):
            args["a"], args["b"] = fault.link
        else:
            args["vm"] = fault.vm
        return getattr(self, fault.kind)(**args)

    def stop_all(self) -> None:
        """Cancel pending flaps (a transition under way finishes first), stop hogs, resume
        paused VMs (teardown)."""
        self._cancel.set()
        for t in self._flaps:
            t.join(timeout=10.0)
        self._flaps.clear()
        for vm in list(self.paused):  # a frozen shell would never exit
            self.lab.cgroups.freeze(self.lab.phys[vm], vm, False)
        self.paused.clear()
        for vm in list(self.hogs):
            proc = self.hogs.pop(vm)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
