"""NCCL's collective operations over a ``Mesh``, on 1-D numpy buffers.

Names, buffer shapes and semantics follow NCCL (user guide, "Collective Operations" and
"Point-to-point communication" for Gather/Scatter/AllToAll); ``count`` is NCCL's count argument,
in elements, and N is the world size:

=============== ================ ================= ==========================================
collective      sendbuf          recvbuf           result
=============== ================ ================= ==========================================
all_reduce      (count,)         (count,)          op over ranks, on every rank
broadcast       (count,) at root (count,)          root's sendbuf, on every rank
reduce          (count,)         (count,) at root  op over ranks, at root only
all_gather      (count,)         (N*count,)        block i = rank i's sendbuf
reduce_scatter  (N*count,)       (count,)          rank r: op over ranks of their block r
gather          (count,)         (N*count,) root   block i = rank i's sendbuf, at root only
scatter         (N*count,) root  (count,)          rank r: block r of root's sendbuf
all_to_all      (N*count,)       (N*count,)        rank r block i = rank i's sendbuf block r
=============== ================ ================= ==========================================

Algorithms (the ones NCCL uses on a ring, or its grouped send/recv for the rest):

* all_reduce: ring reduce-scatter then ring all-gather, each N-1 steps of about count/N
  elements; chunk i is elements ``[i*count//N, (i+1)*count//N)``, so any count works (chunks
  may be empty when count < N); or (``algo="halving_doubling"``, N a power of two)
  recursive-halving reduce-scatter then recursive-doubling all-gather on the same chunks.
* reduce_scatter / all_gather: the same ring phases on the N equal blocks.
* broadcast / reduce: a pipelined chain along the ring from (to) the root, in chunks of
  ``PIPELINE_CHUNK_BYTES``: N-2 + ceil(bytes/chunk) steps.
* gather / scatter / all_to_all: direct transfers with every peer at once (nccl-tests runs
  these as grouped ncclSend/ncclRecv).

Reduction ops: sum, prod, max, min, avg (avg = sum then one division by N, floating types
only). Data types: NCCL's ncclDataType_t names that numpy has (int8, uint8, int32, uint32,
int64, uint64, float16, float32, float64, plus nccl-tests' aliases char, int, half, float,
double); no bfloat16.

Verification: ``make_input`` derives every rank's send buffer from ``(seed, rank)``, using
small integers (|x| <= 50; prod: +-1, +-2), so sums and products are exact in every type
(float16 up to 40 ranks for sum, 15 for prod; integer types wrap, which is associative) and
``expected`` can compare bit for bit whatever the reduction order.

Bandwidths (nccl-tests, doc/PERFORMANCE.md and src/*.cu): ``size_bytes`` is nccl-tests'
"size"; algbw = size / time and busbw = algbw * ``bus_factor``: 2(N-1)/N for AllReduce,
(N-1)/N for AllGather, ReduceScatter, AllToAll, Gather, Scatter, and 1 for Broadcast, Reduce.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from contracts import enums

COLLECTIVES = enums.COLLECTIVES
NCCL_NAMES = {"all_reduce": "AllReduce", "broadcast": "Broadcast", "reduce": "Reduce",
              "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
              "gather": "Gather", "scatter": "Scatter", "all_to_all": "AllToAll"}
ROOTED = ("broadcast", "reduce", "gather", "scatter")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
OPS = ("sum", "prod", "max", "min", "avg")
DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64")
_DTYPE_ALIASES = {"char": "int8", "int": "int32", "half": "float16", "float": "float32",
                  "double": "float64"}
_UFUNCS: dict[str, np.ufunc] = {"sum": np.add, "prod": np.multiply, "max": np.maximum,
                                "min": np.minimum, "avg": np.add}
PIPELINE_CHUNK_BYTES = 64 * 1024


class Communicator(Protocol):
    """What the algorithms need from a transport (``transport.Mesh`` provides it)."""

    rank: int
    world: int

    def exchange(self, sends=(), recvs=(), label: str = "transfer") -> None: ...


# -- names and sizes ----------------------------------------------------------------------

def collective_name(name: str) -> str:
    """Canonical name (``all_reduce``) of ``name``; accepts NCCL's ("AllReduce"), nccl-tests'
    ("all_reduce_perf", "alltoall") and snake case.

    Raises:
        ValueError: unknown collective.
    """
    key = name.lower().removesuffix("_perf").replace("_", "").replace("-", "")
    for c in COLLECTIVES:
        if c.replace("_", "") == key:
            return c
    raise ValueError(f"unknown collective {name!r}; expected one of {', '.join(COLLECTIVES)}")


def dtype_of(name: str | np.dtype) -> np.dtype:
    """numpy dtype of an NCCL/nccl-tests type name.

    Raises:
        ValueError: a type NCCL does not have or numpy cannot hold (e.g. bfloat16).
    """
    try:
        dt = np.dtype(_DTYPE_ALIASES.get(name, name) if isinstance(name, str) else name)
    except TypeError:
        dt = None
    if dt is None or dt.name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return dt


def check_op(op: str, dtype: np.dtype) -> None:
    """Raises ValueError for an unknown op, or avg on an integer type."""
    if op not in OPS:
        raise ValueError(f"unknown reduction op {op!r}; expected one of {', '.join(OPS)}")
    if op == "avg" and dtype.kind != "f":
        raise ValueError(f"op 'avg' needs a floating type, not {dtype.name}")


def buffer_counts(collective: str, world: int, count: int) -> tuple[int, int]:
    """``(send elements, recv elements)`` of a collective with NCCL count ``count``."""
    c = collective_name(collective)
    send = world * count if c in ("reduce_scatter", "scatter", "all_to_all") else count
    recv = world * count if c in ("all_gather", "gather", "all_to_all") else count
    return send, recv


def size_bytes(collective: str, world: int, count: int, itemsize: int) -> int:
    """nccl-tests' "size" column in bytes: the larger of the two buffers."""
    return max(buffer_counts(collective, world, count)) * itemsize


