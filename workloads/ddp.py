"""A real framework workload: PyTorch DistributedDataParallel with the gloo backend training a
small model on synthetic data, one rank per VM (extra ``torch``, the CPU build): an MLP, a
transformer encoder layer or a mixture-of-experts layer whose tokens move by ``all_to_all``
(``job.model``, ``workloads.ddp_models``).

``python -m workloads.ddp --config JSON|@PATH`` takes the same ``config.WorkerConfig`` as the
collective worker, with ``job.collective = "ddp"`` (fields used: iterations, warmup, hidden,
model, schedule, timeout_s, seed, and conns_per_peer: gloo devices, ``gloo_devices``). With a
``schedule`` every iteration first waits for its slot (``schedule.Slots``, one line in the
training loop). It joins the process group at the
first peer's address (``init_method=tcp://``; rank 0 listens there), trains, and prints one
``nslab.worker/1`` document like the collective worker (same command line, watchdog, SIGTERM
handling and exit status: ``worker.main``), plus ``framework`` and ``params``: per iteration
``iteration_s`` (forward, backward with DDP's overlapped gradient AllReduce, optimizer step;
VM clock, s), ``comm_s`` (the same after the slot's wait: DDP overlaps communication with
backward), ``compute_s`` (0.0), ``verified`` (all ranks end with bit-identical parameters,
but for a moe rank's own expert; checked by an AllReduce of max and min of a checksum). Its
``count`` is the parameter count DDP averages (``ddp_models.params``), the gradient AllReduce
of every step. ``job.Job`` runs it like any other job.

Source: PyTorch docs, "Getting Started with Distributed Data Parallel" and torch.distributed
(gloo backend).
"""
from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from fcntl import ioctl

from agents.clock import Clock
from workloads import ddp_models, worker
from workloads.config import DDP, WorkerConfig
from workloads.errors import ConfigError
from workloads.schedule import Slots

SIOCGIFADDR = 0x8915


def interface_for(ip: str) -> str | None:
    """The interface that holds IPv4 address ``ip`` (gloo must bind to the VM's NIC), or
    None (gloo then picks one from the host name)."""
    for _, name in socket.if_nameindex():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            addr = ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            if socket.inet_ntoa(addr[20:24]) == ip:
                return name
        except OSError:
            continue
        finally:
            s.close()
    return None


def gloo_devices(ifname: str, devices: int) -> str:
    """``GLOO_SOCKET_IFNAME`` for ``devices`` gloo devices on one interface: the name
    repeated, comma-separated. ``ProcessGroupGloo`` makes one device per name, one context per
    device (its own connection to every peer) and gives each collective the next context
    (``contexts_[tag % contexts_.size()]``, torch's ProcessGroupGloo.hpp)."""
    return ",".join([ifname] * devices)


def train(cfg: WorkerConfig, clock: Clock | None = None, doc: dict | None = None,
          log: Callable[[str], None] | None = None) -> dict:
    """Train one DDP rank and return its ``nslab.worker/1`` document (filled in ``doc`` if
    given).

    Raises:
        ConfigError: PyTorch is not installed.
        WorkloadError: ``worker.Terminated`` on SIGTERM (from the CLI's handler).
        RuntimeError: torch.distributed failures (a peer unreachable or lost, gloo timeout
            after ``timeout_s``); the CLI reports them as ``internal``.
    """
    try:
        import datetime as dt

        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel
    except ImportError as e:
        raise ConfigError(f"PyTorch is not installed ({e}); pip install 'nslab[torch]'") \
            from None
    if cfg.job.collective != DDP:
        raise ConfigError(f"collective {cfg.job.collective} runs with python -m "
                          "workloads.worker, not workloads.ddp")
    log = log or (lambda msg: None)
    job, rank = cfg.job, cfg.rank
    if doc is None:
        doc = worker.base_document(cfg)
    clock = clock or Clock()
    host, port = cfg.peers[0].rsplit(":", 1)
    ifname = interface_for(cfg.peers[rank].rsplit(":", 1)[0])
    if ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", gloo_devices(ifname, job.conns_per_peer))
    elif job.conns_per_peer > 1:
        raise ConfigError(f"conns_per_peer: {job.conns_per_peer} gloo devices need the VM's "
                          f"interface, and no interface holds {cfg.peers[rank]}")
    doc.update(clock="emulated" if clock.emulated else "system",
               framework=f"torch {torch.__version__} gloo", params=cfg.count)
    torch.set_num_threads(1)
    t_start = time.monotonic()
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank,
                            world_size=cfg.world, timeout=dt.timedelta(seconds=job.timeout_s))
    try:
        module, local, batch = ddp_models.build(job.model, job.hidden or 0, cfg.world, rank,
                                                job.seed)
        # the expert of a moe model is this rank's own: DDP neither syncs nor averages it
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, local)
        model = DistributedDataParallel(module)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed((job.seed << 16) + 1000 + rank)
        doc["connect_s"] = time.monotonic() - t_start
        log(f"rank {rank}: joined the process group of {cfg.world} in {doc['connect_s']:.3f} s")
        slots = Slots(job.schedule, rank, clock, doc)  # CASSINI's slots: the one-line hook
        for i in range(job.warmup + job.iterations):
            x, y = batch(gen)
            t0 = clock.now_ns()
            tc = slots.wait(t0, timed=i >= job.warmup)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()  # gradients AllReduced here
            opt.step()
            t1 = clock.now_ns()
            if i >= job.warmup:
                worker.record(doc, t0, tc, t1, tc)  # no separate compute phase: all is comm
        checksum = torch.stack([sum(p.detach().double().sum()
                                    for n, p in module.named_parameters() if n not in local)])
        hi, lo = checksum.clone(), checksum.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        if hi.item() == lo.item():
            doc["verified"] = True
        else:
            doc.update(verified=False, error=f"rank {rank}: replicas diverged",
                       error_kind="verify")
        dist.barrier()  # no rank closes its connections while a peer still uses them
        log(f"rank {rank}: done")
    finally:
        dist.destroy_process_group()
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m workloads.ddp``: ``worker.main`` with ``train``."""
    parser = worker.build_parser(
        prog="python -m workloads.ddp",
        description="One rank of an nslab PyTorch DDP (gloo) job (job.collective must be "
                    "ddp); prints an nslab.worker/1 JSON document on stdout.")
    return worker.main(argv, run=train, parser=parser)


if __name__ == "__main__":
    # os._exit: the report is out; skip interpreter teardown, where gloo's transport threads
    # can abort the process (SIGABRT after a verified report: seen once in a full test run
    # here; pytorch/gloo#388 discusses gloo's missing clean shutdown).
    os._exit(main())
