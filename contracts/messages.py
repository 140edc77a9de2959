"""The agents' wire contracts, each defined once as a pydantic model (``API.md``).

* ``nslab.report/2``: what an agent sends the coordinator over TCP, one JSON object per
  line: a ``Hello`` first on every connection, then ``Report`` lines (``AgentMessage``, a
  union discriminated by ``type``; ``parse_message`` reads a line). Version 2 adds the
  packed records (``Report.rx_packed``, ``pack_records``): the probe records as little-endian
  int64 arrays (base64 in the JSON line) instead of JSON rows, whose parsing was most of the
  coordinator's CPU at 256 VMs (``benchmarks/coordinator.py``). The coordinator reads both
  versions and both forms.
* ``nslab.coordinator/1``: the coordinator's ``GET /api/v1/state`` document
  (``CoordinatorState``), and ``nslab.coordinator.health/1`` (``Health``).

Units are in the names: ``*_ns`` integers (or floats for estimates) in ns, ``*_us`` floats
in microseconds, ``*_ppm`` in ppm (1 ppm = 1 us/s), ``*_s`` in seconds. An unknown value is
``None`` (JSON ``null``), never NaN. Version 1 only ever adds fields: readers ignore fields
they do not know (``extra="ignore"``); a document of another schema is rejected.

Report rows (``[pair_id, idx, tx_ns, rx_ns]``, JSON or packed) are validated by the coordinator
(``agents.ingest``): a malformed row or packed string is counted (``bad_records``), not fatal
to its report.

Source of the estimates these documents carry: Geng et al., "Exploiting a Natural Network
Effect for Scalable, Fine-grained Clock Synchronization", NSDI 2018.
"""
from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema

from contracts.enums import ActivePacerMode, PacerDatapath
from contracts.tcp import DestStats, NetCounters

__all__ = ["HEALTH_SCHEMA", "RECORD", "REPORT_SCHEMA", "STATE_SCHEMA", "AgentMessage",
           "AgentStats", "Collocation", "CoordinatorState", "Group", "Health", "Hello",
           "HistoryEntry", "HistoryVm", "OwdStats", "PacerDest", "PacerReport", "PackedRecords",
           "Report", "VmState", "pack_records", "parse_message"]

REPORT_SCHEMA = "nslab.report/2"
STATE_SCHEMA = "nslab.coordinator/1"
HEALTH_SCHEMA = "nslab.coordinator.health/1"

class _Wire(BaseModel):
    """Shared settings: attribute docstrings are the JSON Schema's descriptions, ``schema``
    is read and written under that name (``schema_`` in Python), unknown fields ignored."""

    model_config = ConfigDict(use_attribute_docstrings=True, serialize_by_alias=True,
                              validate_by_name=True, validate_by_alias=True, extra="ignore")


# ---- agent -> coordinator (nslab.report/2) --------------------------------------------------
class _AgentWire(_Wire):
    # strict: an integer field takes a JSON integer only (no "123", no 1.0), as on the wire
    model_config = ConfigDict(strict=True)


class AgentStats(_AgentWire):
    """An agent's counters since it started, sent with the last line of each report."""

    probes_tx: int = 0
    """Probes sent."""
    probes_rx: int = 0
    """Valid probes received."""
    rejects: dict[str, int] = Field(default_factory=dict)
    """Rejected datagrams by reason (``agents/PROBE.md``)."""
    send_errors: dict[str, int] = Field(default_factory=dict)
    """Failed sends by errno name."""
    records_dropped: int = 0
    """Records dropped because the buffer was full (coordinator away)."""
    records_unsent: int = 0
    """Records lost in a failed send."""
    tx_user_stamps: int = 0
    """Probes whose follow-up carried a user-space TX stamp (no kernel stamp)."""
    rx_user_stamps: int = 0
    """Probes received without a kernel RX stamp (user-space clock used)."""
    tx_stamps_missing: int = 0
    """Sent probes whose kernel TX stamp never came."""
    loop_errors: int = 0
    """Agent loop passes that failed (and were skipped)."""
    peers_active: list[str] = Field(default_factory=list)
    """The peers the agent probes now."""


