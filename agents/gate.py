"""On-Ramp's gate: hold a destination's traffic at the sender while its one-way delay is above a
threshold, for about the excess.

Rule (Liu et al., "Breaking the Transience-Equilibrium Nexus: A New Approach to Datacenter
Packet Transport", NSDI 2021, section 3): when a one-way delay sample ``owd`` toward a
destination exceeds the threshold ``T``, pause that destination's traffic for ``owd - T`` so
the queue it is building drains at the edge instead of overflowing a shallow switch buffer;
then release. ``T`` must exceed the clock-sync error, or the gate acts on noise.

This module is pure logic (no sockets, no clock reads): times are passed in, ns on one clock.
Bounds the paper leaves implicit, made explicit here so a destination is never held forever:

* a hold lasts at most ``max_hold_ns``;
* a sample whose echo took longer than ``max_age_ns`` to come back (the time from its arrival
  at the destination to now) is ignored (a paused peer, a late echo);
* a sample of a probe sent before the current hold began measured the queue that caused the
  hold and is ignored; a later one (probes are never held) that is still above ``T`` extends
  the hold to ``now + min(owd - T, max_hold_ns)``, but a hold never lasts longer than
  ``max_continuous_ns`` in one piece: then the destination is open for ``max_hold_ns``
  whatever the samples say;
* without a synchronized clock (``synced=False``) the gate is open and says why.

Fresh release (``fresh``, ours, on by default): a hold ends at the later of ``owd - T`` and the
return of a sample of a probe sent at or after the hold's start that is at or below ``T``
(bounded by ``max_continuous_ns`` as above). ``owd - T`` drains the queue a sample saw, and
On-Ramp assumes that sample is fresh; under an incast it is one queue delay old (60-120 ms at
the lab's 5 Mbit/s with a 50-packet queue), the queue grew meanwhile, and a hold of
``owd - T`` ended before any sample taken during it could return: the released bursts refilled
the queue, which stayed full while each sender was held 30-40 % of the time (4 senders need
>= 75 %). The feedback delay is the queue delay itself, so only a sample sent during the hold
can say that the hold drained it; a sample above ``T`` sent during the hold extends the
wait. Off, holds end at ``owd - T`` as published.

Missing echoes (part of ``fresh``, ours): a probe not back ``late_ns`` (``T`` + ``max_hold_ns``)
after it was sent, toward a destination that answered within ``max_age_ns``, starts a fresh hold
(``overdue``): the queue may be long, and nothing fresh says it is not. Measured under the
lab's incast: the receiver's pacer, waiting for a CPU, answered nothing for 80 ms while its
queue went from empty to full; the senders' gates, fed no samples, stayed open. A destination
that never answered or has been silent longer (no pacer there, a paused VM) is not held.

Release spread (``spread``, with ``fresh``, ours, off by default): every sender into one
queue sees the same samples, so they all see the queue drained at the same moment and release
together; their windows meet in the queue again, which may overflow before a sample can say
so. So a fresh release is put off by ``u x s``, ``u`` in [0, 1) drawn per release from
``seed`` (one per VM: splitmix64 of the seed and the release count, reproducible) and ``s``
the largest excess (predicted OWD - T, at most ``max_hold_ns``) a sample showed during the
hold: the time the queue that held this sender took to drain, which holds every sender's
backlog, so the releases of however many senders were held spread over about the time their
backlogs take to leave one by one. A sender needs no count of the others. While the release
waits, a sample above ``T`` (another sender's release already queueing) re-arms the wait for a
fresh sample below ``T``, so the senders go back into the queue one after another while it
stays short. A hold that saw no sample above ``T`` (a missing echo on a short queue) is not
put off. The release never passes the hold's ``max_continuous_ns`` bound. Off by default: the
bottleneck idles until the first draw is due, which lengthens every round
(``benchmarks/pacer.py`` compares both).

Lag compensation (``predict``, ours, not in the paper): a sample describes the queue when its
probe entered it, one OWD and an echo ago; an incast queue fills at several times its drain
rate meanwhile, so a hold of ``owd - T`` drains only what was there then and the queue
ratchets up to the buffer. With ``predict`` the gate uses ``owd + slope x (now - sent)``,
``slope`` the OWD's growth per unit of send time between this sample and the previous one
(clipped to ``[0, max_slope]``: a draining queue is never extrapolated down), a first-order
predictor of the queue now. It lengthens a hold, never starts one: a sample at or below ``T``
holds nothing whatever its trend (noise on a short queue must not pause traffic). Off, the
gate is On-Ramp's rule as published.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from agents import pacer_defaults as D

__all__ = ["Decision", "Gate", "GateConfig"]


MAX_SPAN_NS = 86_400e9
"""The longest threshold, hold or age a ``GateConfig`` takes, ns: times stay far inside the
compiled gate's int64 nanoseconds."""


