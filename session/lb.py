"""The load-balancer comparison (a scenario's ``lb`` section; built-in ``lb_compare``).

One lab, a leaf-spine; for every oversubscription level (leaf-spine rates set so that a
leaf's uplinks carry 1/oversubscription of its VMs' rate), every collective (AllToAll,
halving-doubling AllReduce, ring AllReduce on all VMs, rank order = VM order) and every case
(``symmetric``; ``link_down``: one leaf-spine link taken down mid-job, brought back after;
``degraded``: that link at a fraction of its rate for the whole job), each balancer runs the
same job in turn:

========= =============== ==========================================================
mode      fabric mode     hosts
========= =============== ==========================================================
ecmp      ecmp            none (per-flow hash of each connection)
spray     spray           none (the leaves spray every packet)
reps      entropy         REPS per frame over DSCP-pinned connections
ethereal  entropy         Ethereal per collective step over DSCP-pinned connections
========= =============== ==========================================================

Every mode opens the same ``conns_per_peer`` connections per peer (the balancers need one per
path; the fabric-only modes get as many flows to hash or spray). Per run: completion (the
job's, VM clocks), imbalance = max / mean of the bytes on the leaf-spine links that stayed up
(both directions, the lab's interface counters; 1.0 is perfect), the ranks' TCP
retransmissions, RTOs and reordering (reordering events the senders detected, ``TCP_INFO``
reord_seen: not the holes losses leave), and
whether the job finished (every rank verified). "Mid-job" is read from the lab's counters: the
link goes down once the leaf-spine links have carried ``down_at`` of the bytes the same mode's
symmetric run carried (at the first bytes when the section has no symmetric case), whatever
the ranks' start-up took. With the link down, the imbalance leaves out every link of its
spine (in a two-leaf fabric that spine then carries nothing between the leaves).

Source of the comparison: Ethereal (Khani et al., arXiv 2407.00550) reports up to 30 % lower
completion than packet spraying and 40 % lower than REPS in Astra-Sim, under link failures
too, and ring AllReduce the same for every balancer.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from contracts.events import LinkDown, LinkUp, Rate
from lab.errors import LabError
from lab.observe import link_states
from session import jobs, stats
from workloads.config import JobConfig

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab
    from session.scenario import LbSpec

MODES = {"ecmp": ("ecmp", "none"), "spray": ("spray", "none"), "reps": ("entropy", "reps"),
         "ethereal": ("entropy", "ethereal")}
"""Balancer -> (fabric mode, host-side balancer of the job)."""
COLLECTIVES = {"all_to_all": {"collective": "all_to_all"},
               "halving_doubling": {"collective": "all_reduce", "algo": "halving_doubling"},
               "ring": {"collective": "all_reduce", "algo": "ring"}}
"""The section's collective names -> the job's fields."""
PAPER = {"ethereal_vs_spray": 0.70, "ethereal_vs_reps": 0.60}
"""Ethereal's completion as a fraction of spraying's and REPS's, at best (the paper)."""


def fabric_modes(spec: LbSpec) -> set[str]:
    """The fabric modes the section's balancers need (checked before bring-up)."""
    return {MODES[m][0] for m in spec.modes}


def _uplinks(lab: Lab) -> list:
    role = {n: lab.topo.nodeInfo(n).get("role") for n in lab.topo.nodes()}
    return [s for s in link_states(lab) if role[s.a] == "leaf" and role[s.b] == "spine"]


def spine_links(lab: Lab) -> list[tuple[str, str]]:
    """The leaf-spine links (leaf, spine), in topology order."""
    return [(s.a, s.b) for s in _uplinks(lab)]


def spine_bytes(lab: Lab) -> dict[str, int]:
    """Bytes each leaf-spine link carried since bring-up, both directions, by ``leaf-spine``."""
    return {f"{s.a}-{s.b}": sum(s.tx_bytes) for s in _uplinks(lab)}


