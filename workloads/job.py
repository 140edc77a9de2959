"""Launch a job: N rank processes, one per rank, and summarize their reports.

``Job`` starts ``[python, -m, workloads.worker (workloads.ddp for ddp, workloads.traces.replay
for a trace job), --config JSON]`` for
every rank through ``spawn(rank, argv, **popen_kwargs)`` (``local_spawn``: a local process in a
new session; the lab passes one that starts the process inside the rank's VM), waits for all of
them with a timeout, and returns a summary (schema ``nslab.job/1``) whose core fields are the
``jobs`` entries of ``nslab.results/1``:

    schema, name, collective (snake case; for ddp ``config.DDP_LABEL``), nccl_name, world,
    placement ({"rank": host}), count (NCCL count, elements), bytes (nccl-tests size), dtype,
    op, root, iterations, warmup, compute_units, conns_per_peer, balancer, tcp (the ranks'
    TCP counters summed: retransmits, rtos, reordering; ``tcp_totals``), completion_s (the slowest
    rank's first-to-last timed iteration, VM clocks), iteration_s and comm_s ({p50, p90, p99,
    max, mean}, s, over iterations, ``stats.percentiles``; each iteration counts as its
    slowest rank's duration), iteration_times_s and comm_times_s (per timed iteration, in
    order, its slowest rank's duration, s), algbw_bit_s and busbw_bit_s (nccl-tests: size /
    mean collective time, averaged over ranks as its default ``-a 1``; busbw = algbw * bus_factor),
    bus_factor, trace (a trace job's operations, layers and passes,
    ``traces.summary``; None for other jobs, whose nccl_name, count, bytes, dtype, bus_factor
    and bandwidths are then None, and comm_s the communication not hidden behind compute),
    wall_s (launch to last exit, host clock), verified (every rank verified every
    iteration), error (None, or the ranks' errors with root causes first: ranks without a
    report, then config/unreachable/timeout, then lost peers), failed_ranks, ranks (per rank:
    rank, host, pid, exit_code, killed, verified, error, error_kind), workers (the raw
    nslab.worker/1 documents, None where missing).

Timing values that need every rank (completion_s, percentiles, bandwidths) are None when any
rank failed.

Each rank ends itself with a JSON error when peers are unreachable or die, or ``timeout_s``
(+ 2 s) after it started. The runner waits ``timeout_s + kill_grace_s`` in total; then it
sends SIGTERM to the rank's process group (the rank still reports) and, a second later,
SIGKILL. It signals only the process groups it created: ``spawn`` must return a process that
leads its own process group (``start_new_session=True`` locally; Mininet's ``mnexec -d``
calls ``setsid`` in the lab), so whatever the rank forks is covered and nothing else is
touched. Before the leader has called ``setsid`` (a few microseconds after the start under
``mnexec``), a signal goes to the process itself.

Source of the bandwidth definitions: nccl-tests, doc/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from pydantic import ValidationError

from workloads import collectives as coll
from workloads.config import (
    DDP,
    DDP_LABEL,
    TRACE,
    JobConfig,
    WorkerConfig,
    as_job_config,
    describe,
    read_json_argument,
)
from workloads.stats import percentiles
from workloads.traces import summary as trace_summary
from workloads.worker import SCHEMA as WORKER_SCHEMA

if TYPE_CHECKING:
    from typing import Self

SCHEMA = "nslab.job/1"
THREAD_LIMITS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_CAUSE_ORDER = {None: 0, "config": 1, "unreachable": 2, "timeout": 3, "internal": 4,
                "verify": 5, "terminated": 6, "peer_lost": 7}

Spawn = Callable[..., subprocess.Popen]
"""``spawn(rank, argv, **popen_kwargs) -> subprocess.Popen``: start rank ``rank``'s ``argv``
with the given ``Popen`` keyword arguments (stdin, stdout, stderr, env), as the leader of a new
process group."""


def local_spawn(rank: int, argv: list[str], **popen_kwargs) -> subprocess.Popen:
    """Start ``argv`` as a local process in a new session (its own process group)."""
    return subprocess.Popen(argv, start_new_session=True, **popen_kwargs)


def loopback_addresses(n: int, host: str = "127.0.0.1") -> list[str]:
    """``n`` ``host:port`` addresses with ports free right now (for local jobs and tests;
    another process could take a port before the worker binds it)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.bind((host, 0))
            socks.append(s)
        return [f"{host}:{s.getsockname()[1]}" for s in socks]
    finally:
        for s in socks:
            s.close()


