"""What an agent costs at its default probe rate, this tree against another commit's agent,
side by side in one run: N agent processes and a coordinator on loopback (no lab, no root:
127.77.0.x addresses, real sockets and kernel timestamps), CPU read from /proc after a warm-up.

    .venv/bin/python benchmarks/agent_cost.py [--before 3cb2827] [--vms 8] [--rate 20]
                                              [--seconds 20] [--rounds 3]

This tree's agent has its datagram path and its loop compiled (``agents/probeio.py``; ``make
setup`` builds it): one wake-up per send of up to ``--per-send`` pairs (a round of pairs to
every peer, spread over the round), Python once per report. ``--before
3cb2827`` runs the agent that called C once per 20 ms tick from Python beside it (built from
its own tree), ``--before 6c96ee9`` the last one that did everything in Python.

Three floors run beside them, each an agent's sends and queue reads (same socket options,
rate and peers) without any of its logic: "floor: Python" (``floor_node``, a system call per
datagram from Python every 20 ms tick, as the Python agent), "floor: C, 20 ms ticks"
(``agent_floor.c``: one recvmmsg per queue and one sendmmsg per tick, as 3cb2827's agent) and
"floor: C, bursts" (the same calls once per burst, ``rate`` wake-ups a second, as this tree's
agent). They bound what a rewrite could reach with that schedule: Python cannot go below its
floor, a compiled agent not below C's.

Each round runs the variants at the same time (each its own addresses and ports: the same
machine state for both); printed per variant: median over rounds of the agents' median CPU
(share of one core; 0.01 is 1 %), split into user and system, and the coordinator's. The total
is the scheduler's run time of every thread in ns (``/proc/PID/task/*/schedstat``: exact, where
``/proc/PID/stat`` counts 10 ms clock ticks, 0.05 % of a core over 20 s); the split is sampled
at each timer tick (CONFIG_TICK_CPU_ACCOUNTING) and scaled to it. ``sys`` is the kernel's work
in the agent's context: its system calls and, as this kernel charges softirq time to whatever
task it interrupts (CONFIG_IRQ_TIME_ACCOUNTING off), the loopback delivery of its datagrams and
any other softirq that ran meanwhile, so it grows with the machine's load. In a lab the same
holds, with the emulated fabric's forwarding of its probes in ``sys``.
Goal (issue 14): agent <= 0.01 at 7 peers x 20 pairs/s.
"""
from __future__ import annotations

import argparse
import glob
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent


def checkout(ref: str, into: str) -> str:
    """``ref``'s tree (git archive) unpacked under ``into``, its compiled datagram path built
    when it has one (``agents/native``); returns its path."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True,
                          capture_output=True).stdout
    path = os.path.join(into, "before")
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(path, filter="data")
    native = os.path.join(path, "agents", "native")
    if os.path.exists(os.path.join(native, "Makefile")):
        subprocess.run(["make", "-s", "-C", native], check=True)
    return path


@contextmanager
def pythonpath(tree: str | None):
    """Processes started inside it import ``tree``'s packages (None: this tree's): on their
    PYTHONPATH and as their working directory (``python -m`` puts it first on sys.path)."""
    saved, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
    if tree:
        os.environ["PYTHONPATH"] = tree
        os.chdir(tree)
    try:
        yield
    finally:
        os.chdir(cwd)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


FLOOR = "floor: Python"
C_FLOOR = {"floor: C, 20 ms ticks": "0", "floor: C, bursts": "1"}


def compile_floor(into: str) -> dict[str, str]:
    """``agent_floor.c`` compiled with gcc: ``{variant: binary}`` for both ``C_FLOOR``
    variants (one binary per variant's directory; {} without gcc)."""
    out = {}
    for name in C_FLOOR:
        d = os.path.join(into, name)
        os.makedirs(d)
        exe = os.path.join(d, "agent_floor")
        try:
            subprocess.run(["gcc", "-O2", "-o", exe, str(REPO / "benchmarks" / "agent_floor.c")],
                           check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"C floor skipped: {e}", file=sys.stderr)
            return {}
        out[name] = exe
    return out


def floor_node(me: str, peers: list[str], port: int, rate: float, seconds: float) -> None:
    """An agent's datagram I/O without its logic: every tick (20 ms) the pairs due to each
    peer (two 56-byte datagrams, ``rate`` per second on average), then the error queue and
    the receive queue drained with ``recvmsg``; nothing parsed. The same socket options and
    system calls as ``agents.agent``: the part of an agent's CPU that no rewrite of its logic
    (compiled or not) removes, while it sends and reads each datagram on its own."""
    from agents.agent import MSG_ERRQUEUE, SO_TIMESTAMPING, TS_FLAGS

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TS_FLAGS)
    sock.bind((me, port))
    sock.setblocking(False)
    pkt, due = bytes(56), {p: 0.0 for p in peers}
    end = time.monotonic() + seconds
    while (now := time.monotonic()) < end:
        for queue in (MSG_ERRQUEUE, 0):
            try:
                while True:
                    sock.recvmsg(2048, 512, queue)
            except BlockingIOError:
                pass
        for peer, t in due.items():
            if t <= now:
                sock.sendto(pkt, (peer, port))
                sock.sendto(pkt, (peer, port))
                due[peer] = t + random.uniform(0.5, 1.5) / rate
        time.sleep(max(0.02 - (time.monotonic() - now), 0.0))


