"""Collective-communication workloads that run inside the lab's VMs.

A job is N worker processes (ranks), one per VM, connected by a TCP mesh. Each worker runs one
NCCL-style collective for a number of iterations on numpy buffers, separated by a compute
phase of real CPU work, times every iteration with its VM clock and checks the result exactly
against a local computation.

Modules:
    errors:      the typed errors (``WorkloadError`` and subclasses).
    transport:   ``Mesh``, the TCP mesh between the ranks of a job (connections per peer,
                 path hints: source port and DSCP).
    collectives: the algorithms (AllReduce, Broadcast, Reduce, AllGather, ReduceScatter,
                 Gather, Scatter, AllToAll), deterministic inputs, reference results and
                 nccl-tests' bus-bandwidth factors.
    worker:      the per-rank program, ``python -m workloads.worker``.
    job:         ``run_job``/``Job``: start the N workers, enforce the job timeout, summarize.
"""
