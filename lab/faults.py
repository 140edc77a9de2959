"""The mechanisms of the faults injected at run time; each stamps an ``Event`` into the lab's
ground-truth timeline. The vocabulary (kinds and their parameters) is ``contracts.events``.

Links are named by their two end nodes (``"leaf1", "spine1"``); changes apply to both
directions. Rates are Mbit/s, loss percent, queue limits packets, clock steps ms.
"""
from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

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
)
from lab import qos, tc
from lab.errors import LabError

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
    def ends(self, a: str, b: str):
        """The two interfaces of the link between nodes ``a`` and ``b``.

        Raises:
            LabError: no such node or link.
        """
        net = self.lab.net
        for n in (a, b):
            if n not in net.nameToNode:
                raise LabError(f"no node {n!r} in lab {self.lab.name}")
        links = net.linksBetween(net[a], net[b])
        if not links:
            raise LabError(f"no link between {a} and {b}")
        return links[0].intf1, links[0].intf2

    def _vm(self, name: str):
        node = self.lab.net.nameToNode.get(name)
        if node is None or node not in self.lab.net.hosts:
            raise LabError(f"no VM {name!r} in lab {self.lab.name}")
        return node

    # -- links -----------------------------------------------------------------------------
    def _set_state(self, a: str, b: str, state: str) -> None:
        for intf in self.ends(a, b):
            intf.node.ipr.link("set", index=intf.index, state=state)

    def link_down(self, a: str, b: str) -> Event:
        """Take a link down; fabric routes converge around it."""
        self._set_state(a, b, "down")
        self.lab.down_links.add(frozenset((a, b)))
        self.lab.reroute()
        return self.lab.stamp_fault(LinkDown(link=(a, b)))

    def link_up(self, a: str, b: str) -> Event:
        """Bring a link back; fabric routes use it again."""
        self._set_state(a, b, "up")
        self.lab.down_links.discard(frozenset((a, b)))
        self.lab.reroute()
        return self.lab.stamp_fault(LinkUp(link=(a, b)))

    def flap(self, a: str, b: str, down_s: float = 1.0, up_s: float = 1.0, count: int = 3) -> Event:
        """Take the link down for ``down_s`` then up for ``up_s``, ``count`` times, in the
        background (each transition is stamped). The transitions run in order in one thread,
        each at its time after the flap's start or, when the one before it (its reroute)
        took longer, right after it: with a timer each, a slow reroute on a loaded machine
        let the next transition overtake it."""
        self.ends(a, b)
        ev = self.lab.stamp_fault(Flap(link=(a, b), down_s=down_s, up_s=up_s, count=count))
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
        if not 0 <= percent <= 100:
            raise LabError(f"loss must be within [0, 100] %, got {percent}")
        for intf in self._reshape(a, b, loss=percent or None):
            tc.set_drop(intf.node.netns, intf.name, percent)
        return self.lab.stamp_fault(Loss(link=(a, b), percent=percent))

    def rate(self, a: str, b: str, mbit: float) -> Event:
        """Change the link rate (Mbit/s) of a shaped link."""
        if not mbit > 0:
            raise LabError(f"rate must be > 0 Mbit/s, got {mbit}")
        for intf in self.ends(a, b):
            if intf.shaping.bw is None:
                raise LabError(f"link {a}-{b} has no rate limit to change; give it a bw")
        ends = list(self._reshape(a, b, bw=mbit))
        if self.lab.classes:  # the rate is every class's ceil too: re-install them
            qos.reshape(ends, self.lab.classes)
        else:
            for intf in ends:
                tc.set_rate(intf.shaper_node.ipr, intf.shaper_index, mbit)
        return self.lab.stamp_fault(Rate(link=(a, b), mbit=mbit))

    def queue(self, a: str, b: str, packets: int) -> Event:
        """Change the queue limit (packets) of a link."""
        if packets < 1:
            raise LabError(f"queue limit must be >= 1 packet, got {packets}")
        ends = list(self._reshape(a, b, max_queue_size=packets))
        if self.lab.classes:  # every class has the link's queue
            qos.reshape(ends, self.lab.classes)
        else:
            for intf in ends:
                tc.set_queue(intf.shaper_node.ipr, intf.shaper_index, intf.shaping)
        return self.lab.stamp_fault(Queue(link=(a, b), packets=packets))

    # -- VMs -------------------------------------------------------------------------------
    def cpu_hog(self, vm: str, enable: bool = True) -> Event:
        """Start (or stop) a busy loop inside ``vm``: a noisy neighbour for its host."""
        node = self._vm(vm)
        if enable and vm not in self.hogs:
            self.hogs[vm] = node.popen(HOG)
        elif not enable and vm in self.hogs:
            proc = self.hogs.pop(vm)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        return self.lab.stamp_fault(CpuHog(vm=vm, enable=enable), phys=node.phys)

    def _vm_wire(self, node, percent: float) -> None:
        """Drop everything to and from ``node`` (a paused VM's vNIC) or stop dropping."""
        for intf in node.intfList():
            if intf.link is None:
                continue
            for end in (intf.link.intf1, intf.link.intf2):
                tc.set_drop(end.node.netns, end.name, percent, tag="pause")

    def pause(self, vm: str) -> Event:
        """Freeze every process of ``vm`` and silence its network (its kernel no longer
        answers, as a paused VM's would not)."""
        node = self._vm(vm)
        self.lab.cgroups.freeze(node.phys, vm, True)
        self._vm_wire(node, 100)
        self.paused.add(vm)
        return self.lab.stamp_fault(Pause(vm=vm))

    def resume(self, vm: str) -> Event:
        node = self._vm(vm)
        self._vm_wire(node, 0)
        self.lab.cgroups.freeze(node.phys, vm, False)
        self.paused.discard(vm)
        return self.lab.stamp_fault(Resume(vm=vm))

    def clock_step(self, vm: str, step_ms: float) -> Event:
        """Step ``vm``'s clock by ``step_ms`` (the VM's processes see it at once)."""
        self._vm(vm)
        now = time.time_ns()
        self.lab.clocks.step(vm, now, step_ms * 1e6)
        return self.lab.stamp_fault(ClockStep(vm=vm, step_ms=step_ms), at_ns=now)

    def migrate(self, vm: str, to: str) -> Event:
        """Live-migrate ``vm`` to physical host ``to``: its processes move to that host's
        cgroup and its clock follows that host's oscillator from now on (continuous).

        Raises:
            LabError: unknown host, same host, or a paused VM.
        """
        node = self._vm(vm)
        if to not in set(self.lab.phys.values()):
            hosts = sorted(set(self.lab.phys.values()))
            raise LabError(f"no physical host {to!r}; hosts: {hosts}")
        old = self.lab.phys[vm]
        if to == old:
            raise LabError(f"{vm} already runs on {to}")
        if vm in self.paused:
            raise LabError(f"{vm} is paused; resume it before migrating")
        self.lab.cgroups.move_vm(node.name, old, to)
        now = time.time_ns()
        self.lab.clocks.migrate(vm, now, to)
        self.lab.phys[vm] = to
        self.lab.publish_state()
        return self.lab.stamp_fault(Migrate(vm=vm, to=to), src=old, at_ns=now)

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
