"""One rank of a collective job: ``python -m workloads.worker --config JSON|@PATH``.

The configuration is one ``config.WorkerConfig`` document (the job's ``JobConfig``, the job
name, this rank and every rank's ``host:port``), validated once when it is read. The worker
connects to every other rank (``transport.Mesh``), then runs ``warmup`` + ``iterations``
iterations of: a wait for the iteration's slot when the job has a ``schedule``
(``workloads.schedule``: CASSINI's time shift), a compute phase (``gpu_s`` of sleep, an
emulated accelerator's kernels, then ``compute_units`` matrix products, real CPU work, so a
noisy neighbour on the same CPU slows it), then the collective.
Every iteration is timed with the VM clock (``agents.clock.Clock``: ``NSLAB_CLOCK`` inside
the lab, the system clock outside) and its result is compared bit for bit with
``collectives.expected`` (the recv buffer is poisoned before each iteration, so a stale
result cannot pass).

It prints one JSON document (schema ``nslab.worker/1``) as the last line of stdout, and
writes it to ``--json PATH`` if given. Fields (units in the names):

    schema, job (name), rank, world, host (own address), collective (snake case, or ddp),
    nccl_name, count (NCCL count, elements), dtype, op, root (None unless rooted), bytes
    (nccl-tests "size"), iterations, warmup, compute_units, conns_per_peer, src_port_base,
    dscp, seed, clock ("emulated" or "system"), connect_s, start_ns / end_ns (VM clock, first
    timed iteration start and last end), elapsed_s, iteration_s / wait_s / compute_s / comm_s
    (one per timed iteration, seconds; an iteration is its slot wait, compute and collective),
    comm_start_ns (one per timed iteration: the collective's start, VM clock), first_slot (the
    schedule's slot of the first iteration, ``Schedule.next_slot``; None without a schedule),
    skipped_slots (slots the timed iterations let pass, later than the schedule's ``late_s``),
    verified (bool), error (None or a message starting "rank R: "), error_kind (None, config,
    unreachable, peer_lost, timeout, terminated, verify, internal), flows (the TCP
    connections: peer, conn, local, remote, initiator, dscp), balancer (none, ethereal, reps),
    lb (what the balancer did: ``workloads.lb.balancer`` stats, the paths it found per peer),
    tcp (over the rank's connections at the end, warm-up included: retransmits, rtos,
    reordering = reordering events the senders detected; ``Mesh.tcp_totals``).

Exit status: 0 success, 1 the job failed (peer unreachable or lost, timeout, SIGTERM,
internal error), 2 bad configuration, 3 a result differed from the reference. The worker never
runs past ``timeout_s`` seconds (plus 2 s of grace) from its start: every network wait is
bounded by that deadline and a watchdog ends a stuck compute phase. ``main`` is shared with
``workloads.ddp``, which passes its own ``run`` function.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from pydantic import ValidationError

from agents.clock import Clock
from workloads import collectives as coll
from workloads.config import DDP, JobConfig, WorkerConfig, describe, read_json_argument
from workloads.errors import ConfigError, JobTimeoutError, WorkloadError
from workloads.lb import balancer as lb
from workloads.schedule import Slots
from workloads.transport import Mesh, parse_address

SCHEMA = "nslab.worker/1"
COMPUTE_MATRIX_N = 128
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_WRONG = 0, 1, 2, 3
WATCHDOG_GRACE_S = 2.0

RunRank = Callable[..., dict]  # run(cfg, clock=None, doc=None, log=None) -> nslab.worker/1


class Terminated(WorkloadError):
    """The worker received SIGTERM (the job runner gave up on it)."""

    kind = "terminated"


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
    job = cfg.job
    rooted = job.algorithm in coll.ROOTED
    return {
        "schema": SCHEMA, "job": cfg.name, "rank": cfg.rank, "world": cfg.world,
        "host": cfg.peers[cfg.rank], "collective": job.collective,
        "nccl_name": coll.NCCL_NAMES[job.algorithm], "count": cfg.count, "dtype": job.dtype,
        "op": job.op if job.algorithm in coll.REDUCING else None,
        "root": job.root if rooted else None, "bytes": cfg.nbytes,
        "iterations": job.iterations, "warmup": job.warmup, "compute_units": job.compute_units,
        "conns_per_peer": job.conns_per_peer, "src_port_base": job.src_port_base,
        "dscp": list(job.dscp), "seed": job.seed, "clock": None, "connect_s": None,
        "start_ns": None, "end_ns": None, "elapsed_s": None, "iteration_s": [], "wait_s": [],
        "compute_s": [], "comm_s": [], "comm_start_ns": [], "first_slot": None,
        "skipped_slots": 0,
        "verified": False, "error": None, "error_kind": None, "flows": [],
        "balancer": job.balancer, "lb": None, "tcp": None,
    }


def _fail(doc: dict, kind: str, message: str) -> None:
    prefix = f"rank {doc['rank']}: "
    doc["error"] = message if message.startswith(prefix) else prefix + message
    doc["error_kind"] = kind
    doc["verified"] = False


@contextlib.contextmanager
def reported(doc: dict) -> Iterator[None]:
    """Turn an exception of the block into the document's ``error``/``error_kind``: a
    ``WorkloadError`` keeps its kind, anything else is ``internal`` (never hidden)."""
    try:
        yield
    except WorkloadError as e:
        _fail(doc, e.kind, str(e))
    except Exception as e:  # noqa: BLE001 - reported, never hidden
        _fail(doc, "internal", f"{type(e).__name__}: {e} "
                               f"({traceback.extract_tb(e.__traceback__)[-1].name})")


def run_worker(cfg: WorkerConfig, clock: Clock | None = None, doc: dict | None = None,
               log: Callable[[str], None] | None = None) -> dict:
    """Run one rank to completion and return its ``nslab.worker/1`` document. Never raises
    for job failures: they are reported in ``error``/``error_kind``.

    Args:
        cfg: the rank's configuration (validated when it was built).
        clock: the VM clock (default ``Clock()``: NSLAB_CLOCK or the system clock).
        doc: a document to fill in place (the CLI shares it with its watchdog).
        log: ``callable(str)`` for progress lines (default: none).
    """
    t_start = time.monotonic()
    log = log or (lambda msg: None)
    job, world, rank = cfg.job, cfg.world, cfg.rank
    if doc is None:
        doc = base_document(cfg)
    clock = clock or Clock()
    doc["clock"] = "emulated" if clock.emulated else "system"
    with reported(doc):
        if job.collective == DDP:
            raise ConfigError("collective ddp runs with python -m workloads.ddp")
        with connected(cfg, t_start, doc, log) as mesh:
            args = (job.collective, rank, world, cfg.count, job.dtype, job.op)
            sendbuf = coll.make_input(*args, seed=job.seed)
            want = coll.expected(*args, root=job.root, seed=job.seed)
            recvbuf = np.empty(coll.buffer_counts(job.collective, world, cfg.count)[1],
                               coll.dtype_of(job.dtype))
            rng = np.random.default_rng([job.seed, rank, 1])
            a, b = (rng.standard_normal((COMPUTE_MATRIX_N, COMPUTE_MATRIX_N)) for _ in range(2))
            out = np.empty_like(a)
            problem = None
            slots = Slots(job.schedule, rank, clock, doc)
            for i in range(job.warmup + job.iterations):
                if time.monotonic() >= mesh.deadline:  # type: ignore[operator]
                    raise JobTimeoutError(f"rank {rank}: job timeout ({job.timeout_s} s) "
                                          f"before iteration {i}")
                _poison(recvbuf)
                t0 = clock.now_ns()
                tc = slots.wait(t0, timed=i >= job.warmup)
                time.sleep(job.gpu_s)
                compute(job.compute_units, a, b, out)
                t1 = clock.now_ns()
                coll.run(job.collective, mesh, sendbuf, recvbuf, op=job.op, root=job.root,
                         algo=job.algo)
                t2 = clock.now_ns()
                if want is not None and problem is None and not np.array_equal(recvbuf, want):
                    problem = _mismatch(recvbuf, want, i)
                if i >= job.warmup:
                    record(doc, t0, t1, t2, tc)
        if problem:
            _fail(doc, "verify", problem)
        else:
            doc["verified"] = True
        log(f"rank {rank}: done")
    return doc


@contextlib.contextmanager
def connected(cfg: WorkerConfig, t_start: float, doc: dict,
              log: Callable[[str], None]) -> Iterator[Mesh]:
    """The rank's mesh, connected to every peer with the job's balancer (``doc``:
    connect_s, flows). Leaving the block normally fills ``doc``'s tcp and lb and closes the
    mesh gracefully; an exception closes it at once and goes on.

    Raises:
        PeerUnreachableError, JobTimeoutError: from ``Mesh.connect``.
    """
    job = cfg.job
    balancer = lb.make(job.balancer, cfg.rank, [parse_address(a)[0] for a in cfg.peers],
                       job.conns_per_peer, seed=job.seed)
    mesh = Mesh(cfg.rank, cfg.peers, conns_per_peer=job.conns_per_peer, hints=cfg.hints,
                job_id=cfg.name, connect_timeout=job.connect_timeout_s,
                deadline=t_start + job.timeout_s, cc=job.cc, balancer=balancer)
    try:
        c0 = time.monotonic()
        mesh.connect()
        doc["connect_s"] = time.monotonic() - c0
        doc["flows"] = mesh.flows()
        log(f"rank {cfg.rank}: connected to {cfg.world - 1} peers "
            f"({len(doc['flows'])} connections) in {doc['connect_s']:.3f} s")
        yield mesh
    except BaseException:
        mesh.close(graceful=False)
        raise
    doc["tcp"] = mesh.tcp_totals()
    doc["lb"] = balancer.stats()
    mesh.close(graceful=True)


def record(doc: dict, t0: int, t1: int, t2: int, tc: int | None = None) -> None:
    """Add one timed iteration (VM clock, ns): it starts at ``t0``, waits for its slot until
    ``tc`` (default ``t0``: no wait), computes until ``t1`` and communicates until ``t2``;
    keeps ``start_ns``, ``end_ns`` and ``elapsed_s`` up to date."""
    tc = t0 if tc is None else tc
    if doc["start_ns"] is None:
        doc["start_ns"] = t0
    doc["end_ns"] = t2
    doc["elapsed_s"] = (t2 - doc["start_ns"]) / 1e9
    doc["iteration_s"].append((t2 - t0) / 1e9)
    doc["wait_s"].append((tc - t0) / 1e9)
    doc["compute_s"].append((t1 - tc) / 1e9)
    doc["comm_s"].append((t2 - t1) / 1e9)
    doc["comm_start_ns"].append(t1)


def exit_status(doc: dict) -> int:
    """The process exit status for a finished document."""
    if doc["error_kind"] is None:
        return EXIT_OK
    return {"config": EXIT_USAGE, "verify": EXIT_WRONG}.get(doc["error_kind"], EXIT_FAILED)


def _field_help() -> str:
    lines = textwrap.wrap("WorkerConfig fields: name (job name), rank, peers (host:port of "
                          "every rank in rank order), job (a JobConfig). JobConfig fields:", 79)
    for name, f in JobConfig.model_fields.items():
        default = "" if f.default is None else f" [default {f.default!r}]"
        lines += textwrap.wrap(f"{name}{default}: {f.description}", 79, initial_indent="  ",
                               subsequent_indent="      ")
    return "\n".join(lines)


def build_parser(prog: str = "python -m workloads.worker",
                 description: str = "One rank of an nslab collective job; prints an "
                                    "nslab.worker/1 JSON document on stdout.",
                 ) -> argparse.ArgumentParser:
    """The command line shared by the collective worker and the DDP workload."""
    p = argparse.ArgumentParser(
        prog=prog, description=description, epilog=_field_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", metavar="JSON|@PATH",
                      help="this rank's WorkerConfig as JSON, or @PATH of a file holding it, "
                           'e.g. \'{"name": "j1", "rank": 0, "peers": ["10.0.0.1:7800", '
                           '"10.0.0.2:7800"], "job": {"collective": "all_reduce", '
                           '"bytes": 1048576}}\'')
    what.add_argument("--schema", action="store_true",
                      help="print the JSON Schema of --config and exit")
    p.add_argument("--json", dest="json_path", metavar="PATH", default=None,
                   help="also write the report to PATH")
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


def _load(text: str) -> WorkerConfig | str:
    """The validated configuration, or the error message."""
    try:
        return WorkerConfig.model_validate_json(read_json_argument(text))
    except ValidationError as e:
        return describe(e)
    except OSError as e:
        return f"cannot read the configuration: {e}"


def _config_error(text: str, message: str) -> dict:
    """The report of a configuration that did not validate (rank and name when readable)."""
    try:
        raw = json.loads(read_json_argument(text))
    except (OSError, ValueError):
        raw = {}
    raw = raw if isinstance(raw, dict) else {}
    doc = {"schema": SCHEMA, "job": raw.get("name"), "rank": raw.get("rank"),
           "verified": False, "error": None, "error_kind": None}
    _fail(doc, "config", f"bad configuration: {message}")
    return doc


def main(argv: Sequence[str] | None = None, run: RunRank = run_worker,
         parser: argparse.ArgumentParser | None = None,
         document: Callable[[WorkerConfig], dict] = base_document) -> int:
    """The CLI: read the configuration, run, report; returns the exit status.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).
        run: the rank's program, ``run(cfg, doc=doc, log=log)`` filling ``doc`` (default
            ``run_worker``; ``workloads.ddp`` passes its trainer).
        parser: the argument parser (default ``build_parser()``).
        document: the report before anything ran (default ``base_document``;
            ``workloads.traces.replay`` passes its own).
    """
    args = (parser or build_parser()).parse_args(argv)
    if args.schema:
        print(json.dumps(WorkerConfig.model_json_schema(), indent=1))
        return EXIT_OK
    reporter = _Reporter(args.json_path)
    cfg = _load(args.config)
    if isinstance(cfg, str):
        doc = _config_error(args.config, cfg)
        reporter.emit(doc)
        return exit_status(doc)
    doc = document(cfg)
    limit_s = cfg.job.timeout_s + WATCHDOG_GRACE_S

    def watchdog() -> None:
        d = dict(doc)
        _fail(d, "timeout", f"job timeout: still running {limit_s:.1f} s after start (stuck "
                            "outside the network, e.g. in the compute phase)")
        if reporter.emit(d):
            os._exit(EXIT_FAILED)

    def on_sigterm(signum, frame) -> None:
        raise Terminated(f"rank {cfg.rank}: terminated by SIGTERM")

    signal.signal(signal.SIGTERM, on_sigterm)
    timer = threading.Timer(limit_s, watchdog)
    timer.daemon = True
    timer.start()
    log = None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        with reported(doc):  # also a SIGTERM between two statements that run does not guard
            run(cfg, doc=doc, log=log)
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    reporter.emit(doc)
    return exit_status(doc)


if __name__ == "__main__":
    sys.exit(main())
