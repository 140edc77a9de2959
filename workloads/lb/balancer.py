"""Load balancers inside the collective transport (``workloads.transport.Mesh``).

A rank opens ``k`` TCP connections to every peer; connection ``c`` carries DSCP ``c + 1``, the
entropy value the ``entropy`` fabric maps to path slot ``c + 1`` (``lab.fabric``). The rank
discovers, the way a host can (``workloads.lb.paths``: TTL-limited probes per DSCP, the
routers answer), which connections take distinct spines towards each peer and which peers sit
behind the same destination leaf (``Routes``). A balancer then decides which bytes of each
message go on which connection; the transport frames them (sequence, offset, length), so the
receiver needs no knowledge of the split.

* ``Even``: every message cut into ``k`` equal parts, one per connection (the transport's
  default, no discovery).
* ``Ethereal`` (Khani et al., arXiv 2407.00550): per collective step (one ``exchange``), the
  messages to each destination leaf are placed with Ethereal's rule
  (``workloads.lb.ethereal.assign``: whole flows round-robin over the healthy paths, the
  remainder cut into equal-byte pieces), the round-robin starting at the rank's own offset so
  ranks of one leaf do not all start on the same spine; peers in the rank's own leaf go
  direct. A retransmission timeout (``TCP_INFO``: RTO backoff or ``TCP_CA_Loss``) marks
  (path, leaf) failed for ``reset_s`` and the connection's unsent frames move to a random
  healthy path. Beside the paper's rule, a thread re-probes the spine hop of every entropy
  value towards each destination leaf every ``reprobe_s`` (and at once after a timeout): a
  fabric that remaps a dead link's entropy values to a live spine (a resilient ECMP group, as
  the lab's ``entropy`` mode does) shows no timeout to most flows, only two entropy values
  now reaching one spine; the path list then keeps one of them, so the equal-byte rule holds
  over the spines that are left, and the unsent frames of a connection that left the list are
  dealt over the ones in it (``reroute``). A re-probe that misses an answer changes nothing.
* ``RepsLb`` (Bonato et al., arXiv 2407.21625): per peer, a ``workloads.lb.reps.Reps`` ring
  of entropy values (connections) chooses the connection of every frame when the frame is
  dispatched, at most ``inflight`` frames unacknowledged per peer so choices follow
  feedback. There is no ECN here (no RED qdisc): a frame counts as *clean* when its last
  byte is acknowledged (``tcpi_bytes_acked``) with no retransmission on its connection since
  it was dispatched and a smoothed RTT within ``clean_us`` (4 ms: a third of a 100-packet
  queue at 100 Mbit/s) of the connection's minimum RTT;
  a retransmission timeout freezes the ring. REPS sprays per packet; kernel TCP keeps one
  connection per path, so a choice here is per frame (``FRAME_BYTES``).
"""
from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from workloads.lb.ethereal import FailedPaths, assign
from workloads.lb.paths import discover, distinct_paths
from workloads.lb.reps import Reps

BALANCERS = ("none", "ethereal", "reps")
"""Host-side balancers of a job (``none``: the fabric alone chooses, ECMP or spraying)."""
FRAME_BYTES = 64 * 1024
"""Largest frame on a connection: the unit a failed path's unsent data moves in, and the unit
of REPS's choice."""

Segment = tuple[int, int, int]
"""(connection, start, stop): bytes [start, stop) of a message on one connection."""


