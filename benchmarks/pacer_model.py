"""The pacer's gate in a fluid model of an incast, to separate the rule from the machine.

N senders, each sending at its line rate while open and nothing while held (agents.hold's TBF),
share one bottleneck of rate C with a B-packet drop-tail buffer. Each sender probes every
``probe`` and its OWD sample (base + queue / C when the probe entered) comes back one OWD plus
half a base later, plus the pacer's reaction delay (scheduling, Python) and a jitter. Each sample
goes through the real ``agents.gate.Gate``; its hold applies at once. Senders are always
backlogged (the worst case: TCP's window never limits them).

    .venv/bin/python benchmarks/pacer_model.py [--senders 4] [--queues 30,50] [--react-ms 0.5,2,5]
                                               [--rate-mbit 20] [--threshold-us T]
                                               [--max-hold-us H] [--probe-us P]

Time dilation: dividing the rate by k and multiplying the probe period, T and the hold by k
gives the same queue at k times the time scale, so a reaction delay r at rate C / k acts as
r / k at rate C (the queue fills in B / ((N - 1) C), ~6 ms for 4 senders into 30 packets at
20 Mbit/s, 24 ms at 5 Mbit/s). The reaction and its jitter are the machine's and do not scale.

Printed per row: drops (packets), the bottleneck's utilization (sent / C x duration), the
queue's maximum (packets), for On-Ramp's rule as published (``onramp``) and with the sample's age
compensated (``predict``). Read it beside benchmarks/pacer.py: if the model drops nothing at the
lab's reaction delay and the lab does, the difference is not the rule.
"""
from __future__ import annotations

import argparse
import random
from dataclasses import dataclass, replace

from record import record

from agents.gate import Gate, GateConfig

PKT = 1500  # bytes


@dataclass(frozen=True)
class Incast:
    senders: int = 4
    rate_bit_s: float = 20e6       # bottleneck C and each sender's line
    buffer_pkts: int = 30
    probe_ns: float = 0.5e6
    base_ns: float = 100e3         # OWD of an empty path
    react_ns: float = 0.5e6
    jitter_ns: float = 1e6
    duration_ns: float = 2e9
    step_ns: float = 10e3

    def dilated(self, k: float) -> Incast:
        """The same incast at ``rate_bit_s / k``: the base OWD, the duration and the step ``k``
        times longer; the reaction and its jitter (the machine's) kept."""
        return replace(self, rate_bit_s=self.rate_bit_s / k, base_ns=self.base_ns * k,
                       duration_ns=self.duration_ns * k, step_ns=self.step_ns * k)


def simulate(m: Incast, gate: GateConfig, seed: int = 1) -> tuple[float, float, float]:
    """(drops in packets, bottleneck utilization, max queue in packets) of one run."""
    rnd = random.Random(seed)
    gates = [Gate(gate) for _ in range(m.senders)]
    held_until = [0.0] * m.senders
    next_probe = [rnd.uniform(0, m.probe_ns) for _ in range(m.senders)]
    echoes: list[tuple[float, int, float, float]] = []  # (seen at, sender, sent at, owd)
    per_step = m.rate_bit_s * m.step_ns / 1e9 / 8
    queue = drops = sent = qmax = 0.0
    t = 0.0
    while t < m.duration_ns:
        for i in range(m.senders):
            if t >= next_probe[i]:
                owd = m.base_ns + queue * 8 / m.rate_bit_s * 1e9
                seen = t + owd + m.base_ns / 2 + m.react_ns + rnd.uniform(0, m.jitter_ns)
                echoes.append((seen, i, t, owd))
                next_probe[i] += m.probe_ns
        due = [e for e in echoes if e[0] <= t]
        echoes = [e for e in echoes if e[0] > t]
        for _, i, tx, owd in due:
            d = gates[i].decide("rx", owd, int(tx), int(t))
            if d.hold_ns > 0:
                held_until[i] = d.until_ns
        inflow = per_step * sum(t >= h for h in held_until)
        queue, sent = queue + inflow, sent + inflow
        queue -= min(queue, per_step)
        if queue > m.buffer_pkts * PKT:
            drops += queue - m.buffer_pkts * PKT
            queue = m.buffer_pkts * PKT
        qmax = max(qmax, queue)
        t += m.step_ns
    capacity = per_step * m.duration_ns / m.step_ns
    return drops / PKT, min(sent - drops, capacity) / capacity, qmax / PKT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--queues", default="30,50", help="buffers, packets, comma separated")
    ap.add_argument("--react-ms", default="0.5,2,5", help="the pacer's reaction delays, ms")
    ap.add_argument("--rate-mbit", type=float, default=20.0,
                    help="the senders' lines and the bottleneck, Mbit/s (time dilation: the "
                         "base OWD and the duration, and the defaults below, scale by 20 / this)")
    ap.add_argument("--threshold-us", type=float, default=None, help="T (500 us x 20 / rate)")
    ap.add_argument("--max-hold-us", type=float, default=None,
                    help="longest single hold (5000 us x 20 / rate; the other bounds in "
                         "proportion, as the pacer's CLI: GateConfig.for_hold)")
    ap.add_argument("--probe-us", type=float, default=None,
                    help="probe period per sender (500 us x 20 / rate)")
    args = ap.parse_args()
    k = 20.0 / args.rate_mbit
    t_us, hold_us, probe_us = (v if v is not None else d * k for v, d in (
        (args.threshold_us, 500.0), (args.max_hold_us, 5000.0), (args.probe_us, 500.0)))
    print(f"{'senders':>7s} {'queue':>5s} {'react ms':>8s} {'rule':>7s} {'drops':>6s} "
          f"{'util':>5s} {'qmax':>5s}")
    rows = []
    for react in (float(x) for x in args.react_ms.split(",")):
        for q in (int(x) for x in args.queues.split(",")):
            m = Incast(senders=args.senders, buffer_pkts=q, react_ns=react * 1e6,
                       probe_ns=probe_us * 1e3).dilated(k)
            for rule, predict in (("onramp", False), ("predict", True)):
                d, u, qmax = simulate(m, GateConfig.for_hold(t_us * 1e3, hold_us * 1e3,
                                                             predict=predict))
                print(f"{args.senders:7d} {q:5d} {react:8.1f} {rule:>7s} {d:6.0f} {u:5.2f} "
                      f"{qmax:5.1f}", flush=True)
                rows.append({"senders": args.senders, "queue": q, "react ms": react,
                             "rule": rule, "drops": round(d), "utilization": round(u, 2),
                             "queue max": round(qmax, 1)})
    record("pacer_model", "The pacer's gate in a fluid incast model", list(rows[0]), rows,
           f"{args.senders} senders into one {args.rate_mbit:g} Mbit/s bottleneck; T "
           f"{t_us:g} us, holds up to {hold_us:g} us, probes every {probe_us:g} us; onramp: "
           "On-Ramp's rule as published, predict: with lag compensation (agents/gate.py).")


if __name__ == "__main__":
    main()
