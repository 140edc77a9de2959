"""Path choice per TCP connection for programs that open their own connections (PyTorch's
gloo, iperf3): the pure logic of the balancer daemon (``workloads.lb.daemon``), which sees the
VM's sockets and sets each connection's entropy value (DSCP) from outside the program.

Per destination leaf (peers in the source's own leaf go direct, unpinned):

* a new connection takes the next path of the leaf's round-robin, started at the VM's
  ``offset`` (Ethereal's assignment at arrival: Khani et al., arXiv 2407.00550;
  ``workloads.lb.ethereal``), since flows of a collective are equal;
* the connections of a real framework are not equal flows (gloo sends each collective on
  one connection per peer, its contexts' connections in turn, so which connection carries
  the next bytes depends on the program), so every connection with nothing unacknowledged or
  unsent (idle: moving it reorders nothing) is pinned to the path that has carried the fewest
  bytes towards its leaf so far: whichever of them sends the next burst, it goes where the
  bytes are fewest, which keeps Ethereal's goal of equal bytes on every path. A connection
  stays where it is while its path is within ``slack_bytes`` of the least loaded.
  Connections that burst at once share that path, and the next bursts go elsewhere: the
  paths differ by about one round of simultaneous bursts (more when a connection starts
  sending between two samples).

Bytes are charged to the path a connection was on when they were counted (payload when
acknowledged, ``tcpi_bytes_acked``, and every segment's headers, so a connection that only
acknowledges a peer's data weighs its ACKs); a connection moves only when idle, so every
counted byte of a burst crossed the path it is charged to.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

Key = Hashable
"""A connection's identity (the daemon uses (destination address, source port, destination
port))."""


@dataclass(frozen=True)
class Sample:
    """One connection as the VM's sockets show it now.

    Attributes:
        key: the connection.
        leaf: its destination leaf (any hashable), or None when the destination is in the
            source's own leaf (no spine on the way: never pinned).
        paths: the entropy values (DSCP) that take distinct spines towards that leaf.
        sent: bytes sent so far on the wire (the daemon: payload acknowledged,
            ``tcpi_bytes_acked``, plus the headers of every segment sent, pure ACKs too).
        idle: nothing unacknowledged or unsent (the socket's write queue is empty).
    """

    key: Key
    leaf: Hashable | None
    paths: tuple[int, ...]
    sent: int
    idle: bool


@dataclass
class _Conn:
    leaf: Hashable
    path: int
    last: int  # sent at the previous sample


class Pinner:
    """The daemon's choices (module docstring); ``update`` once per poll.

    Args:
        offset: where every leaf's round-robin starts (give the VMs of one leaf different
            ones, so they do not all start on the same spine).
        slack_bytes: an idle connection moves only when its path carried more than this
            beyond the least loaded one (0: whenever it is not among the least loaded).
    """

    def __init__(self, offset: int = 0, slack_bytes: int = 0):
        self.offset, self.slack_bytes = offset, slack_bytes
        self.pins: dict[Key, int] = {}
        self.load: dict[Hashable, dict[int, int]] = {}
        self.moves = 0
        self._conns: dict[Key, _Conn] = {}
        self._arrivals: dict[Hashable, int] = {}

    def update(self, samples: Iterable[Sample]) -> tuple[dict[Key, int], list[Key]]:
        """Take one poll's samples (every connection the VM has now).

        Returns:
            (pins that are new or changed: key -> entropy value, keys that are gone: their
            pins to remove). ``pins`` then holds every connection's entropy value.

        Raises:
            ValueError: a sample towards another leaf with no path.
        """
        seen = set()
        idle: dict[Hashable, list[tuple[Key, tuple[int, ...]]]] = {}
        changed: dict[Key, int] = {}
        for s in samples:
            if s.leaf is None:
                continue
            if not s.paths:
                raise ValueError(f"connection {s.key!r}: no path towards leaf {s.leaf!r}")
            seen.add(s.key)
            load = self.load.setdefault(s.leaf, {})
            c = self._conns.get(s.key)
            if c is None:
                n = self._arrivals.get(s.leaf, 0)
                self._arrivals[s.leaf] = n + 1
                c = self._conns[s.key] = _Conn(s.leaf, s.paths[(self.offset + n) % len(s.paths)],
                                               s.sent)
                changed[s.key] = c.path
            load[c.path] = load.get(c.path, 0) + max(0, s.sent - c.last)
            c.last = s.sent
            if s.idle:
                idle.setdefault(s.leaf, []).append((s.key, s.paths))
        for leaf, conns in idle.items():
            self._place(leaf, conns, changed)
        gone = [k for k in self._conns if k not in seen]
        for k in gone:
            del self._conns[k]
            self.pins.pop(k, None)
            changed.pop(k, None)
        self.pins.update(changed)
        return changed, gone

    def _place(self, leaf: Hashable, conns: list[tuple[Key, tuple[int, ...]]],
               changed: dict[Key, int]) -> None:
        load = self.load[leaf]
        for key, paths in conns:
            c = self._conns[key]
            cost = {p: load.get(p, 0) for p in paths}
            least = min(cost.values())
            if cost.get(c.path, least + self.slack_bytes + 1) > least + self.slack_bytes:
                self.moves += key not in changed  # a new connection's first pin is no move
                c.path = next(p for p in paths if cost[p] == least)
                changed[key] = c.path

    def stats(self) -> dict:
        """What it did: ``connections`` pinned (every one seen towards another leaf),
        ``moves`` (re-pins of idle connections) and ``bytes_by_path`` (per destination leaf,
        per entropy value, bytes sent: payload and headers)."""
        return {"connections": sum(self._arrivals.values()), "moves": self.moves,
                "bytes_by_path": {str(leaf): {str(p): b for p, b in sorted(paths.items())}
                                  for leaf, paths in self.load.items()}}
