"""A job's edge while it runs: the pacers in its VMs (``python -m agents pacer``, ``sense`` or
``pace``), and what they sensed.

The pacers' last reports (sent when they stop) give the job's TCP retransmissions and RTOs
(the VMs' counters over the pacers' lifetime) and the OWD p99 toward the job's other VMs.
(A job's congestion control is its own: ``JobConfig.cc``, set on its sockets.)
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contracts.messages import CoordinatorState, PacerReport
from lab.errors import LabError
from lab.wait import wait_until
from session.daemons import AgentMesh, PacerSpec

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab

REPORT_WAIT_S = 15.0
"""How long to wait for the pacers' first and last reports, s (a pacer reports every second;
its start, Python importing numpy, pydantic and pyroute2, took over 5 s on a loaded machine)."""


@dataclass
class Sensed:
    """What the job's pacers sensed over the job: TCP segments retransmitted and RTOs in its
    VMs, the largest OWD p99 (us) from one of its VMs toward another, the pacers' own probes
    between its VMs that were lost (part of a queue's drops; None without pacers or reports),
    and their last reports (VM -> ``PacerReport``)."""

    retransmits: int | None = None
    rtos: int | None = None
    owd_p99_us: float | None = None
    probes_lost: int | None = None
    reports: dict[str, PacerReport] = field(default_factory=dict)


def _reports(mesh: AgentMesh, vms: list[str], seen: dict[str, int],
             after: dict[str, int] | None = None) -> CoordinatorState | None:
    """The coordinator's state once every VM of ``vms`` has a pacer report other than the one
    in ``seen`` (by t_ns) and later than ``after`` (``AgentMesh.start_pacers``' return: a
    stopped pacer's last report reaching the coordinator late is not the new one's), or the
    last state after ``REPORT_WAIT_S``."""
    after = after or {}
    last = [None]

    def fresh() -> bool:
        st = last[0] = mesh.state()
        return st is not None and all(v in st.pacers and st.pacers[v].t_ns != seen.get(v)
                                      and st.pacers[v].t_ns > after.get(v, -1) for v in vms)

    wait_until(fresh, REPORT_WAIT_S, 0.2)
    return last[0]


def wait_synced(mesh: AgentMesh, vms: list[str], timeout_s: float,
                started: dict[str, int] | None = None) -> CoordinatorState:
    """Wait until the pacers of ``vms`` report ``synced`` (their gate can act: a pacer's
    start, Python importing numpy, pydantic and pyroute2, took over 5 s on a loaded machine,
    and its gate stays open until the clock sync has converged), in reports later than
    ``started`` (``AgentMesh.start_pacers``' return; without it the last report of a pacer
    stopped before passes too); the coordinator's state then.

    Raises:
        LabError: not within ``timeout_s`` (the pacers' states are named).
    """
    last = [None]

    def synced() -> bool:
        st = last[0] = mesh.state()
        return st is not None and all(v in st.pacers and st.pacers[v].synced
                                      and st.pacers[v].t_ns > (started or {}).get(v, 0)
                                      for v in vms)

    if wait_until(synced, timeout_s, 0.5):
        return last[0]
    st = last[0]
    states = {v: st.pacers[v].status if st and v in st.pacers else "no report" for v in vms}
    raise LabError(f"pacers not synchronized within {timeout_s:.0f} s: {states}")


def _seen(st: CoordinatorState | None) -> dict[str, int]:
    return {k: r.t_ns for k, r in st.pacers.items()} if st is not None else {}


def sensed(st: CoordinatorState | None, vms: list[str]) -> Sensed:
    """The job VMs' pacer counters summed and the largest OWD p99 toward another job VM,
    from the coordinator state ``st`` (None: nothing sensed)."""
    reps = [st.pacers[v] for v in vms if st is not None and v in st.pacers]
    if not reps:
        return Sensed()
    owd = [d.owd_us_p99 for r in reps for k, d in r.dests.items()
           if k in vms and d.owd_us_p99 is not None]
    lost = sum(d.probes_lost for r in reps for k, d in r.dests.items() if k in vms)
    return Sensed(retransmits=sum(r.net.retrans_segs for r in reps),
                  rtos=sum(r.net.timeouts for r in reps), owd_p99_us=max(owd, default=None),
                  probes_lost=lost,
                  reports={v: st.pacers[v] for v in vms if v in st.pacers})


@contextmanager
def job_edge(lab: Lab, mesh: AgentMesh | None, vms: list[str], pacer: str,
             spec: PacerSpec) -> Iterator[Sensed]:
    """Run the body with ``pacer`` (``off``, ``sense`` or ``pace``) in ``vms``; the yielded
    ``Sensed`` is filled when the body ends (empty with ``off``).

    Raises:
        LabError: pacers without agents (``mesh`` None), or pacers that did not report
            within ``REPORT_WAIT_S``.
    """
    if pacer != "off" and mesh is None:
        raise LabError("a job's pacer needs the agents (agents.enabled): it gates on their "
                       "synchronized clocks")
    out = Sensed()
    if pacer == "off":
        yield out
        return
    seen = _seen(mesh.state())
    started = mesh.start_pacers([lab[v] for v in vms], pacer, spec)
    st = _reports(mesh, vms, seen, started)
    missing = [v for v in vms if st is None or v not in st.pacers
               or st.pacers[v].t_ns == seen.get(v) or st.pacers[v].t_ns <= started.get(v, -1)]
    if missing:
        mesh.stop_pacers()
        raise LabError(f"the pacers of {', '.join(missing)} did not report within "
                       f"{REPORT_WAIT_S:.0f} s; see their logs in {mesh.logdir}")
    try:
        yield out
    finally:
        seen = _seen(mesh.state())
        mesh.stop_pacers()
        vars(out).update(vars(sensed(_reports(mesh, vms, seen), vms)))
