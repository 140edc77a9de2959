"""Static ECMP routes for a routed fabric, computed from the topology graph.

Every router that originates ``subnets`` (a leaf) is a destination; every other router gets a
route to each of those subnets whose next hops are all neighbours on a shortest path (hop
count), i.e. equal-cost multipath as a BGP/OSPF fabric would converge to. Paths are
valley-free: a leaf never carries transit traffic between two of its uplinks (as with eBGP in
a CLOS where all spines share one AS, RFC 7938), so after a leaf-spine failure that spine
loses the route instead of detouring through another leaf.

Physical hosts of the host layer (role ``host``, ``topo.hosts``) are routers too, outside the
fabric's ECMP: a leaf routes each of its VMs' subnets to the host the VM runs on now, and a
host routes the lab's addresses (``LAB_PREFIX``) to its leaf (``host_routes``).
"""
from __future__ import annotations

import ipaddress
from collections import deque
from collections.abc import Mapping

from mininet.topo import Topo

ROUTER_ROLES = ("leaf", "spine", "superspine")
HOST_ROLE = "host"
LAB_PREFIX = "10.0.0.0/8"
"""Every address of a leaf-spine lab (``topo.leafspine``): what a host routes to its leaf."""


def routers(topo: Topo) -> list[str]:
    """Names of the nodes whose ``role`` is a router role."""
    return [n for n in topo.nodes() if topo.nodeInfo(n).get("role") in ROUTER_ROLES]


def ecmp_routes(topo: Topo, down: set[frozenset[str]] | None = None
                ) -> dict[str, list[tuple[str, list[str]]]]:
    """Routes per router: ``{router: [(prefix, [next-hop IPv4, ...]), ...]}``.

    ``down`` holds links (``frozenset({a, b})``) to leave out, as a routing protocol would
    after a link failure; a prefix a router can no longer reach is absent from its list.

    Next hops are the neighbour's address on the connecting /31 (``params`` ``ip`` of the link
    end), sorted. Subnets a router originates itself are connected routes and not listed.

    Raises:
        ValueError: a router-to-router link end has no ``ip``.
    """
    rset = set(routers(topo))
    adj: dict[str, dict[str, str]] = {r: {} for r in rset}  # r -> {neighbour: neighbour's ip}
    for a, b, info in topo.links(withInfo=True):
        if a in rset and b in rset and frozenset((a, b)) not in (down or set()):
            ip_a = info.get("params1", {}).get("ip")
            ip_b = info.get("params2", {}).get("ip")
            if not ip_a or not ip_b:
                raise ValueError(f"router link {a}-{b} lacks addresses")
            if info["node1"] != a:
                ip_a, ip_b = ip_b, ip_a
            adj[a][b] = ip_b.split("/")[0]
            adj[b][a] = ip_a.split("/")[0]
    routes: dict[str, list[tuple[str, list[str]]]] = {r: [] for r in sorted(rset)}
    for dst in sorted(rset):
        subnets = topo.nodeInfo(dst).get("subnets") or []
        if not subnets:
            continue
        transit = {r for r in rset if topo.nodeInfo(r).get("role") != "leaf"} | {dst}
        dist = _bfs(adj, dst, transit)
        for r in sorted(rset):
            if r == dst or r not in dist:
                continue
            hops = sorted(ip for nb, ip in adj[r].items()
                          if dist.get(nb) == dist[r] - 1 and nb in transit)
            routes[r] += [(prefix, hops) for prefix in subnets]
    return routes


def _bfs(adj: dict[str, dict[str, str]], src: str, transit: set[str]) -> dict[str, int]:
    """Hop counts from ``src``; only ``transit`` nodes are expanded."""
    dist = {src: 0}
    queue = deque([src])
    while queue:
        n = queue.popleft()
        if n not in transit:
            continue
        for nb in adj[n]:
            if nb not in dist:
                dist[nb] = dist[n] + 1
                queue.append(nb)
    return dist


def path_slots(healthy: list[tuple[str, list[str]]], current: list[tuple[str, list[str]]]
               ) -> list[tuple[str, list[tuple[int, str]]]]:
    """Numbered paths of one router's multipath prefixes, stable across failures.

    Slot k (1-based) of a prefix is the k-th next hop of its route in the healthy fabric
    (``healthy``: ``ecmp_routes(topo)[router]``); it stays alive while that hop is still a
    next hop of the route now (``current``: the routes without the down links). Prefixes with
    a single healthy next hop have no slots.

    Returns:
        ``[(prefix, [(slot, next-hop IPv4), ...]), ...]`` for every multipath prefix that is
        still reachable, alive slots only, in slot order.
    """
    now = dict(current)
    out = []
    for prefix, hops in healthy:
        if len(hops) < 2 or prefix not in now:
            continue
        alive = [(k, hop) for k, hop in enumerate(hops, 1) if hop in now[prefix]]
        out.append((prefix, alive))
    return out


def host_routes(topo: Topo, phys: Mapping[str, str], down: set[frozenset[str]] | None = None
                ) -> dict[str, list[tuple[str, list[str]]]]:
    """Routes of the host layer, as ``ecmp_routes``: each leaf routes the subnet of every VM
    whose host (``phys``: VM -> host now) hangs under it to that host's NIC address; each
    host routes ``LAB_PREFIX`` to its leaf. A NIC in ``down`` carries neither.

    Raises:
        ValueError: a host-leaf link end has no ``ip``, or a VM on a host has none.
    """
    nic: dict[str, tuple[str, str, str]] = {}  # host -> (leaf, host's ip, leaf's ip)
    for a, b, info in topo.links(withInfo=True):
        roles = {n: topo.nodeInfo(n).get("role") for n in (a, b)}
        if HOST_ROLE not in roles.values() or "vm" in roles.values():
            continue
        host, leaf = (a, b) if roles[a] == HOST_ROLE else (b, a)
        ips = {info["node1"]: info.get("params1", {}).get("ip"),
               info["node2"]: info.get("params2", {}).get("ip")}
        if not ips[host] or not ips[leaf]:
            raise ValueError(f"host NIC {host}-{leaf} lacks addresses")
        if frozenset((host, leaf)) not in (down or set()):
            nic[host] = (leaf, ips[host].split("/")[0], ips[leaf].split("/")[0])
    routes: dict[str, list[tuple[str, list[str]]]] = {}
    for host, (_, _, leaf_ip) in sorted(nic.items()):
        routes.setdefault(host, []).append((LAB_PREFIX, [leaf_ip]))
    for vm, host in sorted(phys.items()):
        if host not in nic:
            continue
        ip = topo.nodeInfo(vm).get("ip")
        if not ip:
            raise ValueError(f"VM {vm} on host {host} has no address")
        leaf, host_ip, _ = nic[host]
        subnet = str(ipaddress.ip_interface(ip).network)
        routes.setdefault(leaf, []).append((subnet, [host_ip]))
    return routes


def lab_routes(topo: Topo, phys: Mapping[str, str], down: set[frozenset[str]] | None = None
               ) -> dict[str, list[tuple[str, list[str]]]]:
    """``ecmp_routes`` of the fabric and ``host_routes`` of the host layer together."""
    routes = ecmp_routes(topo, down)
    for router, more in host_routes(topo, phys, down).items():
        routes[router] = routes.get(router, []) + more
    return routes
