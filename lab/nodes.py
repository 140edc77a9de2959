"""Mininet node classes of the lab: VMs, routers (leaf/spine/super-spine) and bridges.

Every node runs in its own network namespace, named ``nslab-<lab>-<node>`` (``ip netns
list``), so ``ip netns exec`` and pyroute2 reach it, and a crashed lab is found by prefix.
"""
from __future__ import annotations

import os
import socket
import threading
from typing import TYPE_CHECKING

from mininet.node import Host, Node

from agents.clock import ENV_VAR
from lab import fabric, tc, vmclock
from lab.errors import LabError
from lab.names import netns_name
from lab.netlink import attach_netns, entered, ns_iproute, remove_netns
from topo.routing import HOST_ROLE, ROUTER_ROLES

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab

# Quieter namespaces: no IPv6 (router solicitations, DAD) in counters and captures.
_COMMON_SYSCTL = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]


class LabNode(Node):
    """A Mininet node whose namespace carries the lab's name prefix."""

    def __init__(self, name: str, lab: Lab, **params):
        self.lab = lab
        self.netns = netns_name(lab.name, name)
        self._iprs: dict[int, object] = {}  # thread id -> IPRoute
        self._ipr_lock = threading.Lock()
        self.batch: dict[str, list[str]] = {"ip": [], "tc": [], "nft": []}
        params["inNamespace"] = True
        super().__init__(name, **params)
        attach_netns(self.netns, self.pid)
        self.lab.record("netns", self.netns)
        self.sysctl(*_COMMON_SYSCTL)

    @property
    def ipr(self):
        """pyroute2 ``IPRoute`` bound to this node's namespace, one per thread: pyroute2's
        synchronous API runs an event loop per thread, and a socket reopened on another thread
        would land in that thread's namespace."""
        tid = threading.get_ident()
        ipr = self._iprs.get(tid)
        if ipr is None:
            ipr = ns_iproute(self.netns)
            with self._ipr_lock:
                self._iprs[tid] = ipr
        return ipr

    def flush(self) -> None:
        """Run the queued bring-up lines (addresses, qdiscs, nftables) in one process per
        tool.

        Raises:
            LabError: a line failed.
        """
        for tool in ("ip", "tc", "nft"):
            tc.run_batch(self.netns, tool, self.batch[tool])
            self.batch[tool] = []

    def sysctl(self, *assignments: str) -> None:
        """Set sysctls in this node's namespace (``key=value`` strings).

        Raises:
            LabError: a key is unknown or the write failed.
        """
        with entered(self.netns):  # /proc/sys/net is the caller's namespace's
            for a in assignments:
                key, value = a.split("=", 1)
                try:
                    with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
                        f.write(value)
                except OSError as e:
                    raise LabError(f"{self.name}: sysctl {a} failed: {e}") from e

    def terminate(self) -> None:
        with self._ipr_lock:
            for ipr in self._iprs.values():
                ipr.close()
            self._iprs.clear()
        remove_netns(self.netns)
        super().terminate()


class VM(LabNode, Host):
    """An emulated cloud VM: its processes run in its physical host's cgroup and live on the VM
    clock (``vmclock`` preloaded, ``NSLAB_CLOCK``), without the capabilities that reach the
    machine (``lab.vmclock.DROPPED_CAPS``). ``phys``: its physical host now (``Lab.phys``, the
    one placement truth). ``owns_nic``: the VM's interface and its qdisc are the guest's; the
    lab emulates the vNIC's outgoing direction at the switch end (``lab.links``)."""

    owns_nic = True

    def __init__(self, name: str, lab: Lab, **params):
        self.clock_path = lab.clocks.path(name)
        super().__init__(name, lab=lab, **params)

    @property
    def phys(self) -> str:
        return self.lab.phys[self.name]

    def _popen(self, cmd, **params):
        """Every process of the VM (its shell, ``popen``) joins the VM's cgroups and drops the
        machine's capabilities before exec, and runs with ``vmclock`` preloaded on the VM's
        ``NSLAB_CLOCK``."""
        env = vmclock.preload_env(dict(params.pop("env", None) or os.environ))
        env[ENV_VAR] = self.clock_path
        join = self.lab.cgroups.join_paths(self.phys, self.name)

        def enter_vm():
            for path in join:
                with open(path, "w") as f:
                    f.write("0")
            vmclock.drop_capabilities()
        return super()._popen(cmd, env=env, preexec_fn=enter_vm, **params)


