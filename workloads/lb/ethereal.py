"""Ethereal's path assignment: equal bytes on every uplink, each (sub)flow on one path.

Source: Khani et al., "Ethereal: Divide and Conquer Network Load Balancing in Large-Scale
Distributed Training" (arXiv 2407.00550); public code STyGIANet/astra-sim, the ETHEREAL branch
of ``sim_send`` in ``astra-sim/network_frontend/ns3/AstraSimNetwork.cc``.

Collective flows are equal-sized and known when they arrive. Per destination leaf, with ``s``
usable paths and ``n`` flows: ``n - r`` flows (``r = n mod s``) go whole, round-robin over the
paths; each of the ``r`` leftover flows is split into ``s / gcd(r, s)`` equal subflows that
continue the round-robin, so every path carries exactly ``n / s`` flows' worth of bytes.
Flows inside the source leaf go direct (no uplink). A retransmission timeout marks
(path, destination leaf) failed for a reset time; later assignments use the healthy paths
only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """A flow, or a subflow of it, on one path.

    Attributes:
        flow: index of the flow in the caller's list.
        part: which of the flow's ``parts`` equal pieces this is (0-based).
        parts: how many pieces the flow is cut into (1: whole).
        path: the path (one of the ``paths`` given to ``assign``).
    """

    flow: int
    part: int
    parts: int
    path: int

    def share(self, nbytes: int) -> tuple[int, int]:
        """(offset, length) of this piece in a flow of ``nbytes`` bytes: contiguous parts, the
        first ``nbytes % parts`` of them one byte longer."""
        base, extra = divmod(nbytes, self.parts)
        start = self.part * base + min(self.part, extra)
        return start, base + (self.part < extra)


def assign(n: int, paths: list[int]) -> list[Piece]:
    """Ethereal's rule for ``n`` equal flows to one destination leaf over ``paths``.

    Returns:
        The pieces: whole flows 0..n-r-1 round-robin over ``paths``, then flows n-r..n-1 each
        cut into ``len(paths) / gcd(r, len(paths))`` parts continuing the round-robin. Every
        path carries the same number of flows' worth of bytes, ``n / len(paths)``.

    Raises:
        ValueError: ``n`` negative or no path.
    """
    if n < 0:
        raise ValueError(f"flow count {n} is negative")
    if not paths:
        raise ValueError("no path to assign flows to")
    s = len(paths)
    r = n % s
    pieces = [Piece(f, 0, 1, paths[f % s]) for f in range(n - r)]
    parts = s // math.gcd(r, s) if r else 1
    turn = 0
    for f in range(n - r, n):
        for part in range(parts):
            pieces.append(Piece(f, part, parts, paths[turn % s]))
            turn += 1
    return pieces


class FailedPaths:
    """Paths marked failed per destination leaf after a retransmission timeout, each for
    ``reset_s`` seconds (Ethereal's failure rule). Times are the caller's clock, s."""

    def __init__(self, reset_s: float):
        self.reset_s = reset_s
        self._until: dict[tuple[int, str], float] = {}

    def mark(self, path: int, leaf: str, now_s: float) -> None:
        """A retransmission timeout on ``path`` towards ``leaf`` at ``now_s``."""
        self._until[(path, leaf)] = now_s + self.reset_s

    def healthy(self, paths: list[int], leaf: str, now_s: float) -> list[int]:
        """``paths`` towards ``leaf`` not marked failed at ``now_s``; all of them when every
        one is marked (a flow must go somewhere)."""
        ok = [p for p in paths if self._until.get((p, leaf), -math.inf) <= now_s]
        return ok or list(paths)
