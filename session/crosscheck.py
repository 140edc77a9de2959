"""Checks between a scenario's sections: times within its duration, names that exist in its
topology, job ranks within its VMs, job sets and two_step that name real jobs, an ``lb``
section on a leaf-spine it can run on, ``servers`` that can carry the topology split across
them (``topo.split``).

``cross_check(sc, topo)`` runs on a scenario that may be partly invalid: a top-level section
that failed validation is None, and so is an item of ``faults``, ``load`` or ``jobs`` that
failed (its own error is reported elsewhere); ``topo`` is None when the topology could not be
built. A check whose inputs are unknown is skipped, so no problem is reported twice or
guessed from a default; ``invalid_entry_times`` reads the ``at_s`` of an invalid fault or
flow from the file, so a late one is reported with its entry's other problems.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mininet.topo import Topo

from session.explain import Explained, field_prefix
from session.lb import job_config
from topo.split import Server, SplitError, split

if TYPE_CHECKING:
    from session.scenario import Scenario

NAMES_SHOWN = 8  # a hint lists at most this many existing names


def cross_check(sc: Scenario, topo: Topo | None) -> list[Explained]:
    """Every cross-section problem of ``sc`` (field paths as in the file)."""
    out: list[Explained] = []
    out += _times(sc)
    out += [Explained(("load", i, "dst"), f"the flow goes from `{flow.src}` to itself",
                      "give another VM") for i, flow in _items(sc, "load") if flow.src == flow.dst]
    if topo is not None:
        out += _names(sc, topo)
    out += _jobs(sc, topo)
    out += _needs_agents(sc)
    out += _cassini(sc)
    out += _two_step(sc)
    out += _lb(sc, topo)
    out += _servers(sc, topo)
    return out


def listing(names) -> str:
    """``vm1, vm2, ..., vm16``: in natural order, cut after NAMES_SHOWN."""
    names = sorted(set(names), key=lambda s: [int(t) if t.isdigit() else t
                                              for t in re.split(r"(\d+)", s)])
    shown = names if len(names) <= NAMES_SHOWN else names[:NAMES_SHOWN - 1] + ["...", names[-1]]
    return ", ".join(shown)


def existing(what: str, names) -> str:
    """A hint naming what exists: ``the VMs are vm1, vm2, vm3``."""
    return f"the {what} are {listing(names)}" if names else f"there are no {what}"


def _items(sc: Scenario, section: str):
    return [(i, x) for i, x in enumerate(getattr(sc, section) or []) if x is not None]


def _late(entry: tuple, at_s: float, end: float) -> Explained:
    return Explained((*entry, "at_s"), f"{at_s:g} s is after the scenario ends (duration_s: "
                                       f"{end:g})",
                     f"use at_s from 0 to {end:g}, or a longer duration_s")


def invalid_entry_times(sc: Scenario, data: dict, error_paths: set[tuple]) -> list[Explained]:
    """``at_s`` after the end in the ``faults`` and ``load`` entries that failed validation
    (None in ``sc``) on another field: their ``at_s`` read from the file's ``data`` when it
    is a number and no error of ``error_paths`` (file paths) is on it, so a late entry is
    reported with its other problems, not after they are fixed."""
    end = sc.duration_s
    out = []
    for section in ("faults", "load"):
        raw, parsed = data.get(section), getattr(sc, section) or []
        if end is None or not isinstance(raw, list):
            continue
        for i, entry in enumerate(raw):
            at = entry.get("at_s") if isinstance(entry, dict) else None
            if (i >= len(parsed) or parsed[i] is None) and isinstance(at, int | float) \
                    and not isinstance(at, bool) and (section, i, "at_s") not in error_paths \
                    and at > end:
                out.append(_late((section, i), at, end))
    return out


def _times(sc: Scenario) -> list[Explained]:
    end = sc.duration_s
    if end is None:
        return []
    out = []
    after = f"after the scenario ends (duration_s: {end:g})"
    for i, f in _items(sc, "faults"):
        if f.at_s > end:
            out.append(_late(("faults", i), f.at_s, end))
        elif f.kind == "flap" and f.at_s + f.count * (f.down_s + f.up_s) - f.up_s > end:
            last = f.at_s + f.count * (f.down_s + f.up_s) - f.up_s
            out.append(Explained(("faults", i), f"the flap's last link_up, at {last:g} s, is "
                                                f"{after}", "fewer flaps or a longer duration_s"))
    for i, flow in _items(sc, "load"):
        if flow.at_s > end:
            out.append(_late(("load", i), flow.at_s, end))
        elif flow.at_s + flow.duration_s > end:
            out.append(Explained(("load", i, "duration_s"),
                                 f"the flow ends at {flow.at_s + flow.duration_s:g} s, {after}",
                                 f"at most duration_s: {end - flow.at_s:g} from at_s "
                                 f"{flow.at_s:g}"))
    return out


def _names(sc: Scenario, topo: Topo) -> list[Explained]:
    vms = set(topo.hosts())
    hosts = {topo.nodeInfo(vm).get("phys") for vm in vms} - {None}
    out = []

    def vm(path, name):
        if name is not None and name not in vms:
            out.append(Explained(path, f"no VM `{name}` in the topology",
                                 existing("VMs", vms)))

    def host(path, name):
        if name not in hosts:
            out.append(Explained(path, f"no physical host `{name}`",
                                 existing("physical hosts", hosts)))

    for i, f in _items(sc, "faults"):
        vm(("faults", i, "vm"), getattr(f, "vm", None))
        if getattr(f, "link", None) is not None:
            out += _link(topo, ("faults", i, "link"), f.link, needs_bw=f.kind == "rate")
        if f.kind == "migrate":
            host(("faults", i, "to"), f.to)
    for i, flow in _items(sc, "load"):
        vm(("load", i, "src"), flow.src)
        vm(("load", i, "dst"), flow.dst)
    for i, job in _items(sc, "jobs"):
        for k, name in enumerate(job.placement if isinstance(job.placement, list) else []):
            vm(("jobs", i, "placement", k), name)
    if sc.agents is not None:
        vm(("agents", "coordinator"), sc.agents.coordinator)
    if sc.chrony is not None:
        vm(("chrony", "server"), sc.chrony.server)
    if sc.clock_daemons is not None:
        vm(("clock_daemons", "server"), sc.clock_daemons.server)
        for name in sc.clock_daemons.clients:
            vm(("clock_daemons", "clients", name), name)
        if sc.clock_daemons.enabled and sc.chrony is not None and sc.chrony.enabled:
            out.append(Explained(("clock_daemons", "enabled"), "chrony: runs chronyd in every "
                                 "VM, where the matrix runs one daemon per VM",
                                 "enable one of chrony and clock_daemons"))
    for h in (sc.hosts.overrides if sc.hosts is not None else {}):
        host(("hosts", "overrides", h), h)
    if sc.clocks is not None:
        for h in sc.clocks.host_drift_ppm:
            host(("clocks", "host_drift_ppm", h), h)
        for name in sc.clocks.vm_offset_ms:
            vm(("clocks", "vm_offset_ms", name), name)
    return out


def _link(topo: Topo, path, link: tuple[str, str], needs_bw: bool) -> list[Explained]:
    nodes = set(topo.nodes())
    for n in link:
        if n not in nodes:
            return [Explained(path, f"no node `{n}` in the topology", existing("nodes", nodes))]
    a, b = link
    for x, y, info in topo.links(withInfo=True):
        if {x, y} == {a, b}:
            if needs_bw and "bw" not in info:
                return [Explained(path, f"a rate change needs a shaped link; {a}-{b} has no bw",
                                  "give the topology host_bw or fabric_bw")]
            return []
    peers = {y if x == a else x for x, y in topo.links() if a in (x, y)}
    return [Explained(path, f"no link between `{a}` and `{b}`",
                      f"`{a}` has links to {listing(peers)}")]


def _jobs(sc: Scenario, topo: Topo | None) -> list[Explained]:
    out, seen = [], {}
    n_vms = len(topo.hosts()) if topo is not None else None
    for i, job in _items(sc, "jobs"):
        if job.name in seen:
            out.append(Explained(("jobs", i, "name"), f"job name `{job.name}` is also jobs"
                                                      f"[{seen[job.name]}]'s; give each job "
                                                      "its own"))
        seen.setdefault(job.name, i)
        if n_vms is not None and job.ranks > n_vms:
            out.append(Explained(("jobs", i, "ranks"), f"{job.ranks} ranks but the topology "
                                                       f"has {n_vms} VMs (one rank per VM)",
                                 f"at most ranks: {n_vms}"))
        if job.balancer != "none" and sc.fabric is not None and sc.fabric.mode != "entropy":
            out.append(Explained(("jobs", i, "balancer"), f"{job.balancer} steers by DSCP, which "
                                 f"fabric mode {sc.fabric.mode} ignores",
                                 "set fabric: {mode: entropy}"))
        try:
            job.count_for(job.ranks)
        except ValueError as e:
            name, message = field_prefix(str(e), type(job).model_fields)
            out.append(Explained(("jobs", i) + ((name,) if name else ()), message))
    return out


def _needs_agents(sc: Scenario) -> list[Explained]:
    """What needs the agents when ``agents.enabled`` is false."""
    if sc.agents is None or sc.agents.enabled:
        return []
    out = [Explained(("jobs", i, "placement"), "collocation_aware places ranks from the "
                     "agents' groups", "set agents: {enabled: true}")
           for i, job in _items(sc, "jobs") if job.placement == "collocation_aware"]
    out += [Explained(("jobs", i, "pacer"), "the pacer gates on the agents' synchronized "
                      "clocks", "set agents: {enabled: true}, or pacer: off")
            for i, job in _items(sc, "jobs") if job.pacer != "off"]
    if sc.two_step is not None:
        out.append(Explained(("two_step",), "the steps choose VMs from the agents' "
                             "collocation groups and run the pacers",
                             "set agents: {enabled: true}"))
    if sc.chrony is not None and sc.chrony.enabled:
        out.append(Explained(("chrony", "enabled"), "chrony is scored beside the agents",
                             "set agents: {enabled: true}"))
    if sc.clock_daemons is not None and sc.clock_daemons.enabled:
        out.append(Explained(("clock_daemons", "enabled"), "the clock daemons are scored "
                             "beside the agents", "set agents: {enabled: true}"))
    return out


def _cassini(sc: Scenario) -> list[Explained]:
    if sc.cassini is None or sc.jobs is None:
        return []
    complete = None not in sc.jobs  # an invalid job's name is unknown: do not call it absent
    specs = {j.name: j for _, j in _items(sc, "jobs")}
    out = []
    for k, s in enumerate(sc.cassini.sets):
        path = ("cassini", "sets", k, "jobs")
        for j, name in enumerate(s.jobs):
            if name not in specs:
                if complete:
                    out.append(Explained(path + (j,), f"no job `{name}` in jobs",
                                         existing("jobs", specs)))
            elif not isinstance(specs[name].placement, list):
                out.append(Explained(path + (j,), f"job `{name}` needs its VMs listed (placement: "
                                           "[vm, ...]) to share the set's link"))
        used = [v for name in s.jobs if isinstance(getattr(specs.get(name), "placement", None),
                                                   list) for v in specs[name].placement]
        if len(set(used)) != len(used):
            out.append(Explained(path, f"the jobs of {s.name} share a VM; give each its own "
                                       "VMs"))
    if "unfair" in sc.cassini.modes and sc.fabric is not None and sc.fabric.mode == "entropy":
        out.append(Explained(("cassini", "modes"), "the unfair mode marks jobs by DSCP, which "
                             "the entropy fabric reads as path slots", "use fabric mode ecmp "
                             "or spray, or leave unfair out of the modes"))
    return out


def _two_step(sc: Scenario) -> list[Explained]:
    if sc.two_step is None or sc.jobs is None or None in sc.jobs:
        return []
    names = [j.name for j in sc.jobs]
    if sc.two_step.job in names:
        return []
    return [Explained(("two_step", "job"), f"no job `{sc.two_step.job}` in jobs",
                      existing("jobs", names))]


def _lb(sc: Scenario, topo: Topo | None) -> list[Explained]:
    """The ``lb`` section needs a leaf-spine with rates, a leaf-spine link to fail, and a
    power-of-two number of VMs for halving_doubling."""
    if sc.lb is None or sc.topology is None:
        return []
    t = sc.topology
    if t.kind != "leafspine" or t.pods or t.spines < 2:
        return [Explained(("lb",), "the comparison needs a two-tier leaf-spine with at least "
                                   "2 spines", "topology: {kind: leafspine, spines: 4, pods: 0}")]
    if t.host_bw is None or t.fabric_bw is None:
        return [Explained(("lb",), "the comparison sets leaf-spine rates: the links need one",
                          "give the topology host_bw and fabric_bw")]
    out = []
    if topo is not None:
        out += _link(topo, ("lb", "link"), sc.lb.link, needs_bw=True)
        roles = {topo.nodeInfo(n).get("role") for n in sc.lb.link if n in topo.nodes()}
        if not out and roles != {"leaf", "spine"}:
            out.append(Explained(("lb", "link"), f"{'-'.join(sc.lb.link)} is not a leaf-spine "
                                                 "link", "e.g. [leaf1, spine1]"))
        n = len(topo.hosts())
        if "halving_doubling" in sc.lb.collectives and n & (n - 1):
            out.append(Explained(("lb", "collectives"), f"halving_doubling needs a power-of-two "
                                                        f"number of VMs, the topology has {n}",
                                 "another vms_per_leaf or leaves, or leave it out"))
        if sc.lb.trace is not None:
            out += _lb_trace(sc, n)
    return out


def _servers(sc: Scenario, topo: Topo | None) -> list[Explained]:
    out = [Explained(("servers", i, "ssh"), "the first server is the one nslab runs on"
                     if i == 0 else "a server after the first is reached over SSH",
                     "leave ssh out" if i == 0 else "give its SSH target, root@ADDRESS")
           for i, s in enumerate(sc.servers) if bool(s.ssh) != (i > 0)]
    if topo is not None and (sc.servers or sc.server_placement):
        servers = [s.server() for s in sc.servers] or [Server("local", "127.0.0.1")]
        try:
            split(topo, servers, sc.server_placement)
        except SplitError as e:
            out += [Explained(("server_placement",), p.removeprefix("placement: "))
                    if p.startswith("placement: ") else Explained(("servers",), p)
                    for p in e.problems]
    return out


def _lb_trace(sc: Scenario, n: int) -> list[Explained]:
    """The ``lb`` section's trace loads and fits the topology's ``n`` VMs."""
    try:
        job_config(sc.lb, "ecmp", "trace").count_for(n)
    except ValueError as e:
        return [Explained(("lb", "trace"), str(e).removeprefix("trace: "))]
    return []
