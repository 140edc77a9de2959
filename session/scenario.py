"""Scenario files: YAML validated against a schema before anything is built.

``load(path_or_name)`` returns a ``Scenario`` or raises ``ScenarioError`` listing every problem
at once, each with its field path, file and line, in plain words
(``s.yaml:3:37: topology.fabirc_bw: unknown field `fabirc_bw`; did you mean `fabric_bw`?``):
``session.yamlmarks`` keeps the lines, ``session.explain`` words pydantic's errors,
``session.crosscheck`` checks the sections against each other, ``session.topology`` builds the
Topo. Built-in scenarios
live in ``session/scenarios/*.yaml``; ``quickstart`` is the default. The field reference is
``Scenario``'s JSON schema (``nslab schema scenario``), from which the docs' scenario reference
is generated.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Literal, TypeVar, get_args, get_origin

from mininet.topo import Topo
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from contracts.enums import (
    PLACEMENT_POLICIES,
    BalancerMode,
    CassiniModeName,
    LbCase,
    LbCollective,
    PacerMode,
)
from contracts.events import Fault
from lab.clocks import ClockConfig
from lab.errors import ScenarioError, ScenarioProblem
from lab.fabric import FabricMode
from lab.tc import LinkParams, parse_time_us
from session import yamlmarks
from session.chrony import ChronySpec
from session.clockd import ClockDaemonsSpec
from session.crosscheck import cross_check, invalid_entry_times
from session.daemons import AgentsSpec, PacerSpec
from session.explain import Explained, explain, file_path
from session.load import Flow
from session.topology import build
from topo.placement import STRATEGIES
from topo.split import Server
from workloads.config import JobConfig, resolve_trace

BUILTIN_DIR = Path(__file__).parent / "scenarios"
M = TypeVar("M", bound=BaseModel)
DEFAULT = "quickstart"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LinkSpec(_Strict):
    """Emulation applied to every link (Mininet's link options; units in the names' docs)."""

    delay: str | None = Field(None, description="one-way delay with a unit (netem)",
                              examples=["100us", "2ms"])
    jitter: str | None = Field(None, description="delay variation with a unit (netem)",
                               examples=["50us"])
    loss: float | None = Field(None, ge=0, le=100, description="random loss, percent")
    reorder: float | None = Field(None, ge=0, le=100, description="reordering, percent (netem)")

    @field_validator("delay", "jitter")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None:
            parse_time_us(v)
        return v

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


class ServerSpec(_Strict):
    """One server of a lab split across servers (``topo.split``): the first is the one nslab
    runs on, the others are reached over SSH."""

    address: str = Field(examples=["10.0.0.2"], description="its IPv4 address on the servers' "
                         "network: the cut links' VXLAN underlay")
    ssh: str = Field("", examples=["root@10.0.0.2"], description="SSH target (key "
                     "authentication, root); empty for the first server")
    name: str | None = Field(None, description="how server_placement names it (default: its "
                             "address)")
    nic_mbit: float | None = Field(None, gt=0, description="what its NIC carries per "
                                   "direction, Mbit/s: the shaped cut links crossing it must "
                                   "fit (not checked when empty)")

    def server(self) -> Server:
        """The ``topo.split.Server`` it describes."""
        return Server(self.name or self.address, self.address, self.ssh, self.nic_mbit)


class HostCpuSpec(_Strict):
    cpu_cores: float | None = Field(None, ge=0.001, description="CPU budget, cores (CFS "
                                    "quota over 10 ms; under 0.1 core a longer period)")
    cpuset: str | None = Field(None, description="cores, e.g. '0' or '0-1'")


class HostNicSpec(_Strict):
    """A physical host's NIC and virtual switch (``topo.hosts``); any of them builds the host
    layer."""

    nic_bw: float | None = Field(None, gt=0, description="the host NIC's rate, Mbit/s, shared "
                                 "by its VMs (None: unshaped)")
    nic_queue: int | None = Field(None, gt=0, description="the host NIC's queue limit, packets")
    vswitch_delay_us: float | None = Field(None, ge=0, description="delay of the host's "
                                           "virtual switch toward each VM, us (netem)")

    def nic_options(self) -> dict:
        """The given NIC fields (``topo.hosts.host_nics``' keys)."""
        return self.model_dump(include=set(HostNicSpec.model_fields), exclude_none=True)


class HostSpec(HostCpuSpec, HostNicSpec):
    """One physical host's overrides."""


class HostsSpec(HostCpuSpec, HostNicSpec):
    """CPU budget and NIC of every physical host, with per-host ``overrides``."""

    overrides: dict[str, HostSpec] = Field(default_factory=dict)
    reserve: bool = Field(False, description="the lab's hosts get their budgets before the "
                          "machine's other processes (the lab weighs as 100 of them; the "
                          "quotas still cap each host)")
    vswitch: bool = Field(False, description="build the host layer (each host a node between "
                          "its VMs and its leaf: its virtual switch and its NIC) even without "
                          "nic_bw, nic_queue or vswitch_delay_us")

    def host_layer(self) -> dict | None:
        """The host layer's options (``LeafSpine``'s ``hosts``), or None without one."""
        overrides = {h: o.nic_options() for h, o in self.overrides.items() if o.nic_options()}
        if not (self.vswitch or self.nic_options() or overrides):
            return None
        return {**self.nic_options(), "overrides": overrides}


class JobSpec(JobConfig):
    """A job of the scenario: its ``JobConfig`` (what it runs) plus its name, rank count and
    placement. Jobs run one after another after the fault timeline."""

    name: str = Field(examples=["train"])
    ranks: int = Field(4, ge=1)
    placement: str | list[str] = Field("naive", description="naive, collocation_aware (from "
                                       "the agents' groups as the jobs begin) or a list of "
                                       "VMs, one per rank",
                                       examples=["naive", ["vm1", "vm3"]])
    pacer: PacerMode = Field(
        "off", description="the pacer in the job's VMs while it runs: sense (measure TCP and "
        "OWD only) or pace (On-Ramp's hold); parameters in the scenario's pacer section")

    @model_validator(mode="after")
    def _policy(self):
        if isinstance(self.placement, str) and self.placement not in PLACEMENT_POLICIES:
            raise ValueError("placement must be naive, collocation_aware or a list of VMs")
        if isinstance(self.placement, list) and len(self.placement) != self.ranks:
            raise ValueError(f"placement lists {len(self.placement)} VMs for {self.ranks} ranks")
        return self

    def config(self) -> JobConfig:
        """What the job runs, without the scenario's name, ranks and placement."""
        return JobConfig.model_validate(self.model_dump(include=set(JobConfig.model_fields),
                                                        exclude_unset=True))


UNFAIR_MAX_JOBS = 7
"""Jobs of a set in the unfair mode at most: HTB prios 0..6 (7 is the unmarked class's)."""


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
    modes: list[CassiniModeName] = Field(
        default_factory=lambda: ["fair", "shifted_synced", "shifted_raw", "unfair"],
        min_length=1, description="fair: together, back to back; shifted_synced: CASSINI "
        "slots on clocks corrected by the agents; shifted_raw: the slots on raw VM clocks; "
        "unfair: back to back, the k-th job of a set marked DSCP 8 (k + 1) and given a "
        "fabric class of HTB prio k (unfair_shares)")
    unfair_shares: list[Annotated[float, Field(gt=0, lt=1)]] = Field(
        default_factory=lambda: [0.05], min_length=1, description="unfair mode: the fraction "
        "of every fabric link guaranteed to the k-th job's class (the last value for jobs "
        "beyond the list; the rest of the link is lent to the classes in prio order, so "
        "small equal shares are a strict priority by the set's order)")
    margin: float = Field(0.1, ge=0, le=10, description="slot = iteration alone * (1 + margin)"
                          ", rounded up to quantum_s")
    quantum_s: float = Field(0.05, gt=0, le=60, description="slots are multiples of it, s")
    threshold: float = Field(0.95, le=1, description="a set is predicted compatible when its "
                             "score is at least this")

    def unfair_share(self, k: int) -> float:
        """The k-th job's (0-based) fraction of a fabric link in the unfair mode."""
        return self.unfair_shares[min(k, len(self.unfair_shares) - 1)]

    @model_validator(mode="after")
    def _distinct(self) -> CassiniSpec:
        for s in self.sets:
            if len(set(s.jobs)) != len(s.jobs):
                raise ValueError(f"sets: {s.name} names a job twice")
            if "unfair" not in self.modes:
                continue
            if len(s.jobs) > UNFAIR_MAX_JOBS:
                raise ValueError(f"sets: {s.name} has {len(s.jobs)} jobs; the unfair mode "
                                 f"classes at most {UNFAIR_MAX_JOBS}")
            total = sum(self.unfair_share(k) for k in range(len(s.jobs)))
            if total >= 1:
                raise ValueError(f"unfair_shares: the jobs of {s.name} take {total:g} of a "
                                 "link; keep the sum below 1 (unmarked traffic needs a class)")
        return self


class TwoStepSpec(_Strict):
    """The scenario's ``two_step`` section (``session.two_step``): one job run naive, on
    collocation-aware VMs, on those with the pacer, and with BBR and CUBIC as baselines."""

    job: str = Field(description="name of one of the scenario's jobs (it leaves the "
                                 "one-after-another turn); its placement is each step's")


class LbSpec(_Strict):
    """The scenario's ``lb`` section (``session.lb``): the load balancers compared on one job
    per collective, symmetric, with a leaf-spine link down mid-job and with it degraded, at
    each oversubscription. The job runs on every VM (rank order = VM order)."""

    modes: list[BalancerMode] = Field(
        default_factory=lambda: ["ecmp", "spray", "reps", "ethereal"], min_length=1,
        description="ecmp: per-flow hash; spray: per-packet spraying at the routers; reps, "
        "ethereal: the hosts' balancer over DSCP-pinned paths (fabric mode entropy)")
    collectives: list[LbCollective] = Field(
        default_factory=lambda: ["all_to_all", "halving_doubling", "ring"], min_length=1,
        description="all_to_all; halving_doubling or ring: AllReduce algorithms; trace: the "
        "section's trace replayed (its collectives' sizes, not bytes)")
    cases: list[LbCase] = Field(
        default_factory=lambda: ["symmetric", "link_down", "degraded"], min_length=1,
        description="symmetric; link_down: `link` down mid-job (up again after); degraded: "
        "`link` at degraded_fraction of its rate during the job")
    oversubscription: list[Annotated[float, Field(ge=1)]] = Field(
        default_factory=lambda: [1.0], min_length=1, description="leaf-spine rates so that a "
        "leaf's uplinks carry 1/x of its VMs' rate (1: 1:1), one pass each")
    bytes: int = Field(4_000_000, ge=1, description="nccl-tests size of every job, bytes")
    iterations: int = Field(2, ge=1, le=100, description="timed iterations (plus one warm-up)")
    conns_per_peer: int = Field(4, ge=2, le=16, description="TCP connections per peer in every "
                                "mode (one per path for reps and ethereal: the spines)")
    link: tuple[str, str] = Field(("leaf1", "spine1"), description="the leaf-spine link of "
                                  "the link_down and degraded cases")
    degraded_fraction: float = Field(0.25, gt=0, lt=1, description="degraded: the link's rate "
                                     "as a fraction of the others'")
    down_at: float = Field(0.5, ge=0, le=1, description="link_down: when, as a fraction of the "
                           "bytes the link's leaf moved on its uplinks in the mode's symmetric "
                           "run (warm-up included), counted from the job's launch")
    timeout_s: float = Field(60.0, gt=0, le=3600, description="each job's timeout, s")
    trace: str | None = Field(None, description="collective trace: the workload trace replayed "
                              "(a job's trace: a path or a built-in trace's name)")
    trace_compute_scale: float = Field(1.0, gt=0, le=1e6, description="collective trace: the "
                                       "job's trace_compute_scale")
    trace_bytes_scale: float = Field(1.0, gt=0, le=1e3, description="collective trace: the "
                                     "job's trace_bytes_scale")

    _resolve = field_validator("trace")(resolve_trace)

    @model_validator(mode="after")
    def _trace(self) -> LbSpec:
        if ("trace" in self.collectives) != (self.trace is not None):
            raise ValueError("trace: give a trace exactly when collectives lists trace")
        return self


class Scenario(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]{0,15}$", examples=["mylab"],
                      description="the scenario's name, also its lab's: lower-case "
                      "letters, digits and _, at most 16 characters")
    description: str = ""
    seed: int = 1
    duration_s: float = Field(10.0, gt=0, description="how long the lab runs after bring-up")
    repeat: int = Field(1, ge=1, le=50, description="repetitions of every compared arm "
                        "(interleaved, order rotated per round), giving each comparison a "
                        "median, a 95 % interval and a verdict (nslab run --repeat)")
    topology: TopologySpec = TopologySpec()
    fabric: FabricSpec = FabricSpec()
    placement: PlacementSpec = PlacementSpec()
    hosts: HostsSpec = HostsSpec()
    clocks: ClockConfig = ClockConfig()
    faults: list[Fault] = Field(default_factory=list, description="the fault timeline: each "
                                "entry is injected at its at_s")
    agents: AgentsSpec = AgentsSpec()
    chrony: ChronySpec = ChronySpec()
    clock_daemons: ClockDaemonsSpec = ClockDaemonsSpec()
    load: list[Flow] = Field(default_factory=list, description="background iperf3 flows")
    jobs: list[JobSpec] = Field(default_factory=list)
    cassini: CassiniSpec | None = Field(None, description="job sets sharing a link, run alone, "
                                        "then together in each mode (session.cassini); their "
                                        "jobs leave the one-after-another turn")
    pacer: PacerSpec = Field(PacerSpec(), description="parameters of the pacers that jobs "
                             "(pacer: sense|pace) and two_step start")
    two_step: TwoStepSpec | None = Field(None, description="naive -> aware -> aware + pacer, "
                                         "and the BBR and CUBIC baselines (session.two_step)")
    lb: LbSpec | None = Field(None, description="ECMP, spraying, REPS and Ethereal in turn on "
                              "one job per collective, symmetric and under link faults "
                              "(session.lb); runs after the jobs")
    servers: list[ServerSpec] = Field(
        default_factory=list, description="a lab split across servers (Mininet Cluster "
        "Edition's model; nslab run --servers replaces it): routers dealt tier by tier, each "
        "physical host with its leaf and each VM with its host or leaf, only links between "
        "routers cut (VXLAN tunnels, shaped at both ends), every NIC budget checked; each "
        "node built and run on its server; empty or one server: this machine")
    server_placement: dict[str, str] = Field(
        default_factory=dict, description="router -> server name, overriding the dealt "
        "placement (a physical host and a VM go with their leaf)")

    def cassini_jobs(self) -> set[str]:
        """Names of the jobs that run in the cassini sets."""
        return {n for s in self.cassini.sets for n in s.jobs} if self.cassini else set()

    def own_turn_jobs(self) -> set[str]:
        """Names of the jobs that do not run in the one-after-another turn (cassini sets,
        two_step)."""
        return self.cassini_jobs() | ({self.two_step.job} if self.two_step else set())


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
    raise ScenarioError(name_or_path, [ScenarioProblem(
        "", "no such file and no built-in scenario", f"built-ins: {', '.join(builtin_names())}",
        name_or_path)])


