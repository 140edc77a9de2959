"""Scenario files: YAML validated against a schema before anything is built.

``load(path_or_name)`` returns a ``Scenario`` or raises ``ScenarioError`` listing every problem
with its field path (``topology.spines: Input should be greater than 0``). Built-in scenarios
live in ``session/scenarios/*.yaml``; ``quickstart`` is the default. The field reference is
``Scenario``'s JSON schema (``nslab schema``) and the README.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

import yaml
from mininet.topo import Topo
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lab.clocks import ClockConfig
from lab.errors import ScenarioError
from lab.events import FAULT_TYPES, Fault
from lab.fabric import FabricMode
from lab.tc import LinkParams
from session.chrony import ChronySpec
from session.daemons import AgentsSpec
from session.load import Flow
from topo.leafspine import LeafSpine
from topo.placement import STRATEGIES
from workloads.config import JobConfig

BUILTIN_DIR = Path(__file__).parent / "scenarios"
DEFAULT = "quickstart"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LinkSpec(_Strict):
    """Emulation applied to every link (Mininet's link options; units in the names' docs)."""

    delay: str | None = Field(None, description="one-way delay, e.g. '100us', '2ms' (netem)")
    jitter: str | None = Field(None, description="delay variation, e.g. '50us' (netem)")
    loss: float | None = Field(None, ge=0, le=100, description="random loss, percent")
    reorder: float | None = Field(None, ge=0, le=100, description="reordering, percent (netem)")

    @model_validator(mode="after")
    def _check(self):
        LinkParams(delay=self.delay, jitter=self.jitter, loss=self.loss,
                   reorder=self.reorder).validate()
        return self


class TopologySpec(_Strict):
    """``kind: leafspine`` (the parameters below) or ``kind: custom`` (a Mininet topology file
    with a ``topos`` dict, as for ``mn --custom``)."""

    kind: Literal["leafspine", "custom"] = "leafspine"
    spines: int = Field(2, gt=0)
    leaves: int = Field(2, gt=0)
    vms_per_leaf: int = Field(2, gt=0, le=250)
    pods: int = Field(0, ge=0, description="0: two tiers; >= 1: pods under super-spines")
    superspines: int = Field(2, gt=0)
    host_bw: float | None = Field(None, gt=0, description="VM-leaf rate, Mbit/s")
    fabric_bw: float | None = Field(None, gt=0, description="leaf-spine rate, Mbit/s")
    super_bw: float | None = Field(None, gt=0, description="spine-superspine rate, Mbit/s")
    host_queue: int | None = Field(None, gt=0, description="VM-leaf queue limit, packets")
    fabric_queue: int | None = Field(None, gt=0, description="fabric queue limit, packets")
    link: LinkSpec = LinkSpec()
    file: str | None = Field(None, description="custom: path of the topology file")
    name: str | None = Field(None, description="custom: key in the file's topos dict")
    args: dict = Field(default_factory=dict, description="custom: keyword arguments")

    @model_validator(mode="after")
    def _custom_needs_file(self):
        if self.kind == "custom" and not (self.file and self.name):
            raise ValueError("kind custom needs 'file' and 'name'")
        return self


class FabricSpec(_Strict):
    """How the routers choose among equal-cost paths (``lab.fabric``)."""

    mode: FabricMode = Field("ecmp", description="ecmp: per-flow hash; spray: a random path "
                             "per packet at every router; entropy: DSCP k takes path slot k "
                             "(a load balancer in the hosts chooses)")


class PlacementSpec(_Strict):
    vms_per_host: int = Field(1, gt=0, description="VMs per physical host")
    strategy: Literal[STRATEGIES] = "packed"  # type: ignore[valid-type]
    map: dict[str, str] | None = Field(None, description="explicit: VM -> physical host")


class HostCpuSpec(_Strict):
    cpu_cores: float | None = Field(None, gt=0, description="CPU budget, cores")
    cpuset: str | None = Field(None, description="cores, e.g. '0' or '0-1'")


class HostsSpec(HostCpuSpec):
    """CPU budget of every physical host, with per-host ``overrides``."""

    overrides: dict[str, HostCpuSpec] = Field(default_factory=dict)


class JobSpec(JobConfig):
    """A job of the scenario: its ``JobConfig`` (what it runs) plus its name, rank count and
    placement. Jobs run one after another after the fault timeline."""

    name: str
    ranks: int = Field(4, ge=1)
    placement: str | list[str] = Field("naive", description="naive, collocation_aware (from "
                                       "the agents' groups) or a list of VMs, one per rank")

    @model_validator(mode="after")
    def _policy(self):
        if isinstance(self.placement, str) and self.placement not in ("naive",
                                                                      "collocation_aware"):
            raise ValueError("placement must be naive, collocation_aware or a list of VMs")
        if isinstance(self.placement, list) and len(self.placement) != self.ranks:
            raise ValueError(f"placement lists {len(self.placement)} VMs for {self.ranks} ranks")
        return self

    def config(self) -> JobConfig:
        """What the job runs, without the scenario's name, ranks and placement."""
        return JobConfig.model_validate(self.model_dump(include=set(JobConfig.model_fields),
                                                        exclude_unset=True))


