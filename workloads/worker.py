"""One rank of a collective job: ``python -m workloads.worker --rank R --peers ADDRS ...``.

The worker connects to every other rank (``transport.Mesh``), then runs ``warmup`` + ``iters``
iterations of: a compute phase (``compute_units`` matrix products, real CPU work, so a noisy
neighbour on the same CPU slows it), then the collective. Every iteration is timed with the
VM clock (``agents.clock.Clock``: ``NSLAB_CLOCK`` inside the lab, the system clock outside)
and its result is compared bit for bit with ``collectives.expected`` (the recv buffer is
poisoned before each iteration, so a stale result cannot pass).

It prints one JSON document (schema ``nslab.worker/1``) as the last line of stdout, and
writes it to ``--json PATH`` if given. Fields (units in the names):

    schema, job, rank, world, host (own address), collective (snake case), nccl_name, count
    (NCCL count, elements), dtype, op, root (None unless rooted), bytes (nccl-tests "size"),
    iterations, warmup, compute_units, conns_per_peer, src_port_base, dscp, clock
    ("emulated" or "system"), connect_s, start_ns / end_ns (VM clock, first timed iteration
    start and last end), elapsed_s, iteration_s / compute_s / comm_s (one per timed
    iteration, seconds), verified (bool), error (None or a message starting "rank R: "),
    error_kind (None, config, unreachable, peer_lost, timeout, terminated, verify,
    internal), flows (the TCP connections: peer, conn, local, remote, initiator, dscp).

Exit status: 0 success, 1 the job failed (peer unreachable or lost, timeout, SIGTERM,
internal error), 2 bad parameters, 3 a result differed from the reference. The worker never
runs past ``--timeout`` seconds (plus 2 s of grace) from its start: every network wait is
bounded by that deadline and a watchdog ends a stuck compute phase.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from agents.clock import Clock
from workloads import collectives as coll
from workloads.errors import ConfigError, JobTimeoutError, WorkloadError
from workloads.transport import Mesh, PathHints, parse_address

SCHEMA = "nslab.worker/1"
COMPUTE_MATRIX_N = 128
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_WRONG = 0, 1, 2, 3
WATCHDOG_GRACE_S = 2.0
_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class Terminated(WorkloadError):
    """The worker received SIGTERM (the job runner gave up on it)."""

    kind = "terminated"


@dataclass
class WorkerConfig:
    """Parameters of one rank (the CLI options, see ``build_parser``)."""

    rank: int
    peers: list[str]
    collective: str = "all_reduce"
    count: int | None = None
    nbytes: int | None = None
    dtype: str = "float32"
    op: str = "sum"
    root: int = 0
    iterations: int = 10
    warmup: int = 2
    compute_units: int = 0
    conns_per_peer: int = 1
    src_port_base: int | None = None
    dscp: tuple[int, ...] = field(default_factory=tuple)
    connect_timeout: float = 10.0
    timeout: float = 60.0
    seed: int = 0
    job: str = "job"

    def validate(self) -> None:
        """Normalize names and resolve ``count`` from ``nbytes``.

        Raises:
            ConfigError: any inconsistent parameter (the message names it).
        """
        try:
            self.collective = coll.collective_name(self.collective)
            dt = coll.dtype_of(self.dtype)
            self.dtype = dt.name
            coll.check_op(self.op, dt)
            for a in self.peers:
                parse_address(a)
            PathHints(self.src_port_base, tuple(self.dscp))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        world = len(self.peers)
        if not 0 <= self.rank < world:
            raise ConfigError(f"rank {self.rank} is outside 0..{world - 1} "
                              f"({world} peer addresses)")
        if not 0 <= self.root < world:
            raise ConfigError(f"root {self.root} is outside 0..{world - 1}")
        if (self.count is None) == (self.nbytes is None):
            raise ConfigError("give exactly one of count and bytes")
        if self.count is None:
            assert self.nbytes is not None
            self.count = coll.count_from_bytes(self.collective, world, self.nbytes, dt.itemsize)
        if self.count < 1:
            whole = self.collective in ("all_reduce", "reduce", "broadcast")
            need = dt.itemsize * (1 if whole else world)
            raise ConfigError(f"size too small: {self.collective} of {self.dtype} on {world} "
                              f"ranks needs at least {need} bytes (1 element per rank)")
        for name in ("iterations", "warmup", "compute_units"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        if self.iterations < 1:
            raise ConfigError("iterations must be >= 1")
        if self.conns_per_peer < 1:
            raise ConfigError("conns_per_peer must be >= 1")
        if self.timeout <= 0 or self.connect_timeout <= 0:
            raise ConfigError("timeouts must be > 0 s")


def compute(units: int, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """The compute phase: ``units`` products of two 128x128 float64 matrices
    (2*128**3 = 4.2 MFLOP each; BLAS threads follow OPENBLAS_NUM_THREADS/OMP_NUM_THREADS,
    which ``job.run_job`` sets to 1)."""
    for _ in range(units):
        np.matmul(a, b, out=out)


def _poison(buf: np.ndarray) -> None:
    buf.fill(np.iinfo(buf.dtype).max if buf.dtype.kind in "iu" else np.nan)


def _mismatch(got: np.ndarray, want: np.ndarray, iteration: int) -> str:
    bad = np.flatnonzero(got != want)
    i = int(bad[0])
    return (f"verification failed at iteration {iteration}: {bad.size} of {want.size} "
            f"elements differ (first at index {i}: got {got[i]!r}, expected {want[i]!r})")


def base_document(cfg: WorkerConfig) -> dict:
    """The report before anything ran (every field present)."""
    world = len(cfg.peers)
    rooted = cfg.collective in coll.ROOTED
    nbytes = None
    if cfg.count is not None and cfg.collective in coll.COLLECTIVES:
        try:
            nbytes = coll.size_bytes(cfg.collective, world, cfg.count,
                                     coll.dtype_of(cfg.dtype).itemsize)
        except ValueError:
            pass
    return {
        "schema": SCHEMA, "job": cfg.job, "rank": cfg.rank, "world": world,
        "host": cfg.peers[cfg.rank] if 0 <= cfg.rank < world else None,
        "collective": cfg.collective, "nccl_name": coll.NCCL_NAMES.get(cfg.collective),
        "count": cfg.count, "dtype": cfg.dtype, "op": cfg.op if cfg.collective in
        coll.REDUCING else None, "root": cfg.root if rooted else None, "bytes": nbytes,
        "iterations": cfg.iterations, "warmup": cfg.warmup, "compute_units": cfg.compute_units,
        "conns_per_peer": cfg.conns_per_peer, "src_port_base": cfg.src_port_base,
        "dscp": list(cfg.dscp), "seed": cfg.seed, "clock": None, "connect_s": None,
        "start_ns": None, "end_ns": None, "elapsed_s": None,
        "iteration_s": [], "compute_s": [], "comm_s": [], "verified": False,
        "error": None, "error_kind": None, "flows": [],
    }


def _fail(doc: dict, kind: str, message: str) -> None:
    prefix = f"rank {doc['rank']}: "
    doc["error"] = message if message.startswith(prefix) else prefix + message
    doc["error_kind"] = kind
    doc["verified"] = False


def run_worker(cfg: WorkerConfig, clock: Clock | None = None, doc: dict | None = None,
               log=None) -> dict:
    """Run one rank to completion and return its ``nslab.worker/1`` document. Never raises
    for job failures: they are reported in ``error``/``error_kind``.

    Args:
        cfg: the parameters (validated here).
        clock: the VM clock (default ``Clock()``: NSLAB_CLOCK or the system clock).
        doc: a document to fill in place (the CLI shares it with its watchdog).
        log: ``callable(str)`` for progress lines (default: none).
    """
    t_start = time.monotonic()
    log = log or (lambda msg: None)
    try:
        cfg.validate()
    except ConfigError as e:
        d = base_document(cfg) if doc is None else doc
        _fail(d, e.kind, str(e))
        return d
    if doc is None:
        doc = base_document(cfg)
    else:
        doc.update(base_document(cfg))
    clock = clock or Clock()
    doc["clock"] = "emulated" if clock.emulated else "system"
    assert cfg.count is not None
    world, rank = len(cfg.peers), cfg.rank
    hints = PathHints(cfg.src_port_base, tuple(cfg.dscp))
    mesh = Mesh(rank, cfg.peers, conns_per_peer=cfg.conns_per_peer, hints=hints, job_id=cfg.job,
                connect_timeout=cfg.connect_timeout, deadline=t_start + cfg.timeout)
    closed = False
    try:
        c0 = time.monotonic()
        mesh.connect()
        doc["connect_s"] = time.monotonic() - c0
        doc["flows"] = mesh.flows()
        log(f"rank {rank}: connected to {world - 1} peers "
            f"({len(doc['flows'])} connections) in {doc['connect_s']:.3f} s")
        args = (cfg.collective, rank, world, cfg.count, cfg.dtype, cfg.op)
        sendbuf = coll.make_input(*args, seed=cfg.seed)
        want = coll.expected(*args, root=cfg.root, seed=cfg.seed)
        recvbuf = np.empty(coll.buffer_counts(cfg.collective, world, cfg.count)[1],
                           coll.dtype_of(cfg.dtype))
        rng = np.random.default_rng([cfg.seed, rank, 1])
        a, b = (rng.standard_normal((COMPUTE_MATRIX_N, COMPUTE_MATRIX_N)) for _ in range(2))
        out = np.empty_like(a)
        problem = None
        for i in range(cfg.warmup + cfg.iterations):
            if time.monotonic() >= mesh.deadline:  # type: ignore[operator]
                raise JobTimeoutError(f"rank {rank}: job timeout ({cfg.timeout} s) before "
                                      f"iteration {i}")
            _poison(recvbuf)
            t0 = clock.now_ns()
            compute(cfg.compute_units, a, b, out)
            t1 = clock.now_ns()
            coll.run(cfg.collective, mesh, sendbuf, recvbuf, op=cfg.op, root=cfg.root)
            t2 = clock.now_ns()
            if want is not None and problem is None and not np.array_equal(recvbuf, want):
                problem = _mismatch(recvbuf, want, i)
            if i >= cfg.warmup:
                if doc["start_ns"] is None:
                    doc["start_ns"] = t0
                doc["end_ns"] = t2
                doc["iteration_s"].append((t2 - t0) / 1e9)
                doc["compute_s"].append((t1 - t0) / 1e9)
                doc["comm_s"].append((t2 - t1) / 1e9)
        doc["elapsed_s"] = (doc["end_ns"] - doc["start_ns"]) / 1e9
        mesh.close(graceful=True)
        closed = True
        if problem:
            _fail(doc, "verify", problem)
        else:
            doc["verified"] = True
        log(f"rank {rank}: done")
    except WorkloadError as e:
        _fail(doc, e.kind, str(e))
    except Exception as e:  # noqa: BLE001 - reported, never hidden
        _fail(doc, "internal", f"{type(e).__name__}: {e} "
                               f"({traceback.extract_tb(e.__traceback__)[-1].name})")
    finally:
        if not closed:
            mesh.close(graceful=False)
    return doc


def exit_status(doc: dict) -> int:
    """The process exit status for a finished document."""
    if doc["error_kind"] is None:
        return EXIT_OK
    return {"config": EXIT_USAGE, "verify": EXIT_WRONG}.get(doc["error_kind"], EXIT_FAILED)


def parse_size(text: str) -> int:
    """``"64K"``, ``"1M"``, ``"1G"`` (powers of 1024, as nccl-tests' -b/-e) or plain bytes."""
    t = text.strip().lower().removesuffix("b")
    mult = _SUFFIX.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in _SUFFIX else t
    try:
        value = int(float(num) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"negative size: {text!r}")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")\
            from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workloads.worker",
        description="One rank of an nslab collective job; prints an nslab.worker/1 JSON "
                    "document on stdout.")
    p.add_argument("--rank", type=int, required=True, help="this worker's rank")
    p.add_argument("--peers", required=True,
                   help="host:port of every rank in rank order, comma-separated "
                        "(this rank listens on its own entry)")
    p.add_argument("--collective", default="all_reduce",
                   help=f"one of {', '.join(coll.COLLECTIVES)} (NCCL names accepted)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--bytes", dest="nbytes", type=parse_size,
                      help="nccl-tests size (bytes of the larger buffer; K/M/G suffixes); "
                           "default 1M")
    size.add_argument("--count", type=int, help="NCCL count argument (elements)")
    p.add_argument("--dtype", default="float32", help=", ".join(coll.DTYPES))
    p.add_argument("--op", default="sum", help=", ".join(coll.OPS))
    p.add_argument("--root", type=int, default=0, help="root of rooted collectives")
    p.add_argument("--iters", dest="iterations", type=int, default=10,
                   help="timed iterations")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first")
    p.add_argument("--compute-units", type=int, default=0,
                   help="compute phase per iteration: N 128x128 float64 matrix products")
    p.add_argument("--conns", dest="conns_per_peer", type=int, default=1,
                   help="TCP connections per peer (a transfer is split over them)")
    p.add_argument("--src-port-base", type=int, default=None,
                   help="path hint: bind connection c to rank p to port "
                        "BASE + (rank*world + p)*conns + c")
    p.add_argument("--dscp", type=_int_list, default=(),
                   help="path hint: DSCP per connection index, e.g. 10 or 10,18")
    p.add_argument("--connect-timeout", type=float, default=10.0,
                   help="seconds to establish the mesh (s)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="overall limit from start to finish (s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the input data")
    p.add_argument("--job", default="job", help="job name (ranks of other jobs are refused)")
    p.add_argument("--json", dest="json_path", default=None, help="also write the report here")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


class _Reporter:
    """Emits the document exactly once, from the main thread or the watchdog."""

    def __init__(self, json_path: str | None):
        self.json_path = json_path
        self._lock = threading.Lock()
        self._done = False

    def emit(self, doc: dict) -> bool:
        with self._lock:
            if self._done:
                return False
            self._done = True
            text = json.dumps(doc)
            if self.json_path:
                tmp = f"{self.json_path}.tmp{os.getpid()}"
                with open(tmp, "w") as f:
                    f.write(text + "\n")
                os.replace(tmp, self.json_path)
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            return True


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI: parse, run, report; returns the exit status."""
    args = build_parser().parse_args(argv)
    cfg = WorkerConfig(
        rank=args.rank, peers=[a.strip() for a in args.peers.split(",") if a.strip()],
        collective=args.collective, count=args.count,
        nbytes=args.nbytes if args.nbytes is not None or args.count is not None else 1 << 20,
        dtype=args.dtype, op=args.op, root=args.root, iterations=args.iterations,
        warmup=args.warmup, compute_units=args.compute_units,
        conns_per_peer=args.conns_per_peer, src_port_base=args.src_port_base,
        dscp=tuple(args.dscp), connect_timeout=args.connect_timeout, timeout=args.timeout,
        seed=args.seed, job=args.job)
    reporter = _Reporter(args.json_path)
    doc = base_document(cfg)

    def watchdog() -> None:
        d = dict(doc)
        _fail(d, "timeout", f"job timeout: still running {cfg.timeout + WATCHDOG_GRACE_S:.1f} s "
                            "after start (stuck outside the network, e.g. in the compute phase)")
        if reporter.emit(d):
            os._exit(EXIT_FAILED)

    def on_sigterm(signum, frame) -> None:
        raise Terminated(f"rank {cfg.rank}: terminated by SIGTERM")

    signal.signal(signal.SIGTERM, on_sigterm)
    timer = threading.Timer(max(cfg.timeout, 0) + WATCHDOG_GRACE_S, watchdog)
    timer.daemon = True
    timer.start()
    log = None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        run_worker(cfg, doc=doc, log=log)
    except Terminated as e:  # raised between two statements that run_worker does not guard
        _fail(doc, e.kind, str(e))
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    reporter.emit(doc)
    return exit_status(doc)


if __name__ == "__main__":
    sys.exit(main())
