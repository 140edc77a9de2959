"""An incast round in a running lab: every sender sends the same bytes over TCP to one receiver
at once (``workloads.bulk``: a sender is done when the receiver has its bytes), with the
queue drops it caused on every link (the lab's tc counters: the truth). Used by the pacer's
benchmark (benchmarks/pacer.py); ``drops`` also by the two-step story (session/two_step.py)."""
from __future__ import annotations

import sys
import time

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
        (completion s, from the senders' start until every sender is done; queue drops per
        link during the round, links without drops left out).

    Raises:
        AssertionError: a sender failed.
    """
    bulk = [sys.executable, "-m", "workloads.bulk"]
    srv = [rx.popen(bulk + ["recv", str(BASE_PORT + i)]) for i in range(len(senders))]
    d0, t0 = drops(lab), time.monotonic()
    cl = [s.popen(bulk + ["send", rx.IP(), str(BASE_PORT + i), str(nbytes)]
                  + (["--cc", cc] if cc else []))
          for i, s in enumerate(senders)]
    codes = [c.wait(timeout=timeout_s) for c in cl]
    t = time.monotonic() - t0
    for s in srv:
        s.wait(timeout=10)
    assert codes == [0] * len(cl), f"a sender failed: exit codes {codes}"
    d1 = drops(lab)
    return t, {k: d1[k] - d0[k] for k in d1 if d1[k] > d0[k]}
