"""Jobs on the lab's VMs, and the choice of which VMs a tenant gives a job.

A job is ``workloads.job.Job`` (an NCCL collective or PyTorch DDP, configured by one
``workloads.config.JobConfig``): one process per rank, each started inside its VM by the VM's
``popen`` (Mininet's ``mnexec -da``: the VM's namespace, a new session; ``lab.nodes.VM``: the
physical host's cgroups and ``NSLAB_CLOCK``), exactly as the lab starts its agents. Placement
policies:

    * ``naive``: the first ``ranks`` VMs in name order (what a tenant gets without looking);
    * ``collocation_aware``: at most one VM per collocation group *found by the agents* (not
      the truth), largest groups' spares last, so ranks avoid sharing a physical host;
    * an explicit list of VM names.

The truth then says whether the choice was right (``shared_host_ranks``).

A ``ddp`` job with a ``balancer`` gets the balancer daemon (``python -m workloads.lb.daemon``) in
each of its VMs for its run, started before its ranks and stopped after them: PyTorch opens
its own connections, so the VM's daemon pins each one to a path (``workloads.lb.daemon``); the
ranks use ``conns_per_peer`` gloo devices (``workloads.ddp.gloo_devices``).
"""
from __future__ import annotations

import contextlib
import json
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lab.errors import LabError
from lab.series import downsample
from workloads.config import DDP, JobConfig
from workloads.job import Job, Spawn

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab

__all__ = ["DDP", "PORT", "VmJob", "collocation_aware", "finish", "launch", "naive", "run",
           "run_together", "shared_host_ranks", "vm_spawn"]

JOB_SERIES_POINTS = 1000
"""At most this many points in a job entry's ``iteration_times_s`` and ``comm_times_s``."""
PORT = 7800  # every rank listens on this port of its VM (DDP: rank 0's is the rendezvous)
DAEMON_READY_S = 30.0
"""How long a balancer daemon may take to put its nftables table in place, s."""


def naive(vms: Sequence[str], ranks: int) -> list[str]:
    """The first ``ranks`` VMs in natural name order."""
    ordered = sorted(vms, key=lambda v: (len(v), v))
    return ordered[:ranks]


def collocation_aware(groups: Sequence[Sequence[str]], ranks: int) -> list[str]:
    """Pick VMs round-robin over the agents' groups: first one VM of every group, then
    second members, and so on, so no two ranks share a detected host while avoidable.

    Raises:
        LabError: fewer VMs in all groups than ranks.
    """
    ordered = [sorted(g, key=lambda v: (len(v), v)) for g in groups]
    ordered.sort(key=lambda g: (len(g[0]), g[0]))
    picks: list[str] = []
    depth = 0
    while len(picks) < ranks:
        layer = [g[depth] for g in ordered if len(g) > depth]
        if not layer:
            raise LabError(f"only {len(picks)} VMs in the agents' groups, job needs {ranks}")
        picks += layer[: ranks - len(picks)]
        depth += 1
    return picks


def shared_host_ranks(vms: Sequence[str], phys: dict[str, str]) -> int:
    """How many of ``vms`` share their physical host with another of them (truth)."""
    hosts = [phys[v] for v in vms]
    return sum(1 for h in hosts if hosts.count(h) > 1)


def vm_spawn(lab: Lab, vms: Sequence[str]) -> Spawn:
    """A ``Job`` spawn that starts rank ``r`` in VM ``vms[r]`` with ``popen``.

    ``mnexec -d`` makes the process a session and group leader itself, so the keyword
    arguments must not ask for ``start_new_session`` (``mnexec`` would then fork and the
    returned process would be a parent that exits at once).
    """
    nodes = [lab[v] for v in vms]

    def spawn(rank: int, argv: list[str], **popen_kwargs) -> subprocess.Popen:
        if popen_kwargs.get("start_new_session"):
            raise ValueError("start_new_session: mnexec -d already starts a new session")
        return nodes[rank].popen(argv, **popen_kwargs)
    return spawn


