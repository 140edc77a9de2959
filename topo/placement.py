"""Physical placement: which physical host each VM runs on.

A physical host sits behind one leaf (its NIC is cabled to one ToR), so every strategy keeps a
host's VMs on one leaf when the VMs carry a ``leaf`` attribute.
"""
from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence

STRATEGIES = ("packed", "spread", "random", "explicit")


def place(vms: Sequence[str], leaf_of: Mapping[str, str | None], vms_per_host: int,
          strategy: str = "packed", seed: int = 0,
          explicit: Mapping[str, str] | None = None) -> dict[str, str]:
    """Assign every VM to a physical host.

    Args:
        vms: VM names in topology order.
        leaf_of: VM name -> its leaf (None for topologies without leaves).
        vms_per_host: capacity of a physical host (>= 1).
        strategy: ``packed`` fills hosts in VM order; ``spread`` deals a leaf's VMs round-robin
            over as many hosts as the leaf needs; ``random`` is a seeded shuffle within a leaf
            then packed; ``explicit`` uses ``explicit`` (VM -> host name).
        seed: seed of ``random``.
        explicit: the map for ``explicit``.

    Returns:
        VM name -> physical host name (``phys1``, ``phys2``, ... unless explicit).

    Raises:
        ValueError: unknown strategy, bad capacity, an explicit map that misses a VM, names an
            unknown VM, overfills a host or puts one host's VMs behind two leaves.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown placement strategy {strategy!r}; expected one of {STRATEGIES}")
    if vms_per_host < 1:
        raise ValueError(f"vms_per_host must be >= 1, got {vms_per_host}")
    if strategy == "explicit":
        return _check_explicit(vms, leaf_of, vms_per_host, explicit or {})
    by_leaf: dict[str | None, list[str]] = defaultdict(list)
    for vm in vms:
        by_leaf[leaf_of.get(vm)].append(vm)
    rng = random.Random(seed)
    out: dict[str, str] = {}
    n = 0
    for group in by_leaf.values():
        hosts = -(-len(group) // vms_per_host)
        if strategy == "random":
            group = group[:]
            rng.shuffle(group)
        for i, vm in enumerate(group):
            slot = i % hosts if strategy == "spread" else i // vms_per_host
            out[vm] = f"phys{n + slot + 1}"
        n += hosts
    return out


def _check_explicit(vms, leaf_of, vms_per_host, explicit) -> dict[str, str]:
    missing = [vm for vm in vms if vm not in explicit]
    unknown = [vm for vm in explicit if vm not in set(vms)]
    if missing or unknown:
        raise ValueError("explicit placement: " + "; ".join(
            ([f"VMs without a host: {', '.join(missing)}"] if missing else [])
            + ([f"not VMs of the topology: {', '.join(unknown)}"] if unknown else [])))
    members: dict[str, list[str]] = defaultdict(list)
    for vm in vms:
        members[explicit[vm]].append(vm)
    for host, group in members.items():
        if len(group) > vms_per_host:
            raise ValueError(f"physical host {host} has {len(group)} VMs, capacity {vms_per_host}")
        leaves = sorted({str(leaf_of.get(vm)) for vm in group})
        if len(leaves) > 1:
            raise ValueError(f"physical host {host} has VMs behind {leaves}; "
                             "a physical host sits behind one leaf")
    return {vm: explicit[vm] for vm in vms}