def per_spine(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Bytes each spine carried (its leaf-spine links summed) between two ``spine_bytes``
    readings."""
    out: dict[str, int] = {}
    for link, n in after.items():
        spine = link.split("-", 1)[1]
        out[spine] = out.get(spine, 0) + n - before.get(link, 0)
    return out


def leaf_bytes(lab: Lab, leaf: str, spines: list[str]) -> int:
    """Bytes ``leaf`` sent plus received on its links to ``spines`` since bring-up, from
    ``/proc/PID/net/dev`` of a process in its namespace (man 5 proc): a file read, from any
    thread, cheap enough to poll while a job runs (a netlink dump on the lab thread took up
    to 0.9 s on a loaded machine, where a job's bytes moved in 0.2 s).

    Raises:
        OSError: the leaf's shell is gone (the lab was torn down)."""
    node = lab[leaf]
    names = set()
    for spine in spines:
        a, b = lab.faults.ends(leaf, spine)
        names.add((a if a.node.name == leaf else b).name)
    total = 0
    with open(f"/proc/{node.pid}/net/dev") as f:
        for line in f.readlines()[2:]:  # two header lines, then "name: rx_bytes ... tx_bytes"
            name, counters = line.split(":", 1)
            if name.strip() in names:
                fields = counters.split()
                total += int(fields[0]) + int(fields[8])
    return total


def imbalance(delta: dict[str, int], leave_out: set[str] = frozenset()) -> float | None:
    """max / mean of ``delta`` over the links not in ``leave_out``; None when they carried
    nothing."""
    vals = [v for k, v in delta.items() if k not in leave_out]
    mean = sum(vals) / len(vals) if vals else 0
    return round(max(vals) / mean, 3) if mean else None


def uplink_rate(spec: LbSpec, topo_spec, oversubscription: float) -> float:
    """Leaf-spine rate, Mbit/s, for ``oversubscription`` (1: a leaf's uplinks carry its VMs'
    whole rate)."""
    return topo_spec.host_bw * topo_spec.vms_per_leaf / topo_spec.spines / oversubscription


def job_config(spec: LbSpec, mode: str, collective: str) -> JobConfig:
    """The job one run of the section starts (collective ``trace``: the section's trace).

    Raises:
        ValueError: the section's trace does not load.
    """
    what = ({"trace": spec.trace, "trace_compute_scale": spec.trace_compute_scale,
             "trace_bytes_scale": spec.trace_bytes_scale} if collective == "trace" else
            {**COLLECTIVES[collective], "bytes": spec.bytes})
    return JobConfig(**what, iterations=spec.iterations, warmup=1,
                     conns_per_peer=spec.conns_per_peer, balancer=MODES[mode][1],
                     timeout_s=spec.timeout_s)


def balancer_events(workers: list[dict | None]) -> dict[str, int]:
    """The ranks' balancer counters summed (``workloads.lb.balancer`` stats: failed_marks,
    moves, path_changes, freezes, clean_acks, marked_acks; none for ecmp and spray)."""
    out: dict[str, int] = {}
    for d in workers:
        for k, v in ((d or {}).get("lb") or {}).items():
            if isinstance(v, int):
                out[k] = out.get(k, 0) + v
    return out


class Runner:
    """Runs the section on a started lab.

    Args:
        lab: the running lab.
        spec: the ``lb`` section; topo_spec: the scenario's ``topology``.
        vms: the job's VMs, rank order.
        call: runs a function on the lab's thread (``Session.call``): every kernel operation
            (fabric mode, faults, counters) goes through it.
        progress: short messages.
        rounds: the repetitions of a list of modes (``Session.rounds``): (round, the modes in
            that round's order); one round, in order, by default.
        saturated: whether the fidelity check flagged a run (start, end ns).

    ``samples`` and ``saturated_runs``: per (oversubscription, collective, case, mode) every
    round's completion (None when it did not finish) and fidelity flag.
    """

    def __init__(self, lab: Lab, spec: LbSpec, topo_spec, vms: list[str],
                 call: Callable, progress: Callable[[str], None],
                 rounds: Callable = lambda modes: [(0, modes)],
                 saturated: Callable[[int, int], bool | None] = lambda a, b: None):
        self.lab, self.spec, self.topo_spec, self.vms = lab, spec, topo_spec, vms
        self.call, self.progress, self.rounds, self.saturated = call, progress, rounds, saturated
        self.link = tuple(spec.link)
        self.before: dict[str, int] = {}
        self.samples: dict[tuple, list[float | None]] = {}
        self.saturated_runs: dict[tuple, list[bool]] = {}

    def fault(self, fault) -> None:
        self.call(self.lab.inject, fault, "lab")

    def run(self, runs: list[dict]) -> dict:
        """Every run of the section (the first round's appended to ``runs`` as each ends, a
        live view; later rounds' only in ``samples``); the section: {"runs", "ratios",
        "paper"}."""
        spec = self.spec
        links = self.call(spine_links, self.lab)
        for over in spec.oversubscription:
            rate = uplink_rate(spec, self.topo_spec, over)
            for a, b in links:
                self.fault(Rate(link=(a, b), mbit=rate))
            for collective in spec.collectives:
                symmetric: dict[str, dict] = {}
                for case in spec.cases:
                    for r, order in self.rounds(list(spec.modes)):
                        for mode in order:
                            t0 = time.time_ns()
                            entry = self.one(mode, collective, case, over, rate,
                                             symmetric.get(mode))
                            key = (over, collective, case, mode)
                            self.samples.setdefault(key, []).append(
                                entry["completion_s"] if entry["finished"] else None)
                            self.saturated_runs.setdefault(key, []).append(
                                bool(self.saturated(t0, time.time_ns())))
                            if r == 0:
                                if case == "symmetric":
                                    symmetric[mode] = entry
                                runs.append(entry)
        return {"runs": runs, "ratios": ratios(runs), "paper": PAPER}

    def one(self, mode: str, collective: str, case: str, over: float, rate: float,
            symmetric: dict | None) -> dict:
        """One run: set the fabric mode, the case's fault, run the job, restore the link."""
        entry = {"mode": mode, "collective": collective, "case": case,
                 "oversubscription": over, "completion_s": None, "imbalance": None,
                 "retransmits": None, "rtos": None, "reordering": None, "finished": False,
                 "fault_at_s": None, "link_bytes": {}, "link_bytes_at_fault": {},
                 "balancer_events": {}, "error": None}
        name = f"lb_{mode}_{collective}_{case}"
        self.progress(f"lb {case} 1:{over:g} {collective} {mode}")
        try:
            if self.lab.fabric != MODES[mode][0]:
                self.call(self.lab.set_fabric, MODES[mode][0])
            if case == "degraded":
                self.fault(Rate(link=self.link, mbit=rate * self.spec.degraded_fraction))
            before = self.before = self.call(spine_bytes, self.lab)
            t0 = time.monotonic()
            with jobs.launch(self.lab, name, job_config(self.spec, mode, collective),
                             self.vms) as job:
                if case == "link_down" and (down := self.take_down(job, symmetric, t0)):
                    entry["fault_at_s"] = down[0]
                    entry["link_bytes_at_fault"] = {k: v - before[k] for k, v in down[1].items()}
                got = jobs.finish(self.lab, job)
                summary = job.wait()
            after = self.call(spine_bytes, self.lab)
            delta = {k: after[k] - before[k] for k in after}
            tcp = summary["tcp"]
            spine = self.link[1]
            entry.update(completion_s=got["completion_s"], finished=bool(got["verified"]),
                         error=got["error"], retransmits=tcp["retransmits"], rtos=tcp["rtos"],
                         reordering=tcp["reordering"], link_bytes=delta,
                         balancer_events=balancer_events(summary["workers"]),
                         imbalance=imbalance(delta, {k for k in delta if k.endswith(f"-{spine}")}
                                             if case == "link_down" else set()))
        except (LabError, OSError, ValueError) as e:  # the comparison goes on; the run says why
            entry["error"] = str(e)
        finally:
            self.restore(case, rate)
        self.progress(f"lb {case} 1:{over:g} {collective} {mode}: completion "
                      f"{entry['completion_s']} s, imbalance {entry['imbalance']}, retransmits "
                      f"{entry['retransmits']}, finished {entry['finished']}")
        return entry

    def take_down(self, job, symmetric: dict | None,
                  t0: float) -> tuple[float, dict[str, int]] | None:
        """Take the link down once its leaf's uplinks moved ``down_at`` of the bytes they
        moved in the mode's symmetric run (module docstring); (s after the job's launch,
        ``spine_bytes`` once the link is down and the routes around it), or None when the job
        ended first."""
        leaf = self.link[0]
        spines = [k.split("-")[1] for k in self.before if k.startswith(f"{leaf}-")]
        total = sum(v for k, v in (symmetric or {}).get("link_bytes", {}).items()
                    if k.startswith(f"{leaf}-"))
        goal = max(1, total * self.spec.down_at)
        start = leaf_bytes(self.lab, leaf, spines)
        while job.running():
            if leaf_bytes(self.lab, leaf, spines) - start >= goal:
                self.fault(LinkDown(link=self.link))
                return round(time.monotonic() - t0, 3), self.call(spine_bytes, self.lab)
            time.sleep(0.01)
        return None

    def restore(self, case: str, rate: float) -> None:
        if case == "link_down" and frozenset(self.link) in self.lab.down_links:
            self.fault(LinkUp(link=self.link))
        elif case == "degraded":
            self.fault(Rate(link=self.link, mbit=rate))


def ratios(runs: list[dict]) -> list[dict]:
    """Per (oversubscription, collective, case): every mode's completion as a fraction of
    ECMP's in the same conditions (null where either did not finish)."""
    groups: dict[tuple, dict[str, float | None]] = {}
    for r in runs:
        key = (r["oversubscription"], r["collective"], r["case"])
        groups.setdefault(key, {})[r["mode"]] = r["completion_s"] if r["finished"] else None
    out = []
    for (over, collective, case), times in groups.items():
        base = times.get("ecmp")
        out.append({"oversubscription": over, "collective": collective, "case": case,
                    "ecmp_s": base,
                    "to_ecmp": {m: round(t / base, 3) if t and base else None
                                for m, t in times.items()}})
    return out


def comparisons(samples: dict[tuple, list[float | None]],
                saturated: dict[tuple, list[bool]]) -> list[dict]:
    """Every mode against ECMP in the same conditions, on completion over the rounds; the arm
    named ``mode collective case 1:oversubscription``."""
    out = []
    for (over, collective, case, mode), got in samples.items():
        base = samples.get((over, collective, case, "ecmp"))
        if mode == "ecmp" or base is None:
            continue
        where = f"{collective} {case} 1:{over:g}"
        arm, ecmp = f"{mode} {where}", f"ecmp {where}"
        out.append(stats.comparison(
            "lb", arm, ecmp, "completion_s", {arm: got, ecmp: base},
            {arm: saturated[(over, collective, case, mode)],
             ecmp: saturated[(over, collective, case, "ecmp")]}))
    return out
