"""What the TUI shows and drives, independent of where it comes from.

A ``Backend`` runs (or replays) a scenario and answers ``snapshot()`` with a ``Snapshot``: plain
dataclasses, JSON-serialisable with ``to_dict``/``from_dict`` so a live run can be recorded and
replayed without root (``tui.recorded``). ``tui.live.LiveBackend`` drives a real lab.

Every backend method may block (the live one waits on the kernel): the app calls them from
Textual thread workers only, never on the UI thread.

Units: times s (``time_s``, ``t_s``), offsets ms, errors us, drift ppm, one-way delays us,
utilization a fraction of the link rate (0..1), CPU percent of one core.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

from contracts.events import Fault, describe
from lab.observe import TIERS  # noqa: F401 - node tiers: the lab's, re-exported for views

SCHEMA = "nslab.tui-recording/1"


@dataclass
class NodeView:
    """A fabric node: ``role`` vm/host/leaf/spine/superspine, ``tier`` 0 (VMs), 0.5 (physical
    hosts of a host layer) .. 3 (super-spines) (``lab.observe.TIERS``)."""

    name: str
    role: str
    tier: float


@dataclass
class LinkView:
    """A link between nodes ``a`` and ``b`` (``a`` the lower tier).

    ``utilization``: the busier direction's throughput over the link rate (0..1; against
    1 Gbit/s for unshaped links); ``mbit``: that throughput, Mbit/s; ``bw_mbit``: the rate
    (None: unshaped); ``drops``: packets dropped on both ends since bring-up (qdisc and
    interface counters); ``drop_rate``: packets dropped per second over the last interval;
    ``queue_pkts``: packets queued now in the fuller direction's emulated queue (None:
    unshaped or not read); ``loss_percent``: injected loss; ``tx_bytes``: bytes sent by both
    ends since bring-up.
    """

    a: str
    b: str
    utilization: float = 0.0
    up: bool = True
    drops: int = 0
    drop_rate: float = 0.0
    queue_pkts: int | None = None
    mbit: float = 0.0
    bw_mbit: float | None = None
    loss_percent: float = 0.0
    tx_bytes: int = 0

    @property
    def key(self) -> str:
        return f"{self.a}-{self.b}"


@dataclass
class VMView:
    """A VM: where it runs, its clock (truth) and what the agents estimate.

    ``offset_ms``/``drift_ppm``: the injected clock (t_v - t, and the frequency error) now
    (None: hidden by an exercise).
    ``est_*``: the coordinator's estimate relative to the reference VM; ``err_offset_us`` and
    ``err_drift_ppm``: estimate minus truth (relative to the same reference). None when no
    agent runs.
    """

    name: str
    phys: str
    leaf: str
    cpu_pct: float = 0.0
    offset_ms: float | None = 0.0
    drift_ppm: float | None = 0.0
    est_offset_ms: float | None = None
    est_drift_ppm: float | None = None
    err_offset_us: float | None = None
    err_drift_ppm: float | None = None
    paused: bool = False
    hog: bool = False


@dataclass
class GroupView:
    """A collocation group the agents found (``confidence`` 0..1)."""

    members: list[str]
    confidence: float | None = None


@dataclass
class JobView:
    """A collective job: ``progress`` 0..1, ``iteration_s`` per-iteration times (s) when
    known, ``completion_s`` once done, ``verified`` (the result checked out), ``detail`` (a
    short line under it, e.g. a two_step step's drops and retransmissions)."""

    name: str
    progress: float = 0.0
    iteration_s: list[float] = field(default_factory=list)
    completion_s: float | None = None
    verified: bool | None = None
    error: str | None = None
    detail: str = ""


@dataclass
class EventView:
    """A timeline event: a fault (``source`` "timeline" or "tui"), a job step or a lab note.
    ``t_s`` is seconds after bring-up."""

    t_s: float
    kind: str
    target: str
    params: dict[str, Any] = field(default_factory=dict)
    source: str = "lab"

    def describe(self) -> str:
        """The event in words (``contracts.events.describe``)."""
        return describe(self.kind, self.target, self.params)


@dataclass
class FidelityView:
    """The machine's state: ``busy`` and ``softirq`` fractions of all CPUs (last interval),
    ``saturated`` (timing results not trustworthy)."""

    busy: float = 0.0
    softirq: float = 0.0
    saturated: bool = False


@dataclass
class Snapshot:
    """Everything the TUI draws at one instant.

    ``state``: "starting", "running", "paused" (timeline held), "done" (timeline over),
    "stopped" (torn down) or "error". ``pending``: the scenario's timeline entries not yet
    played, in order. ``owd_us``: ``{"a->b": p50 one-way delay, us}``; ``asymmetry_us``:
    ``{"a<->b": owd(a->b) - owd(b->a), us}``. ``fabric``: the fabric mode (``lab.fabric``).
    ``cassini``: the results' ``cassini.sets`` entries planned so far (``contracts.studies.cassini.
    CassiniSet`` as JSON; their modes as they finish). ``comparisons``: the studies' compared
    pairs so far (``contracts.comparisons.Comparison`` as JSON).
    """

    time_s: float = 0.0
    scenario: str = ""
    lab: str = ""
    fabric: str = "ecmp"
    state: str = "starting"
    nodes: list[NodeView] = field(default_factory=list)
    links: list[LinkView] = field(default_factory=list)
    vms: list[VMView] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    groups: list[GroupView] = field(default_factory=list)
    truth_groups: list[list[str]] = field(default_factory=list)
    reference: str | None = None
    owd_us: dict[str, float] = field(default_factory=dict)
    asymmetry_us: dict[str, float] = field(default_factory=dict)
    jobs: list[JobView] = field(default_factory=list)
    events: list[EventView] = field(default_factory=list)
    pending: list[EventView] = field(default_factory=list)
    fidelity: FidelityView = field(default_factory=FidelityView)
    agents: str = "off"
    cassini: list[dict] = field(default_factory=list)
    comparisons: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict) -> Snapshot:
        """Inverse of ``to_dict``; unknown keys are ignored (newer recordings load)."""
        nested = {"nodes": NodeView, "links": LinkView, "vms": VMView, "groups": GroupView,
                  "jobs": JobView, "events": EventView, "pending": EventView}
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {}
        for k, v in doc.items():
            if k not in known:
                continue
            if k in nested:
                kw[k] = [_build(nested[k], x) for x in v]
            elif k == "fidelity":
                kw[k] = _build(FidelityView, v)
            else:
                kw[k] = v
        return cls(**kw)

    def link(self, a: str, b: str) -> LinkView | None:
        for lk in self.links:
            if {lk.a, lk.b} == {a, b}:
                return lk
        return None

    def vm(self, name: str) -> VMView | None:
        for v in self.vms:
            if v.name == name:
                return v
        return None


