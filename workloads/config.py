"""The configuration of a job: one typed definition, validated once.

``JobConfig`` is what a job runs (collective or DDP, size, iterations, path hints, timeouts);
the scenario layer's ``JobSpec`` subclasses it with the job's name, rank count and placement.
``WorkerConfig`` is what one rank receives, as JSON on its command line
(``python -m workloads.worker --config JSON`` or ``python -m workloads.ddp --config JSON``): a
``JobConfig`` plus the job name, the rank and the ranks' addresses. Checks that need the number
of ranks (root, a size too small to give each rank an element, source ports) run in
``JobConfig.count_for(world)``, which ``WorkerConfig`` calls.

Errors: pydantic's ``ValidationError`` (a ``ValueError``); every message names the field and
what is allowed. ``describe`` turns one into a one-line message.

Sizes follow nccl-tests and NCCL: ``bytes`` is nccl-tests' "size" (bytes of the larger of the
send and receive buffers), ``count`` is NCCL's count argument (elements). Sources: NCCL
documentation, "Collective Operations"; nccl-tests, doc/PERFORMANCE.md.
"""
from __future__ import annotations

import os
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from contracts.enums import AllReduceAlgo, CongestionControl, DdpModel, HostBalancer, TraceFormat
from workloads import collectives as coll
from workloads import ddp_models, traces
from workloads.schedule import Schedule
from workloads.transport import PathHints, parse_address

DDP = "ddp"
TRACE = "trace"  # a trace job's collective: its ranks replay the file given in ``trace``
DDP_LABEL = "ddp (torch gloo; gradient all_reduce)"
DEFAULT_BYTES = 1 << 20
DEFAULT_HIDDEN = 256
# fields the DDP workload does not use: they must keep their defaults in a ddp job
NCCL_ONLY = ("dtype", "op", "root", "compute_units", "gpu_s", "src_port_base", "dscp", "cc",
             "connect_timeout_s", "algo")
DDP_BALANCERS = ("none", "ethereal")
"""Balancers of a ddp job: the VMs' balancer daemon (``workloads.lb.daemon``) pins whole
connections, which Ethereal's rule fits; REPS chooses per frame inside nslab's transport."""
# fields a trace job does not use (its sizes and compute come from the trace)
NOT_FOR_TRACE = ("bytes", "count", "dtype", "op", "root", "compute_units", "gpu_s", "hidden",
                 "model", "schedule")
TRACE_ONLY = ("trace_format", "trace_clock_ghz", "trace_compute_scale", "trace_bytes_scale")


def resolve_trace(v: str | None, info: ValidationInfo) -> str | None:
    """A ``trace`` field's validator: ``traces.resolve`` relative to the validation
    context's ``base`` (a scenario's folder)."""
    return v if v is None else traces.resolve(v, (info.context or {}).get("base"))


