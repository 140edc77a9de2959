"""A scenario's ``topology`` and ``placement`` sections -> the Mininet ``Topo`` (pure data, no
root): a ``LeafSpine``, or a custom topology file with a ``topos`` dict as for
``mn --custom``, whose VMs are then placed on physical hosts.

``build`` returns the problems it meets (a file that does not load, a missing ``topos`` key,
arguments the topology refuses, a placement that does not fit) with their field paths instead
of raising, so that ``session.scenario.load`` reports them with the rest.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from mininet.topo import Topo

from session.explain import Explained, close_match
from topo.leafspine import LeafSpine
from topo.placement import place

if TYPE_CHECKING:
    from session.scenario import PlacementSpec, TopologySpec


class _Invalid(Exception):
    def __init__(self, problem: Explained):
        super().__init__(problem.message)
        self.problem = problem


def build(t: TopologySpec, p: PlacementSpec, seed: int, base: Path,
          hosts: dict | None = None) -> tuple[Topo | None, list[Explained]]:
    """The topology of sections ``t`` and ``p``; a custom file's path is relative to ``base``
    (the scenario's directory); ``hosts``: the host layer's options (``topo.hosts``;
    leafspine only).

    Returns:
        (topology, []) or (None, [the problem, with its field path]).
    """
    link = {k: v for k, v in t.link.model_dump().items() if v is not None}
    strategy = "explicit" if p.map else p.strategy
    try:
        if t.kind == "leafspine":
            return LeafSpine(spines=t.spines, leaves=t.leaves, vms_per_leaf=t.vms_per_leaf,
                             pods=t.pods, superspines=t.superspines, host_bw=t.host_bw,
                             fabric_bw=t.fabric_bw, super_bw=t.super_bw,
                             host_queue=t.host_queue, fabric_queue=t.fabric_queue,
                             link_opts=link, vms_per_host=p.vms_per_host, placement=strategy,
                             seed=seed, explicit=p.map, hosts=hosts), []
        if hosts is not None:
            return None, [Explained(("hosts",), "the host layer (nic_bw, nic_queue, "
                                    "vswitch_delay_us, vswitch) needs topology kind leafspine")]
        topo = _custom(base / t.file, t.name, t.args)
        vms = topo.hosts()
        leaf_of = {vm: topo.nodeInfo(vm).get("leaf") for vm in vms}
        for vm, host in place(vms, leaf_of, p.vms_per_host, strategy, seed, p.map).items():
            topo.nodeInfo(vm)["phys"] = host
        return topo, []
    except _Invalid as e:
        return None, [e.problem]
    except (ValueError, KeyError) as e:  # LeafSpine's counts, topo.placement's placement
        text = str(e).strip('"')
        if "host layer" in text or "physical host name" in text:
            return None, [Explained(("hosts",), text)]
        field = ("placement", "map") if p.map and "host" in text else ("placement",) \
            if "placement" in text or "host" in text else ("topology",)
        return None, [Explained(field, text)]


def _custom(path: Path, name: str, args: dict) -> Topo:
    """``topos[name](**args)`` of the Mininet custom file ``path``.

    Raises:
        _Invalid: no such file, the file raises when loaded, no such key, or the topology
            refuses ``args``.
    """
    spec = importlib.util.spec_from_file_location(f"nslab_custom_{path.stem}", path)
    if spec is None or not path.is_file():
        raise _Invalid(Explained(("topology", "file"), f"topology file {path} not found"))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file: any error it raises is the problem to report
        raise _Invalid(Explained(("topology", "file"), f"{path} does not load: "
                                                       f"{type(e).__name__}: {e}")) from e
    topos = getattr(module, "topos", {})
    if name not in topos:
        raise _Invalid(Explained(("topology", "name"), f"{path} has no topos[{name!r}]",
                                 close_match(name, sorted(topos))
                                 or f"it has {', '.join(sorted(topos)) or 'no topos dict'}"))
    try:
        return topos[name](**args)
    except Exception as e:  # the user's topology refuses the arguments
        raise _Invalid(Explained(("topology", "args"), f"topos[{name!r}](**args) fails: "
                                                       f"{type(e).__name__}: {e}")) from e
