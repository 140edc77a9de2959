"""One rank of a trace job: ``python -m workloads.traces.replay --config JSON|@PATH``.

Same configuration (``config.WorkerConfig`` with ``job.trace``), command line, watchdog,
SIGTERM handling and exit status as ``workloads.worker`` (``worker.main``). The rank builds
its graph (``traces.ops_for``, ``warmup + iterations`` passes), connects to every other rank
(``transport.Mesh``, with the job's balancer) and runs the graph:

* the accelerator: compute ops one at a time, lowest id first among the ready ones, each
  busy for its duration on the VM clock (``accel.run_until``: the CPU stays free); a compute
  op that is ready when the previous one ends starts at that one's end, as kernels queued on
  a GPU stream;
* the communication stream: a thread that runs the collectives and send/recv in
  ``graph.comm_order`` (the same on every rank), each when its dependencies are done; a
  collective among a group runs over the group's ranks only (``GroupComm``); consecutive
  ready send/recv ops run as one group (``ncclGroupStart``/``End``), so that two ranks that
  send to each other first do not wait for each other;
* delays: timers that occupy neither.

Every collective's result is checked (each rank sends its global rank + 1, so every
expected value is known: sums, blocks); send/recv payloads too. The report is an
``nslab.worker/1`` document (``worker.py``) with ``collective`` "trace", ``count`` and
``bytes`` null, per timed pass ``iteration_s`` (from its first op's start to the next pass's
first op's start; the last pass to its last op's end), ``compute_s`` (its compute ops'
accelerator time) and ``comm_s`` (the rest: communication not hidden behind compute), plus
``trace``: ``info`` (``traces.ops_for``), ``ops`` (every op of one pass: id, name, kind,
layer, phase, collective, bytes, group_size; ids of pass 0) and ``times`` (per timed pass,
per op in that order: [start_ns, end_ns] on the VM clock).
"""
from __future__ import annotations

import heapq
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from agents.clock import Clock
from workloads import accel, traces
from workloads import collectives as coll
from workloads.config import WorkerConfig
from workloads.errors import ConfigError, JobTimeoutError, WorkloadError
from workloads.traces.graph import Op, comm_order
from workloads.transport import Mesh
from workloads.worker import SCHEMA, build_parser, connected, record, reported
from workloads.worker import main as worker_main


class VerifyError(WorkloadError):
    """A replayed collective's or message's result differed from the reference."""

    kind = "verify"


class GroupComm:
    """A ``collectives.Communicator`` over some ranks of a mesh: local rank i is global rank
    ``group[i]``."""

    def __init__(self, mesh, group: Sequence[int]):
        self.mesh, self.group = mesh, tuple(group)
        self.rank, self.world = self.group.index(mesh.rank), len(self.group)

    def exchange(self, sends=(), recvs=(), label: str = "transfer") -> None:
        self.mesh.exchange([(self.group[p], a) for p, a in sends],
                           [(self.group[p], a) for p, a in recvs], label)