class JobConfig(BaseModel):
    """What a job runs: an NCCL collective (or PyTorch DDP training) and its parameters.

    ``bytes`` and ``count`` are alternatives (at most one; 1 MiB when neither is given, filled
    in by validation); a ddp job has neither (its size is the model's gradient) and keeps the
    NCCL-only fields (``NCCL_ONLY``) at their defaults; ``hidden`` is for ddp only (256 when
    not given).

    Raises:
        pydantic.ValidationError: a field is out of range or inconsistent; the message names
            the field and the allowed values.
    """

    model_config = ConfigDict(extra="forbid")

    collective: str = Field(
        "all_reduce", description="all_reduce, broadcast, reduce, all_gather, reduce_scatter, "
        "gather, scatter, all_to_all (NCCL names such as AllReduce accepted, stored in snake "
        "case) or ddp (PyTorch DDP training with gloo)")
    bytes: int | None = Field(
        None, ge=1, description="nccl-tests size in bytes: the larger of the send and receive "
        "buffers (default 1 MiB when count is not given; not for ddp)")
    count: int | None = Field(
        None, ge=1, description="NCCL count in elements (instead of bytes; not for ddp)")
    dtype: str = Field("float32", description=f"element type: {', '.join(coll.DTYPES)} "
                       "(NCCL aliases such as half, float accepted)")
    op: str = Field("sum", description=f"reduction: {', '.join(coll.OPS)} (avg needs a "
                    "floating dtype)")
    root: int = Field(0, ge=0, description="root rank of broadcast, reduce, gather, scatter "
                      "(must be below the number of ranks)")
    iterations: int = Field(10, ge=1, le=1_000_000, description="timed iterations")
    warmup: int = Field(1, ge=0, le=1_000_000, description="untimed iterations first")
    compute_units: int = Field(
        0, ge=0, description="compute phase before every collective: that many products of "
        "two 128x128 float64 matrices (4.2 MFLOP each), real CPU work")
    gpu_s: float = Field(
        0.0, ge=0, le=3600, description="compute phase on an emulated accelerator, before "
        "compute_units: the rank sleeps this long every iteration (a GPU's kernels: the "
        "host's CPU stays free, so a 2-core machine can run many jobs' compute at once), s")
    conns_per_peer: int = Field(1, ge=1, le=64, description="TCP connections per peer; a "
                                "transfer is split over them (ddp: gloo devices on the VM's "
                                "NIC, each a context with its own connection to every peer; "
                                "gloo takes them in turn, one per collective)")
    src_port_base: int | None = Field(
        None, ge=1, le=65535, description="path hint: connection c from rank r to peer p binds "
        "local port src_port_base + (r * world + p) * conns_per_peer + c (default: ephemeral)")
    dscp: tuple[Annotated[int, Field(ge=0, le=63)], ...] = Field(
        (), description="path hint: DSCP code points 0..63, cycled over connection indices "
        "(default: no marking)")
    algo: AllReduceAlgo = Field(
        "ring", description="all_reduce only: ring, or halving_doubling (recursive halving "
        "then doubling; the number of ranks must be a power of two)")
    balancer: HostBalancer = Field(
        "none", description="host-side load balancer (workloads.lb.balancer; the fabric must "
        "map DSCP to paths, fabric mode entropy): connection c to every peer carries DSCP "
        "c + 1, the ranks discover the paths by TTL probes, and ethereal (per collective step, "
        "equal bytes per path) or reps (recycled clean entropy values per frame) chooses the "
        "connection of every frame; needs conns_per_peer >= 2 (one per path) and no dscp. "
        "ddp: none or ethereal, by the balancer daemon in every VM of the job "
        "(workloads.lb.daemon), which sets the DSCP of each of gloo's connections")
    cc: CongestionControl | None = Field(
        None, description="TCP congestion control of the job's connections (TCP_CONGESTION, "
        "tcp(7)); null: the VM's default")
    connect_timeout_s: float = Field(10.0, gt=0, le=3600, description="seconds to build the "
                                     "mesh of connections")
    timeout_s: float = Field(60.0, gt=0, le=86400, description="seconds from start to finish; "
                             "then the ranks stop and report a timeout")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="seed of the input data (and of the "
                      "DDP model's data)")
    hidden: int | None = Field(None, ge=1, le=4096, description="ddp only: width of the "
                               "model's hidden layers (default 256)")
    model: DdpModel = Field("mlp", description="ddp only: the model trained "
                            "(workloads.ddp_models): mlp, transformer (one encoder layer, 4 "
                            "heads: hidden a multiple of 4) or moe (one expert per rank, tokens "
                            "moved by all_to_all)")
    schedule: Schedule | None = Field(
        None, description="iteration slots (CASSINI's time shift, workloads.schedule): "
        "iteration i starts no earlier than start_ns + shift_s + i * period_s on the reference "
        "clock, read through each rank's VM clock and offset (default: back to back)")
    trace: str | None = Field(
        None, description="replay this workload trace instead of one collective "
        "(workloads.traces): an ASTRA-sim text workload or a Chakra trace's prefix "
        "(PREFIX.RANK.et, one file per rank): a path (in a scenario, relative to its folder) "
        "or a built-in trace's name; the job's "
        "collective is then 'trace', iterations are training passes", examples=[
            "Resnet50_DataParallel.txt"])
    trace_format: TraceFormat = Field(
        "auto", description="trace only: the trace's format (auto: from its content)")
    trace_clock_ghz: float = Field(
        1.0, gt=0, le=100, description="trace only: the modelled accelerator's clock, GHz "
        "(ASTRA-sim's cycles; its examples assume 1 GHz)")
    trace_compute_scale: float = Field(
        1.0, gt=0, le=1e6, description="trace only: every compute time (and ASTRA-sim's "
        "update delays) times this, on the VM clock")
    trace_bytes_scale: float = Field(
        1.0, gt=0, le=1e3, description="trace only: every collective and send/recv size times "
        "this (whole float32 elements, at least one per rank); to keep the modelled cluster's "
        "compute/communication ratio: trace_compute_scale * lab link bit/s / modelled link "
        "bit/s (workloads.traces.scale_for)")

    @field_validator("collective")
    @classmethod
    def _collective(cls, v: str) -> str:
        if v in (DDP, TRACE):
            return v
        try:
            return coll.collective_name(v)
        except ValueError:
            raise ValueError(f"collective: unknown {v!r}; expected one of "
                             f"{', '.join(coll.COLLECTIVES)} or {DDP}") from None

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        try:
            return coll.dtype_of(v).name
        except ValueError:
            raise ValueError(f"dtype: unsupported {v!r}; expected one of "
                             f"{', '.join(coll.DTYPES)}") from None

    @field_validator("op")
    @classmethod
    def _op(cls, v: str) -> str:
        if v not in coll.OPS:
            raise ValueError(f"op: unknown {v!r}; expected one of {', '.join(coll.OPS)}")
        return v

    _trace = field_validator("trace")(resolve_trace)

    @model_validator(mode="after")
    def _consistent(self) -> JobConfig:
        if self.trace is not None or self.collective == TRACE:
            return self._trace_job()
        self._defaults_only(TRACE_ONLY, "only for a trace job (give trace: PATH)")
        if self.collective == DDP:
            for name in ("bytes", "count"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: not used by ddp (its size is the model's "
                                     "gradient, set by hidden); remove it")
            self._defaults_only(NCCL_ONLY, "not used by ddp (PyTorch DDP with gloo uses "
                                "iterations, warmup, timeout_s, seed, hidden, model, schedule, "
                                "conns_per_peer, balancer); remove it")
            if self.balancer not in DDP_BALANCERS:
                raise ValueError(f"balancer: {self.balancer} is not for ddp (a framework's "
                                 "connections are pinned whole by the VMs' balancer daemon); "
                                 f"use one of {', '.join(DDP_BALANCERS)}")
            self._check_balancer()
            if self.hidden is None:
                self.hidden = DEFAULT_HIDDEN
            if self.model == "transformer" and self.hidden % ddp_models.HEADS:
                raise ValueError(f"hidden: {self.hidden} is not a multiple of the transformer's "
                                 f"{ddp_models.HEADS} heads")
            return self
        if self.hidden is not None:
            raise ValueError(f"hidden: only for collective {DDP}, not {self.collective}")
        self._defaults_only(("model",), f"only for collective {DDP}")
        if self.algo != "ring" and self.collective != "all_reduce":
            raise ValueError(f"algo: {self.algo} is an all_reduce algorithm, not one of "
                             f"{self.collective}")
        self._check_balancer()
        if self.bytes is not None and self.count is not None:
            raise ValueError("bytes, count: give at most one of them (bytes: nccl-tests size; "
                             "count: NCCL count in elements)")
        if self.op == "avg" and coll.dtype_of(self.dtype).kind != "f":
            raise ValueError(f"op: avg needs a floating dtype, not {self.dtype}; use one of "
                             f"{', '.join(o for o in coll.OPS if o != 'avg')}")
        if self.bytes is None and self.count is None:
            self.bytes = DEFAULT_BYTES
        return self

    def _defaults_only(self, names: tuple[str, ...], why: str) -> None:
        """Raises ValueError ``NAME: why`` for the first of ``names`` not at its default."""
        for name in names:
            if getattr(self, name) != type(self).model_fields[name].default:
                raise ValueError(f"{name}: {why}")

    def _check_balancer(self) -> None:
        if self.balancer != "none" and (self.dscp or self.conns_per_peer < 2):
            raise ValueError(f"balancer: {self.balancer} sets DSCP 1..conns_per_peer itself and "
                             "needs one connection per path: give conns_per_peer >= 2 (the "
                             "fabric's spines) and no dscp")

    def _trace_job(self) -> JobConfig:
        if self.trace is None:
            raise ValueError("collective: trace needs trace: PATH (the workload to replay)")
        if "collective" in self.model_fields_set and self.collective != TRACE:
            raise ValueError(f"collective: give either collective ({self.collective}) or trace, "
                             "not both")
        self._defaults_only(NOT_FOR_TRACE, "not used by a trace job (its sizes and compute "
                            "come from the trace); remove it")
        self._check_balancer()
        self.collective = TRACE
        return self

    @property
    def algorithm(self) -> str:
        """The collective that moves the data (DDP: ``all_reduce`` of the gradients)."""
        return "all_reduce" if self.collective == DDP else self.collective

    def compute(self) -> dict:
        """What a rank computes every iteration: ``kind`` accelerator (``gpu_s``: accelerator
        time on the VM clock, which the host's CPU load does not slow), cpu
        (``compute_units``: CPU work, which takes what the machine's CPU and the host's
        budget give it), both, or none; ``s_per_iteration``: the accelerator time, s (None
        without one: CPU work has no fixed time; a trace job's is per operation, in its
        results' ``trace``); ``units``: ``compute_units``."""
        if self.collective == TRACE:
            return {"kind": "accelerator", "s_per_iteration": None, "units": 0}
        kind = {(True, True): "both", (True, False): "accelerator", (False, True): "cpu",
                (False, False): "none"}[(self.gpu_s > 0, self.compute_units > 0)]
        return {"kind": kind, "s_per_iteration": self.gpu_s or None,
                "units": self.compute_units}

    def count_for(self, world: int) -> int:
        """The NCCL count (elements) on ``world`` ranks, after the checks that need ``world``.

        Raises:
            ValueError: ``world`` < 1, ``root`` not below ``world``, ``bytes`` too small to give
                each rank one element, or ``src_port_base`` too high for the connections.
        """
        if world < 1:
            raise ValueError(f"world: a job needs at least 1 rank, not {world}")
        if self.root >= world:
            raise ValueError(f"root: {self.root} is outside 0..{world - 1} ({world} ranks)")
        if self.collective == DDP:
            if self.model == "moe" and not 2 <= world <= ddp_models.BATCH:
                raise ValueError(f"model: moe needs 2 to {ddp_models.BATCH} ranks (one expert "
                                 f"each), not {world}")
            return ddp_models.params(self.model, self.hidden or DEFAULT_HIDDEN, world)
        if self.collective == TRACE:
            try:
                traces.check(self.trace or "", self.trace_format, world)
            except (OSError, ValueError) as e:
                raise ValueError(f"trace: {e}") from None
            return 0
        try:
            coll.check_algo(self.algo, world)
        except ValueError as e:
            raise ValueError(f"algo: {e}") from None
        if self.src_port_base is not None:
            last = self.src_port_base + world * world * self.conns_per_peer - 1
            if last > 65535:
                raise ValueError(f"src_port_base: {self.src_port_base} + {world}*{world}*"
                                 f"{self.conns_per_peer} connections would need port {last}; "
                                 f"allowed 1..{65536 - world * world * self.conns_per_peer}")
        if self.count is not None:
            return self.count
        itemsize = coll.dtype_of(self.dtype).itemsize
        count = coll.count_from_bytes(self.collective, world, self.bytes or DEFAULT_BYTES,
                                      itemsize)
        if count < 1:
            whole = self.collective in ("all_reduce", "reduce", "broadcast")
            need = itemsize * (1 if whole else world)
            raise ValueError(f"bytes: {self.bytes} is too small for {self.collective} of "
                             f"{self.dtype} on {world} ranks; allowed >= {need} (1 element "
                             "per rank)")
        return count

    def size_for(self, world: int) -> int:
        """nccl-tests' size in bytes on ``world`` ranks (``bytes`` rounded down to whole
        elements per rank; 0 for a trace job, whose sizes are per operation). Raises
        ValueError as ``count_for``."""
        if self.collective == TRACE:
            return self.count_for(world)
        return coll.size_bytes(self.algorithm, world, self.count_for(world),
                               coll.dtype_of(self.dtype).itemsize)


class WorkerConfig(BaseModel):
    """What one rank receives (as JSON): its job's ``JobConfig``, the job name, its rank and
    the ``host:port`` of every rank in rank order (the rank listens on its own; for ddp, rank
    0's address is the rendezvous).

    Raises:
        pydantic.ValidationError: a bad address, a rank outside the world, or a ``JobConfig``
            check (including ``count_for``).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="job name; ranks of another "
                      "job are refused")
    rank: int = Field(ge=0, description="this rank, 0..len(peers)-1")
    peers: list[str] = Field(min_length=1, description="host:port of every rank, rank order")
    job: JobConfig

    @field_validator("peers")
    @classmethod
    def _peers(cls, v: list[str]) -> list[str]:
        for a in v:
            try:
                parse_address(a)
            except ValueError as e:
                raise ValueError(f"peers: {e}") from None
        return v

    @model_validator(mode="after")
    def _world(self) -> WorkerConfig:
        if self.rank >= self.world:
            raise ValueError(f"rank: {self.rank} is outside 0..{self.world - 1} "
                             f"({self.world} peer addresses)")
        schedule = self.job.schedule
        for name in ("offsets_ns", "drifts_ppm"):
            given = getattr(schedule, name) if schedule else []
            if given and len(given) != self.world:
                raise ValueError(f"schedule.{name}: {len(given)} values for {self.world} "
                                 "ranks; give one per rank or none")
        self.job.count_for(self.world)
        return self

    @property
    def world(self) -> int:
        """Number of ranks."""
        return len(self.peers)

    @property
    def count(self) -> int:
        """NCCL count (elements) of this job on its world."""
        return self.job.count_for(self.world)

    @property
    def nbytes(self) -> int:
        """nccl-tests size (bytes) of this job on its world."""
        return self.job.size_for(self.world)

    @property
    def hints(self) -> PathHints:
        """The connections' path hints (source ports, DSCP; with a balancer DSCP c + 1 on
        connection c)."""
        dscp = (tuple(range(1, self.job.conns_per_peer + 1)) if self.job.balancer != "none"
                else tuple(self.job.dscp))
        return PathHints(self.job.src_port_base, dscp)


def as_job_config(config: JobConfig) -> JobConfig:
    """``config`` as a plain ``JobConfig`` (a subclass such as the scenario's ``JobSpec``
    carries fields a rank does not take)."""
    if type(config) is JobConfig:
        return config
    return JobConfig(**{k: getattr(config, k) for k in JobConfig.model_fields})


def describe(error: ValidationError) -> str:
    """One line for a validation error: ``field.path: message; ...``."""
    parts = []
    for err in error.errors():
        msg = err["msg"].removeprefix("Value error, ")
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(msg if not loc or msg.startswith(f"{err['loc'][-1]}:") else f"{loc}: {msg}")
    return "; ".join(parts)


def read_json_argument(text: str) -> str:
    """A JSON command-line argument: the text itself, or ``@PATH`` for a file's contents.

    Raises:
        OSError: the file cannot be read.
    """
    if text.startswith("@"):
        with open(os.path.expanduser(text[1:])) as f:
            return f.read()
    return text