def split_bytes(nbytes: int, parts: int) -> list[tuple[int, int]]:
    """Cut ``nbytes`` into ``parts`` contiguous ``(start, stop)`` ranges, sizes differing by at
    most one byte (some empty when ``nbytes < parts``)."""
    return [(c * nbytes // parts, (c + 1) * nbytes // parts) for c in range(parts)]


@dataclass
class Routes:
    """What a rank discovered about its peers (``discover``).

    Attributes:
        leaf: peer -> its destination leaf's key (the addresses of the last routers before
            it), or None when the peer is in the rank's own leaf (no spine on the way).
        paths: peer -> connection indices that take distinct spines (one per spine), in
            order; every connection when discovery found none.
    """

    leaf: dict[int, tuple[str, ...] | None] = field(default_factory=dict)
    paths: dict[int, list[int]] = field(default_factory=dict)


def routes_from_hops(hops: dict[int, dict[int, list[str | None]]], conns: int) -> Routes:
    """``Routes`` from traceroute hops: peer -> {DSCP: [hop address, ...]} where connection
    ``c`` carries DSCP ``c + 1``. A peer whose every trace is two hops long (its leaf, then
    itself) is in the own leaf; otherwise its leaf is the set of last routers before it."""
    out = Routes()
    for peer, by_dscp in hops.items():
        reached = [h for h in by_dscp.values() if h and h[-1] is not None]
        if reached and all(len(h) <= 2 for h in reached):
            out.leaf[peer] = None
            out.paths[peer] = [0]
            continue
        out.leaf[peer] = tuple(sorted({h[-2] for h in reached if len(h) >= 2 and h[-2]}))
        distinct = [d - 1 for d in distinct_paths(by_dscp) if 1 <= d <= conns]
        out.paths[peer] = distinct or list(range(conns))
    return out


def spine_paths(host: str, conns: int, timeout_s: float) -> list[int] | None:
    """Connections towards ``host`` that take distinct spines now (TTL-2 probes, one per
    entropy value, ``workloads.lb.paths``), or None when a probe went unanswered."""
    hops = discover(host, list(range(1, conns + 1)), max_ttl=2, timeout_s=timeout_s)
    if any(len(h) < 2 or h[1] is None for h in hops.values()):
        return None
    return [d - 1 for d in distinct_paths(hops)]


class Even:
    """Every message in ``conns`` equal parts, part c on connection c."""

    name = "none"
    dynamic = False
    poll_s: float | None = None

    def __init__(self, conns: int):
        self.conns = conns
        self.routes: Routes | None = None

    def split(self, sends: Sequence[tuple[int, int]], now_s: float) -> list[list[Segment]]:
        """Per ``(peer, nbytes)`` of one exchange, its segments."""
        return [[(c, a, b) for c, (a, b) in enumerate(split_bytes(n, self.conns)) if b > a]
                for _, n in sends]

    def timeout(self, peer: int, conn: int, now_s: float) -> int | None:
        """A retransmission timeout on ``conn`` to ``peer``: the connection to move its
        unsent frames to, or None to leave them."""
        return None

    def reroute(self, peer: int, conn: int, now_s: float) -> list[int] | None:
        """The connections to deal ``conn``'s unsent frames to ``peer`` over, when it should
        no longer carry them; None to leave them."""
        return None

    def stats(self) -> dict:
        """What the balancer did (for the worker's report): its name, the paths it found
        per peer (connection indices) and its own counters."""
        paths = {str(p): v for p, v in self.routes.paths.items()} if self.routes else None
        return {"balancer": self.name, "paths": paths}


class Ethereal(Even):
    """Ethereal's assignment per exchange and its failure rule (see the module docstring).

    Args:
        routes: the rank's discovered ``Routes``.
        rank: the rank (offset of its round-robin).
        reset_s: how long a (path, leaf) stays failed after a timeout, s.
        rng: choice of the healthy path a failed connection's frames move to.
        reprobe: peer -> its path connections probed now, or None when a probe went
            unanswered (``make``: ``spine_paths``); None: no re-probing.
        reprobe_s: period of the re-probing, s.
    """

    name = "ethereal"
    poll_s = 0.005

    def __init__(self, routes: Routes, conns: int, rank: int, reset_s: float = 1.0,
                 rng: random.Random | None = None,
                 reprobe: Callable[[int], list[int] | None] | None = None,
                 reprobe_s: float = 0.5):
        super().__init__(conns)
        self.routes, self.rank = routes, rank
        self.failed = FailedPaths(reset_s)
        self.rng = rng or random.Random(rank)
        self.marks = 0
        self.moves = 0
        self.path_changes = 0
        self._wake = threading.Event()
        if reprobe is not None:
            threading.Thread(target=self._watch, args=(reprobe, reprobe_s), daemon=True,
                             name="ethereal-reprobe").start()

    def _watch(self, reprobe: Callable[[int], list[int] | None], period_s: float) -> None:
        """Re-probe one peer per destination leaf every ``period_s`` (or when woken) and give
        every peer of that leaf the paths found (atomic list swaps: ``split`` runs on)."""
        while True:
            self._wake.wait(period_s)
            self._wake.clear()
            by_leaf: dict[tuple[str, ...], list[int]] = {}
            for peer, leaf in self.routes.leaf.items():
                if leaf is not None:
                    by_leaf.setdefault(leaf, []).append(peer)
            for peers in by_leaf.values():
                found = reprobe(peers[0])
                if found and found != self.routes.paths[peers[0]]:
                    self.path_changes += 1
                    for peer in peers:
                        self.routes.paths[peer] = found

    def healthy(self, peer: int, now_s: float) -> list[int]:
        """The peer's path connections not marked failed towards its leaf, rotated by the
        rank."""
        paths = self.failed.healthy(self.routes.paths[peer], self._leaf(peer), now_s)
        k = self.rank % len(paths)
        return paths[k:] + paths[:k]

    def _leaf(self, peer: int) -> str:
        return repr(self.routes.leaf.get(peer))

    def split(self, sends: Sequence[tuple[int, int]], now_s: float) -> list[list[Segment]]:
        out: list[list[Segment]] = [[] for _ in sends]
        by_leaf: dict[str, list[int]] = {}
        for i, (peer, _) in enumerate(sends):
            if self.routes.leaf.get(peer, ()) is None:  # own leaf: direct, whole
                out[i] = [(self.routes.paths[peer][0], 0, sends[i][1])]
            else:
                by_leaf.setdefault(self._leaf(peer), []).append(i)
        for flows in by_leaf.values():
            paths = self.healthy(sends[flows[0]][0], now_s)
            for piece in assign(len(flows), paths):
                i = flows[piece.flow]
                start, length = piece.share(sends[i][1])
                if length:
                    out[i].append((piece.path, start, start + length))
        return out

    def timeout(self, peer: int, conn: int, now_s: float) -> int | None:
        self.marks += 1
        self._wake.set()
        if self.routes.leaf.get(peer, ()) is None:
            return None
        self.failed.mark(conn, self._leaf(peer), now_s)
        others = [c for c in self.healthy(peer, now_s) if c != conn]
        if not others:
            return None
        self.moves += 1
        return self.rng.choice(others)

    def reroute(self, peer: int, conn: int, now_s: float) -> list[int] | None:
        """A connection to a far leaf that is no longer among the healthy paths (re-probed
        away, or marked failed): the healthy paths."""
        if self.routes.leaf.get(peer, ()) is None:
            return None
        paths = self.healthy(peer, now_s)
        return paths if paths and conn not in paths else None

    def stats(self) -> dict:
        return {**super().stats(), "failed_marks": self.marks, "moves": self.moves,
                "path_changes": self.path_changes}


class RepsLb(Even):
    """REPS per peer, choosing each frame's connection at dispatch (module docstring).

    Args:
        routes: the rank's discovered ``Routes`` (entropy values: each peer's paths).
        inflight: frames dispatched and not yet acknowledged, per peer, at most.
        clean_us: a frame is clean when the smoothed RTT is within this of the minimum, us.
        seed: seed of the exploring draws.
    """

    name = "reps"
    dynamic = True
    poll_s = 0.002

    def __init__(self, routes: Routes, conns: int, inflight: int = 16,
                 clean_us: float = 4000.0, seed: int = 0):
        super().__init__(conns)
        self.routes, self.inflight, self.clean_us = routes, inflight, clean_us
        self.rng = random.Random(seed)
        self._rings: dict[int, Reps] = {}
        self.clean = self.marked = self.freezes = 0

    def ring(self, peer: int) -> Reps:
        """The peer's REPS buffer (created on first use)."""
        if peer not in self._rings:
            self._rings[peer] = Reps(self.routes.paths.get(peer, list(range(self.conns))),
                                     rng=self.rng)
        return self._rings[peer]

    def pick(self, peer: int) -> int:
        """The connection of the next frame to ``peer``."""
        return self.ring(peer).next()

    def acked(self, peer: int, conn: int, retransmitted: bool, rtt_us: int,
              min_rtt_us: int | None) -> None:
        """A frame on ``conn`` is acknowledged; clean unless it saw a retransmission or the
        RTT stood more than ``clean_us`` above the minimum."""
        clean = not retransmitted and (min_rtt_us is None or rtt_us <= min_rtt_us + self.clean_us)
        self.clean += clean
        self.marked += not clean
        self.ring(peer).ack(conn, clean)

    def timeout(self, peer: int, conn: int, now_s: float) -> int | None:
        self.freezes += 1
        self.ring(peer).timeout()
        return -1  # back to the pool: the frozen ring places them again

    def stats(self) -> dict:
        return {**super().stats(), "clean_acks": self.clean, "marked_acks": self.marked,
                "freezes": self.freezes}


def make(kind: str, rank: int, hosts: Sequence[str], conns: int, seed: int = 0,
         timeout_s: float = 0.3):
    """The balancer ``kind`` (``BALANCERS``) of rank ``rank`` whose peers are at ``hosts``
    (rank order): ``none`` needs nothing; ``ethereal`` and ``reps`` first discover the
    paths to every peer (``workloads.lb.paths``, DSCP 1..``conns``, probes of at most
    ``timeout_s`` s each).

    Raises:
        ValueError: an unknown kind.
    """
    if kind == "none":
        return Even(conns)
    if kind not in BALANCERS:
        raise ValueError(f"unknown balancer {kind!r}; balancers: {', '.join(BALANCERS)}")
    dscps = list(range(1, conns + 1))
    routes = routes_from_hops({p: discover(h, dscps, max_ttl=4, timeout_s=timeout_s)
                               for p, h in enumerate(hosts) if p != rank}, conns)
    if kind == "ethereal":
        return Ethereal(routes, conns, rank,
                        reprobe=lambda peer: spine_paths(hosts[peer], conns, timeout_s))
    return RepsLb(routes, conns, seed=seed * 1009 + rank)
