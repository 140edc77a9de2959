"""Leaf-spine (CLOS) fabric as a Mininet topology, with an optional super-spine tier (pods).

Addressing plan (IPv4):
    * VM k (1-based) of leaf L (global index, 1..250): ``10.L.k.2/24``, gateway ``10.L.k.1`` on
      the leaf; the leaf originates ``10.L.0.0/16``.
    * Router-to-router links (leaf-spine, spine-superspine) are /31s taken in order from
      ``10.254.0.0/16``.
Node names: ``vm1..``, ``leaf1..``, ``spine1..``, ``super1..``, numbered across pods.

Node metadata (``topo.nodeInfo(name)``): ``role`` (vm, leaf, spine, superspine, host), ``leaf``
and ``phys`` (physical host) on VMs, ``pod`` on routers, ``subnets`` on leaves, ``leaf`` on
hosts.

With ``hosts`` (the host layer, ``topo.hosts``) every physical host is a node of its own
(role ``host``, named as its placement names it): its VMs link to it (their gateway
``10.L.k.1`` is on the host's end), and it links to its leaf through its NIC, a /31 from the
fabric pool whose rate and queue are the host's ``nic_bw`` and ``nic_queue``. Routers are added as
switches, so plain ``mn --custom topo/leafspine.py --topo leafspine`` loads the file; nslab turns
them into Linux routers.

Rates are Mbit/s (Mininet's ``bw``), queue limits are packets (``max_queue_size``).
Oversubscription of a leaf = (VMs per leaf * host_bw) / (spines * fabric_bw).
"""
from __future__ import annotations

import ipaddress

from mininet.topo import Topo

from topo.hosts import host_nics
from topo.placement import place
from topo.routing import HOST_ROLE

MAX_LEAVES = 250
FABRIC_POOL = ipaddress.ip_network("10.254.0.0/16")


class LeafSpine(Topo):
    """``LeafSpine(spines=2, leaves=2, vms_per_leaf=2, ...)``.

    Args:
        spines: spines per pod.
        leaves: leaves per pod.
        vms_per_leaf: VMs under each leaf (<= 250).
        pods: 0 for a two-tier fabric; >= 1 adds a super-spine tier above ``pods`` pods.
        superspines: super-spines (each linked to every spine) when ``pods`` >= 1.
        host_bw, fabric_bw, super_bw: link rates, Mbit/s (None: unshaped).
        host_queue, fabric_queue: queue limits, packets (None: kernel default).
        link_opts: extra Mininet link options for every link (delay, jitter, loss, ...).
        vms_per_host, placement, seed, explicit: physical placement (see ``topo.place``).
        hosts: None (VMs link straight to their leaf) or the host layer's options
            ``{"nic_bw", "nic_queue", "vswitch_delay_us", "overrides": {host: {...}}}``
            (``topo.hosts.HostNic``).

    Raises:
        ValueError: counts out of range, a bad placement or bad host layer options.
    """

    def build(self, spines=2, leaves=2, vms_per_leaf=2, pods=0, superspines=2,
              host_bw=None, fabric_bw=None, super_bw=None, host_queue=None, fabric_queue=None,
              link_opts=None, vms_per_host=1, placement="packed", seed=0, explicit=None,
              hosts=None):
        npods = max(pods, 1)
        if min(spines, leaves, vms_per_leaf) < 1 or leaves * npods > MAX_LEAVES:
            raise ValueError(f"need spines, leaves, vms_per_leaf >= 1 and at most {MAX_LEAVES} "
                             f"leaves in all; got {spines}, {leaves}x{npods}, {vms_per_leaf}")
        if vms_per_leaf > 250:
            raise ValueError(f"at most 250 VMs per leaf, got {vms_per_leaf}")
        self._p2p = FABRIC_POOL.subnets(new_prefix=31)
        link_opts = dict(link_opts or {})
        vm_leaf: dict[str, str] = {}
        for gl in range(1, leaves * npods + 1):
            for k in range(1, vms_per_leaf + 1):
                vm_leaf[f"vm{(gl - 1) * vms_per_leaf + k}"] = f"leaf{gl}"
        phys = place(list(vm_leaf), vm_leaf, vms_per_host, placement, seed, explicit)
        nics = host_nics(phys, vm_leaf, hosts) if hosts is not None else {}
        spine_names: list[str] = []
        vm_opts = _shape(link_opts, host_bw, host_queue)
        for pod in range(1, npods + 1):
            pod_spines = [f"spine{(pod - 1) * spines + s}" for s in range(1, spines + 1)]
            for sp in pod_spines:
                self.addSwitch(sp, role="spine", pod=pod)
            spine_names += pod_spines
            for li in range(1, leaves + 1):
                gl = (pod - 1) * leaves + li
                leaf = f"leaf{gl}"
                self.addSwitch(leaf, role="leaf", pod=pod, subnets=[f"10.{gl}.0.0/16"])
                for k in range(1, vms_per_leaf + 1):
                    vm = f"vm{(gl - 1) * vms_per_leaf + k}"
                    self.addHost(vm, role="vm", leaf=leaf, phys=phys[vm], ip=f"10.{gl}.{k}.2/24",
                                 defaultRoute=f"via 10.{gl}.{k}.1")
                    gateway = {"ip": f"10.{gl}.{k}.1/24"}
                    nic = nics.get(phys[vm])
                    if nic is None:
                        self.addLink(vm, leaf, params2=gateway, **vm_opts)
                        continue
                    if phys[vm] not in self.nodes():
                        self.addSwitch(phys[vm], role=HOST_ROLE, leaf=leaf)
                        self._p2p_link(phys[vm], leaf, _shape(link_opts, nic.nic_bw,
                                                              nic.nic_queue))
                    self.addLink(vm, phys[vm], params2={**gateway, **nic.vswitch_opts()},
                                 **vm_opts)
                for sp in pod_spines:
                    self._p2p_link(leaf, sp, _shape(link_opts, fabric_bw, fabric_queue))
        if pods >= 1:
            for s in range(1, superspines + 1):
                name = f"super{s}"
                self.addSwitch(name, role="superspine", pod=0)
                for sp in spine_names:
                    self._p2p_link(sp, name, _shape(link_opts, super_bw, fabric_queue))

    def _p2p_link(self, a: str, b: str, opts: dict) -> None:
        net = next(self._p2p)
        ip_a, ip_b = (f"{ip}/31" for ip in net)
        self.addLink(a, b, params1={"ip": ip_a}, params2={"ip": ip_b}, **opts)


def _shape(base: dict, bw, queue) -> dict:
    opts = dict(base)
    if bw is not None:
        opts["bw"] = bw
    if queue is not None:
        opts["max_queue_size"] = queue
    return opts


topos = {"leafspine": LeafSpine}