HIDDEN_NOTES = ("lab_up", "agents_up", "chrony_up", "job_start", "job_end",
                "timeline_paused", "timeline_resumed")
"""Events an exercise hiding ``faults`` still shows (besides what the user did: source tui)."""


def hidden(snap: Snapshot, hide: set[str] | frozenset[str]) -> Snapshot:
    """``snap`` without what an exercise hides (``session.exercise.Exercise.hide``), in place:
    ``placement`` the physical hosts and the clocks' truth (VMs of a host share it) and the
    errors against it; ``collocation`` the agents' groups and the true ones; ``links`` every
    link's counters and rate; ``faults`` the timeline's faults and load (what the user injects
    stays)."""
    if "placement" in hide:
        snap.hosts, snap.truth_groups = [], []
        for v in snap.vms:
            v.phys, v.offset_ms, v.drift_ppm = "?", None, None
            v.err_offset_us = v.err_drift_ppm = None
    if "collocation" in hide:
        snap.groups, snap.truth_groups = [], []
    if "links" in hide:
        snap.links = [LinkView(lk.a, lk.b, up=lk.up) for lk in snap.links]
    if "faults" in hide:
        snap.events = [e for e in snap.events if e.source == "tui" or e.kind in HIDDEN_NOTES]
        snap.pending = []
    return snap


def _build(cls, doc: dict):
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in doc.items() if k in known})


class Backend(Protocol):
    """A running (or replayed) scenario. Methods may block; call them from worker threads.

    Faults are the typed models of ``contracts.events`` (the one fault vocabulary).

    Abilities: every backend declares ``replays`` (True: it is a ``Replay``, with a
    recording's controls) and ``lab_results`` (True: it is a ``LabResults``, with the truth
    and the job results of a lab, which an exercise's check reads); the app reads these flags
    and calls those methods only where they are True.

    ``hide``: what the snapshots leave out (``hidden``: an exercise's truth; set before
    ``start``); ``error``: why the lab failed (state "error"), else None.

    Errors: ``inject`` raises ``lab.errors.LabError`` with a message for the user when the lab
    refuses a fault (``lab.fault_rules.check``); the others raise ``LabError`` on lab failures.
    """

    scenario: str
    hide: frozenset[str]
    error: str | None
    replays: bool
    lab_results: bool

    def start(self, scenario: str | None = None) -> None:
        """Bring the scenario's lab up and start its timeline (None: the one given before)."""

    def snapshot(self) -> Snapshot:
        """The state now."""

    def inject(self, fault: Fault) -> EventView:
        """Apply ``fault`` now (its ``at_s`` is ignored); the event it stamped (source "tui",
        ``kind``/``target`` the fault's)."""

    def pause(self) -> None:
        """Hold the scenario timeline (faults already injected stay)."""

    def resume(self) -> None:
        """Let the timeline play on (the remaining steps keep their spacing)."""

    def step(self) -> EventView | None:
        """Play the next timeline step now; None when none is left."""

    def stop(self) -> None:
        """Tear the lab down (idempotent; safe from any thread, also after a crash)."""


class Replay(Backend, Protocol):
    """A backend over a recording (``replays`` True): ``jumped`` says the position jumped
    (start, seek, loop) since ``past()`` was last called."""

    jumped: bool

    def seek(self, frames: int) -> int:
        """Jump ``frames`` frames (negative: back); the frame index now."""

    def set_speed(self, factor: float) -> float:
        """Multiply the replay speed by ``factor``; the speed now, frames per snapshot."""

    def toggle_loop(self) -> bool:
        """Loop on or off; True when on."""

    def past(self) -> list[Snapshot]:
        """The recorded frames before the one played next (clears ``jumped``)."""


class LabResults(Backend, Protocol):
    """A backend over a real lab (``lab_results`` True)."""

    def truth(self) -> dict:
        """The lab's truth shaped as the results' ``truth`` section (at least ``placements``).

        Raises:
            LabError: the lab is not up.
        """

    def job_results(self) -> list[dict]:
        """The finished jobs' entries, as in the results' ``jobs`` section."""
