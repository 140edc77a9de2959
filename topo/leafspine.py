"""Leaf-spine (CLOS) fabric as a Mininet topology, with an optional super-spine tier (pods).

Addressing plan (IPv4):
    * VM k (1-based) of leaf L (global index, 1..250): ``10.L.k.2/24``, gateway ``10.L.k.1`` on
      the leaf; the leaf originates ``10.L.0.0/16``.
    * Router-to-router links (leaf-spine, spine-superspine) are /31s taken in order from
      ``10.254.0.0/16``.
Node names: ``vm1..``, ``leaf1..``, ``spine1..``, ``super1..``, numbered across pods.

Node metadata (``topo.nodeInfo(name)``): ``role`` (vm, leaf, spine, superspine), ``leaf`` and
``phys`` (physical host) on VMs, ``pod`` on routers, ``subnets`` on leaves. Routers are added as
switches, so plain ``mn --custom topo/leafspine.py --topo leafspine`` loads the file; nslab turns
them into Linux routers.

Rates are Mbit/s (Mininet's ``bw``), queue limits are packets (``max_queue_size``).
Oversubscription of a leaf = (VMs per leaf * host_bw) / (spines * fabric_bw).
"""
from __future__ import annotations

import ipaddress

from mininet.topo import Topo

from topo.placement import place

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

    Raises:
        ValueError: counts out of range or a bad placement.
    """

    def build(self, spines=2, leaves=2, vms_per_leaf=2, pods=0, superspines=2,
              host_bw=None, fabric_bw=None, super_bw=None, host_queue=None, fabric_queue=None,
              link_opts=None, vms_per_host=1, placement="packed", seed=0, explicit=None):
        npods = max(pods, 1)
        if min(spines, leaves, vms_per_leaf) < 1 or leaves * npods > MAX_LEAVES:
            raise ValueError(f"need spines, leaves, vms_per_leaf >= 1 and at most {MAX_LEAVES} "
                             f"leaves in all; got {spines}, {leaves}x{npods}, {vms_per_leaf}")
        if vms_per_leaf > 250:
            raise ValueError(f"at most 250 VMs per leaf, got {vms_per_leaf}")
        self._p2p = FABRIC_POOL.subnets(new_prefix=31)
        link_opts = dict(link_opts or {})
        vm_leaf: dict[str, str] = {}
        spine_names: list[str] = []
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
                    vm_leaf[vm] = leaf
                    self.addHost(vm, role="vm", leaf=leaf, ip=f"10.{gl}.{k}.2/24",
                                 defaultRoute=f"via 10.{gl}.{k}.1")
                    self.addLink(vm, leaf, params2={"ip": f"10.{gl}.{k}.1/24"},
                                 **_shape(link_opts, host_bw, host_queue))
                for sp in pod_spines:
                    self._p2p_link(leaf, sp, _shape(link_opts, fabric_bw, fabric_queue))
        if pods >= 1:
            for s in range(1, superspines + 1):
                name = f"super{s}"
                self.addSwitch(name, role="superspine", pod=0)
                for sp in spine_names:
                    self._p2p_link(sp, name, _shape(link_opts, super_bw, fabric_queue))
        phys = place(list(vm_leaf), vm_leaf, vms_per_host, placement, seed, explicit)
        for vm, host in phys.items():
            self.nodeInfo(vm)["phys"] = host

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