def count_from_bytes(collective: str, world: int, nbytes: int, itemsize: int) -> int:
    """NCCL count for a nccl-tests size of ``nbytes`` (rounded down as nccl-tests does:
    ``nbytes // itemsize`` elements, divided by N for the per-rank collectives)."""
    c = collective_name(collective)
    total = nbytes // itemsize
    return total if c in ("all_reduce", "broadcast", "reduce") else total // world


def bus_factor(collective: str, world: int) -> float:
    """nccl-tests' busbw / algbw factor for a world of ``world`` ranks."""
    c = collective_name(collective)
    if c == "all_reduce":
        return 2.0 * (world - 1) / world
    if c in ("broadcast", "reduce"):
        return 1.0
    return (world - 1) / world


def chunk_bounds(count: int, parts: int) -> list[int]:
    """``parts + 1`` offsets cutting ``count`` elements into near-equal chunks."""
    return [i * count // parts for i in range(parts + 1)]


# -- deterministic inputs and reference results ------------------------------------------

def make_input(collective: str, rank: int, world: int, count: int, dtype, op: str = "sum",
               seed: int = 0) -> np.ndarray:
    """Rank ``rank``'s send buffer, a pure function of its arguments (shape per the table)."""
    dt = dtype_of(dtype)
    n = buffer_counts(collective, world, count)[0]
    rng = np.random.default_rng([seed, rank])
    if op == "prod":
        table = np.array([1, 2, 1, 2] if dt.kind == "u" else [-2, -1, 1, 2], dtype=np.int8)
        vals = table[rng.integers(0, 4, size=n, dtype=np.int8)]
    else:
        vals = rng.integers(0 if dt.kind == "u" else -50, 51, size=n, dtype=np.int8)
    return vals.astype(dt)


def expected(collective: str, rank: int, world: int, count: int, dtype, op: str = "sum",
             root: int = 0, seed: int = 0) -> np.ndarray | None:
    """What ``rank``'s recvbuf must hold after the collective on ``make_input`` buffers, or
    None where NCCL leaves it undefined (non-root ranks of reduce and gather)."""
    c = collective_name(collective)
    if c in ("reduce", "gather") and rank != root:
        return None

    def inp(i: int) -> np.ndarray:
        return make_input(c, i, world, count, dtype, op, seed)

    if c == "broadcast":
        return inp(root)
    if c == "scatter":
        return inp(root)[rank * count:(rank + 1) * count]
    if c in ("all_gather", "gather"):
        return np.concatenate([inp(i) for i in range(world)])
    if c == "all_to_all":
        return np.concatenate([inp(i)[rank * count:(rank + 1) * count] for i in range(world)])
    ufunc = _UFUNCS[op]
    part = slice(rank * count, (rank + 1) * count) if c == "reduce_scatter" else slice(None)
    out = inp(0)[part].copy()
    for i in range(1, world):
        ufunc(out, inp(i)[part], out=out)
    if op == "avg":
        np.divide(out, world, out=out)
    return out


# -- the algorithms -----------------------------------------------------------------------

def _buf(buf: np.ndarray | None, n: int, dtype: np.dtype, what: str) -> np.ndarray:
    if buf is None:
        return np.empty(n, dtype)
    if buf.ndim != 1 or buf.shape[0] != n or buf.dtype != dtype or not buf.flags.c_contiguous:
        raise ValueError(f"{what} must be a contiguous 1-D {dtype.name} array of {n} elements, "
                         f"got shape {buf.shape} {buf.dtype}")
    return buf


def _prepare(comm: Communicator, sendbuf: np.ndarray | None, recvbuf: np.ndarray | None,
             collective: str, root: int = 0, op: str = "sum"
             ) -> tuple[np.ndarray, np.ndarray, int]:
    n = comm.world
    if not 0 <= root < n:
        raise ValueError(f"root {root} is outside 0..{n - 1}")
    ref = sendbuf if sendbuf is not None else recvbuf
    if ref is None:
        raise ValueError(f"{collective}: give sendbuf or recvbuf")
    dt = dtype_of(ref.dtype)
    check_op(op, dt)
    per_count = buffer_counts(collective, n, 1)[0 if sendbuf is not None else 1]
    count = ref.shape[0] // per_count
    sn, rn = buffer_counts(collective, n, count)
    if sendbuf is None and not (collective in ("broadcast", "scatter") and comm.rank != root):
        raise ValueError(f"{collective}: rank {comm.rank} needs a sendbuf")
    send = sendbuf if sendbuf is None else _buf(sendbuf, sn, dt, "sendbuf")
    return send, _buf(recvbuf, rn, dt, "recvbuf"), count  # type: ignore[return-value]


def _ring_reduce_scatter(comm: Communicator, work: np.ndarray, bounds: list[int],
                         ufunc: np.ufunc, label: str) -> None:
    """After N-1 steps rank r's chunk r of ``work`` holds the reduction over all ranks."""
    n, r = comm.world, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    tmp = np.empty(max(bounds[i + 1] - bounds[i] for i in range(n)), work.dtype)
    for s in range(n - 1):
        si, ri = (r - s - 1) % n, (r - s - 2) % n
        dst = work[bounds[ri]:bounds[ri + 1]]
        got = tmp[:dst.shape[0]]
        comm.exchange(sends=[(right, work[bounds[si]:bounds[si + 1]])], recvs=[(left, got)],
                      label=f"{label} reduce-scatter step {s}")
        ufunc(dst, got, out=dst)


def _ring_all_gather(comm: Communicator, work: np.ndarray, bounds: list[int],
                     label: str) -> None:
    """Rank r owns chunk r of ``work``; after N-1 steps every rank has every chunk."""
    n, r = comm.world, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        si, ri = (r - s) % n, (r - s - 1) % n
        comm.exchange(sends=[(right, work[bounds[si]:bounds[si + 1]])],
                      recvs=[(left, work[bounds[ri]:bounds[ri + 1]])],
                      label=f"{label} all-gather step {s}")


def _halving_reduce_scatter(comm: Communicator, work: np.ndarray, bounds: list[int],
                            ufunc: np.ufunc, label: str) -> None:
    """Recursive halving: at distance N/2, N/4, ..., 1 a rank keeps the half of its chunk
    range on its side of the partner (rank XOR distance) and sends the other half; after
    log2 N steps rank r's chunk r of ``work`` holds the reduction over all ranks."""
    n, r = comm.world, comm.rank
    lo, hi, dist = 0, n, n // 2
    while dist:
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if not r & dist else ((mid, hi), (lo, mid))
        dst = work[bounds[keep[0]]:bounds[keep[1]]]
        got = np.empty_like(dst)
        comm.exchange(sends=[(r ^ dist, work[bounds[give[0]]:bounds[give[1]]])],
                      recvs=[(r ^ dist, got)], label=f"{label} reduce-scatter distance {dist}")
        ufunc(dst, got, out=dst)
        (lo, hi), dist = keep, dist // 2


def _doubling_all_gather(comm: Communicator, work: np.ndarray, bounds: list[int],
                         label: str) -> None:
    """Recursive doubling: rank r owns chunk r; at distance 1, 2, ..., N/2 it swaps its
    owned range with the partner's (rank XOR distance), doubling it."""
    n, r = comm.world, comm.rank
    lo, hi, dist = r, r + 1, 1
    while dist < n:
        other = (hi, 2 * hi - lo) if not r & dist else (2 * lo - hi, lo)
        comm.exchange(sends=[(r ^ dist, work[bounds[lo]:bounds[hi]])],
                      recvs=[(r ^ dist, work[bounds[other[0]]:bounds[other[1]]])],
                      label=f"{label} all-gather distance {dist}")
        lo, hi, dist = min(lo, other[0]), max(hi, other[1]), dist * 2


ALL_REDUCE_ALGOS = ("ring", "halving_doubling")


def check_algo(algo: str, world: int) -> None:
    """Raises ValueError for an unknown AllReduce algorithm, or halving_doubling on a world
    that is not a power of two."""
    if algo not in ALL_REDUCE_ALGOS:
        raise ValueError(f"unknown all_reduce algorithm {algo!r}; expected one of "
                         f"{', '.join(ALL_REDUCE_ALGOS)}")
    if algo == "halving_doubling" and world & (world - 1):
        raise ValueError(f"halving_doubling needs a power-of-two number of ranks, not {world}")


def all_reduce(comm: Communicator, sendbuf: np.ndarray, recvbuf: np.ndarray | None = None,
               op: str = "sum", algo: str = "ring") -> np.ndarray:
    """ncclAllReduce: ``recvbuf[i] = op over ranks of sendbuf[i]``; shapes (count,).

    ``ring``: reduce-scatter then all-gather, 2(N-1) steps of about count/N elements, each to
    the next rank. ``halving_doubling`` (Rabenseifner; Thakur et al., "Optimization of
    Collective Communication Operations in MPICH", 2005): recursive-halving reduce-scatter
    then recursive-doubling all-gather, 2 log2 N steps with partners at distance N/2 .. 1
    (N a power of two).

    Returns:
        recvbuf (allocated when None).
    Raises:
        ValueError: buffer shape/dtype mismatch, unknown op, avg on integers, unknown algo or
            halving_doubling on a world that is not a power of two.
        PeerLostError, JobTimeoutError: from the transport.
    """
    check_algo(algo, comm.world)
    sendbuf, recvbuf, count = _prepare(comm, sendbuf, recvbuf, "all_reduce", op=op)
    recvbuf[:] = sendbuf
    if comm.world > 1 and count:
        bounds = chunk_bounds(count, comm.world)
        ring = algo == "ring"
        (_ring_reduce_scatter if ring else _halving_reduce_scatter)(
            comm, recvbuf, bounds, _UFUNCS[op], "all_reduce")
        if op == "avg":
            own = recvbuf[bounds[comm.rank]:bounds[comm.rank + 1]]
            np.divide(own, comm.world, out=own)
        (_ring_all_gather if ring else _doubling_all_gather)(comm, recvbuf, bounds, "all_reduce")
    elif op == "avg":
        np.divide(recvbuf, comm.world, out=recvbuf)
    return recvbuf


def reduce_scatter(comm: Communicator, sendbuf: np.ndarray, recvbuf: np.ndarray | None = None,
                   op: str = "sum") -> np.ndarray:
    """ncclReduceScatter: rank r's ``recvbuf`` (count,) = op over ranks of block r of their
    ``sendbuf`` (N*count,). Ring, N-1 steps of count elements.

    Raises:
        ValueError: buffer shape/dtype mismatch (sendbuf length not a multiple of N), bad op.
        PeerLostError, JobTimeoutError: from the transport.
    """
    n, r = comm.world, comm.rank
    if sendbuf.shape[0] % n:
        raise ValueError(f"reduce_scatter sendbuf has {sendbuf.shape[0]} elements, "
                         f"not a multiple of {n} ranks")
    sendbuf, recvbuf, count = _prepare(comm, sendbuf, recvbuf, "reduce_scatter",
                                       op=op)
    if n > 1 and count:
        work = sendbuf.copy()
        bounds = chunk_bounds(n * count, n)
        _ring_reduce_scatter(comm, work, bounds, _UFUNCS[op], "reduce_scatter")
        recvbuf[:] = work[r * count:(r + 1) * count]
    else:
        recvbuf[:] = sendbuf[r * count:(r + 1) * count]
    if op == "avg":
        np.divide(recvbuf, n, out=recvbuf)
    return recvbuf


def all_gather(comm: Communicator, sendbuf: np.ndarray,
               recvbuf: np.ndarray | None = None) -> np.ndarray:
    """ncclAllGather: ``recvbuf`` (N*count,) holds rank i's ``sendbuf`` (count,) at block i.
    Ring, N-1 steps of count elements.

    Raises:
        ValueError: buffer shape/dtype mismatch.
        PeerLostError, JobTimeoutError: from the transport.
    """
    n, r = comm.world, comm.rank
    sendbuf, recvbuf, count = _prepare(comm, sendbuf, recvbuf, "all_gather")
    recvbuf[r * count:(r + 1) * count] = sendbuf
    if n > 1 and count:
        _ring_all_gather(comm, recvbuf, chunk_bounds(n * count, n), "all_gather")
    return recvbuf


def _pipeline_chunks(count: int, itemsize: int) -> list[int]:
    per = max(1, PIPELINE_CHUNK_BYTES // itemsize)
    return chunk_bounds(count, max(1, -(-count // per)))


def broadcast(comm: Communicator, sendbuf: np.ndarray | None, recvbuf: np.ndarray | None = None,
              root: int = 0) -> np.ndarray:
    """ncclBroadcast: every rank's ``recvbuf`` (count,) = root's ``sendbuf`` (count,).

    ``sendbuf`` is read only at the root; other ranks may pass None with a ``recvbuf``.
    Pipelined chain along the ring from the root, ``PIPELINE_CHUNK_BYTES`` chunks.

    Raises:
        ValueError: buffer shape/dtype mismatch, bad root, neither buffer given.
        PeerLostError, JobTimeoutError: from the transport.
    """
    n, r = comm.world, comm.rank
    if r != root and recvbuf is not None:
        sendbuf = None
    sendbuf, recvbuf, count = _prepare(comm, sendbuf, recvbuf, "broadcast",
                                       root=root)
    pos = (r - root) % n
    if pos == 0:
        recvbuf[:] = sendbuf
    if n == 1 or count == 0:
        return recvbuf
    b = _pipeline_chunks(count, recvbuf.itemsize)
    nch = len(b) - 1
    nxt, prv = (r + 1) % n, (r - 1) % n
    for t in range(nch + n - 2):
        sends, recvs = [], []
        c = t - pos
        if pos < n - 1 and 0 <= c < nch:
            sends.append((nxt, recvbuf[b[c]:b[c + 1]]))
        c = t - pos + 1
        if pos > 0 and 0 <= c < nch:
            recvs.append((prv, recvbuf[b[c]:b[c + 1]]))
        if sends or recvs:
            comm.exchange(sends, recvs, label=f"broadcast step {t}")
    return recvbuf


def reduce(comm: Communicator, sendbuf: np.ndarray, recvbuf: np.ndarray | None = None,
           op: str = "sum", root: int = 0) -> np.ndarray:
    """ncclReduce: root's ``recvbuf`` (count,) = op over ranks of ``sendbuf`` (count,);
    ``recvbuf`` is left untouched on other ranks.

    Pipelined chain along the ring toward the root, ``PIPELINE_CHUNK_BYTES`` chunks.

    Raises:
        ValueError: buffer shape/dtype mismatch, bad root or op.
        PeerLostError, JobTimeoutError: from the transport.
    """
    n, r = comm.world, comm.rank
    sendbuf, recvbuf, count = _prepare(comm, sendbuf, recvbuf, "reduce",
                                       root=root, op=op)
    ufunc = _UFUNCS[op]
    if n == 1 or count == 0:
        if r == root:
            recvbuf[:] = sendbuf
            if op == "avg":
                np.divide(recvbuf, n, out=recvbuf)
        return recvbuf
    # the chain root-1 -> root-2 -> ... -> root+1 -> root; d = position from its far end
    # (root-1 has d = 0, the root d = N-1)
    d = n - 1 - (r - root) % n
    if r == root:
        recvbuf[:] = sendbuf
        work = recvbuf
    else:
        work = sendbuf.copy() if d > 0 else sendbuf
    b = _pipeline_chunks(count, sendbuf.itemsize)
    nch = len(b) - 1
    toward, away = (r - 1) % n, (r + 1) % n
    for t in range(nch + n - 2):
        sends, recvs = [], []
        c_out = t - d
        if r != root and 0 <= c_out < nch:
            sends.append((toward, work[b[c_out]:b[c_out + 1]]))
        c_in = t - d + 1
        got = None
        if d > 0 and 0 <= c_in < nch:
            got = np.empty(b[c_in + 1] - b[c_in], sendbuf.dtype)
            recvs.append((away, got))
        if sends or recvs:
            comm.exchange(sends, recvs, label=f"reduce step {t}")
        if got is not None:
            dst = work[b[c_in]:b[c_in + 1]]
            ufunc(dst, got, out=dst)
    if r == root and op == "avg":
        np.divide(recvbuf, n, out=recvbuf)
    return recvbuf


def gather(comm: Communicator, sendbuf: np.ndarray, recvbuf: np.ndarray | None = None,
           root: int = 0) -> np.ndarray:
    """Gather: root's ``recvbuf`` (N*count,) holds rank i's ``sendbuf`` (count,) at block i;
    untouched on other ranks. Every rank sends to the root directly, all at once.

    Raises:
        ValueError: buffer shape/dtype mismatch, bad root.
        PeerLostError, JobTimeoutError: from the transport.
    """
    n, r = comm.world, comm.rank
    sendbuf, recvbuf, count = _prepare(comm, sendbuf, recvbuf, "gather", root=root)
    if r == root:
        recvbuf[r * count:(r + 1) * count] = sendbuf
        recvs = [(i, recvbuf[i * count:(i + 1) * count]) for i in range(n) if i != r]
        comm.exchange(recvs=recvs, label="gather")
    else:
        comm.exchange(sends=[(root, sendbuf)], label="gather")
    return recvbuf


def scatter(comm: Communicator, sendbuf: np.ndarray | None, recvbuf: np.ndarray | None = None,
            root: int = 0) -> np.ndarray:
    """Scatter: rank r's ``recvbuf`` (count,) = block r of root's ``sendbuf`` (N*count,).
    ``sendbuf`` is read only at the root (others may pass None with a ``recvbuf``). The root
    sends to every rank directly, all at once.

    Raises:
        ValueError: buffer shape/dtype mismatch, bad root.
        PeerLostError, JobTimeoutError: from the transport.
    """
    n, r = comm.world, comm.rank
    if r != root and recvbuf is not None:
        sendbuf = None
    sendbuf, recvbuf, count = _prepare(comm, sendbuf, recvbuf, "scatter",
                                       root=root)
    if r == root:
        recvbuf[:] = sendbuf[r * count:(r + 1) * count]
        sends = [(i, sendbuf[i * count:(i + 1) * count]) for i in range(n) if i != r]
        comm.exchange(sends=sends, label="scatter")
    else:
        comm.exchange(recvs=[(root, recvbuf)], label="scatter")
    return recvbuf


def all_to_all(comm: Communicator, sendbuf: np.ndarray,
               recvbuf: np.ndarray | None = None) -> np.ndarray:
    """AllToAll: rank r's ``recvbuf`` block i (count,) = rank i's ``sendbuf`` block r; both
    buffers (N*count,). Every pair exchanges directly, all at once.

    Raises:
        ValueError: buffer shape/dtype mismatch (sendbuf length not a multiple of N).
        PeerLostError, JobTimeoutError: from the transport.
    """
    n, r = comm.world, comm.rank
    if sendbuf.shape[0] % n:
        raise ValueError(f"all_to_all sendbuf has {sendbuf.shape[0]} elements, "
                         f"not a multiple of {n} ranks")
    sendbuf, recvbuf, count = _prepare(comm, sendbuf, recvbuf, "all_to_all")
    recvbuf[r * count:(r + 1) * count] = sendbuf[r * count:(r + 1) * count]
    others = [i for i in range(n) if i != r]
    comm.exchange(sends=[(i, sendbuf[i * count:(i + 1) * count]) for i in others],
                  recvs=[(i, recvbuf[i * count:(i + 1) * count]) for i in others],
                  label="all_to_all")
    return recvbuf


def run(collective: str, comm: Communicator, sendbuf: np.ndarray | None,
        recvbuf: np.ndarray | None = None, op: str = "sum", root: int = 0,
        algo: str = "ring") -> np.ndarray:
    """Dispatch by name: the collective's function with the arguments it takes (``algo``:
    all_reduce only)."""
    c = collective_name(collective)
    fn: Callable[..., np.ndarray] = globals()[c]
    kwargs: dict = {"algo": algo} if c == "all_reduce" else {}
    if c in REDUCING:
        kwargs["op"] = op
    if c in ROOTED:
        kwargs["root"] = root
    return fn(comm, sendbuf, recvbuf, **kwargs)