class Router(LabNode):
    """A leaf, spine or super-spine: a Linux router with ECMP (L4 hash, fixed per-lab seed),
    or another fabric mode of the lab (``lab.fabric``); or a physical host of the host layer
    (role ``host``, ``topo.hosts``): its virtual switch routes between its VMs and its NIC
    (a hop in traceroute). It answers TTL-expired packets at once (``icmp_ratelimit=0``), as
    traceroute-style path discovery needs."""

    def __init__(self, name: str, lab: Lab, role: str, **params):
        self.role = role
        super().__init__(name, lab=lab, **params)
        self.sysctl("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0", "net.ipv4.icmp_ratelimit=0",
                    "net.ipv4.fib_multipath_hash_policy=1",
                    f"net.ipv4.fib_multipath_hash_seed={lab.seed & 0xFFFFFFFF}")
        self.slots = max((len(h) for _, h in lab.healthy_routes.get(name, [])), default=0)
        """Path slots of the fabric mode: the most next hops of any healthy route."""
        self._slot_rules = False

    def start(self, controllers) -> None:
        self.install_routes(self.lab.routes.get(self.name, []))

    def install_routes(self, routes: list[tuple[str, list[str]]]) -> None:
        """Make the static routes of this router exactly ``routes`` (prefix, next hops): the
        lab plays the fabric's routing protocol, converged at once. Other fabric modes than
        ``ecmp`` also get their path-slot tables (and marking rules) for these routes."""
        for prefix, hops in routes:
            if len(hops) == 1:
                self.ipr.route("replace", dst=prefix, gateway=hops[0])
            else:
                self.ipr.route("replace", dst=prefix,
                               multipath=[{"gateway": h} for h in hops])
        keep = {p for p, _ in routes}
        for r in self.ipr.get_routes(family=socket.AF_INET, proto=4):  # RTPROT_STATIC
            dst = f"{r.get_attr('RTA_DST')}/{r['dst_len']}"
            if dst not in keep:
                self.ipr.route("del", dst=dst)
        self.apply_fabric()

    def apply_fabric(self) -> None:
        """Install the lab's fabric mode for the routes now: the slot rules once, the slot
        tables and the marking rules (``ecmp`` after another mode: the marking rules
        removed, so every packet takes the main table's multipath route again)."""
        if self.slots < 2 or (self.lab.fabric == "ecmp" and not self._slot_rules):
            return
        if not self._slot_rules:
            tc.run_batch(self.netns, "ip", fabric.rule_commands(self.slots))
            self._slot_rules = True
        slot_routes = self.lab.path_slots(self.name)
        tc.run_batch(self.netns, "ip", fabric.table_commands(slot_routes, self.slots))
        tc.run_batch(self.netns, "nft", fabric.mark_commands(self.lab.fabric, slot_routes,
                                                            self.slots))

    def stop(self, deleteIntfs: bool = False) -> None:
        """Nothing to stop: the namespace and its links go with ``terminate``."""


class Bridge(LabNode):
    """A switch of a plain Mininet topology: a Linux bridge inside its own namespace (there is
    no Open vSwitch here, and nothing is bridged in the root namespace)."""

    def start(self, controllers) -> None:
        self.ipr.link("add", ifname="br0", kind="bridge")
        br = self.ipr.link_lookup(ifname="br0")[0]
        for intf in self.intfList():
            if intf.name != "lo":
                idx = self.ipr.link_lookup(ifname=intf.name)[0]
                self.ipr.link("set", index=idx, master=br, state="up")
        self.ipr.link("set", index=br, state="up")

    def stop(self, deleteIntfs: bool = False) -> None:
        """Nothing to stop: the namespace and its links go with ``terminate``."""


def fabric_node(lab: Lab):
    """Mininet ``switch=`` factory: routers for router roles and hosts, bridges otherwise."""
    def make(name: str, role: str | None = None, **params):
        params.pop("listenPort", None)
        if role in ROUTER_ROLES or role == HOST_ROLE:
            return Router(name, lab=lab, role=role, **params)
        return Bridge(name, lab=lab, **params)
    return make
