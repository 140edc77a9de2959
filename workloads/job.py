"""Launch a collective job: N worker processes, one per rank, and summarize their reports.

``run_job`` starts ``[*command(rank), python, -m, workloads.worker, ...]`` for every rank
(``command`` maps a rank to a command prefix: nothing for a local process, the argv that enters
a VM's namespace and cgroup in the lab), waits for all of them with a timeout, and returns a
summary (schema ``nslab.job/1``) whose core fields are the ``jobs`` entries of
``nslab.results/1``:

    schema, name, collective, nccl_name, world, placement ({"rank": host}), count (NCCL
    count, elements), bytes (nccl-tests size), dtype, op, root, iterations, warmup,
    compute_units, conns_per_peer, completion_s (the slowest rank's first-to-last timed
    iteration, VM clocks), iteration_s and comm_s ({p50, p90, p99, max, mean}, s, over
    iterations; each iteration counts as its slowest rank's duration), algbw_bit_s and
    busbw_bit_s (nccl-tests: size / mean collective time, averaged over ranks as its default
    ``-a 1``; busbw = algbw * bus_factor), bus_factor, wall_s (launch to last exit, host
    clock), verified (every rank verified every iteration), error (None, or the ranks'
    errors with root causes first: ranks without a report, then unreachable/config/timeout,
    then lost peers), failed_ranks, ranks (per rank: rank, host, pid, exit_code, killed,
    verified, error, error_kind), workers (the raw nslab.worker/1 documents, None where
    missing).

Timing values that need every rank (completion_s, percentiles, bandwidths) are None when any
rank failed.

Each worker gets ``--timeout`` and ends itself with a JSON error when peers are unreachable or
die. The runner waits ``timeout + kill_grace_s`` in total; then it sends SIGTERM (the worker
still reports) and, a second later, SIGKILL. It signals only the process groups it created:
every worker starts in a new session whose group id is the PID the runner started, so a
prefix that forks (``sudo``, ``nsenter -F``) is covered and nothing else is touched.
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
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from workloads import collectives as coll
from workloads.transport import PathHints, parse_address
from workloads.worker import SCHEMA as WORKER_SCHEMA
from workloads.worker import parse_size

if TYPE_CHECKING:
    from typing import Self

SCHEMA = "nslab.job/1"
WORKER_MODULE = "workloads.worker"
THREAD_LIMITS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_CAUSE_ORDER = {None: 0, "config": 1, "unreachable": 2, "timeout": 3, "internal": 4,
                "verify": 5, "terminated": 6, "peer_lost": 7}

CommandPrefix = Callable[[int], Sequence[str]]


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


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """``{p50, p90, p99, max, mean}`` of ``values`` (linear interpolation), None if empty."""
    if not len(values):
        return None
    v = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(v.max()),
            "mean": float(v.mean())}


class Job:
    """N worker processes of one collective job.

    Args:
        name: job name (ranks of other jobs refuse each other's connections).
        collective: ``collectives.COLLECTIVES`` name (NCCL names accepted).
        addresses: ``host:port`` of every rank, in rank order; world = len(addresses).
        command: rank -> command prefix (default: none, a local process).
        placement: rank -> host name for the summary (default: the address's host).
        count: NCCL count in elements, or
        nbytes: nccl-tests size in bytes (exactly one of the two).
        dtype, op, root, iterations, warmup, compute_units, conns_per_peer, src_port_base,
        dscp, connect_timeout, timeout, seed: as the worker's options (seconds for times).
        env: extra environment, a mapping or rank -> mapping (e.g. NSLAB_CLOCK per VM); the
            BLAS thread limits ``THREAD_LIMITS`` are set unless given.
        python: the interpreter that runs the worker.
        kill_grace_s: how long past ``timeout`` the runner waits before signalling (s).
        workdir: where each rank's stdout/stderr go (kept); default a temporary directory
            removed by ``close``.

    Raises:
        ValueError: inconsistent parameters (before anything starts).
    """

    def __init__(self, name: str, collective: str, addresses: Sequence[str], *,
                 command: CommandPrefix | None = None,
                 placement: Mapping[int, str] | Sequence[str] | None = None,
                 count: int | None = None, nbytes: int | None = None, dtype: str = "float32",
                 op: str = "sum", root: int = 0, iterations: int = 10, warmup: int = 2,
                 compute_units: int = 0, conns_per_peer: int = 1,
                 src_port_base: int | None = None, dscp: Sequence[int] = (),
                 connect_timeout: float = 10.0, timeout: float = 60.0, seed: int = 0,
                 env: Mapping[str, str] | Callable[[int], Mapping[str, str]] | None = None,
                 python: str = sys.executable, kill_grace_s: float = 5.0,
                 workdir: str | None = None):
        self.name = name
        self.collective = coll.collective_name(collective)
        self.addresses = list(addresses)
        self.world = len(self.addresses)
        if self.world < 1:
            raise ValueError("a job needs at least one address")
        for a in self.addresses:
            parse_address(a)
        dt = coll.dtype_of(dtype)
        self.dtype = dt.name
        coll.check_op(op, dt)
        PathHints(src_port_base, tuple(dscp))
        if (count is None) == (nbytes is None):
            raise ValueError("give exactly one of count and nbytes")
        self.count = count if count is not None else coll.count_from_bytes(
            self.collective, self.world, nbytes, dt.itemsize)  # type: ignore[arg-type]
        if self.count < 1:
            raise ValueError(f"{nbytes} bytes give no element per rank for {self.collective} "
                             f"of {self.dtype} on {self.world} ranks")
        if not 0 <= root < self.world:
            raise ValueError(f"root {root} is outside 0..{self.world - 1}")
        if iterations < 1 or warmup < 0 or compute_units < 0 or conns_per_peer < 1:
            raise ValueError("need iterations >= 1, warmup >= 0, compute_units >= 0, "
                             "conns_per_peer >= 1")
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeouts must be > 0 s")
        self.op, self.root, self.iterations, self.warmup = op, root, iterations, warmup
        self.compute_units, self.conns_per_peer = compute_units, conns_per_peer
        self.src_port_base, self.dscp = src_port_base, tuple(dscp)
        self.connect_timeout, self.timeout, self.seed = connect_timeout, timeout, seed
        self.command = command or (lambda rank: ())
        if placement is None:
            self.placement = {r: parse_address(a)[0] for r, a in enumerate(self.addresses)}
        elif isinstance(placement, Mapping):
            self.placement = {int(r): str(h) for r, h in placement.items()}
        else:
            self.placement = dict(enumerate(placement))
        self.env = env
        self.python = python
        self.kill_grace_s = kill_grace_s
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix=f"nslab-job-{name}-")
        os.makedirs(self.workdir, exist_ok=True)
        self._procs: dict[int, subprocess.Popen] = {}
        self._killed: set[int] = set()
        self._t0: float | None = None
        self._summary: dict | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def worker_argv(self, rank: int) -> list[str]:
        """The full argv of rank ``rank`` (prefix, interpreter, worker options)."""
        argv = [*self.command(rank), self.python, "-m", WORKER_MODULE,
                "--rank", str(rank), "--peers", ",".join(self.addresses),
                "--collective", self.collective, "--count", str(self.count),
                "--dtype", self.dtype, "--op", self.op, "--root", str(self.root),
                "--iters", str(self.iterations), "--warmup", str(self.warmup),
                "--compute-units", str(self.compute_units),
                "--conns", str(self.conns_per_peer),
                "--connect-timeout", str(self.connect_timeout),
                "--timeout", str(self.timeout), "--seed", str(self.seed), "--job", self.name]
        if self.src_port_base is not None:
            argv += ["--src-port-base", str(self.src_port_base)]
        if self.dscp:
            argv += ["--dscp", ",".join(map(str, self.dscp))]
        return argv

    def _env(self, rank: int) -> dict[str, str]:
        env = dict(os.environ)
        for k, v in THREAD_LIMITS.items():
            env.setdefault(k, v)
        extra = self.env(rank) if callable(self.env) else (self.env or {})
        env.update(extra)
        return env

    def log_path(self, rank: int, stream: str = "err") -> str:
        """Where rank ``rank``'s ``"out"`` (the JSON report) or ``"err"`` (progress) goes."""
        return os.path.join(self.workdir, f"rank{rank}.{stream}")

    _path = log_path

    @property
    def pids(self) -> dict[int, int]:
        """rank -> PID of the process the runner started (also its process group id)."""
        return {r: p.pid for r, p in self._procs.items()}

    def start(self) -> Job:
        """Start every rank. A rank whose command cannot start at all is reported as failed
        by ``wait`` (the others then fail to reach it)."""
        if self._procs:
            raise RuntimeError("job already started")
        self._t0 = time.monotonic()
        self._start_errors: dict[int, str] = {}
        for rank in range(self.world):
            argv = self.worker_argv(rank)
            with open(self._path(rank, "out"), "wb") as out, \
                    open(self._path(rank, "err"), "wb") as err:
                try:
                    self._procs[rank] = subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                        env=self._env(rank), start_new_session=True)
                except OSError as e:
                    self._start_errors[rank] = f"cannot start {argv[0]!r}: {e}"
        return self

    def kill(self, rank: int | None = None, sig: int = signal.SIGKILL) -> None:
        """Signal the process group of one rank (or every rank still running): only groups
        this runner created, and only while their leader has not been reaped."""
        ranks = [rank] if rank is not None else list(self._procs)
        for r in ranks:
            p = self._procs.get(r)
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass

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

    def wait(self) -> dict:
        """Wait for every rank (at most ``timeout + kill_grace_s`` after ``start``), stop the
        stragglers, and return the summary."""
        if self._summary is not None:
            return self._summary
        if self._t0 is None:
            raise RuntimeError("job not started")
        limit = self._t0 + self.timeout + self.kill_grace_s
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
            with open(self._path(rank, "out"), errors="replace") as f:
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
            what = (f"still running after the job timeout ({self.timeout:g} s + "
                    f"{self.kill_grace_s:g} s grace), killed")
        elif rc is not None and rc < 0:
            try:
                what = f"killed by {signal.Signals(-rc).name}"
            except ValueError:
                what = f"killed by signal {-rc}"
        else:
            what = f"exited with status {rc}"
        try:
            with open(self._path(rank, "err"), errors="replace") as f:
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
        size = coll.size_bytes(self.collective, self.world, self.count,
                               coll.dtype_of(self.dtype).itemsize)
        factor = coll.bus_factor(self.collective, self.world)
        completion = iteration = comm = algbw = busbw = None
        if ok:
            good = [d for d in docs if d is not None]
            its = np.array([d["iteration_s"] for d in good], dtype=float)
            comms = np.array([d["comm_s"] for d in good], dtype=float)
            completion = float(max(d["elapsed_s"] for d in good))
            iteration = percentiles(its.max(axis=0))
            comm = percentiles(comms.max(axis=0))
            t = float(comms.mean(axis=1).mean())
            if t > 0:
                algbw = 8.0 * size / t
                busbw = algbw * factor
        causes = sorted(failed, key=lambda row: (
            _CAUSE_ORDER.get(row["error_kind"], 4) if docs[row["rank"]] is not None else -1,
            row["rank"]))
        rooted = self.collective in coll.ROOTED
        return {
            "schema": SCHEMA, "name": self.name, "collective": self.collective,
            "nccl_name": coll.NCCL_NAMES[self.collective], "world": self.world,
            "placement": {str(r): self.placement.get(r) for r in range(self.world)},
            "count": self.count, "bytes": size, "dtype": self.dtype,
            "op": self.op if self.collective in coll.REDUCING else None,
            "root": self.root if rooted else None,
            "iterations": self.iterations, "warmup": self.warmup,
            "compute_units": self.compute_units, "conns_per_peer": self.conns_per_peer,
            "completion_s": completion, "iteration_s": iteration, "comm_s": comm,
            "algbw_bit_s": algbw, "busbw_bit_s": busbw, "bus_factor": factor,
            "wall_s": wall_s, "verified": ok,
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


def run_job(name: str, collective: str, addresses: Sequence[str],
            command: CommandPrefix | None = None, **options) -> dict:
    """Run a collective job to completion and return its ``nslab.job/1`` summary.

    Args:
        name: job name.
        collective: e.g. "all_reduce" (NCCL names accepted).
        addresses: ``host:port`` of every rank, in rank order.
        command: rank -> command prefix (default: a local process).
        **options: the keyword arguments of ``Job`` (count or nbytes, dtype, op, root,
            iterations, warmup, compute_units, conns_per_peer, src_port_base, dscp,
            connect_timeout, timeout, seed, env, placement, python, kill_grace_s, workdir).

    Returns:
        The summary; failures are in ``error``/``failed_ranks``, never raised.

    Raises:
        ValueError: inconsistent parameters (nothing was started).
    """
    with Job(name, collective, addresses, command=command, **options) as job:
        job.start()
        return job.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m workloads.job``: run a local job on loopback and print its summary."""
    p = argparse.ArgumentParser(prog="python -m workloads.job",
                                description="Run a collective job of local processes on "
                                            "loopback and print its nslab.job/1 summary.")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--collective", default="all_reduce")
    p.add_argument("--bytes", dest="nbytes", type=parse_size, default=1 << 20)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", default="sum")
    p.add_argument("--root", type=int, default=0)
    p.add_argument("--iters", dest="iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compute-units", type=int, default=0)
    p.add_argument("--conns", dest="conns_per_peer", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--full", action="store_true", help="include the per-rank documents")
    a = p.parse_args(argv)
    try:
        summary = run_job("local", a.collective, loopback_addresses(a.world), nbytes=a.nbytes,
                          dtype=a.dtype, op=a.op, root=a.root, iterations=a.iterations,
                          warmup=a.warmup, compute_units=a.compute_units,
                          conns_per_peer=a.conns_per_peer, timeout=a.timeout)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not a.full:
        summary.pop("workers")
    print(json.dumps(summary, indent=1))
    return 0 if summary["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