CassiniMode = Literal["fair", "shifted_synced", "shifted_raw"]


class CassiniSet(_Strict):
    """Jobs (names of the scenario's ``jobs``) that share one link."""

    name: str
    jobs: list[str] = Field(min_length=1, description="names of the scenario's jobs")


class CassiniSpec(_Strict):
    """The scenario's ``cassini`` section: job sets, the shared link's capacity, the modes and
    the scheduler's parameters (``scheduler.plan``)."""

    capacity_mbit: float = Field(gt=0, description="rate of the link the jobs of a set share, "
                                 "Mbit/s")
    sets: list[CassiniSet] = Field(min_length=1)
    modes: list[CassiniMode] = Field(
        default_factory=lambda: ["fair", "shifted_synced", "shifted_raw"], min_length=1,
        description="fair: together, back to back; shifted_synced: CASSINI slots on clocks "
        "corrected by the agents; shifted_raw: the slots on raw VM clocks")
    margin: float = Field(0.1, ge=0, le=10, description="slot = iteration alone * (1 + margin)"
                          ", rounded up to quantum_s")
    quantum_s: float = Field(0.05, gt=0, le=60, description="slots are multiples of it, s")
    threshold: float = Field(0.95, le=1, description="a set is predicted compatible when its "
                             "score is at least this")

    @model_validator(mode="after")
    def _distinct(self) -> CassiniSpec:
        for s in self.sets:
            if len(set(s.jobs)) != len(s.jobs):
                raise ValueError(f"sets: {s.name} names a job twice")
        return self


class Scenario(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]{0,15}$", description="also the lab name")
    description: str = ""
    seed: int = 1
    duration_s: float = Field(10.0, gt=0, description="how long the lab runs after bring-up")
    topology: TopologySpec = TopologySpec()
    fabric: FabricSpec = FabricSpec()
    placement: PlacementSpec = PlacementSpec()
    hosts: HostsSpec = HostsSpec()
    clocks: ClockConfig = ClockConfig()
    faults: list[Fault] = Field(default_factory=list, description="the fault timeline: each "
                                "entry is injected at its at_s")
    agents: AgentsSpec = AgentsSpec()
    chrony: ChronySpec = ChronySpec()
    load: list[Flow] = Field(default_factory=list, description="background iperf3 flows")
    jobs: list[JobSpec] = Field(default_factory=list)
    cassini: CassiniSpec | None = Field(None, description="job sets sharing a link, run alone, "
                                        "then together in each mode (session.cassini); their "
                                        "jobs leave the one-after-another turn")

    @model_validator(mode="after")
    def _cassini_jobs(self) -> Scenario:
        if self.cassini is None:
            return self
        specs = {j.name: j for j in self.jobs}
        for s in self.cassini.sets:
            for name in s.jobs:
                if name not in specs:
                    raise ValueError(f"cassini.sets: {s.name} names job {name!r}, not in jobs")
                if not isinstance(specs[name].placement, list):
                    raise ValueError(f"cassini.sets: job {name} needs its VMs listed "
                                     "(placement: [vm, ...]) to share the set's link")
            used = [v for name in s.jobs for v in specs[name].placement]
            if len(set(used)) != len(used):
                raise ValueError(f"cassini.sets: the jobs of {s.name} share a VM; give each "
                                 "its own VMs")
        return self

    def cassini_jobs(self) -> set[str]:
        """Names of the jobs that run in the cassini sets."""
        return {n for s in self.cassini.sets for n in s.jobs} if self.cassini else set()


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def resolve(name_or_path: str | None) -> Path:
    """A built-in scenario name or a file path -> the file.

    Raises:
        ScenarioError: neither a file nor a built-in name.
    """
    name_or_path = name_or_path or DEFAULT
    path = Path(name_or_path)
    if path.is_file():
        return path
    builtin = BUILTIN_DIR / f"{name_or_path}.yaml"
    if builtin.is_file():
        return builtin
    raise ScenarioError(name_or_path, [("", f"no such file and no built-in scenario; built-ins: "
                                             f"{', '.join(builtin_names())}")])