def load(name_or_path: str | None) -> tuple[Scenario, Topo]:
    """Parse, validate and build the topology (pure data, no root) of a scenario: the one
    loader of ``nslab run``, ``nslab up``, the TUI and the Python API.

    Returns:
        (scenario, topology) ready for ``Lab``.

    Raises:
        ScenarioError: every problem found at once (YAML syntax, each field, and the checks
            between sections: times within ``duration_s``, names in the topology, job ranks
            within the VMs), each a ``ScenarioProblem`` with its field path, file, line,
            message and hint, in file order.
    """
    path = resolve(name_or_path)
    source = str(path)
    doc, found = read_mapping(path, "`name: mylab`")
    try:
        # base: a job's trace path is relative to the scenario's folder
        sc = partial = Scenario.model_validate(doc.data, context={"base": path.parent})
    except ValidationError as e:
        sc, partial = None, _salvage(doc.data, e.errors())
        found += explain(Scenario, e.errors())
        found += invalid_entry_times(partial, doc.data, {file_path(Scenario, err["loc"])
                                                         for err in e.errors()})
    topo = None
    if None not in (partial.topology, partial.placement, partial.seed):
        topo, problem = build(partial.topology, partial.placement, partial.seed, path.parent,
                              partial.hosts.host_layer() if partial.hosts else None)
        found += problem
    found += cross_check(partial, topo)
    if found:
        raise ScenarioError(source, problems(found, doc, source))
    return sc, topo


