"""Collective jobs on the lab's VMs, and the choice of which VMs a tenant gives a job.

A job is ``workloads.job.Job``: one worker per rank, each started inside its VM through
``nslab exec`` (its namespace, its physical host's cgroup, its clock). Placement policies:

    * ``naive``: the first ``ranks`` VMs in name order (what a tenant gets without looking);
    * ``collocation_aware``: at most one VM per collocation group *found by the agents* (not
      the truth), largest groups' spares last, so ranks avoid sharing a physical host;
    * an explicit list of VM names.

The truth then says whether the choice was right (``shared_host_ranks``).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from lab.errors import LabError
from workloads.ddp import DDPJob
from workloads.job import Job

PORT = 7800


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


DDP = "ddp"  # the PyTorch DistributedDataParallel (gloo) workload, in place of a collective


def run(lab, name: str, collective: str, vms: Sequence[str], timeout_s: float = 60.0,
        **options) -> dict:
    """Run a job with one rank per VM in ``vms`` (rank order); returns its ``jobs`` entry.

    Args:
        lab: a running ``Lab``.
        collective: an NCCL collective name, or ``"ddp"`` for PyTorch DDP training.
        options: ``Job`` options (nbytes or count, dtype, iterations, warmup, compute_units,
            conns_per_peer, ...); for ``ddp`` only iterations, warmup and ``hidden``.
    """
    nodes = [lab[v] for v in vms]
    addresses = [f"{n.IP()}:{PORT}" for n in nodes]
    prefix = [sys.executable, "-m", "cli.main", "exec", lab.name]
    common = dict(command=lambda r: [*prefix, vms[r], "--"],
                  placement={r: v for r, v in enumerate(vms)}, timeout=timeout_s)
    lab.stamp("job_start", name, collective=collective, vms=list(vms))
    if collective == DDP:
        job = DDPJob(name, addresses, **common, **options)
    else:
        job = Job(name, collective, addresses, **common, **options)
    with job:
        job.start()
        summary = job.wait()
    if collective == DDP:
        summary["collective"] = "ddp (torch gloo; gradient all_reduce)"
    lab.stamp("job_end", name, completion_s=summary.get("completion_s"),
              error=summary.get("error"))
    keep = ("name", "collective", "nccl_name", "world", "bytes", "dtype", "iterations",
            "compute_units", "completion_s", "iteration_s", "comm_s", "algbw_bit_s",
            "busbw_bit_s", "wall_s", "verified", "error", "failed_ranks")
    entry = {k: summary.get(k) for k in keep}
    entry["placement"] = {"vms": list(vms), "phys": [lab.phys[v] for v in vms],
                          "shared_host_ranks": shared_host_ranks(vms, lab.phys)}
    return entry
