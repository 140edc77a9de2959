"""ASTRA-sim text workloads: parse a file and build each rank's operation graph.

Format (ASTRA-sim 1.0, ``Workload::initialize_workload`` in Workload.cc; the file
``Resnet50_DataParallel.txt`` shipped here comes from ASTRA-sim's
``examples/text_converter/text_workloads``): whitespace-separated tokens; line 1 the
parallelism and its options, line 2 the number of layers, then one line per layer: name, a
reserved integer, three (compute cycles, collective, size in bytes) triples for the forward
pass (fwd), the input gradient (ig) and the weight gradient (wg), and the weight update's
delay in cycles. Collectives: ALLREDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL or NONE.

Parallelisms replayed (what ASTRA-sim 1.0's ``iterate_*`` state machines do, per pass):

* ``DATA``: forward layer 0..L-1 (layer i waits for its previous pass's weight-gradient
  collective and update delay), then backward layer L-1..0: ig compute, wg compute, then the
  wg collective among all ranks, issued without blocking (it overlaps the next layers'
  backward compute) and followed by the update delay. fwd and ig collectives must be NONE
  (ASTRA-sim involves no dimension in them).
* ``HYBRID_TRANSFORMER model_parallel_NPU_group: M`` (M divides the ranks): model-parallel
  groups of M consecutive ranks (``r // M``), data-parallel groups of the ranks with the
  same ``r % M`` (ASTRA-sim's ``break_dimension(M)`` gives the first dimensions, M NPUs, to
  the model). fwd and ig collectives run in the model-parallel group and block (the next
  compute waits for them); wg collectives run in the data-parallel group without blocking,
  as in DATA.
* ``HYBRID_DLRM B`` (B: the last bottom-MLP layer): forward collectives must be ALLTOALL
  (the embedding exchange), issued without blocking among all ranks; layer B+1's forward
  waits for layer 0's. Backward from layer L-1: wg compute and wg collective (all ranks, not
  blocking; none for NONE), then ig compute (not for layer 0); after layer B+1's ig compute
  layer 0's ig collective (ALLTOALL) is issued without blocking, and the pass ends when it
  is done. ig collectives of other layers must be NONE.

Compute and delays: cycles / ``clock_ghz`` * ``compute_scale`` ns (``accel.cycles_ns``).
Sizes: the file's bytes times ``bytes_scale``, rounded to whole float32 elements (at least
one per rank), as nccl-tests' size of the collective (the larger buffer). Other
parallelisms (MODEL, HYBRID_DATA_MODEL, ..., HYBRID_TRANSFORMER_FWD_IN_BCKWD) are errors.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workloads import collectives as coll
from workloads.accel import cycles_ns
from workloads.traces.graph import Op

PARALLELISMS = ("DATA", "HYBRID_TRANSFORMER", "HYBRID_DLRM")
COLLECTIVES = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather",
               "REDUCESCATTER": "reduce_scatter", "ALLTOALL": "all_to_all", "NONE": None}
PHASES = ("fwd", "ig", "wg")
ELEMENT_BYTES = 4  # float32 buffers


@dataclass(frozen=True)
class Layer:
    """One layer line: cycles, collective names (``COLLECTIVES`` keys) and sizes (bytes) per
    phase, and the update delay (cycles)."""

    name: str
    cycles: dict[str, int]
    comm: dict[str, str]
    size: dict[str, int]
    update_cycles: int


@dataclass(frozen=True)
class Workload:
    """A parsed file: its parallelism, its option (model-parallel group size for
    HYBRID_TRANSFORMER, last bottom layer for HYBRID_DLRM, None for DATA) and its layers."""

    parallelism: str
    option: int | None
    layers: tuple[Layer, ...]

    def total_cycles(self) -> int:
        """Compute cycles of one pass (every layer's fwd, ig and wg; the update delays are not
        compute)."""
        return sum(sum(la.cycles.values()) for la in self.layers)


def _int(token: str, what: str, where: str) -> int:
    try:
        value = int(token)
    except ValueError:
        raise ValueError(f"{where}: {what} {token!r} is not an integer") from None
    if value < 0 and what != "reserved":
        raise ValueError(f"{where}: {what} {value} is negative")
    return value


def _header(tokens: list[str], where: str) -> tuple[str, int | None]:
    kind = tokens[0]
    if kind not in PARALLELISMS:
        raise ValueError(f"{where}: parallelism {kind} is not replayed; supported: "
                         f"{', '.join(PARALLELISMS)}")
    rest = tokens[1:]
    if kind == "DATA":
        if rest:
            raise ValueError(f"{where}: DATA takes no options, got {' '.join(rest)!r}")
        return kind, None
    if kind == "HYBRID_TRANSFORMER":
        if len(rest) != 2 or rest[0] != "model_parallel_NPU_group:":
            raise ValueError(f"{where}: expected 'HYBRID_TRANSFORMER model_parallel_NPU_group: "
                             f"N', got {' '.join(tokens)!r}")
        group = _int(rest[1], "model_parallel_NPU_group", where)
        if group < 1:
            raise ValueError(f"{where}: model_parallel_NPU_group must be at least 1")
        return kind, group
    if len(rest) != 1:
        raise ValueError(f"{where}: expected 'HYBRID_DLRM B' (B: the last bottom layer), got "
                         f"{' '.join(tokens)!r}")
    return kind, _int(rest[0], "last bottom layer", where)


def _layer(tokens: list[str], where: str) -> Layer:
    if len(tokens) != 12:
        raise ValueError(f"{where}: a layer line has 12 fields (name, reserved, 3 x (cycles, "
                         f"collective, bytes), update cycles), got {len(tokens)}")
    _int(tokens[1], "reserved", where)
    cycles, comm, size = {}, {}, {}
    for k, phase in enumerate(PHASES):
        c, kind, nbytes = tokens[2 + 3 * k: 5 + 3 * k]
        if kind not in COLLECTIVES:
            raise ValueError(f"{where}: {phase} collective {kind!r} is not one of "
                             f"{', '.join(COLLECTIVES)}")
        cycles[phase] = _int(c, f"{phase} compute cycles", where)
        comm[phase] = kind
        size[phase] = _int(nbytes, f"{phase} size", where)
    return Layer(tokens[0], cycles, comm, size, _int(tokens[11], "update cycles", where))


def parse(text: str, source: str = "workload") -> Workload:
    """Parse an ASTRA-sim text workload (blank lines skipped).

    Raises:
        ValueError: an unsupported parallelism, a malformed header or layer line, a layer
            count that differs from the lines, or a collective the parallelism does not take
            (naming ``source`` and the line number).
    """
    lines = [(i + 1, ln.split()) for i, ln in enumerate(text.splitlines()) if ln.strip()]
    if len(lines) < 2:
        raise ValueError(f"{source}: expected a parallelism line and a layer count")
    kind, option = _header(lines[0][1], f"{source}:{lines[0][0]}")
    n = _int(lines[1][1][0], "layer count", f"{source}:{lines[1][0]}")
    body = lines[2:]
    if len(body) != n or n == 0:
        raise ValueError(f"{source}: the file announces {n} layers and has {len(body)} layer "
                         "lines")
    layers = tuple(_layer(toks, f"{source}:{no}") for no, toks in body)
    wl = Workload(kind, option, layers)
    _check_phases(wl, source)
    return wl


def _check_phases(wl: Workload, source: str) -> None:
    bad = []
    for i, la in enumerate(wl.layers):
        if wl.parallelism == "DATA":
            bad += [(la.name, p) for p in ("fwd", "ig") if la.comm[p] != "NONE"]
        elif wl.parallelism == "HYBRID_DLRM":
            if la.comm["fwd"] not in ("ALLTOALL", "NONE"):
                bad.append((la.name, "fwd"))
            if la.comm["ig"] != "NONE" and (i != 0 or la.comm["ig"] != "ALLTOALL"):
                bad.append((la.name, "ig"))
    if bad:
        what = ", ".join(f"{name} {phase}" for name, phase in bad[:5])
        raise ValueError(f"{source}: {wl.parallelism} does not run these collectives (ASTRA-sim "
                         f"involves no rank in them): {what}; set them to NONE")
    if wl.parallelism == "HYBRID_DLRM":
        b = wl.option or 0
        if not 0 <= b < len(wl.layers) - 1:
            raise ValueError(f"{source}: last bottom layer {b} must be below the last layer "
                             f"({len(wl.layers) - 1})")


def groups(wl: Workload, rank: int, world: int) -> dict[str, tuple[int, ...]]:
    """The global ranks of ``rank``'s collectives per phase (fwd, ig, wg).

    Raises:
        ValueError: HYBRID_TRANSFORMER's group size does not divide ``world``.
    """
    everyone = tuple(range(world))
    if wl.parallelism != "HYBRID_TRANSFORMER":
        return {"fwd": everyone, "ig": everyone, "wg": everyone}
    m = wl.option or 1
    if world % m:
        raise ValueError(f"model_parallel_NPU_group: {m} does not divide {world} ranks")
    model = tuple(range(rank - rank % m, rank - rank % m + m))
    data = tuple(range(rank % m, world, m))
    return {"fwd": model, "ig": model, "wg": data}


def run_bytes(collective: str, nbytes: int, scale: float, group_size: int) -> int:
    """nccl-tests size (bytes) that replays a collective of ``nbytes`` times ``scale`` among
    ``group_size`` ranks: whole float32 elements, at least one per rank."""
    want = max(1, round(nbytes * scale))
    count = max(1, coll.count_from_bytes(collective, group_size, want, ELEMENT_BYTES))
    return coll.size_bytes(collective, group_size, count, ELEMENT_BYTES)


class _Builder:
    """Appends ops with sequential ids; ``chain`` is what the program's next op waits for
    (its last compute, or the blocking collective after it)."""

    def __init__(self, wl: Workload, rank: int, world: int, clock_ghz: float,
                 compute_scale: float, bytes_scale: float):
        self.wl, self.groups = wl, groups(wl, rank, world)
        self.clock_ghz, self.compute_scale, self.bytes_scale = clock_ghz, compute_scale, \
            bytes_scale
        self.ops: list[Op] = []
        self.chain: tuple[int, ...] = ()
        self.iteration = 0

    def add(self, **kw) -> int:
        op = Op(id=len(self.ops), iteration=self.iteration, **kw)
        self.ops.append(op)
        return op.id

    def ns(self, cycles: int) -> int:
        return cycles_ns(cycles, self.clock_ghz, self.compute_scale)

    def compute(self, la: Layer, phase: str, waits: tuple[int | None, ...] = ()) -> None:
        deps = self.chain + tuple(d for d in waits if d is not None)
        self.chain = (self.add(name=f"{la.name} {phase} compute", kind="compute", deps=deps,
                               layer=la.name, phase=phase,
                               duration_ns=self.ns(la.cycles[phase])),)

    def comm(self, la: Layer, phase: str, blocking: bool = False) -> int | None:
        kind = COLLECTIVES[la.comm[phase]]
        if kind is None:
            return None
        group = self.groups[phase]
        i = self.add(name=f"{la.name} {phase} {la.comm[phase]}", kind="collective",
                     deps=self.chain, collective=kind, group=group, layer=la.name, phase=phase,
                     bytes=run_bytes(kind, la.size[phase], self.bytes_scale, len(group)))
        if blocking:
            self.chain = (i,)
        return i

    def update(self, la: Layer, comm: int | None) -> int | None:
        if comm is None:
            return None
        return self.add(name=f"{la.name} update", kind="delay", deps=(comm,), layer=la.name,
                        phase="update", duration_ns=self.ns(la.update_cycles))


def build(wl: Workload, rank: int, world: int, passes: int, clock_ghz: float = 1.0,
          compute_scale: float = 1.0, bytes_scale: float = 1.0) -> list[Op]:
    """Rank ``rank``'s graph of ``passes`` training passes (ids in program order; see the
    module docstring for the order and the dependencies).

    Raises:
        ValueError: group size that does not divide ``world``, or bad scales.
    """
    b = _Builder(wl, rank, world, clock_ghz, compute_scale, bytes_scale)
    n = len(wl.layers)
    done: list[int | None] = [None] * n  # per layer: its previous wg collective (+ update)
    pass_end: int | None = None  # DLRM: layer 0's ig all-to-all of the previous pass
    for p in range(passes):
        b.iteration = p
        a2a0: int | None = None
        for i, la in enumerate(wl.layers):
            waits = (done[i], pass_end if i == 0 else None)
            if wl.parallelism == "HYBRID_DLRM" and i == (wl.option or 0) + 1:
                waits += (a2a0,)
            b.compute(la, "fwd", waits)
            if wl.parallelism == "HYBRID_TRANSFORMER":
                b.comm(la, "fwd", blocking=True)
            elif wl.parallelism == "HYBRID_DLRM":
                c = b.comm(la, "fwd")
                a2a0 = c if i == 0 else a2a0
        if wl.parallelism == "HYBRID_DLRM":
            pass_end = _dlrm_backward(b, wl, done)
        else:
            for i in reversed(range(n)):
                la = wl.layers[i]
                b.compute(la, "ig")
                if wl.parallelism == "HYBRID_TRANSFORMER":
                    b.comm(la, "ig", blocking=True)
                b.compute(la, "wg")
                done[i] = b.update(la, b.comm(la, "wg"))
    return b.ops


def _dlrm_backward(b: _Builder, wl: Workload, done: list[int | None]) -> int | None:
    """DLRM's backward pass; returns layer 0's ig all-to-all (the pass ends with it)."""
    ig0 = None
    for i in reversed(range(len(wl.layers))):
        la = wl.layers[i]
        b.compute(la, "wg")
        done[i] = b.update(la, b.comm(la, "wg"))
        if i > 0:
            b.compute(la, "ig")
            if i == (wl.option or 0) + 1:
                ig0 = b.comm(wl.layers[0], "ig")
    return ig0


def load(path: str | Path) -> Workload:
    """Parse the file at ``path``.

    Raises:
        OSError: it cannot be read. ValueError: as ``parse``.
    """
    p = Path(path)
    return parse(p.read_text(), str(p))


def looks_like(head: bytes) -> bool:
    """The first bytes of a file start with a parallelism keyword of this format."""
    first = head.split(maxsplit=1)[:1]
    return bool(first) and first[0].decode("ascii", "replace").startswith(
        ("DATA", "HYBRID", "MODEL", "MICRO", "DISTRIBUTED"))