def buffers(op: Op, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(sendbuf, recvbuf, expected)`` of a collective op on global rank ``rank``: float32,
    every rank's send buffer filled with its global rank + 1 (expected None where NCCL leaves
    the result undefined: non-root ranks of reduce and gather; the root is the group's
    first)."""
    c, group = op.collective or "", op.group
    n, me = len(group), group.index(rank)
    count = coll.count_from_bytes(c, n, op.bytes, 4)
    sn, rn = coll.buffer_counts(c, n, count)
    send = np.full(sn, rank + 1, np.float32)
    blocks = np.repeat(np.array(group, np.float32) + 1, count)
    total = float(sum(g + 1 for g in group))
    want: np.ndarray | None
    if c in ("all_reduce", "reduce_scatter") or (c == "reduce" and me == 0):
        want = np.full(rn, total, np.float32)
    elif c in ("all_gather", "all_to_all") or (c == "gather" and me == 0):
        want = blocks
    elif c in ("broadcast", "scatter"):
        want = np.full(rn, group[0] + 1, np.float32)
    else:
        want = None
    return send, np.empty(rn, np.float32), want


class CommStream(threading.Thread):
    """Runs the communication ops in order, each once ``release``d; reports ``(op ids,
    start_ns, end_ns)`` or an exception on ``events``."""

    def __init__(self, mesh: Mesh, order: list[Op], clock, events: queue.Queue):
        super().__init__(daemon=True, name="comm-stream")
        self.mesh, self.order, self.clock, self.events = mesh, order, clock, events
        self.ready: set[int] = set()
        self.cond = threading.Condition()
        self.stopped = False
        self.problem: str | None = None

    def release(self, op: Op) -> None:
        with self.cond:
            self.ready.add(op.id)
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()

    def _next(self, i: int) -> bool:
        with self.cond:
            while self.order[i].id not in self.ready and not self.stopped:
                self.cond.wait()
            return not self.stopped

    def run(self) -> None:
        i = 0
        try:
            while i < len(self.order) and self._next(i):
                op = self.order[i]
                batch = [op]
                if op.kind != "collective":
                    with self.cond:
                        while (i + len(batch) < len(self.order)
                               and self.order[i + len(batch)].kind != "collective"
                               and self.order[i + len(batch)].id in self.ready):
                            batch.append(self.order[i + len(batch)])
                t0 = self.clock.now_ns()
                if op.kind == "collective":
                    self._collective(op)
                else:
                    self._p2p(batch)
                self.events.put(([o.id for o in batch], t0, self.clock.now_ns()))
                i += len(batch)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises
            self.events.put(e)

    def _collective(self, op: Op) -> None:
        send, recv, want = buffers(op, self.mesh.rank)
        recv.fill(np.nan)
        coll.run(op.collective or "", GroupComm(self.mesh, op.group), send, recv)
        if want is not None and self.problem is None and not np.array_equal(recv, want):
            self.problem = f"{op.name}: the {op.collective} result differs from the reference"

    def _p2p(self, batch: list[Op]) -> None:
        me = self.mesh.rank
        sends = [(o.peer, np.full(o.bytes, (me + 1) % 256, np.uint8)) for o in batch
                 if o.kind == "send"]
        recvs = [(o, np.zeros(o.bytes, np.uint8)) for o in batch if o.kind == "recv"]
        self.mesh.exchange(sends, [(o.peer, a) for o, a in recvs],
                           label=" + ".join(o.name for o in batch))
        for o, a in recvs:
            if self.problem is None and not np.all(a == ((o.peer or 0) + 1) % 256):
                self.problem = f"{o.name}: the payload from rank {o.peer} differs"


class Runner:
    """Runs one rank's graph (see the module docstring); ``times[op id] = (start_ns,
    end_ns)`` on the VM clock after ``run``."""

    def __init__(self, ops: list[Op], mesh: Mesh, clock, deadline: float):
        self.ops = {op.id: op for op in ops}
        self.clock, self.deadline = clock, deadline
        self.left = {op.id: len(set(op.deps)) for op in ops}
        self.children: dict[int, list[int]] = {op.id: [] for op in ops}
        for op in ops:
            for d in set(op.deps):
                self.children[d].append(op.id)
        self.events: queue.Queue = queue.Queue()
        self.stream = CommStream(mesh, comm_order(ops), clock, self.events)
        self.times: dict[int, tuple[int, int]] = {}
        self.compute: list[int] = []  # heap of ready compute op ids
        self.ready_ns: dict[int, int] = {}  # when each compute op became ready
        self.deps_end: dict[int, int] = {}  # the latest end of each waiting op's parents so far
        self.finished = 0
        self.timers: list[tuple[int, int]] = []  # heap of (end_ns, delay op id)
        self.busy: tuple[int, int] | None = None  # (op id, end_ns) on the accelerator
        self.free_ns = 0  # when the accelerator's last kernel ended

    def _ready(self, op: Op, now: int) -> None:
        if op.kind == "compute":
            heapq.heappush(self.compute, op.id)
            self.ready_ns[op.id] = now
        elif op.kind == "delay":
            heapq.heappush(self.timers, (now + op.duration_ns, op.id))
            self.times[op.id] = (now, now + op.duration_ns)
        else:
            self.stream.release(op)

    def _done(self, i: int, end: int) -> None:
        """Op ``i`` ended at ``end``: a child is ready at the latest end of its parents, which
        a late wake-up may hand over in any order."""
        self.finished += 1
        for c in self.children[i]:
            self.left[c] -= 1
            self.deps_end[c] = max(self.deps_end.get(c, end), end)
            if self.left[c] == 0:
                self._ready(self.ops[c], self.deps_end.pop(c))

    def run(self) -> None:
        """Run every op (raises the communication stream's error, or ``JobTimeoutError``)."""
        now = self.clock.now_ns()
        self.free_ns = now
        self.stream.start()
        try:
            for op in self.ops.values():
                if self.left[op.id] == 0:
                    self._ready(op, now)
            while self.finished < len(self.ops):
                self._step()
        finally:
            self.stream.stop()

    def _step(self) -> None:
        if time.monotonic() >= self.deadline:
            raise JobTimeoutError("trace replay: job timeout with operations pending")
        now = self.clock.now_ns()
        if self.busy is None and self.compute:
            op = self.ops[heapq.heappop(self.compute)]
            start = max(self.ready_ns.pop(op.id), self.free_ns)
            self.busy = (op.id, start + op.duration_ns)
            self.times[op.id] = (start, start + op.duration_ns)
        ends = [t for t in (self.busy[1] if self.busy else None,
                            self.timers[0][0] if self.timers else None) if t is not None]
        limit = now + round((self.deadline - time.monotonic()) * 1e9)
        event = accel.run_until(self.clock, min(ends, default=limit), self.events)
        if isinstance(event, BaseException):
            raise event
        now = self.clock.now_ns()
        if event is not None:
            ids, t0, t1 = event
            for i in ids:
                self.times[i] = (t0, t1)
                self._done(i, t1)
        if self.busy and self.busy[1] <= now:
            i, end = self.busy
            self.busy, self.free_ns = None, end
            self._done(i, end)
        while self.timers and self.timers[0][0] <= now:
            end, i = heapq.heappop(self.timers)
            self._done(i, end)


def base_document(cfg: WorkerConfig) -> dict:
    """The report before anything ran (every field present; see the module docstring)."""
    job = cfg.job
    return {
        "schema": SCHEMA, "job": cfg.name, "rank": cfg.rank, "world": cfg.world,
        "host": cfg.peers[cfg.rank], "collective": job.collective, "nccl_name": None,
        "count": None, "dtype": None, "op": None, "root": None, "bytes": None,
        "iterations": job.iterations, "warmup": job.warmup, "compute_units": 0,
        "conns_per_peer": job.conns_per_peer, "src_port_base": job.src_port_base,
        "dscp": list(job.dscp), "seed": job.seed, "clock": None, "connect_s": None,
        "start_ns": None, "end_ns": None, "elapsed_s": None, "iteration_s": [], "wait_s": [],
        "compute_s": [], "comm_s": [], "comm_start_ns": [], "first_slot": None,
        "skipped_slots": 0, "verified": False, "error": None, "error_kind": None, "flows": [],
        "balancer": job.balancer, "lb": None, "tcp": None, "trace": None,
    }


def report(doc: dict, ops: list[Op], times: dict[int, tuple[int, int]], info: dict,
           warmup: int) -> None:
    """Fill ``doc``'s timings and ``trace`` from the ops' ``times`` (passes before
    ``warmup`` left out)."""
    passes = max(op.iteration for op in ops) + 1
    by_pass: list[list[Op]] = [[] for _ in range(passes)]
    for op in sorted(ops, key=lambda o: o.id):
        by_pass[op.iteration].append(op)
    starts = [min(times[o.id][0] for o in p) for p in by_pass]
    last_end = max(t[1] for t in times.values())
    doc["trace"] = {"info": info, "ops": [
        {"id": o.id, "name": o.name, "kind": o.kind, "layer": o.layer, "phase": o.phase,
         "collective": o.collective, "bytes": o.bytes if o.comm else None,
         "group_size": len(o.group) if o.kind == "collective" else None,
         "peer": o.peer} for o in by_pass[0]], "times": []}
    for k in range(warmup, passes):
        end = starts[k + 1] if k + 1 < passes else last_end
        compute = sum(o.duration_ns for o in by_pass[k] if o.kind == "compute")
        record(doc, starts[k], starts[k] + compute, end)
        doc["comm_start_ns"].pop()  # no single collective starts the communication
        doc["trace"]["times"].append([list(times[o.id]) for o in by_pass[k]])


def replay(cfg: WorkerConfig, clock: Clock | None = None, doc: dict | None = None,
           log: Callable[[str], None] | None = None) -> dict:
    """Replay one rank's trace and return its report (filled in ``doc`` if given). Never
    raises for job failures: they are in ``error``/``error_kind``.

    Raises:
        ConfigError (reported): the job is not a trace job, or its trace does not load.
    """
    t_start = time.monotonic()
    log = log or (lambda msg: None)
    job, rank = cfg.job, cfg.rank
    doc = doc if doc is not None else base_document(cfg)
    clock = clock or Clock()
    doc["clock"] = "emulated" if clock.emulated else "system"
    with reported(doc):
        if job.trace is None:
            raise ConfigError("not a trace job: give trace")
        try:
            ops, info = traces.ops_for(job.trace, job.trace_format, rank, cfg.world,
                                       job.warmup + job.iterations, job.trace_clock_ghz,
                                       job.trace_compute_scale, job.trace_bytes_scale)
        except (OSError, ValueError) as e:
            raise ConfigError(f"trace: {e}") from None
        with connected(cfg, t_start, doc, log) as mesh:
            runner = Runner(ops, mesh, clock, t_start + job.timeout_s)
            runner.run()
            report(doc, ops, runner.times, info, job.warmup)
        if runner.stream.problem:
            raise VerifyError(runner.stream.problem)
        doc["verified"] = True
        log(f"rank {rank}: done")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m workloads.traces.replay``: ``worker.main`` with ``replay``."""
    parser = build_parser(prog="python -m workloads.traces.replay",
                          description="One rank of an nslab trace job (job.trace set); prints "
                                      "an nslab.worker/1 JSON document on stdout.")
    return worker_main(argv, run=replay, parser=parser, document=base_document)


if __name__ == "__main__":
    sys.exit(main())
