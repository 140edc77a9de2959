"""Trace replay: a job whose ranks replay a workload trace instead of one collective.

Formats: ASTRA-sim text workloads (``astra``) and Chakra execution traces (``chakra``, one
``.et`` file per rank). Both become a per-rank graph of ``graph.Op`` that ``replay`` runs:
compute as accelerator time on the VM clock (``workloads.accel``), collectives through
``workloads.collectives`` over the job's mesh (with its balancer), send/recv point to point.

Modules:
    graph:    ``Op``, dependency order, the communication stream's order.
    astra:    the ASTRA-sim text format and its parallelisms (DATA, HYBRID_TRANSFORMER,
              HYBRID_DLRM).
    chakra:   ``.et`` files (read, write, to operations); ``chakra_et.proto`` is the schema.
    replay:   the rank program, ``python -m workloads.traces.replay --config JSON``.
    summary:  per operation, layer and iteration results of a job's ranks.

Built-in traces (``data/``, named by file name): ``Resnet50_DataParallel.txt`` (ASTRA-sim's
example, unchanged), ``transformer_hybrid.txt`` (a small HYBRID_TRANSFORMER file written for
nslab) and ``diamond.{0..3}.et`` (a 4-rank Chakra trace built with ``chakra.write``: a
diamond of compute nodes, an AllReduce, a ring of send/recv).

Scaling (``scale_for``): a modelled cluster computes ``cycles / clock`` and moves bytes at
``model_bit_s``; the lab's link moves them at ``lab_bit_s``. Compute is stretched by
``compute_scale`` (so the lab's TCP and the emulated link have time to matter), and the
collective sizes by ``bytes_scale = compute_scale * lab_bit_s / model_bit_s``, so that on the
lab link a collective takes ``compute_scale`` times its modelled time, like the compute: the
ratio of compute to communication is the modelled cluster's.
"""
from __future__ import annotations

from pathlib import Path

from workloads.traces import astra, chakra
from workloads.traces.graph import Op, check_ranks, comm_order

DATA_DIR = Path(__file__).parent / "data"
FORMATS = ("astra", "chakra")


def scale_for(compute_scale: float, lab_bit_s: float, model_bit_s: float) -> float:
    """``bytes_scale`` that keeps the modelled compute/communication ratio on a lab link of
    ``lab_bit_s`` when compute is stretched ``compute_scale`` times (see the module
    docstring).

    Raises:
        ValueError: a rate or scale that is not positive.
    """
    if min(compute_scale, lab_bit_s, model_bit_s) <= 0:
        raise ValueError("compute_scale, lab_bit_s and model_bit_s must be positive")
    return compute_scale * lab_bit_s / model_bit_s


def resolve(path: str, base: str | Path | None = None) -> str:
    """The absolute path of a trace: ``path`` if it (or, for Chakra, its rank-0 file) exists,
    relative to ``base`` (a scenario's folder) or else to the current directory, else the
    built-in trace of that name (``DATA_DIR``).

    Raises:
        ValueError: none exists (listing the built-in traces).
    """
    for p in (Path(base or ".") / path, Path(path), DATA_DIR / path):
        if p.is_file() or chakra.rank_files(p):
            return str(p.resolve())
    names = sorted({f.name if f.suffix == ".txt" else f.name.split(".")[0]
                    for f in DATA_DIR.iterdir() if f.suffix in (".txt", ".et")})
    raise ValueError(f"trace: no file {path!r} and no built-in trace of that name; built-in: "
                     f"{', '.join(names)} (a Chakra trace is named by its prefix, e.g. "
                     "'diamond')")


def detect(path: str) -> str:
    """``astra`` or ``chakra`` from the file's content (Chakra: ``PATH.0.et`` exists or the
    file is a protobuf stream).

    Raises:
        ValueError: neither format.
    """
    if chakra.rank_files(path):
        return "chakra"
    p = Path(path)
    if p.is_file():
        with open(p, "rb") as f:
            head = f.read(64)
        if astra.looks_like(head):
            return "astra"
        if p.suffix == ".et":
            return "chakra"
    raise ValueError(f"trace: cannot tell the format of {path}: not an ASTRA-sim text workload "
                     "(first word DATA, HYBRID_...) nor Chakra files PREFIX.RANK.et; give "
                     "trace_format")


