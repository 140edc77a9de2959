"""An incast round in a running lab: every sender sends the same bytes over TCP to one receiver
at once (``workloads.bulk``: a sender is done when the receiver has its bytes; every receiver
listens and every sender has started before all senders are told to go, and connect, together),
with the
queue drops it caused on every link (the lab's tc counters: the truth). Used by the pacer's
benchmark (benchmarks/pacer.py); ``drops`` also by the two-step story (session/two_step.py)."""
from __future__ import annotations

import select
import subprocess
import sys
import time

from lab.errors import LabError
from lab.observe import link_states

__all__ = ["drops", "incast"]

BASE_PORT = 5201


def drops(lab) -> dict[str, int]:
    """Queue drops so far per link ("a-b"), both ends."""
    return {f"{ln.a}-{ln.b}": ln.drops for ln in link_states(lab)}


def incast(lab, senders: list, rx, nbytes: int, cc: str | None = None,
           timeout_s: float = 120.0) -> tuple[float, dict[str, int]]:
    """One round: ``nbytes`` from each of ``senders`` to ``rx`` (lab VMs), TCP with congestion
    control ``cc`` (None: the VMs' default).

    Returns:
        (completion s, from the go (every process started) until every sender is done;
        queue drops per link during the round, links without drops left out).

    Raises:
        LabError: a sender failed, or the round outlasted ``timeout_s`` (its processes are
            ended either way).
    """
    bulk = [sys.executable, "-m", "workloads.bulk"]
    procs = [rx.popen(bulk + ["recv", str(BASE_PORT + i), "--ready"], text=True)
             for i in range(len(senders))]
    srv = list(procs)
    try:
        deadline = time.monotonic() + timeout_s
        cl = [s.popen(bulk + ["send", rx.IP(), str(BASE_PORT + i), str(nbytes), "--ready"]
                      + (["--cc", cc] if cc else []), stdin=subprocess.PIPE, text=True)
              for i, s in enumerate(senders)]
        procs += cl
        for c in procs:  # their Python start (seconds apart under load) is not the round's
            up = select.select([c.stdout], [], [], max(deadline - time.monotonic(), 0))[0]
            if not up:
                raise LabError(f"an incast process did not start within {timeout_s:.0f} s")
            if c.stdout.readline().strip() != "ready":
                raise LabError(f"an incast process did not start: exit code {c.wait()}")
        d0, t0 = drops(lab), time.monotonic()
        try:
            for c in cl:
                c.stdin.write("go\n")
                c.stdin.flush()
        except OSError as e:
            raise LabError(f"an incast sender exited before the go: {e}") from None
        try:
            codes = [c.wait(timeout=max(deadline - time.monotonic(), 0)) for c in cl]
            t = time.monotonic() - t0
            for s in srv:
                s.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise LabError(f"the incast round outlasted {timeout_s:.0f} s") from None
        if codes != [0] * len(cl):
            raise LabError(f"a sender failed: exit codes {codes}")
        d1 = drops(lab)
        return t, {k: d1[k] - d0[k] for k in d1 if d1[k] > d0[k]}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            for pipe in (p.stdin, p.stdout):
                if pipe is not None:
                    pipe.close()