@dataclass(frozen=True)
class GateConfig:
    """Gate parameters.

    Args:
        threshold_ns: ``T``: OWD above which a destination is held, ns (> 0; should exceed the
            sync error p99 and the path's base OWD).
        max_hold_ns: longest single hold, ns (> 0).
        max_age_ns: samples whose echo took longer than this are ignored, ns (> 0).
        max_continuous_ns: longest hold in one piece (extensions included), ns (> 0).
        predict: compensate the sample's age (module doc); False is On-Ramp as published.
        fresh: a hold also lasts until a sample sent during it comes back at or below ``T``,
            and a probe without echo for ``late_ns`` starts one (module doc); False is
            On-Ramp as published.
        max_slope: the largest OWD growth per unit of time the predictor believes (> 0;
            an incast of N line-rate senders into one line grows at N - 1).
        spread: with ``fresh``, put a release off by a draw in [0, the hold's largest excess)
            (module doc); False (default) releases at once.
        seed: the draws' seed (one per VM, so senders draw apart; any int, used mod 2**64).

    Raises:
        ValueError: a parameter out of range.
    """

    threshold_ns: float = D.THRESHOLD_US * 1e3
    max_hold_ns: float = D.MAX_HOLD_US * 1e3
    max_age_ns: float = 20_000_000.0
    max_continuous_ns: float = 50_000_000.0
    predict: bool = D.PREDICT
    max_slope: float = 8.0
    fresh: bool = D.FRESH
    spread: bool = D.SPREAD
    seed: int = 0

    @classmethod
    def for_hold(cls, threshold_ns: float, max_hold_ns: float, predict: bool = True,
                 fresh: bool = True, spread: bool = False, seed: int = 0) -> GateConfig:
        """The gate for ``T`` and a longest single hold, its other bounds in proportion to the
        hold (as the defaults: ``max_age_ns`` 4 x, ``max_continuous_ns`` 10 x), so that a lab
        run at a k-times lower link rate with k-times longer T and holds (time dilation) has
        k-times longer bounds too.

        Raises:
            ValueError: a parameter out of range."""
        return cls(threshold_ns=threshold_ns, max_hold_ns=max_hold_ns,
                   max_age_ns=4 * max_hold_ns, max_continuous_ns=10 * max_hold_ns,
                   predict=predict, fresh=fresh, spread=spread, seed=seed)

    @property
    def late_ns(self) -> float:
        """How long a probe may be unanswered before ``fresh`` holds its destination, ns:
        ``threshold_ns + max_hold_ns`` (module doc)."""
        return self.threshold_ns + self.max_hold_ns

    def __post_init__(self):
        for name in ("threshold_ns", "max_hold_ns", "max_age_ns", "max_continuous_ns",
                     "max_slope"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("threshold_ns", "max_hold_ns", "max_age_ns", "max_continuous_ns"):
            if getattr(self, name) > MAX_SPAN_NS:
                raise ValueError(f"{name} must be <= {MAX_SPAN_NS:.0f} ns (a day), got "
                                 f"{getattr(self, name)}")
        if self.spread and not self.fresh:
            raise ValueError("spread needs fresh: only a fresh release is put off")


@dataclass(frozen=True)
class Decision:
    """What the gate decided on one sample: ``hold_ns`` > 0 holds the destination until
    ``until_ns``; ``reason`` says why it did not hold otherwise."""

    hold_ns: float
    until_ns: int
    reason: str


@dataclass
class _Dest:
    held_until_ns: int = 0
    held_since_ns: int = 0
    open_until_ns: int = 0
    holds: int = 0
    held_ns: float = 0.0
    last_sent_ns: int | None = None
    last_owd_ns: float = 0.0
    time_until_ns: int = 0      # fresh: the end by owd - T alone
    waiting: bool = False       # fresh: held until a sample sent in the hold is below T
    spread_ns: float = 0.0      # spread: the largest excess in this hold (<= max_hold_ns)
    releases: int = 0           # spread: fresh releases so far (the draws' counter)


@dataclass
class Gate:
    """Per-destination gate state (``decide`` per OWD sample, ``held`` to query)."""

    cfg: GateConfig = field(default_factory=GateConfig)
    dests: dict[str, _Dest] = field(default_factory=dict)

    def decide(self, dest: str, owd_ns: float, sent_ns: int, now_ns: int,
               synced: bool = True) -> Decision:
        """One OWD sample toward ``dest`` taken by a probe sent at ``sent_ns``, its echo seen
        at ``now_ns`` (ns, one steady clock of the sender: pacer.c passes CLOCK_MONOTONIC).

        Returns:
            The decision; a hold is recorded in the destination's state (``held``, ``stats``).
        """
        d = self.dests.setdefault(dest, _Dest())
        if not synced:
            return Decision(0.0, 0, "clock not synchronized: gate open")
        if now_ns - sent_ns - owd_ns > self.cfg.max_age_ns:
            return Decision(0.0, 0, "stale sample")
        predicted = self._predicted(d, owd_ns, sent_ns, now_ns)
        holding = now_ns < d.held_until_ns
        if not holding and d.waiting:  # the hold ran to its cap with no fresh sample below T
            d.waiting, d.open_until_ns = False, d.held_until_ns + int(self.cfg.max_hold_ns)
        if holding and sent_ns < d.held_since_ns:
            return Decision(0.0, d.held_until_ns, "held: sample predates the hold")
        if now_ns < d.open_until_ns:
            return Decision(0.0, 0, "open after the longest continuous hold")
        if owd_ns <= self.cfg.threshold_ns:
            if not d.waiting:
                return Decision(0.0, 0, "below threshold")
            end = min(max(d.time_until_ns, now_ns) + self._stagger(d), d.held_until_ns)
            d.held_ns -= d.held_until_ns - end
            d.held_until_ns, d.waiting = end, False
            return Decision(0.0, end, "released: a sample sent in the hold is below threshold")
        excess = predicted - self.cfg.threshold_ns
        if not holding:
            d.held_since_ns, d.time_until_ns, d.spread_ns = now_ns, 0, 0.0
            d.holds += 1
        d.spread_ns = max(d.spread_ns, min(excess, self.cfg.max_hold_ns))
        end = now_ns + int(min(excess, self.cfg.max_hold_ns))
        cap = d.held_since_ns + int(self.cfg.max_continuous_ns)
        if self.cfg.fresh:
            d.time_until_ns, d.waiting = min(max(end, d.time_until_ns), cap), True
            end = cap
        elif end >= cap:
            end, d.open_until_ns = cap, cap + int(self.cfg.max_hold_ns)
        d.held_ns += end - max(d.held_until_ns, now_ns)
        d.held_until_ns = end
        return Decision(end - now_ns, end, "above threshold")

    def overdue(self, dest: str, sent_ns: int, now_ns: int, answered_ns: int | None,
                synced: bool = True) -> Decision:
        """A probe toward ``dest`` sent at ``sent_ns`` has no echo by ``now_ns``; ``dest``'s last
        echo came at ``answered_ns`` (None: never; ns, the clock of ``decide``). With ``fresh``,
        once the probe is ``late_ns`` old and ``dest`` answered within ``max_age_ns``, a
        hold starts that lasts until a sample sent in it is at or below ``T`` (module doc).

        Returns:
            The decision (a started hold is recorded as ``decide``'s are).
        """
        d = self.dests.setdefault(dest, _Dest())
        if not synced:
            return Decision(0.0, 0, "clock not synchronized: gate open")
        if not self.cfg.fresh or now_ns - sent_ns <= self.cfg.late_ns:
            return Decision(0.0, 0, "probe not late")
        if answered_ns is None or now_ns - answered_ns > self.cfg.max_age_ns:
            return Decision(0.0, 0, "destination silent: gate open")
        if now_ns < d.held_until_ns:
            return Decision(0.0, d.held_until_ns, "held: the hold goes on")
        if d.waiting:  # the hold ran to its cap with no fresh sample below T
            d.waiting, d.open_until_ns = False, d.held_until_ns + int(self.cfg.max_hold_ns)
        if now_ns < d.open_until_ns:
            return Decision(0.0, 0, "open after the longest continuous hold")
        end = now_ns + int(self.cfg.max_continuous_ns)
        d.held_since_ns, d.time_until_ns, d.waiting, d.spread_ns = now_ns, now_ns, True, 0.0
        d.holds += 1
        d.held_ns += end - now_ns
        d.held_until_ns = end
        return Decision(end - now_ns, end, "probe overdue: held until a fresh sample")

    def _stagger(self, d: _Dest) -> int:
        """How long a fresh release is put off, ns: ``u x spread_ns`` (module doc)."""
        if not self.cfg.spread:
            return 0
        d.releases += 1
        return int(_uniform(self.cfg.seed, d.releases) * d.spread_ns)

    def _predicted(self, d: _Dest, owd_ns: float, sent_ns: int, now_ns: int) -> float:
        """The OWD extrapolated to ``now_ns`` (module doc); records the sample."""
        prev, prev_owd = d.last_sent_ns, d.last_owd_ns
        if prev is not None and sent_ns <= prev:
            return owd_ns  # reordered echo: the newer sample already set the trend
        d.last_sent_ns, d.last_owd_ns = sent_ns, owd_ns
        if not self.cfg.predict or prev is None:
            return owd_ns
        slope = min(max((owd_ns - prev_owd) / (sent_ns - prev), 0.0), self.cfg.max_slope)
        return owd_ns + slope * (now_ns - sent_ns)

    def held(self, dest: str, now_ns: int) -> bool:
        """Whether ``dest`` is held at ``now_ns``."""
        d = self.dests.get(dest)
        return d is not None and now_ns < d.held_until_ns

    def stats(self, dest: str) -> tuple[int, float]:
        """(holds, total hold time in ns) toward ``dest`` so far."""
        d = self.dests.get(dest, _Dest())
        return d.holds, d.held_ns


_M64 = (1 << 64) - 1


def _uniform(seed: int, k: int) -> float:
    """The ``k``-th draw in [0, 1) of ``seed``: splitmix64 (Steele, Lea and Flood, "Fast
    splittable pseudorandom number generators", OOPSLA 2014) of ``seed + k x golden``, its top
    53 bits; ``agents/native/pacer.c``'s ``uniform`` is the same arithmetic."""
    z = (seed + k * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return ((z ^ (z >> 31)) >> 11) * 2.0 ** -53