def ops_for(path: str, fmt: str, rank: int, world: int, passes: int, clock_ghz: float = 1.0,
            compute_scale: float = 1.0, bytes_scale: float = 1.0) -> tuple[list[Op], dict]:
    """Rank ``rank``'s operations for ``passes`` passes, and what the trace is (``info``:
    format, parallelism, model_parallel_group, layers, compute_s_per_pass: this rank's
    scaled compute of one pass, s).

    Raises:
        OSError: a file cannot be read.
        ValueError: a format error, a trace that does not fit ``world`` ranks (group size,
            number of Chakra files, peers), naming the file and the node or line.
    """
    fmt = detect(path) if fmt == "auto" else fmt
    if fmt == "astra":
        wl = astra.load(path)
        ops = astra.build(wl, rank, world, passes, clock_ghz, compute_scale, bytes_scale)
        info = {"parallelism": wl.parallelism, "layers": len(wl.layers),
                "model_parallel_group": (wl.option if wl.parallelism == "HYBRID_TRANSFORMER"
                                         else None)}
    elif fmt == "chakra":
        files = chakra.rank_files(path) or [Path(path)]
        if len(files) != world:
            raise ValueError(f"trace: {len(files)} Chakra files for {world} ranks; give one "
                             f"file per rank ({path}.RANK.et)")
        try:
            ops = chakra.to_ops(chakra.read(files[rank])[1], world, passes,
                                compute_scale, bytes_scale)
        except ValueError as e:
            raise ValueError(f"{files[rank]}: {e}") from None
        info = {"parallelism": None, "layers": None, "model_parallel_group": None}
    else:
        raise ValueError(f"trace_format: {fmt!r} is not one of auto, {', '.join(FORMATS)}")
    check_ranks(ops, rank, world)
    comm_order(ops)  # raises for a dependency cycle or a missing node
    compute = sum(op.duration_ns for op in ops if op.kind == "compute" and op.iteration == 0)
    return ops, {"format": fmt, **info, "compute_s_per_pass": compute / 1e9}


def check(path: str, fmt: str, world: int) -> None:
    """Load every rank's graph of one pass and check that the ranks agree: the members of
    every group run the same collectives (kind and size) in the same order, and every rank's
    sends to a peer match that peer's receives from it in order and size (what a job checks
    before it starts; a mismatch would hang the replay).

    Raises:
        OSError, ValueError: as ``ops_for`` for the first rank that fails, or the first
            disagreement (naming the ranks and the operation).
    """
    colls: dict[tuple[int, ...], dict[int, list]] = {}
    p2p: dict[tuple[str, int, int], list[int]] = {}
    for rank in range(world):
        ops, _ = ops_for(path, fmt, rank, world, 1)
        for op in comm_order(ops):
            if op.kind == "collective":
                colls.setdefault(op.group, {}).setdefault(rank, []).append(
                    (op.collective, op.bytes, op.name))
            else:
                a, b = (rank, op.peer) if op.kind == "send" else (op.peer, rank)
                p2p.setdefault((op.kind, a, b), []).append(op.bytes)
    for group, seqs in colls.items():
        first = seqs.get(group[0], [])
        for r in group:
            got = seqs.get(r, [])
            if [x[:2] for x in got] != [x[:2] for x in first]:
                i = next((k for k, (x, y) in enumerate(zip(got, first, strict=False))
                          if x[:2] != y[:2]),
                         min(len(got), len(first)))
                raise ValueError(f"ranks {group[0]} and {r} of group {list(group)} disagree at "
                                 f"their collective {i}: "
                                 f"{first[i][2] if i < len(first) else 'none'} against "
                                 f"{got[i][2] if i < len(got) else 'none'}")
    for (kind, a, b), sizes in p2p.items():
        if kind == "send" and p2p.get(("recv", a, b), []) != sizes:
            raise ValueError(f"rank {a} sends {sizes} bytes to rank {b}, which receives "
                             f"{p2p.get(('recv', a, b), [])} from it")
        if kind == "recv" and ("send", a, b) not in p2p:
            raise ValueError(f"rank {b} receives {sizes} bytes from rank {a}, which sends none")
