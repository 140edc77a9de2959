"""Fabric modes: how the routers choose among equal-cost next hops.

* ``ecmp``: per-flow hashing, the kernel's multipath route with the L4 hash
  (``fib_multipath_hash_policy=1``) and a fixed per-lab seed: one flow, one path.
* ``spray``: packet spraying (the Ultra Ethernet position): a router picks a path per packet.
  An nftables prerouting rule per multipath prefix sets the packet's mark to one of the
  prefix's alive path slots (``meta mark set numgen random mod n map {...}``); ``ip rule
  fwmark k lookup 100+k`` sends it through table 100+k, which holds that prefix through the
  k-th next hop only.
* ``entropy``: the host's entropy value selects the path: a packet with DSCP k goes through
  slot k (``meta mark set ip dscp map {k : k, ...}``, then the same tables); DSCP 0 is hashed
  as in ``ecmp``. The DSCP of a dead slot is remapped to an alive one (alive slot number
  (k - 1) mod alive, as a resilient ECMP group refills a dead member's buckets), so every
  DSCP stays pinned to one path and a host's path discovery sees which.
  The collective library sets DSCP per connection (``workloads.transport.PathHints``), so a
  load balancer (REPS, Ethereal) steers each connection onto a path of its choice.

Slot k of a prefix is the k-th next hop of its healthy route (``topo.routing.path_slots``);
when a link fails its slot's table loses the prefix, and unmarked packets take the main
table's ECMP route over the remaining hops.
"""
from __future__ import annotations

from typing import Literal, get_args

from lab.capabilities import Capability
from lab.errors import CapabilityError

FabricMode = Literal["ecmp", "spray", "entropy"]
FABRIC_MODES: tuple[str, ...] = get_args(FabricMode)
TABLE_BASE = 100
"""Routing table of path slot k: TABLE_BASE + k."""
RULE_PREF = 1000
"""Priority of the ip rule of slot k: RULE_PREF + k (before ``main`` at 32766)."""
NEEDS = {"ecmp": (), "spray": ("policy_routing", "nft_mark"),
         "entropy": ("policy_routing", "nft_mark")}
"""Capabilities (``lab.capabilities.probe``) each mode needs."""


def check_mode(mode: str) -> str:
    """``mode`` itself if it is a fabric mode.

    Raises:
        ValueError: an unknown mode (the modes are named).
    """
    if mode not in FABRIC_MODES:
        raise ValueError(f"unknown fabric mode {mode!r}; modes: {', '.join(FABRIC_MODES)}")
    return mode


def require_fabric(mode: str, caps: dict[str, Capability]) -> None:
    """Check that this kernel can provide fabric ``mode``, before anything is built.

    Raises:
        CapabilityError: a capability the mode needs is missing (named, with what was seen).
        ValueError: an unknown mode.
    """
    missing = [caps[c] for c in NEEDS[check_mode(mode)] if not caps[c].ok]
    if missing:
        raise CapabilityError(f"fabric mode {mode} needs "
                              + "; ".join(f"{c.name} ({c.detail})" for c in missing))


def rule_commands(slots: int) -> list[str]:
    """``ip -batch`` lines of the policy rules for path slots 1..``slots``: mark k looks up
    table TABLE_BASE + k."""
    return [f"rule add pref {RULE_PREF + k} fwmark {k} lookup {TABLE_BASE + k}"
            for k in range(1, slots + 1)]


def table_commands(slot_routes: list[tuple[str, list[tuple[int, str]]]], slots: int
                   ) -> list[str]:
    """``ip -batch`` lines that make the slot tables 1..``slots`` exactly ``slot_routes``
    (``topo.routing.path_slots``)."""
    lines = [f"route flush table {TABLE_BASE + k}" for k in range(1, slots + 1)]
    for prefix, alive in slot_routes:
        lines += [f"route replace {prefix} via {hop} table {TABLE_BASE + k}"
                  for k, hop in alive]
    return lines


def mark_commands(mode: str, slot_routes: list[tuple[str, list[tuple[int, str]]]],
                  slots: int) -> list[str]:
    """``nft -f`` lines (table ``ip nslab_fabric``, replaced atomically) that mark every
    packet towards a multipath prefix with its slot: ``spray`` a uniformly random alive one,
    ``entropy`` the slot named by the packet's DSCP (1..``slots``), remapped to an alive one
    when it is dead; ``ecmp`` removes the table (no marks: the main table's hash)."""
    lines = ["add table ip nslab_fabric", "delete table ip nslab_fabric"]
    if mode == "ecmp":
        return lines
    lines += ["add table ip nslab_fabric",
             "add chain ip nslab_fabric pick { type filter hook prerouting priority mangle; }"]
    for prefix, alive in slot_routes:
        if mode == "spray" and len(alive) > 1:
            pick = ", ".join(f"{i} : {k}" for i, (k, _) in enumerate(alive))
            expr = f"numgen random mod {len(alive)} map {{ {pick} }}"
        elif mode == "entropy" and alive:
            live = [k for k, _ in alive]
            pick = ", ".join(f"{k} : {k if k in live else live[(k - 1) % len(live)]}"
                             for k in range(1, slots + 1))
            expr = f"ip dscp map {{ {pick} }}"
        else:
            continue  # the main route takes it
        lines.append(f"add rule ip nslab_fabric pick ip daddr {prefix} meta mark set {expr}")
    return lines