def read_mapping(path: Path, example: str, outcome: str = "nothing was built"
                 ) -> tuple[yamlmarks.MarkedDoc, list[Explained]]:
    """Parse the YAML file ``path`` whose top level must be a mapping (``example`` shows one):
    the marked document and the keys given twice (problems, not raised).

    Raises:
        ScenarioError: unreadable, a YAML syntax error (its line and column), or not a
            mapping; ``outcome`` ends its header line.
    """
    source = str(path)
    try:
        doc = yamlmarks.parse(path.read_text())
    except yamlmarks.YamlSyntaxError as e:
        raise ScenarioError(source, [ScenarioProblem("", e.message, e.hint, source, e.line,
                                                     e.column)], outcome) from e
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(source, [ScenarioProblem("", f"cannot read it: {e}",
                                                     file=source)], outcome) from e
    found = [Explained(p, f"given twice (also at line {first}); YAML keeps only the last")
             for p, first, _ in doc.duplicates]
    if not isinstance(doc.data, dict):
        found.append(Explained((), f"expected a mapping of sections at the top level, e.g. "
                                   f"{example}"))
        raise ScenarioError(source, problems(found, doc, source), outcome)
    return doc, found


def load_model(model: type[M], path: Path, example: str,
               outcome: str = "nothing was built") -> M:
    """A YAML file validated as ``model`` (a pydantic model; no cross-checks), its problems
    worded as a scenario's (``session.explain``).

    Raises:
        ScenarioError: every problem at once, with file, line and column; ``outcome`` ends
            its header line (e.g. "not checked").
    """
    doc, found = read_mapping(path, example, outcome)
    try:
        out = model.model_validate(doc.data)
    except ValidationError as e:
        found += explain(model, e.errors())
    if found:
        raise ScenarioError(str(path), problems(found, doc, str(path)), outcome)
    return out


