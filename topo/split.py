"""A topology split across servers (pure data): which server runs each node, which links
become tunnels, and whether each server's NIC can carry them.

The model is Mininet Cluster Edition's (``mininet.examples.cluster``): a list of servers, the
first the one nslab runs on, and a placement of nodes onto them. Routers (Mininet switches) are
dealt tier by tier (leaves, then spines, then super-spines) onto the servers in even bins with
its ``SwitchBinPlacer.bin``, so every server gets its share of each tier; a host or VM goes
with the router it is cabled to. Only links between two routers may cross servers: a VM's or a
host's link never does (its emulated NIC and the leaf's queue stay on one kernel).

Each cut link becomes a tunnel shaped at both ends (``lab.tunnel``), so it must have a rate
(``bw``, Mbit/s). A server's NIC budget is the sum of the rates of the cut links with an end on
it (each direction of a full-duplex NIC carries at most that sum); it must not exceed the
server's ``nic_mbit``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mininet.examples.cluster import SwitchBinPlacer
from mininet.topo import Topo

from topo.routing import HOST_ROLE

TIERS = ("leaf", "spine", "superspine")


@dataclass(frozen=True)
class Server:
    """One server of a split lab.

    Attributes:
        name: how placements and results name it (default: its address).
        address: its IPv4 address on the servers' network (the tunnels' underlay).
        ssh: the SSH target (``root@10.0.0.2``); "" for the first, local one.
        nic_mbit: what its NIC carries per direction, Mbit/s (None: not checked).
    """

    name: str
    address: str
    ssh: str = ""
    nic_mbit: float | None = None


@dataclass(frozen=True)
class CutLink:
    """A link between two routers on different servers, in topology order (``index``)."""

    index: int
    node_a: str
    node_b: str
    server_a: str
    server_b: str
    opts: Mapping = field(default_factory=dict)

    @property
    def bw(self) -> float:
        """Its shaped rate, Mbit/s."""
        return float(self.opts["bw"])


@dataclass(frozen=True)
class Split:
    """Where every node runs (``server_of``: node -> server name) and the links cut."""

    servers: tuple[Server, ...]
    server_of: Mapping[str, str]
    cut: tuple[CutLink, ...]

    def nodes_on(self, server: str) -> list[str]:
        """The nodes placed on ``server``, in topology order."""
        return [n for n, s in self.server_of.items() if s == server]

    def nic_load(self, server: str) -> float:
        """Mbit/s of shaped cut links with an end on ``server``."""
        return sum(c.bw for c in self.cut if server in (c.server_a, c.server_b))


class SplitError(ValueError):
    """A placement that cannot be built; ``problems`` lists each one in plain words."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("the lab cannot be split across its servers, nothing was built:\n"
                         + "\n".join(f"  {p}" for p in self.problems))


def split(topo: Topo, servers: Sequence[Server],
          explicit: Mapping[str, str] | None = None) -> Split:
    """Place ``topo`` onto ``servers`` and check the result before anything is built.

    Args:
        topo: a Mininet topology; routers are its switches, their tier the ``role`` in
            ``nodeInfo`` (leaf, spine, superspine; any other is one tier of its own).
        servers: the servers, the first the local one; names unique.
        explicit: node -> server name, overriding the dealt placement of those nodes.

    Returns:
        The ``Split``; with one server nothing is cut.

    Raises:
        SplitError: every problem at once: unknown nodes or servers in ``explicit``, a VM's or
            host's link crossing servers, a cut link without a rate, a server's NIC budget
            exceeded.
    """
    names = [s.name for s in servers]
    if not names or len(set(names)) != len(names):
        raise SplitError([f"servers: need at least one, names unique; got {names}"])
    explicit = dict(explicit or {})
    problems = [f"placement: {k}: no such node" for k in explicit if k not in topo.g.node]
    problems += [f"placement: {k}: no such server {v!r} (servers: {', '.join(names)})"
                 for k, v in explicit.items() if v not in names]
    if problems:
        raise SplitError(problems)
    server_of = _deal(topo, names, explicit)
    cut, problems = _cut_links(topo, server_of)
    by_name = {s.name: s for s in servers}
    placed = Split(tuple(servers), server_of, tuple(cut))
    for name in names:
        nic = by_name[name].nic_mbit
        load = placed.nic_load(name)
        if nic is not None and load > nic:
            links = ", ".join(f"{c.node_a}-{c.node_b} ({c.bw:g})" for c in cut
                              if name in (c.server_a, c.server_b))
            problems.append(f"server {name}: its cut links need {load:g} Mbit/s, its NIC has "
                            f"{nic:g} (nic_mbit): {links}; lower fabric_bw, add servers or "
                            "place the routers so fewer links cross")
    if problems:
        raise SplitError(problems)
    return placed