class Hello(_AgentWire):
    """First line on every connection of an agent to the coordinator."""

    type: Literal["hello"] = "hello"
    schema_: Literal["nslab.report/1", "nslab.report/2"] = Field(alias="schema")
    """The report schema the agent speaks (``nslab.report/2``: its reports may carry
    ``rx_packed``); a hello of any other is rejected."""
    name: str = Field(min_length=1, max_length=64)
    """This VM's name (``--name``)."""
    ip: str | None = None
    """This VM's probe address (IPv4)."""
    port: int | None = None
    """UDP probe port."""
    rate: float | None = Field(default=None, gt=0)
    """Coded probe pairs per second per active peer."""
    window_s: float | None = None
    """The agent's estimation window, s."""
    report_s: float = Field(default=0.5, gt=0)
    """Report period, s."""
    start_ns: int | None = None
    """The agent's VM clock when it started, ns: no record of it is older."""
    peers: list[str] = Field(default_factory=list)
    """Every peer the agent knows (it probes a subset)."""
    pid: int | None = None
    """The agent's process id."""


_ROW_SCHEMA = {
    "type": "array", "minItems": 4, "maxItems": 4,
    "prefixItems": [{"type": "integer", "description": "pair_id"},
                    {"type": "integer", "enum": [0, 1], "description": "idx in the pair"},
                    {"type": "integer", "description": "tx_ns, sender's VM clock"},
                    {"type": "integer", "description": "rx_ns, receiver's VM clock"}],
    "description": "[pair_id, idx, tx_ns, rx_ns] of one received probe; a malformed row "
                   "is counted in the coordinator's bad_records and skipped"}
Row = Annotated[Any, WithJsonSchema(_ROW_SCHEMA)]
"""One record, checked row by row by the coordinator (``agents.ingest``)."""

RECORD = struct.Struct("<4q")
"""One packed record: ``pair_id, idx, tx_ns, rx_ns`` as little-endian int64 (32 bytes)."""


class PackedRecords(_AgentWire):
    """A report's probe records packed (``nslab.report/2``): every sender's records one after
    the other in one byte string, ``counts[i]`` of them from ``senders[i]``."""

    # bytes are base64 in JSON, decoded and encoded by pydantic-core (binascii takes 5x longer)
    model_config = ConfigDict(val_json_bytes="base64", ser_json_bytes="base64")

    senders: list[str]
    """The VMs the records came from, in the order of their records."""
    counts: list[int]
    """Records from each sender (as many entries as ``senders``)."""
    records: bytes
    """``sum(counts)`` records of 32 bytes (``RECORD``), each four little-endian int64
    ``pair_id, idx, tx_ns, rx_ns``: ``tx_ns`` on the sender's VM clock, ``rx_ns`` on this
    VM's clock; compressed as ``encoding`` says. In JSON: base64 (RFC 4648; written in the
    URL-safe alphabet with padding, read in either alphabet, padded or not); a line whose
    ``records`` is not base64 is rejected."""
    encoding: Literal["raw", "zlib"] = "raw"
    """``raw``: the records as they are; ``zlib``: compressed (RFC 1950; the agent's, for
    the coordinator VM's link)."""


