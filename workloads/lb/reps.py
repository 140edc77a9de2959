"""REPS: recycled entropies, per connection.

Source: Bonato et al., "REPS: Recycled Entropy Packet Spraying for Adaptive Load Balancing
and Failure Mitigation" (arXiv 2407.21625, EuroSys 2026); reference code
ultraethernet/uet-htsim (``uec_mp.cpp``, ``buffer_reps``).

The sender keeps a ring of up to ``size`` (8) entropy values whose acknowledgement came back
clean. For the first ``explore`` sends (about one BDP) it explores: random entropies. After
that a send reuses the oldest cached entropy, which is then consumed (a clean ACK puts it
back), and uses a random one when the ring is empty. A marked ACK caches nothing, so a path
that congests stops being reused. A timeout starts *freezing*: no exploring, the cached
entropies are cycled without being consumed, until a clean ACK ends it, after which one
``explore`` of exploring follows.

nslab has no ECN (no RED qdisc here): the caller decides what "clean" means, from delay
(RTT within a bound of the path's minimum) or TCP_INFO (no retransmission), and says so.
"""
from __future__ import annotations

import random
from collections import deque


class Reps:
    """The entropy buffer of one connection.

    Args:
        entropies: the entropy values to draw from (e.g. the path slots 1..S).
        size: ring capacity (the paper: 8).
        explore: sends of exploring at the start and after a freeze ends (about one BDP).
        rng: random source (seed it for reproducible choices).

    Raises:
        ValueError: no entropies, or size < 1.
    """

    def __init__(self, entropies: list[int], size: int = 8, explore: int = 8,
                 rng: random.Random | None = None):
        if not entropies or size < 1:
            raise ValueError("REPS needs at least one entropy value and a ring of size >= 1")
        self.entropies = list(entropies)
        self.ring: deque[int] = deque(maxlen=size)
        self.explore_left = explore
        self.explore = explore
        self.frozen = False
        self.rng = rng or random.Random()

    def next(self) -> int:
        """The entropy of the next send."""
        if self.frozen and self.ring:
            e = self.ring.popleft()
            self.ring.append(e)  # cycled, not consumed
            return e
        if self.explore_left > 0 or not self.ring:
            self.explore_left = max(0, self.explore_left - 1)
            return self.rng.choice(self.entropies)
        return self.ring.popleft()

    def ack(self, entropy: int, clean: bool) -> None:
        """The send with ``entropy`` was acknowledged, ``clean`` or marked (congested)."""
        if not clean:
            return
        if self.frozen:
            self.frozen = False
            self.explore_left = self.explore
        self.ring.append(entropy)

    def timeout(self) -> None:
        """A retransmission timeout: freeze (reuse the cached entropies, explore nothing)."""
        self.frozen = True
        self.explore_left = 0