def _deal(topo: Topo, servers: list[str], explicit: dict[str, str]) -> dict[str, str]:
    """Routers by tier in even bins, then each physical host (``topo.hosts``) with its leaf
    and each VM with its router (or ``explicit``)."""
    switches = [n for n in topo.switches() if n not in explicit
                and topo.nodeInfo(n).get("role") != HOST_ROLE]
    tiers: dict[str, list[str]] = {}
    for n in switches:
        tiers.setdefault(topo.nodeInfo(n).get("role", ""), []).append(n)
    placed: dict[str, str] = {}
    for tier in sorted(tiers, key=lambda t: TIERS.index(t) if t in TIERS else len(TIERS)):
        placed.update(SwitchBinPlacer.bin(tiers[tier], servers))
    placed.update(explicit)
    for n in [*topo.switches(), *topo.hosts()]:  # physical hosts first: VMs may hang off them
        if n not in placed:
            routers = [r for r in topo.g[n] if topo.isSwitch(r) and r in placed]
            placed[n] = placed[routers[0]] if routers else servers[0]
    return {n: placed[n] for n in topo.nodes()}


def _router(topo: Topo, n: str) -> bool:
    """A fabric router (a switch that is not a physical host of the host layer)."""
    return topo.isSwitch(n) and topo.nodeInfo(n).get("role") != HOST_ROLE


def _cut_links(topo: Topo, server_of: Mapping[str, str]) -> tuple[list[CutLink], list[str]]:
    cut, problems = [], []
    for a, b, info in topo.links(withInfo=True):
        sa, sb = server_of[a], server_of[b]
        if sa == sb:
            continue
        if not (_router(topo, a) and _router(topo, b)):
            host = b if _router(topo, a) else a
            problems.append(f"link {a}-{b} would cross servers {sa} and {sb}: a VM or host "
                            f"stays on its router's server; move {host} with it")
        elif info.get("bw") is None:
            problems.append(f"link {a}-{b} crosses servers {sa} and {sb} unshaped: a tunnel "
                            "needs a rate for the NIC budget and the emulation (fabric_bw)")
        else:
            opts = {k: v for k, v in info.items() if k not in ("node1", "node2")}
            cut.append(CutLink(len(cut), a, b, sa, sb, opts))
    return cut, problems


def without_cut(topo: Topo, placed: Split) -> Topo:
    """A copy of ``topo`` without the links ``placed`` cuts (nodes, ports and options kept):
    what Mininet builds as veth links, the cut ones being tunnels (``lab.tunnel``)."""
    out = Topo()
    for n in topo.nodes(sort=False):
        out.addNode(n, **topo.nodeInfo(n))
    cut = {frozenset((c.node_a, c.node_b)) for c in placed.cut}
    for a, b, key, info in topo.links(sort=False, withKeys=True, withInfo=True):
        if frozenset((a, b)) not in cut:
            opts = {k: v for k, v in info.items() if k not in ("node1", "node2", "port1",
                                                                "port2")}
            out.addLink(info["node1"], info["node2"], info["port1"], info["port2"], key=key,
                        **opts)
    return out