def _stop_daemon(proc: subprocess.Popen) -> dict | None:
    """SIGTERM a balancer daemon and return its JSON report (None without one)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    lines = [ln for ln in (out or "").splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


class VmJob(Job):
    """A ``Job`` whose rank ``r`` runs in VM ``vms[r]``, with the balancer daemons of a ddp
    job around its ranks (``daemons``: their reports by VM after ``wait``)."""

    def __init__(self, lab: Lab, name: str, config: JobConfig, vms: Sequence[str]):
        addresses = [f"{lab[v].IP()}:{PORT}" for v in vms]
        super().__init__(name, config, addresses, spawn=vm_spawn(lab, vms), placement=list(vms))
        self.lab, self.vms = lab, list(vms)
        self._daemons: dict[str, subprocess.Popen] = {}
        self.daemons: dict[str, dict | None] | None = None

    def start(self) -> VmJob:
        """Start the balancer daemons (ddp with a balancer), then the ranks.

        Raises:
            LabError: a daemon did not get ready within ``DAEMON_READY_S`` (its stderr)."""
        c = self.config
        if c.collective == DDP and c.balancer != "none":
            argv = [sys.executable, "-m", "workloads.lb.daemon", "--paths", str(c.conns_per_peer)]
            for i, v in enumerate(self.vms):
                peers = ",".join(self.lab[u].IP() for u in self.vms if u != v)
                self._daemons[v] = self.lab[v].popen(argv + ["--offset", str(i),
                                                             "--peers", peers],
                                                     stdout=subprocess.PIPE,
                                                     stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + DAEMON_READY_S
            for v, proc in self._daemons.items():
                ready = select.select([proc.stdout], [], [],
                                      max(0.0, deadline - time.monotonic()))[0]
                if not ready or proc.stdout.readline().strip() != "ready":
                    self._stop_daemons()
                    err = proc.stderr.read().strip() if proc.poll() is not None else ""
                    raise LabError(f"job {self.name}: the balancer daemon in {v} did not "
                                   f"start{': ' + err if err else ''}")
        super().start()
        return self

    def _stop_daemons(self) -> None:
        if self._daemons:
            self.daemons = {v: _stop_daemon(p) for v, p in self._daemons.items()}
            self._daemons = {}

    def wait(self) -> dict:
        summary = super().wait()
        self._stop_daemons()
        return summary

    def close(self) -> None:
        self._stop_daemons()
        super().close()


def launch(lab: Lab, name: str, config: JobConfig, vms: Sequence[str]) -> VmJob:
    """Start a job with rank ``r`` in VM ``vms[r]`` (listening on ``PORT`` of its VM's
    address) and stamp ``job_start`` (collective, vms); ``finish`` waits for it. The caller
    closes the returned ``Job`` (a context manager).

    Raises:
        ValueError: ``config`` does not fit ``len(vms)`` ranks (root, size, source ports);
            nothing was started or stamped.
        KeyError: a VM name the lab does not have.
        LabError: a ddp job's balancer daemon did not start.
    """
    job = VmJob(lab, name, config, vms)
    lab.stamp("job_start", name, collective=job.config.collective, vms=list(vms))
    return job.start()


def finish(lab: Lab, job: VmJob) -> dict:
    """Wait for a ``launch``ed job, stamp ``job_end`` (completion_s, error) and return its
    ``jobs`` results entry (see ``run``); ``job.wait()`` keeps the full ``nslab.job/1``
    summary (per-rank documents included)."""
    summary = job.wait()
    lab.stamp("job_end", job.name, completion_s=summary["completion_s"],
              error=summary["error"])
    keep = ("name", "collective", "nccl_name", "world", "bytes", "dtype", "iterations",
            "compute_units", "compute", "completion_s", "iteration_s", "comm_s", "algbw_bit_s",
            "busbw_bit_s", "wall_s", "verified", "error", "failed_ranks", "trace")
    entry = {k: summary[k] for k in keep}
    for k in ("iteration_times_s", "comm_times_s"):
        entry[k] = summary[k] and downsample(summary[k], JOB_SERIES_POINTS, how="max")
    vms = [job.placement[r] for r in range(job.world)]
    entry["placement"] = {"vms": vms, "phys": [lab.phys[v] for v in vms],
                          "shared_host_ranks": shared_host_ranks(vms, lab.phys)}
    entry["balancer_daemons"] = job.daemons
    return entry


def run(lab: Lab, name: str, config: JobConfig, vms: Sequence[str]) -> dict:
    """Run a job with rank ``r`` in VM ``vms[r]``; returns its ``jobs`` results entry.

    Stamps ``job_start`` (collective, vms) and ``job_end`` (completion_s, error) in the lab's
    timeline. The ranks listen on ``PORT`` of their VM's address.

    Args:
        lab: a running ``Lab``.
        name: job name.
        config: what to run (``JobConfig`` or a subclass such as the scenario's ``JobSpec``).
        vms: one VM name per rank, rank order.

    Returns:
        name, collective (``config.DDP_LABEL`` for ddp), nccl_name, world, bytes (nccl-tests
        size), dtype, iterations, compute_units, compute ({kind, s_per_iteration, units}:
        ``JobConfig.compute``), completion_s (s), iteration_s and comm_s
        ({p50, p90, p99, max, mean}, s), iteration_times_s and comm_times_s (per iteration,
        its slowest rank, s; at most ``JOB_SERIES_POINTS``, each the largest of a run of
        consecutive iterations when more), algbw_bit_s, busbw_bit_s, wall_s, verified, error,
        failed_ranks, placement {vms, phys, shared_host_ranks}, balancer_daemons (a ddp
        job's balancer daemons' reports by VM, ``workloads.lb.daemon``; None without); job
        failures are in ``error``.

    Raises:
        ValueError: ``config`` does not fit ``len(vms)`` ranks (root, size, source ports);
            nothing was started or stamped.
        KeyError: a VM name the lab does not have.
    """
    return run_together(lab, [(name, config, vms)])[0][0]


def run_together(lab: Lab, runs: Sequence[tuple[str, JobConfig, Sequence[str]]],
                 ) -> list[tuple[dict, dict]]:
    """Run several jobs at once (``(name, config, vms)`` each; no VM in two jobs: every rank
    listens on ``PORT``); per job in the same order its ``jobs`` entry (see ``run``) and its
    full ``nslab.job/1`` summary (per-rank documents included).

    Raises:
        ValueError: a VM in two jobs (nothing was started), or a ``config`` that does not fit
            its ranks (the jobs started before it are stopped).
        KeyError: a VM name the lab does not have.
    """
    used = [v for _, _, vms in runs for v in vms]
    if len(set(used)) != len(used):
        raise ValueError(f"jobs run together need distinct VMs, got {used}")
    with contextlib.ExitStack() as stack:
        started = [stack.enter_context(launch(lab, *r)) for r in runs]
        return [(finish(lab, job), job.wait()) for job in started]