def start(tree: str, n: int, vms: int, rate: float, seconds: float) -> list[subprocess.Popen]:
    """Variant ``n``'s coordinator and ``vms`` agents from ``tree`` (addresses 127.77.n.x,
    ports 47700 + 10 n .. so variants run side by side); for a floor (``tree`` a compiled
    ``agent_floor`` binary, or ``FLOOR``: ``floor_node``), ``vms`` floor nodes and an idle
    process in the coordinator's place."""
    env = dict(os.environ, PYTHONPATH=tree if os.path.isdir(tree) else str(REPO))
    ips = {f"vm{i + 1}": f"127.77.{n}.{i + 2}" for i in range(vms)}
    port = 47700 + 10 * n
    coord = f"127.77.{n}.1"
    if not os.path.isdir(tree):
        cmd = [sys.executable, __file__, "--floor-node"] if tree == FLOOR else [tree]
        tail = [] if tree == FLOOR else [C_FLOOR[os.path.basename(os.path.dirname(tree))]]
        return [subprocess.Popen(["sleep", str(seconds)])] + [
            subprocess.Popen([*cmd, ip, ",".join(q for q in ips.values() if q != ip),
                              str(port + 2), str(rate), str(seconds), *tail], env=env)
            for ip in ips.values()]
    base = [sys.executable, "-m", "agents", "--log-level", "WARNING"]
    procs = [subprocess.Popen([*base, "coordinator", "--bind", coord, "--port", str(port),
                               "--http-port", str(port + 1)], env=env, cwd=tree)]
    for vm, ip in ips.items():
        peers = ",".join(f"{p}={q}" for p, q in ips.items() if p != vm)
        procs.append(subprocess.Popen([*base, "agent", "--name", vm, "--bind", ip, "--peers",
                                       peers, "--coordinator", f"{coord}:{port}", "--port",
                                       str(port + 2), "--rate", str(rate)], env=env, cwd=tree))
    return procs


def run_time_s(pid: int) -> float:
    """CPU time of all of ``pid``'s threads so far, s (the scheduler's ns, schedstat)."""
    total = 0
    for stat in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(stat) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that just ended
            continue
    return total / 1e9


def measure(trees: list[str], vms: int, rate: float, warmup: float,
            seconds: float) -> list[dict]:
    """Run every tree's agents and coordinator at once; per tree, CPU shares over
    ``seconds`` after ``warmup``: ``{"agent": median over agents, "user": ..., "sys": ...,
    "coordinator": ...}``."""
    procs = [start(tree, n, vms, rate, warmup + seconds + 5) for n, tree in enumerate(trees)]
    try:
        time.sleep(warmup)
        ps = [[psutil.Process(p.pid) for p in group] for group in procs]

        def sample() -> list[list[tuple[float, float, float]]]:
            return [[(run_time_s(p.pid), *p.cpu_times()[:2]) for p in g] for g in ps]

        t0, c0 = time.monotonic(), sample()
        time.sleep(seconds)
        dt, c1 = time.monotonic() - t0, sample()
    finally:
        for p in (p for g in procs for p in g):
            p.send_signal(signal.SIGTERM)
        for p in (p for g in procs for p in g):
            p.wait(timeout=10)
    out = []
    for a, b in zip(c0, c1, strict=True):
        total = [(y[0] - x[0]) / dt for x, y in zip(a, b, strict=True)]
        ticks = [(y[1] - x[1], y[2] - x[2]) for x, y in zip(a, b, strict=True)]
        user = [t * u / (u + s) if u + s else 0.0 for t, (u, s) in zip(total, ticks, strict=True)]
        out.append({"agent": statistics.median(total[1:]), "user": statistics.median(user[1:]),
                    "sys": statistics.median(t - u for t, u in zip(total[1:], user[1:],
                                                                   strict=True)),
                    "coordinator": total[0]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--before", default=None, help="git ref of the agent to compare with")
    ap.add_argument("--vms", type=int, default=8, help="agents (each probes all others)")
    ap.add_argument("--rate", type=float, default=20.0, help="pairs/s per peer")
    ap.add_argument("--warmup", type=float, default=15.0,
                    help="s before measuring (an agent's start-up, its imports, takes several "
                         "seconds of CPU on a loaded 2-core machine: not counted)")
    ap.add_argument("--seconds", type=float, default=20.0, help="s measured per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--floor-node", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor_node:
        me, peers, port, rate, seconds = args.floor_node
        floor_node(me, peers.split(","), int(port), float(rate), float(seconds))
        return
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": str(REPO), FLOOR: FLOOR, **compile_floor(tmp)}
        if args.before:
            trees = {f"before ({args.before})": checkout(args.before, tmp), **trees}
        runs: dict[str, list[dict]] = {k: [] for k in trees}
        for _ in range(args.rounds):
            for name, res in zip(trees, measure(list(trees.values()), args.vms, args.rate,
                                                args.warmup, args.seconds), strict=True):
                runs[name].append(res)
    print(f"{args.vms} agents x {args.vms - 1} peers x {args.rate:g} pairs/s, "
          f"{args.rounds} rounds of {args.seconds:g} s (share of one core, median)")
    print(f"{'variant':24s} {'user':>7s} {'sys':>7s} {'agent':>7s} {'coord':>7s}")
    med = {}
    for name, rs in runs.items():
        m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        med[name] = m
        print(f"{name:24s} {m['user']:7.4f} {m['sys']:7.4f} {m['agent']:7.4f} "
              f"{m['coordinator']:7.4f}")
    total = {k: m["agent"] for k, m in med.items()}
    if args.before:
        print(f"ratio this/before: {total['this tree'] / total[f'before ({args.before})']:.2f}")
    for name in (FLOOR, *C_FLOOR):
        if name in total:
            print(f"{name} / this tree: {total[name] / total['this tree']:.2f}")


if __name__ == "__main__":
    main()