def problems(found: list[Explained], doc: yamlmarks.MarkedDoc,
              source: str) -> list[ScenarioProblem]:
    out = [ScenarioProblem(_dotted(e.path), e.message, e.hint, source, *doc.where(e.path))
           for e in found]
    return sorted(out, key=lambda p: (p.line or 0, p.column or 0))


def _dotted(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


LIST_SECTIONS = tuple(n for n, f in Scenario.model_fields.items() if get_origin(f.annotation)
                      is list)
"""Top-level sections that are lists of entries (faults, load, jobs): an invalid entry is
left out of the cross-checks, the others are checked."""


def _salvage(data: dict, errors: list[dict]) -> Scenario:
    """The scenario without its invalid parts, for the cross-checks: unknown keys removed, a
    section or list entry with any other error None (``session.crosscheck`` skips it)."""
    data = copy.deepcopy(data)
    bad = set()
    for err in errors:
        path = file_path(Scenario, err["loc"])
        if err["type"] == "extra_forbidden":
            _delete(data, path)
        elif path:
            listed = path[0] in LIST_SECTIONS and len(path) > 1 and isinstance(path[1], int)
            bad.add(path[:2] if listed else path[:1])
    parts = {}
    for name, info in Scenario.model_fields.items():
        if (name,) in bad:
            parts[name] = None
        elif name in LIST_SECTIONS and isinstance(data.get(name), list):
            entry = TypeAdapter(get_args(info.annotation)[0])
            parts[name] = [None if (name, i) in bad else entry.validate_python(x)
                           for i, x in enumerate(data[name])]
        elif name in data:
            parts[name] = TypeAdapter(Annotated[info.annotation, info]).validate_python(
                data[name])
    return Scenario.model_construct(**parts)


def _delete(data, path: tuple) -> None:
    for part in path[:-1]:
        data = data[part]
    data.pop(path[-1], None)