class Job:
    """N rank processes of one job (an NCCL collective or DDP training).

    Args:
        name: job name (ranks of other jobs refuse each other's connections).
        config: what to run (a ``JobConfig`` or a subclass such as the scenario's ``JobSpec``;
            only the ``JobConfig`` fields reach the ranks).
        addresses: ``host:port`` of every rank, in rank order; world = len(addresses).
        spawn: starts one rank (see ``Spawn``; default ``local_spawn``).
        placement: host name of every rank for the summary (default: the address's host).
        kill_grace_s: how long past ``config.timeout_s`` the runner waits before signalling (s).
        workdir: where each rank's stdout/stderr go (kept); default a temporary directory
            removed by ``close``.

    Raises:
        ValueError: the configuration does not fit the addresses (root, size, source ports,
            an address that is not host:port), before anything starts.
    """

    def __init__(self, name: str, config: JobConfig, addresses: Sequence[str], *,
                 spawn: Spawn = local_spawn, placement: Sequence[str] | None = None,
                 kill_grace_s: float = 5.0, workdir: str | None = None):
        self.name = name
        self.config = as_job_config(config)
        try:
            self.rank_config = WorkerConfig(name=name, rank=0, peers=list(addresses),
                                            job=self.config)
        except ValidationError as e:
            raise ValueError(f"job {name}: {describe(e)}") from None
        self.addresses = self.rank_config.peers
        self.world = self.rank_config.world
        self.count = self.rank_config.count
        self.spawn = spawn
        hosts = placement if placement is not None else [a.rsplit(":", 1)[0].strip("[]")
                                                         for a in self.addresses]
        self.placement = dict(enumerate(hosts))
        self.kill_grace_s = kill_grace_s
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix=f"nslab-job-{name}-")
        os.makedirs(self.workdir, exist_ok=True)
        self._procs: dict[int, subprocess.Popen] = {}
        self._start_errors: dict[int, str] = {}
        self._killed: set[int] = set()
        self._t0: float | None = None
        self._summary: dict | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def worker_argv(self, rank: int) -> list[str]:
        """The argv of rank ``rank``: the interpreter, the rank's module and its
        ``WorkerConfig`` as JSON."""
        module = {DDP: "workloads.ddp", TRACE: "workloads.traces.replay"}.get(
            self.config.collective, "workloads.worker")
        cfg = self.rank_config.model_copy(update={"rank": rank})
        return [sys.executable, "-m", module, "--config", cfg.model_dump_json()]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for k, v in THREAD_LIMITS.items():
            env.setdefault(k, v)
        return env

    def log_path(self, rank: int, stream: str = "err") -> str:
        """Where rank ``rank``'s ``"out"`` (the JSON report) or ``"err"`` (progress) goes."""
        return os.path.join(self.workdir, f"rank{rank}.{stream}")

    @property
    def pids(self) -> dict[int, int]:
        """rank -> PID of the process the runner started (also its process group id)."""
        return {r: p.pid for r, p in self._procs.items()}

    def running(self) -> bool:
        """Some rank's process is still running (False before ``start``)."""
        return any(p.poll() is None for p in self._procs.values())

    def start(self) -> Job:
        """Start every rank through ``spawn`` (environment: ours plus ``THREAD_LIMITS``). A rank
        whose process cannot start at all is reported as failed by ``wait`` (the others then
        fail to reach it)."""
        if self._t0 is not None:
            raise RuntimeError("job already started")
        self._t0 = time.monotonic()
        for rank in range(self.world):
            argv = self.worker_argv(rank)
            with open(self.log_path(rank, "out"), "wb") as out, \
                    open(self.log_path(rank, "err"), "wb") as err:
                try:
                    self._procs[rank] = self.spawn(rank, argv, stdin=subprocess.DEVNULL,
                                                   stdout=out, stderr=err, env=self._env())
                except OSError as e:
                    self._start_errors[rank] = f"cannot start {argv[0]!r}: {e}"
        return self

    def kill(self, rank: int | None = None, sig: int = signal.SIGKILL) -> None:
        """Signal the process group of one rank (or every rank still running): only groups
        this runner created, and only while their leader has not been reaped. A leader that
        has no group of its own yet (``mnexec`` before its ``setsid``) gets the signal
        itself."""
        ranks = [rank] if rank is not None else list(self._procs)
        for r in ranks:
            p = self._procs.get(r)
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                p.send_signal(sig)

    def _stop_all(self) -> None:
        running = [r for r, p in self._procs.items() if p.poll() is None]
        self._killed.update(running)
        for r in running:
            self.kill(r, signal.SIGTERM)
        end = time.monotonic() + 1.0
        for r in running:
            try:
                self._procs[r].wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(r, signal.SIGKILL)
                self._procs[r].wait()

    def run(self) -> dict:
        """``start`` then ``wait``: the summary."""
        return self.start().wait()

    def wait(self) -> dict:
        """Wait for every rank (at most ``timeout_s + kill_grace_s`` after ``start``), stop the
        stragglers, and return the summary."""
        if self._summary is not None:
            return self._summary
        if self._t0 is None:
            raise RuntimeError("job not started")
        limit = self._t0 + self.config.timeout_s + self.kill_grace_s
        try:
            for p in self._procs.values():
                p.wait(max(0.0, limit - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            self._stop_all()
        wall_s = time.monotonic() - self._t0
        docs: list[dict | None] = []
        ranks = []
        for r in range(self.world):
            p = self._procs.get(r)
            doc = self._report(r)
            docs.append(doc)
            row = {"rank": r, "host": self.placement.get(r), "pid": p.pid if p else None,
                   "exit_code": p.returncode if p else None, "killed": r in self._killed,
                   "verified": bool(doc and doc.get("verified")),
                   "error": doc.get("error") if doc else None,
                   "error_kind": doc.get("error_kind") if doc else None}
            if doc is None:
                row["error"] = f"rank {r}: {self._no_report(r)}"
            elif doc.get("error") is None and (p is None or p.returncode != 0):
                row["error"] = f"rank {r}: exited with status {p.returncode if p else None}"
                row["error_kind"] = "internal"
            ranks.append(row)
        self._summary = self.summarize(ranks, docs, wall_s)
        return self._summary

    def _report(self, rank: int) -> dict | None:
        try:
            with open(self.log_path(rank, "out"), errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            if line.startswith("{"):
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict) and doc.get("schema") == WORKER_SCHEMA:
                    return doc
        return None

    def _no_report(self, rank: int) -> str:
        if rank in self._start_errors:
            return self._start_errors[rank]
        p = self._procs[rank]
        rc = p.returncode
        if rank in self._killed:
            what = (f"still running after the job timeout ({self.config.timeout_s:g} s + "
                    f"{self.kill_grace_s:g} s grace), killed")
        elif rc is not None and rc < 0:
            try:
                what = f"killed by {signal.Signals(-rc).name}"
            except ValueError:
                what = f"killed by signal {-rc}"
        else:
            what = f"exited with status {rc}"
        try:
            with open(self.log_path(rank, "err"), errors="replace") as f:
                tail = [ln for ln in f.read().splitlines() if ln.strip()][-2:]
        except OSError:
            tail = []
        return what + " without a report" + (f" (stderr: {' | '.join(tail)})" if tail else "")

    def summarize(self, ranks: list[dict], docs: list[dict | None], wall_s: float) -> dict:
        """The ``nslab.job/1`` summary of finished ranks (see the module docstring)."""
        failed = [row for row in ranks if row["error"] is not None or not row["verified"]]
        for row in failed:
            if row["error"] is None:
                row["error"] = f"rank {row['rank']}: not verified"
        ok = not failed and all(d is not None for d in docs)
        c, algorithm = self.config, self.config.algorithm
        trace = c.collective == TRACE
        size = None if trace else self.rank_config.nbytes
        factor = None if trace else coll.bus_factor(algorithm, self.world)
        completion = iteration = comm = algbw = busbw = replayed = None
        times = {"iteration_times_s": None, "comm_times_s": None}
        if ok:
            good = [d for d in docs if d is not None]
            comms = np.array([d["comm_s"] for d in good], dtype=float)
            completion = float(max(d["elapsed_s"] for d in good))
            iterations = np.max([d["iteration_s"] for d in good], axis=0)
            iteration, comm = percentiles(iterations), percentiles(comms.max(axis=0))
            times = {"iteration_times_s": iterations.tolist(),
                     "comm_times_s": comms.max(axis=0).tolist()}
            t = float(comms.mean(axis=1).mean())
            if trace:
                replayed = trace_summary.summarize(good, c.trace or "", c.trace_clock_ghz,
                                                   c.trace_compute_scale, c.trace_bytes_scale)
            elif t > 0 and size is not None and factor is not None:
                algbw = 8.0 * size / t
                busbw = algbw * factor
        causes = sorted(failed, key=lambda row: (
            _CAUSE_ORDER.get(row["error_kind"], 4) if docs[row["rank"]] is not None else -1,
            row["rank"]))
        return {
            "schema": SCHEMA, "name": self.name,
            "collective": DDP_LABEL if c.collective == DDP else c.collective,
            "nccl_name": None if trace else coll.NCCL_NAMES[algorithm], "world": self.world,
            "placement": {str(r): self.placement.get(r) for r in range(self.world)},
            "count": None if trace else self.count, "bytes": size,
            "dtype": None if trace else c.dtype,
            "op": c.op if algorithm in coll.REDUCING else None,
            "root": c.root if algorithm in coll.ROOTED else None,
            "iterations": c.iterations, "warmup": c.warmup,
            "compute_units": c.compute_units, "compute": c.compute(),
            "conns_per_peer": c.conns_per_peer,
            "balancer": c.balancer, "tcp": tcp_totals(docs),
            "completion_s": completion, "iteration_s": iteration, "comm_s": comm, **times,
            "algbw_bit_s": algbw, "busbw_bit_s": busbw, "bus_factor": factor,
            "trace": replayed, "wall_s": wall_s, "verified": ok,
            "error": "; ".join(row["error"] for row in causes) if causes else None,
            "failed_ranks": sorted(row["rank"] for row in failed),
            "ranks": ranks, "workers": docs,
        }

    def close(self) -> None:
        """Stop any rank still running and remove the temporary directory (if ours)."""
        if self._procs:
            self._stop_all()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def tcp_totals(docs: Sequence[dict | None]) -> dict[str, int | None]:
    """The ranks' ``tcp`` counters summed (retransmits, rtos, reordering); a counter is None
    when a rank did not report it."""
    out: dict[str, int | None] = {}
    for key in ("retransmits", "rtos", "reordering"):
        vals = [(d.get("tcp") or {}).get(key) if d else None for d in docs]
        out[key] = None if None in vals else sum(vals)
    return out


def run_job(name: str, config: JobConfig, addresses: Sequence[str],
            spawn: Spawn = local_spawn, **options) -> dict:
    """Run a job to completion and return its ``nslab.job/1`` summary.

    Args:
        name: job name.
        config: what to run.
        addresses: ``host:port`` of every rank, in rank order.
        spawn: starts one rank (default: a local process).
        **options: the other keyword arguments of ``Job`` (placement, kill_grace_s, workdir).

    Returns:
        The summary; failures are in ``error``/``failed_ranks``, never raised.

    Raises:
        ValueError: the configuration does not fit the addresses (nothing was started).
    """
    with Job(name, config, addresses, spawn=spawn, **options) as job:
        return job.run()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m workloads.job``: run a local job on loopback and print its summary."""
    p = argparse.ArgumentParser(prog="python -m workloads.job",
                                description="Run a job of local processes on loopback and "
                                            "print its nslab.job/1 summary.")
    p.add_argument("--world", type=int, default=4, help="number of ranks")
    p.add_argument("--config", metavar="JSON|@PATH", default="{}",
                   help="the JobConfig as JSON or @PATH (see python -m workloads.worker "
                        "--help for its fields); default {} (all_reduce of 1 MiB)")
    p.add_argument("--full", action="store_true", help="include the per-rank documents")
    a = p.parse_args(argv)
    try:
        config = JobConfig.model_validate_json(read_json_argument(a.config))
        summary = run_job("local", config, loopback_addresses(a.world))
    except ValidationError as e:
        print(f"error: {describe(e)}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not a.full:
        summary.pop("workers")
    print(json.dumps(summary, indent=1))
    return 0 if summary["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