def load(name_or_path: str | None) -> tuple[Scenario, Topo]:
    """Parse, validate and build the topology (pure data, no root) of a scenario.

    Returns:
        (scenario, topology) ready for ``Lab``.

    Raises:
        ScenarioError: every problem found, each with its field path.
    """
    path = resolve(name_or_path)
    source = str(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ScenarioError(source, [("", f"not valid YAML: {e}")]) from e
    if not isinstance(doc, dict):
        raise ScenarioError(source, [("", "expected a mapping at the top level")])
    try:
        sc = Scenario.model_validate(doc)
    except ValidationError as e:
        raise ScenarioError(source, [(_path(err["loc"]), _msg(err)) for err in e.errors()]) from e
    topo, errors = _topology(sc, path.parent)
    if topo is not None:
        errors += _cross_check(sc, topo)
    if errors:
        raise ScenarioError(source, errors)
    return sc, topo


def _path(loc) -> str:
    out = ""
    for i, part in enumerate(loc):
        if i >= 2 and loc[i - 2] == "faults" and part in FAULT_TYPES:
            continue  # the union's tag: faults[0].link_down.link -> faults[0].link
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _msg(err: dict) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown field"
    return err["msg"].removeprefix("Value error, ")


def _topology(sc: Scenario, base: Path) -> tuple[Topo | None, list[tuple[str, str]]]:
    t, p = sc.topology, sc.placement
    link = {k: v for k, v in t.link.model_dump().items() if v is not None}
    strategy = "explicit" if p.map else p.strategy
    try:
        if t.kind == "leafspine":
            topo = LeafSpine(spines=t.spines, leaves=t.leaves, vms_per_leaf=t.vms_per_leaf,
                             pods=t.pods, superspines=t.superspines, host_bw=t.host_bw,
                             fabric_bw=t.fabric_bw, super_bw=t.super_bw, host_queue=t.host_queue,
                             fabric_queue=t.fabric_queue, link_opts=link,
                             vms_per_host=p.vms_per_host, placement=strategy, seed=sc.seed,
                             explicit=p.map)
        else:
            topo = _custom(base / t.file, t.name, t.args)
            _place_custom(topo, p, sc.seed)
    except (ValueError, KeyError, FileNotFoundError) as e:
        field = "placement" if "placement" in str(e) or "host" in str(e) else "topology"
        return None, [(field, str(e))]
    return topo, []


def _custom(path: Path, name: str, args: dict) -> Topo:
    spec = importlib.util.spec_from_file_location(f"nslab_custom_{path.stem}", path)
    if spec is None or not path.is_file():
        raise FileNotFoundError(f"topology file {path} not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    topos = getattr(module, "topos", {})
    if name not in topos:
        raise KeyError(f"{path} has no topos[{name!r}]; it has {sorted(topos)}")
    return topos[name](**args)


def _place_custom(topo: Topo, p: PlacementSpec, seed: int) -> None:
    from topo.placement import place
    vms = topo.hosts()
    leaf_of = {vm: topo.nodeInfo(vm).get("leaf") for vm in vms}
    strategy = "explicit" if p.map else p.strategy
    for vm, host in place(vms, leaf_of, p.vms_per_host, strategy, seed, p.map).items():
        topo.nodeInfo(vm)["phys"] = host


def _cross_check(sc: Scenario, topo: Topo) -> list[tuple[str, str]]:
    """Names in faults, hosts and clocks that the topology does not have."""
    errors = []
    vms = set(topo.hosts())
    nodes = set(topo.nodes())
    hosts = {topo.nodeInfo(vm).get("phys") for vm in vms}
    links = {frozenset((a, b)) for a, b in topo.links()}
    for i, f in enumerate(sc.faults):
        if f.at_s > sc.duration_s:
            errors.append((f"faults[{i}].at_s", f"{f.at_s} s is after the scenario ends "
                                                 f"(duration_s {sc.duration_s})"))
        vm, link = getattr(f, "vm", None), getattr(f, "link", None)
        if vm is not None and vm not in vms:
            errors.append((f"faults[{i}].vm", f"no VM {vm!r} in the topology"))
        if link is not None:
            bad = [n for n in link if n not in nodes]
            if bad:
                errors.append((f"faults[{i}].link", f"no node {bad[0]!r} in the topology"))
            elif frozenset(link) not in links:
                errors.append((f"faults[{i}].link", f"no link between {link[0]} and {link[1]}"))
            elif f.kind == "rate" and "bw" not in _link_info(topo, *link):
                errors.append((f"faults[{i}].link", "rate change on a link without a bw"))
        if f.kind == "migrate" and f.to not in hosts:
            errors.append((f"faults[{i}].to", f"no physical host {f.to!r}; hosts are "
                                               f"{', '.join(sorted(hosts))}"))
    for i, flow in enumerate(sc.load):
        for end in ("src", "dst"):
            if getattr(flow, end) not in vms:
                errors.append((f"load[{i}].{end}", f"no VM {getattr(flow, end)!r}"))
    for i, job in enumerate(sc.jobs):
        if job.ranks > len(vms):
            errors.append((f"jobs[{i}].ranks", f"{job.ranks} ranks but only {len(vms)} VMs"))
        if isinstance(job.placement, list):
            for vm in job.placement:
                if vm not in vms:
                    errors.append((f"jobs[{i}].placement", f"no VM {vm!r}"))
        if job.placement == "collocation_aware" and not sc.agents.enabled:
            errors.append((f"jobs[{i}].placement", "collocation_aware needs agents.enabled"))
    if sc.agents.coordinator is not None and sc.agents.coordinator not in vms:
        errors.append(("agents.coordinator", f"no VM {sc.agents.coordinator!r}"))
    if sc.chrony.enabled and not sc.agents.enabled:
        errors.append(("chrony.enabled", "chrony is scored beside the agents: needs "
                                         "agents.enabled"))
    if sc.chrony.server is not None and sc.chrony.server not in vms:
        errors.append(("chrony.server", f"no VM {sc.chrony.server!r}"))
    for h in sc.hosts.overrides:
        if h not in hosts:
            errors.append((f"hosts.overrides.{h}", f"no physical host {h!r}"))
    for h in sc.clocks.host_drift_ppm:
        if h not in hosts:
            errors.append((f"clocks.host_drift_ppm.{h}", f"no physical host {h!r}"))
    for vm in sc.clocks.vm_offset_ms:
        if vm not in vms:
            errors.append((f"clocks.vm_offset_ms.{vm}", f"no VM {vm!r}"))
    return errors


def _link_info(topo: Topo, a: str, b: str) -> dict:
    for x, y, info in topo.links(withInfo=True):
        if {x, y} == {a, b}:
            return info
    return {}

