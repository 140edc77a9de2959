"""Agents' reports made from clock truth without a network, for the coordinator's unit tests
and its benchmarks: coded probe pairs with a known minimum delay and queueing, each probe
stamped by the sender's and the receiver's emulated clock (``agents.clock.ClockSpec``), sent
as the agents' messages (``contracts.messages``).
"""
from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterator, Mapping

from agents.clock import ClockSpec
from contracts.messages import REPORT_SCHEMA, AgentStats, Hello, Report, pack_records

S = 1_000_000_000
T0_NS = 1_800_000_000 * S
"""True time (ns) at which a simulation starts unless told otherwise."""
PAIR_GAP_NS = 15_000
"""Send gap of the two probes of a coded pair, ns."""


def hellos(specs: Mapping[str, ClockSpec], *, rate: float = 20.0, chunk_s: float = 0.5,
           t0_ns: int = T0_NS) -> list[Hello]:
    """Every VM's ``hello``, started at true time ``t0_ns``."""
    return [Hello(schema=REPORT_SCHEMA, name=v, ip="127.0.0.1", rate=rate, report_s=chunk_s,
                  start_ns=specs[v].to_vm_ns(t0_ns)) for v in sorted(specs)]


def reports(specs: Mapping[str, ClockSpec], seconds: float, *, rate: float = 20.0,
            dmin_ns: int = 20_000, queue_ns: Mapping[tuple[str, str], float] | None = None,
            seed: int = 1, start_s: float = 0.0, chunk_s: float = 0.5,
            silent: Collection[str] = (),
            peers: Mapping[str, Collection[str]] | None = None, t0_ns: int = T0_NS,
            stats: AgentStats | None = None, packed: bool = True,
            standing_ns: Mapping[tuple[str, str], float | Callable[[float], float]]
            | None = None,
            standing_s: tuple[float, float] | None = None,
            burst: tuple[float, float] | None = None
            ) -> Iterator[list[Report]]:
    """Every VM's report after each ``chunk_s`` of true time, from ``t0_ns + start_s`` for
    ``seconds``.

    Every VM sends coded pairs to each of its ``peers`` (default: every other VM) at ``rate``
    pairs/s. A probe's true delay is ``dmin_ns`` plus queueing: exponential with mean
    ``queue_ns[(src, dst)]`` (default 500 ns) shared by both probes of a pair, plus 300 ns
    (mean) of independent jitter; in 20 % of the pairs the second probe waits for more
    (an impure pair). ``silent`` VMs neither probe, answer nor report (a paused VM);
    ``stats`` is every report's counters (default zeros); ``standing_ns[(src, dst)]``: a
    queue that stands all along, added to every probe of that direction, or only to those sent
    within ``standing_s = (from_s, to_s)``, true seconds after ``t0_ns`` (a flow that covers
    a part of a window: its queue stands up and drains at once); a callable there is the
    queue's depth (ns) at each probe's send time (true seconds after ``t0_ns``): a queue
    that varies. ``burst = (rate, seconds)``: each VM sends at that rate for its first seconds
    after ``t0_ns`` (the agent's start-up burst, ``AgentConfig.burst_s``). The records are packed
    (``Report.rx_packed``, as the agents send them), or JSON rows (``Report.rx``) with
    ``packed=False``.
    """
    rng = random.Random(seed)
    queue_ns = queue_ns or {}
    standing_ns = standing_ns or {}
    names = sorted(specs)
    peers = peers or {v: [p for p in names if p != v] for v in names}
    stand_lo, stand_hi = ((t0_ns + int(standing_s[0] * S), t0_ns + int(standing_s[1] * S))
                          if standing_s is not None else (-1, 1 << 62))
    t = t0_ns + int(start_s * S)
    end = t + int(seconds * S)
    while t < end:
        stop = t + int(chunk_s * S)
        rx: dict[str, dict] = {v: {} for v in names}
        for src in names:
            for dst in peers[src]:
                if src in silent or dst in silent:
                    continue
                mean_q = queue_ns.get((src, dst), 500)
                stand = standing_ns.get((src, dst), 0)
                bursting = burst is not None and t < t0_ns + int(burst[1] * S)
                ts = t + int(rng.uniform(0, 1 / (burst[0] if bursting else rate)) * S)
                while ts < stop:
                    bursting = burst is not None and ts < t0_ns + int(burst[1] * S)
                    pid = rng.getrandbits(32)
                    common = rng.expovariate(1 / mean_q)  # both probes wait in one queue
                    for idx, tx_true in enumerate((ts, ts + PAIR_GAP_NS)):
                        q = common + rng.expovariate(1 / 300)
                        if idx == 1 and rng.random() < 0.2:  # cross traffic between them
                            q += rng.expovariate(1 / mean_q)
                        depth = stand((tx_true - t0_ns) / S) if callable(stand) else stand
                        stood = depth if stand_lo <= tx_true < stand_hi else 0
                        rx_true = tx_true + dmin_ns + int(q + stood)
                        rx[dst].setdefault(src, []).append(
                            [pid, idx, specs[src].to_vm_ns(tx_true),
                             specs[dst].to_vm_ns(rx_true)])
                    ts += int(S / (burst[0] if bursting else rate))
        yield [Report(name=v, t_ns=specs[v].to_vm_ns(stop), stats=stats or AgentStats(),
                      **({"rx_packed": pack_records({s: [x for row in rows for x in row]
                                                     for s, rows in rx[v].items()})}
                         if packed else {"rx": rx[v]}))
               for v in names if v not in silent]
        t = stop


def simulate(coord, specs: Mapping[str, ClockSpec], seconds: float, *, hello: bool = True,
             rate: float = 20.0, chunk_s: float = 0.5, t0_ns: int = T0_NS, **kw) -> None:
    """Feed ``coord`` (an ``agents.coordinator.Coordinator``) what its agents would send:
    each VM's ``hello`` first (``hello=False``: the agents are already known), then after
    each chunk every VM's report (``reports``, same arguments), then ``coord.step()``."""
    for msg in hellos(specs, rate=rate, chunk_s=chunk_s, t0_ns=t0_ns) if hello else []:
        coord.ingest(msg)
    for chunk in reports(specs, seconds, rate=rate, chunk_s=chunk_s, t0_ns=t0_ns, **kw):
        for msg in chunk:
            coord.ingest(msg)
        coord.step()