def pack_records(by_sender: Mapping[str, Sequence[int]]) -> PackedRecords:
    """Records as a ``Report.rx_packed``: ``by_sender`` maps a sender to its records' fields
    in a row, ``pair_id, idx, tx_ns, rx_ns, pair_id, ...`` (ints).

    Raises:
        ValueError: a sender's values not a multiple of 4.
        struct.error: a value outside int64.
    """
    for src, values in by_sender.items():
        if len(values) % 4:
            raise ValueError(f"records have 4 fields; {src} has {len(values)} values")
    flat = [x for values in by_sender.values() for x in values]
    return PackedRecords(senders=list(by_sender),
                         counts=[len(v) // 4 for v in by_sender.values()],
                         records=struct.pack(f"<{len(flat)}q", *flat))


class Report(_AgentWire):
    """Records and counters of an agent, every ``report_s`` (split over several lines when
    it holds more than 5000 records: only the last line carries ``t_ns`` and ``stats``)."""

    type: Literal["report"] = "report"
    name: str = Field(min_length=1, max_length=64)
    """This VM's name."""
    t_ns: int | None = None
    """This VM's clock read before the records were collected, ns: every record the agent
    produced before it is in this report or an earlier one; ``None`` on all lines of a
    report but the last."""
    rx: dict[str, list[Row]] = Field(default_factory=dict)
    """Probes this VM received, by sender: ``tx_ns`` on the sender's VM clock, ``rx_ns`` on
    this VM's clock."""
    rx_packed: PackedRecords | None = None
    """Such records packed (``nslab.report/2``; what the agents send, grouped by their
    compiled side: ``agents.probeio.ProbeIO.pack``; ``pack_records`` builds one from rows);
    when they are not ``sum(counts)`` records they are counted in the coordinator's
    ``bad_records`` and skipped, the rest of the report kept."""
    stats: AgentStats | None = None
    """The agent's counters (on the last line of a report, else ``None``)."""


class PacerDest(_Wire):
    """The pacer's view of one destination VM since it started."""

    owd_us_p50: float | None = None
    """Median one-way delay toward it, us (synchronized clocks): of the pacer's probes
    (datapath ``probe``), or of this VM's TCP data segments as that VM measured and echoed
    them (``bpf``; from a histogram of 8 buckets per power of two: within 6 %)."""
    owd_us_p99: float | None = None
    """99th percentile one-way delay, us."""
    owd_samples: int = 0
    """OWD samples taken (``bpf``: echoes received from it)."""
    above_threshold: int = 0
    """OWD samples above the threshold T (only these can start or extend a hold)."""
    probes_sent: int = 0
    """OWD probes sent toward it."""
    probes_lost: int = 0
    """Probes sent toward it whose echo never came back (lost either way, or in flight at
    the report): the share of a queue's drops that were the pacer's own."""
    stale_echoes: int = 0
    """Echoes from it that answered no unanswered probe, ignored: duplicates, echoes of a
    previous pacer on the port, echoes of probes already taken as lost."""
    holds: int = 0
    """Times its traffic went from open to held (a switch of its class; a gate decision whose
    switch failed counts only when a later decision of the same hold switches)."""
    overdue_holds: int = 0
    """Of ``holds``, those started by a probe without echo for T + the longest hold (its OWD
    unknown: ``agents.gate.Gate.overdue``), not by a sample above T."""
    held_ms: float = 0.0
    """Total time the gate held it, ms (as decided: a spell whose switch failed counts)."""
    react_us_p99: float | None = None
    """``probe``: from an echo's arrival (kernel stamp) to its hold applied, 99th percentile
    over the recent holds, us: the control loop's own delay (benchmarks/pacer_model.py shows
    what a given delay costs in drops). ``bpf``: from an echo leaving the destination to its
    hold decided here (the echo's own transit; the hold applies to the next segment), 99th
    percentile over every echo, us."""
    wake_us_p99: float | None = None
    """From an echo's arrival (kernel stamp) to the pacer's loop handling it, 99th percentile
    over the recent samples, us: the part of ``react_us_p99`` spent waiting for a CPU."""
    echo_us_p99: float | None = None
    """``bpf``: from a data segment of its arriving here (its OWD measured) to that sample's
    echo leaving here toward it, 99th percentile, us: the receiver's part of its reaction
    time (``react_us_p99`` at its pacer is the rest)."""
    echoes: int = 0
    """``bpf``: OWD samples of its data segments echoed to it."""
    refused: int = 0
    """``bpf``, hold ``refuse``: its new data segments refused while it was held (TCP kept
    them unsent and sent them later: not drops, not retransmissions)."""
    clamped: int = 0
    """``bpf``, window clamp: segments this VM sent it whose advertised receive window the
    clamp lowered (it as a sender toward this VM)."""
    window_bytes: int | None = None
    """``bpf``, window clamp: the last window the clamp advertised to it, bytes."""
    tcp: DestStats | None = None
    """Its TCP connections now (``agents.tcpsense``); ``None`` without any."""


class PacerReport(_Wire):
    """The pacer's state, sent to the coordinator every second on the report connection
    (``python -m agents pacer``) and served in ``CoordinatorState.pacers``."""

    type: Literal["pacer"] = "pacer"
    name: str = Field(min_length=1, max_length=64)
    """This VM's name."""
    t_ns: int
    """This VM's clock when the report was made, ns."""
    mode: ActivePacerMode
    """``sense``: measure only; ``pace``: hold destinations above the threshold."""
    datapath: PacerDatapath = "probe"
    """``bpf``: OWD of every data segment and holds in the kernel (``agents.bpf``);
    ``probe``: UDP probes and HTB switches from a compiled user-space loop
    (``agents.pacerio``)."""
    threshold_us: float
    """On-Ramp's threshold T, us."""
    synced: bool
    """Whether the pacer trusts the synchronized clock (else the gate is open)."""
    status: str
    """Why the gate is open or what it does, in words."""
    net: NetCounters
    """This VM's TCP counters since the pacer started (retransmitted segments, RTOs, ...)."""
    dests: dict[str, PacerDest] = Field(default_factory=dict)
    """By destination VM name."""


AgentMessage = Annotated[Hello | Report | PacerReport, Field(discriminator="type")]
"""One line of ``nslab.report/2`` (or ``/1``)."""
_MESSAGE = TypeAdapter(AgentMessage)


def parse_message(line: bytes | str) -> Hello | Report | PacerReport:
    """One agent line (JSON) as a model.

    Raises:
        pydantic.ValidationError (a ValueError): not JSON, an unknown ``type`` or schema, a
            field of the wrong type.
    """
    return _MESSAGE.validate_json(line)


# ---- coordinator API (nslab.coordinator/1) ------------------------------------------------
@dataclass(frozen=True)
class ClockEstimate:
    """A VM clock against the reference: ``offset_ns`` (VM clock minus reference, ns) and
    ``drift_ppm`` at reference time ``ref_ns`` (None: no drift term), e.g.
    ``CoordinatorState.estimate(vm)``. The one formula every user of the estimates applies."""

    offset_ns: float
    drift_ppm: float
    ref_ns: int | None

    def offset_at(self, t_ns: int) -> float:
        """The offset at reference time ``t_ns``: ``offset + drift x 1e-6 x (t - ref)``, ns."""
        if self.ref_ns is None:
            return self.offset_ns
        return self.offset_ns + self.drift_ppm * 1e-6 * (t_ns - self.ref_ns)

    def offset_at_vm(self, vm_ns: int) -> float:
        """The offset at the VM's own reading ``vm_ns`` (its reference time taken as
        ``vm_ns - offset``), ns; ``agents/native/pacer.c`` ``npc_offset_at_vm`` mirrors it."""
        return self.offset_at(vm_ns - self.offset_ns)

    def moved_to(self, t_ns: int | None) -> ClockEstimate:
        """The same estimate with its reference time moved to ``t_ns`` along its drift."""
        if t_ns is None or self.ref_ns is None:
            return self
        return ClockEstimate(self.offset_at(t_ns), self.drift_ppm, t_ns)


class VmState(_Wire):
    """One VM as the coordinator knows it; estimates are at ``CoordinatorState.t_ns``."""

    offset_ns: float | None = None
    """Clock of this VM minus the reference VM's, ns (Huygens fits + network solve);
    ``None`` without an estimate in the latest window."""
    drift_ppm: float | None = None
    """d(clock - reference clock) / d(reference clock), ppm."""
    offset_sigma_ns: float | None = None
    """One-sigma uncertainty of ``offset_ns`` from the solve's loop residuals, ns."""
    drift_sigma_ppm: float | None = None
    """One-sigma uncertainty of the window's own drift, ppm."""
    ntp_offset_ns: float | None = None
    """Baseline: NTP-style offset (RFC 5905 clock filter) on the same probes, ns."""
    ntp_drift_ppm: float | None = None
    """Baseline: NTP-style drift, ppm."""
    last_report_ns: int | None = None
    """The coordinator's clock at the agent's last report, ns."""
    connected: bool = False
    """The agent reported within the last 5 s."""
    ip: str | None = None
    """The agent's address (from its hello)."""
    probes_tx: int = 0
    """Probes the agent sent."""
    probes_rx: int = 0
    """Valid probes the agent received."""
    rejects: dict[str, int] = Field(default_factory=dict)
    """The agent's rejected datagrams by reason (``agents/PROBE.md``)."""
    records_dropped: int = 0
    """Records the agent dropped while its buffer was full."""
    peers_active: list[str] = Field(default_factory=list)
    """The peers the agent probes now."""


class OwdStats(_Wire):
    """One-way delays of one direction's probes in the latest window, corrected with the
    network solve."""

    min_us: float | None = None
    """Smallest one-way delay, us."""
    p50_us: float | None = None
    """Median one-way delay, us."""
    p99_us: float | None = None
    """99th percentile one-way delay, us."""
    n: int = 0
    """Probes."""


class Group(_Wire):
    """VMs believed to share a physical host (a singleton: alone)."""

    members: list[str]
    """VM names, sorted."""
    confidence: float | None = None
    """0..1 (``agents/collocation.py``)."""


class Collocation(_Wire):
    """Collocation detection (shared oscillator frequency)."""

    groups: list[Group] = Field(default_factory=list)
    """Every VM with an estimate in exactly one group."""
    windows_used: int = 0
    """Windows of drift series the grouping used."""


class HistoryVm(_Wire):
    """One VM's estimate in one window."""

    offset_ns: float | None = None
    """Offset to the reference VM, ns."""
    drift_ppm: float | None = None
    """Drift to the reference VM, ppm (provisional in the last ``drift_windows // 2``)."""
    ntp_offset_ns: float | None = None
    """NTP-style baseline offset, ns."""
    ntp_drift_ppm: float | None = None
    """NTP-style baseline drift, ppm."""


class HistoryEntry(_Wire):
    """One window's estimates."""

    t_ns: int
    """The window's centre on the reference VM's clock, ns."""
    vms: dict[str, HistoryVm] = Field(default_factory=dict)
    """Per VM with an estimate in the window."""


class CoordinatorState(_Wire):
    """``GET /api/v1/state``: the coordinator's estimates (``agents/API.md``)."""

    schema_: Literal["nslab.coordinator/1"] = Field(alias="schema")
    """Document schema."""
    time_ns: int
    """The coordinator's own clock when the document was made, ns."""
    reference: str | None = None
    """The reference VM whose clock is the zero; ``None`` before any agent is known."""
    window_s: float
    """Window length, s (on the reference clock)."""
    drift_windows: int
    """Windows whose offsets give a window's drift; the last ``drift_windows // 2`` history
    entries are provisional."""
    windows: int = 0
    """History entries kept."""
    t_ns: int | None = None
    """The latest window's centre on the reference clock, ns; ``None`` before the first."""
    vms: dict[str, VmState] = Field(default_factory=dict)
    """Every VM the coordinator knows, by name."""
    owd_us: dict[str, OwdStats] = Field(default_factory=dict)
    """One-way delays of the latest window by direction ``"a->b"``."""
    asymmetry_us: dict[str, float | None] = Field(default_factory=dict)
    """``"a|b"`` (``a`` before ``b`` in natural order: vm2 before vm10) ->
    p50 OWD(a->b) - p50 OWD(b->a), us; > 0: a -> b is the slower direction
    (``agents.owd.asymmetry_us``)."""
    collocation: Collocation = Field(default_factory=Collocation)
    """VMs grouped by physical host."""
    drift_series: dict[str, list[float | None]] = Field(default_factory=dict)
    """Per VM, each window's own drift, ppm, oldest first (what collocation uses)."""
    drift_series_t_ns: list[int] = Field(default_factory=list)
    """The ``t_ns`` of each ``drift_series`` entry, ns."""
    history: list[HistoryEntry] = Field(default_factory=list)
    """The last windows, oldest first."""
    pacers: dict[str, PacerReport] = Field(default_factory=dict)
    """The latest report of each VM's pacer, when pacers run (``python -m agents pacer``)."""
    counters: dict[str, int] = Field(default_factory=dict)
    """Coordinator diagnostics (``late_records``, ``bad_records``, ``bad_messages``, ...)."""

    def estimate(self, vm: str) -> ClockEstimate | None:
        """``vm``'s offset and drift at ``t_ns``; None without an offset estimate."""
        vs = self.vms.get(vm)
        if vs is None or vs.offset_ns is None:
            return None
        return ClockEstimate(vs.offset_ns, vs.drift_ppm or 0.0, self.t_ns)


class Health(_Wire):
    """``GET /api/v1/health``."""

    schema_: Literal["nslab.coordinator.health/1"] = Field(alias="schema")
    """Document schema."""
    ok: bool = True
    """The coordinator answers."""
    time_ns: int
    """The coordinator's clock, ns."""
    agents: int
    """Agents known."""
    agents_connected: int
    """Agents that reported within the last 5 s."""
    windows: int
    """History entries kept."""
    reference: str | None = None
    """The reference VM."""
