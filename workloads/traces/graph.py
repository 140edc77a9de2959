"""A rank's replayable workload: operations with dependencies (what both trace formats become).

An ``Op`` is one node of a rank's execution graph, as in a Chakra execution trace:

* ``compute``: accelerator time, ``duration_ns`` on the VM clock (one at a time: the rank's
  accelerator is one stream);
* ``delay``: a wait of ``duration_ns`` that occupies nothing (ASTRA-sim's weight-update delay
  after a weight-gradient collective);
* ``collective``: ``collective`` (snake case, ``workloads.collectives``) of ``bytes`` bytes
  (nccl-tests size) among the global ranks ``group`` (this rank included);
* ``send`` / ``recv``: ``bytes`` bytes to / from global rank ``peer``.

``deps`` are the ids of the ops that must end before it starts (data and control dependencies
alike). ``layer`` and ``phase`` (fwd, ig, wg, update, or None) name what the op belongs to;
``iteration`` is the training pass (0-based) the op is part of.

Communication ops run on one communication stream in ``comm_order``: a topological order of
the graph that takes the lowest id among the ready ops first, the same on every rank whose
traces agree, as NCCL orders the operations of one communicator's stream.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

OpKind = Literal["compute", "delay", "collective", "send", "recv"]
COMM_KINDS = ("collective", "send", "recv")


@dataclass(frozen=True)
class Op:
    """One operation of a rank's graph (see the module docstring; times in ns, sizes in
    bytes)."""

    id: int
    name: str
    kind: OpKind
    deps: tuple[int, ...] = ()
    duration_ns: int = 0
    collective: str | None = None
    bytes: int = 0
    group: tuple[int, ...] = ()
    peer: int | None = None
    layer: str | None = None
    phase: str | None = None
    iteration: int = 0

    @property
    def comm(self) -> bool:
        """A communication op (collective, send, recv)."""
        return self.kind in COMM_KINDS


def topological(ops: Sequence[Op]) -> list[Op]:
    """``ops`` in dependency order, the lowest id first among the ready ones (Kahn's
    algorithm with a heap).

    Raises:
        ValueError: a dependency on an id that is not in ``ops``, a duplicate id, or a cycle
            (named by the ids left).
    """
    by_id: dict[int, Op] = {}
    for op in ops:
        if op.id in by_id:
            raise ValueError(f"node id {op.id} appears twice")
        by_id[op.id] = op
    waiting = {op.id: len(set(op.deps)) for op in ops}
    children: dict[int, list[int]] = {i: [] for i in by_id}
    for op in ops:
        for d in set(op.deps):
            if d not in by_id:
                raise ValueError(f"node {op.id} ({op.name}) depends on node {d}, which the "
                                 "trace does not have")
            children[d].append(op.id)
    ready = [i for i, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    out: list[Op] = []
    while ready:
        i = heapq.heappop(ready)
        out.append(by_id[i])
        for c in children[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, c)
    if len(out) != len(ops):
        left = sorted(i for i, n in waiting.items() if n > 0)
        raise ValueError(f"dependency cycle among nodes {left[:10]}"
                         f"{' ...' if len(left) > 10 else ''}")
    return out


def comm_order(ops: Sequence[Op]) -> list[Op]:
    """The communication ops of ``ops`` in the order the communication stream runs them."""
    return [op for op in topological(ops) if op.comm]


def check_ranks(ops: Iterable[Op], rank: int, world: int) -> None:
    """Check that every communication op of rank ``rank`` fits a world of ``world`` ranks.

    Raises:
        ValueError: a group that does not hold ``rank`` or names a rank outside the world, or
            a peer that is ``rank`` itself or outside the world (naming the op).
    """
    for op in ops:
        if op.kind == "collective":
            bad = [g for g in op.group if not 0 <= g < world]
            if bad:
                raise ValueError(f"rank {rank}: {op.name} names ranks {bad} outside "
                                 f"0..{world - 1}")
            if rank not in op.group:
                raise ValueError(f"rank {rank}: {op.name} runs among ranks {list(op.group)}, "
                                 "which do not include it")
        elif op.kind in ("send", "recv"):
            if op.peer is None or op.peer == rank or not 0 <= op.peer < world:
                raise ValueError(f"rank {rank}: {op.name} has peer {op.peer}; expected another "
                                 f"rank in 0..{world - 1}")
