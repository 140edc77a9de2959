"""Workloads that run inside the lab's VMs (and on real VMs: nothing here imports the lab).

A job is N rank processes, one per VM. A collective job connects its ranks by a TCP mesh; each
rank runs one NCCL-style collective for a number of iterations on numpy buffers, separated by
a compute phase of real CPU work, times every iteration with its VM clock and checks the
result exactly against a local computation. A ddp job trains a small model with PyTorch
DistributedDataParallel (gloo) instead; a trace job replays an ASTRA-sim or Chakra workload.

Modules:
    config:      ``JobConfig``, the one definition of a job's configuration (the scenario's
                 ``JobSpec`` subclasses it), and ``WorkerConfig``, what one rank receives.
    errors:      the typed errors (``WorkloadError`` and subclasses).
    transport:   ``Mesh``, the TCP mesh between the ranks of a job (connections per peer,
                 path hints: source port and DSCP).
    collectives: the algorithms (AllReduce, Broadcast, Reduce, AllGather, ReduceScatter,
                 Gather, Scatter, AllToAll), deterministic inputs, reference results and
                 nccl-tests' bus-bandwidth factors.
    worker:      the per-rank program, ``python -m workloads.worker --config JSON``.
    ddp:         the PyTorch DDP rank, ``python -m workloads.ddp --config JSON``.
    job:         ``Job``/``run_job``: start the N ranks through a ``spawn`` callable, enforce
                 the job timeout, summarize.
    stats:       ``percentiles``, the project's one percentile helper.
    bulk:        a TCP transfer that ends when the receiver has every byte (a load-balanced
                 flow's piece, an incast sender), ``python -m workloads.bulk``.
    schedule:    iteration slots on the VM clock (CASSINI's time shift).
    accel:       accelerator time on the VM clock (cycles at a clock rate, busy waits).
    traces/:     trace jobs: ASTRA-sim and Chakra workloads replayed, one rank per VM.
    lb/:         load balancing from the hosts (path discovery, Ethereal, REPS).
"""
