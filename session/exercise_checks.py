"""The check kinds of teaching exercises (``session.exercise``): for each kind, what the seed
hides in the exercise's lab (``draw``), what the student is shown (``observe``), the answer's
format (``Answer``, a pydantic model: its errors are worded as a scenario's) and the check
against the truth (``check``: a ``Verdict`` of what was right and what was not).

A kind works on plain data: the scenario as a dict (``Scenario.model_dump(mode="json")``),
its Mininet ``Topo`` (VM -> ``leaf`` and ``phys`` in ``nodeInfo``) and the exercise's record
(``truth``: what ``draw`` chose; ``results``: the ``nslab.results/1`` document of the run;
``check_results``: the document of the lab a check ran itself, for ``pacer``). Checks are pure
functions of the record, so they are unit-tested on recorded or synthetic truth.

Kinds (``KINDS``): ``colocated`` (which VMs share a physical host, from the agents' clock
estimates), ``congested`` (which link direction holds a standing queue, from the OWD matrix),
``slowdown`` (a job slowed by a noisy neighbour or by its link), ``ecmp`` (balance flows over
the spines with entropy values), ``pacer`` (pacer settings that cut an incast's drops,
measured against the unpaced run in the same check).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

from mininet.topo import Topo
from pydantic import BaseModel, ConfigDict, Field

from agents.owd import natural_key
from contracts.results.lab import Fidelity, fidelity_line
from session.daemons import PacerSpec
from session.scoring import truth_groups


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass
class Verdict:
    """What was right and what was not: ``items`` of (right, what), in order; ``passed`` when
    there is at least one item and every one is right. ``fidelity``: the fidelity section of
    the check's own lab (kinds that run one: ``pacer``; ``contracts.results.lab.Fidelity`` as a
    dict), None otherwise."""

    items: list[tuple[bool, str]] = field(default_factory=list)
    fidelity: dict | None = None

    def add(self, right: bool, what: str) -> bool:
        self.items.append((right, what))
        return right

    @property
    def passed(self) -> bool:
        return bool(self.items) and all(ok for ok, _ in self.items)

    def text(self) -> str:
        """One line per item (``right:``/``wrong:``), then the verdict."""
        lines = [f"  {'right' if ok else 'wrong'}: {what}" for ok, what in self.items]
        n = sum(ok for ok, _ in self.items)
        lines.append(f"{'PASSED' if self.passed else 'NOT YET'}: {n} of {len(self.items)} "
                     "right")
        if self.fidelity is not None:
            lines.append("the check's lab " + fidelity_line(Fidelity.model_validate(
                self.fidelity)))
        return "\n".join(lines)


@dataclass
class Live:
    """The lab's counters at the end of an exercise's run: ``links``
    (``lab.observe.LinkState``) and ``vms`` (``lab.observe.VmState``: CPU time per VM)."""

    links: list = field(default_factory=list)
    vms: list = field(default_factory=list)


class NoParams(_Strict):
    """This kind takes no parameters."""


class Kind:
    """A check kind. ``Answer`` validates the student's answer file; ``Params`` the
    exercise's ``params`` section."""

    Answer: type[BaseModel]
    Params: type[BaseModel] = NoParams

    def draw(self, rng: random.Random, sc: dict, topo: Topo, params) -> dict:
        """Hide the truth in the scenario ``sc`` (changed in place), drawn with ``rng``; the
        truth (JSON)."""
        return {}

    def observe(self, doc: dict, agents, live: Live, truth: dict) -> dict:
        """What the student is shown after the run (JSON): from the results document
        ``doc``, the coordinator's last state ``agents`` (``CoordinatorState`` or None), the
        lab's counters at the end (``live``) and the drawn ``truth`` (to know where to look,
        never to tell)."""
        return {}

    def check_scenario(self, answer, record: dict, params) -> dict | None:
        """A scenario (dict) the check must run first (its results go to the record's
        ``check_results``); None: the check needs no lab."""
        return None

    def check(self, answer, record: dict, params) -> Verdict:
        raise NotImplementedError


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def vms_of(topo: Topo) -> list[str]:
    """The topology's VMs in natural order."""
    return sorted(topo.hosts(), key=natural_key)


def settled_window(agents):
    """The coordinator's last settled window (``HistoryEntry``) in its state ``agents``:
    the ``drift_windows // 2 + 1``-th newest, whose drift is no longer provisional (the
    newer windows' are one-sided, hence noisier); None without state or so many windows."""
    settled = agents.drift_windows // 2 + 1 if agents is not None else 0
    if agents is None or len(agents.history) < settled:
        return None
    return agents.history[-settled]


# -- colocated -----------------------------------------------------------------------------
class GroupsAnswer(_Strict):
    groups: list[list[str]] = Field(description="the VMs of each physical host that holds "
                                    "more than one; VMs alone on their host are left out",
                                    examples=[[["vm1", "vm3"], ["vm2", "vm4"]]])


class Colocated(Kind):
    """Which VMs share a physical host. The seed shuffles VMs onto hosts within each leaf
    (placement strategy ``random``: the lab's own placer); the student sees the agents' clock
    estimates (offset and drift against the reference VM) and groups VMs whose clocks run at
    one rate (one oscillator). The truth is the lab's (``truth.placements``)."""

    Answer = GroupsAnswer

    def draw(self, rng, sc, topo, params):
        sc["placement"].update(strategy="random", map=None)
        return {}

    def observe(self, doc, agents, live, truth):
        """The estimates of the last settled window (``settled_window``)."""
        window = settled_window(agents)
        if window is None:
            return {"error": "the agents settled no window"}
        return {"reference": agents.reference,
                "clocks": {vm: {"offset_us": round(est.offset_ns / 1e3, 1),
                                "drift_ppm": round(est.drift_ppm, 3)}
                           for vm, est in sorted(window.vms.items(),
                                                 key=lambda kv: natural_key(kv[0]))
                           if est.offset_ns is not None and est.drift_ppm is not None}}

    def check(self, answer, record, params):
        placements = record["results"]["truth"]["placements"]
        truth = {frozenset(g) for g in truth_groups(placements) if len(g) > 1}
        given = [frozenset(g) for g in answer.groups]
        v = Verdict()
        unknown = sorted({vm for g in given for vm in g} - set(placements), key=natural_key)
        if unknown:
            v.add(False, f"no such VM: {' '.join(unknown)}")
        seen: set[str] = set()
        for g in given:
            names = " ".join(sorted(g, key=natural_key))
            if g & seen:
                v.add(False, f"{names}: a VM is in two groups")
            elif g in truth:
                v.add(True, f"{names} share a physical host")
            else:
                v.add(False, f"{names} are not the VMs of one physical host")
            seen |= g
        missing = len(truth - set(given))
        v.add(not missing, f"{len(truth) - missing} of the {len(truth)} shared hosts found")
        return v


# -- congested -----------------------------------------------------------------------------
class LinkAnswer(_Strict):
    link: str = Field(pattern=r"^[A-Za-z0-9_]+->[A-Za-z0-9_]+$",
                      description="the congested direction of a link, sender->receiver",
                      examples=["leaf1->vm3"])


class CongestedParams(_Strict):
    rate_mbit: float = Field(20, gt=0, description="the congested link's rate, Mbit/s")
    load_mbit: float = Field(40, gt=0, description="UDP load through it, Mbit/s")
    from_s: float = Field(6, ge=0, description="first burst, s after bring-up")
    on_s: float = Field(2, gt=0, description="burst length, s")
    off_s: float = Field(1, gt=0, description="pause between bursts, s: the queue drains, "
                         "so the clocks' lower envelopes stay clean")


class Congested(Kind):
    """Which link direction holds a standing queue. The seed picks a VM, the direction (its
    uplink or downlink) and a peer on another leaf; the VM's link gets a lower rate and
    bursts of UDP cross it in that direction. The student sees the OWD matrix (p50 and p99
    of every ordered pair) and names the direction ``sender->receiver``."""

    Answer = LinkAnswer
    Params = CongestedParams

    def draw(self, rng, sc, topo, p):
        vms = vms_of(topo)
        vm = rng.choice(vms)
        leaf = topo.nodeInfo(vm)["leaf"]
        peer = rng.choice([x for x in vms if topo.nodeInfo(x)["leaf"] != leaf])
        up = rng.random() < 0.5
        src, dst = (vm, peer) if up else (peer, vm)
        sc["faults"].append({"at_s": 0, "kind": "rate", "link": [vm, leaf],
                             "mbit": p.rate_mbit})
        t, k = p.from_s, 0
        while t + p.on_s <= sc["duration_s"]:
            sc["load"].append({"src": src, "dst": dst, "at_s": t, "duration_s": p.on_s,
                               "udp": True, "bw": p.load_mbit, "port": 5301 + k})
            t, k = t + p.on_s + p.off_s, k + 1
        return {"link": f"{vm}->{leaf}" if up else f"{leaf}->{vm}"}

    def observe(self, doc, agents, live, truth):
        owd = (doc.get("owd_us") or {}).get("pairs") or {}
        return {"owd_us": {pair: {q: _round(s.get(f"{q}_us")) for q in ("p50", "p99")}
                           for pair, s in sorted(owd.items(), key=lambda kv: natural_key(
                               kv[0]))}}

    def check(self, answer, record, params):
        ta, tb = record["truth"]["link"].split("->")
        a, b = answer.link.split("->")
        v = Verdict()
        if v.add({a, b} == {ta, tb}, f"{a}-{b} is {'' if {a, b} == {ta, tb} else 'not '}"
                                     "the congested link"):
            v.add((a, b) == (ta, tb), f"{a}->{b} is {'' if (a, b) == (ta, tb) else 'not '}"
                                      "the direction that queues")
        return v


# -- slowdown ------------------------------------------------------------------------------
class CauseAnswer(_Strict):
    cause: Literal["noisy_neighbour", "link"] = Field(
        description="noisy_neighbour: a VM on the same physical host takes the CPU; link: "
        "a link of the job is slower", examples=["link"])


class SlowdownParams(_Strict):
    job: str = Field("slow", description="the scenario's job that is slowed down")
    rate_mbit: float = Field(5, gt=0, description="the slowed link's rate, Mbit/s")


class Slowdown(Kind):
    """Why one of two identical jobs is slower. The seed picks one VM of the slow job and
    the cause: a CPU hog in the VM sharing its physical host (a noisy neighbour), or its
    link's rate cut. The student sees both jobs' iteration, collective and compute times and
    every VM's CPU time over the run (a straggler's compute shows as its peer's wait in the
    collective, so the times alone do not tell the causes apart)."""

    Answer = CauseAnswer
    Params = SlowdownParams

    def draw(self, rng, sc, topo, p):
        job = next(j for j in sc["jobs"] if j["name"] == p.job)
        vm = rng.choice(job["placement"])
        info = topo.nodeInfo(vm)
        if rng.random() < 0.5:
            neighbour = next(x for x in vms_of(topo)
                             if x != vm and topo.nodeInfo(x)["phys"] == info["phys"])
            sc["faults"].append({"at_s": 0, "kind": "cpu_hog", "vm": neighbour,
                                 "enable": True})
            return {"cause": "noisy_neighbour", "vm": vm, "hog": neighbour}
        sc["faults"].append({"at_s": 0, "kind": "rate", "link": [vm, info["leaf"]],
                             "mbit": p.rate_mbit})
        return {"cause": "link", "vm": vm}

    def observe(self, doc, agents, live, truth):
        out = {}
        for job in doc.get("jobs") or []:
            it, comm = job.get("iteration_s") or {}, job.get("comm_s") or {}
            out[job["name"]] = {
                "vms": (job.get("placement") or {}).get("vms"),
                "iteration_p50_s": it.get("p50"), "comm_p50_s": comm.get("p50"),
                "compute_p50_s": (round(it["p50"] - comm["p50"], 4)
                                  if it.get("p50") is not None and comm.get("p50") is not None
                                  else None),
                "error": job.get("error")}
        return {"jobs": out, "cpu_s": {v.name: round(v.cpu_ns / 1e9, 2) for v in sorted(
            live.vms, key=lambda v: natural_key(v.name)) if v.cpu_ns is not None}}

    def check(self, answer, record, params):
        right = answer.cause == record["truth"]["cause"]
        return Verdict([(right, f"the cause is {'' if right else 'not '}{answer.cause}")])


# -- ecmp ----------------------------------------------------------------------------------
class DscpAnswer(_Strict):
    dscp: dict[str, int] = Field(description="flow src->dst: its DSCP (the entropy value: "
                                 "DSCP k takes path slot k, 1..spines; 0 is hashed)",
                                 examples=[{"vm1->vm5": 1, "vm2->vm6": 2}])


class EcmpParams(_Strict):
    tolerance: float = Field(0.1, ge=0, description="largest uplink load over the mean, "
                             "minus 1, that counts as balanced")
    duration_s: float = Field(6, gt=0, description="the flows' length, s")


class Ecmp(Kind):
    """Repair an ECMP imbalance. One flow from every VM of the first leaf to a VM of the
    second, each capped at a rate the seed draws (so that a perfect split exists); the fabric
    runs in ``entropy`` mode, so unmarked (DSCP 0) flows are hashed as in ECMP. The student
    sees the flows and the bytes each uplink of the first leaf carried, and gives every flow
    a DSCP so that the uplinks carry equal load. The check applies the fabric's rule (DSCP k
    takes path slot k, ``lab.fabric``) to the flows' rates; it does not rerun them."""

    Answer = DscpAnswer
    Params = EcmpParams

    def draw(self, rng, sc, topo, p):
        leaves = sorted({topo.nodeInfo(v)["leaf"] for v in vms_of(topo)}, key=natural_key)
        srcs = [v for v in vms_of(topo) if topo.nodeInfo(v)["leaf"] == leaves[0]]
        dsts = [v for v in vms_of(topo) if topo.nodeInfo(v)["leaf"] == leaves[1]]
        rates = balanced_rates(rng, len(srcs))
        flows = []
        for i, (src, dst, mbit) in enumerate(zip(srcs, dsts, rates, strict=False)):
            sc["load"].append({"src": src, "dst": dst, "at_s": 1, "duration_s": p.duration_s,
                               "bw": mbit, "port": 5301 + i})
            flows.append({"flow": f"{src}->{dst}", "mbit": mbit})
        return {"flows": flows, "slots": sc["topology"]["spines"], "leaf": leaves[0]}

    def observe(self, doc, agents, live, truth):
        return {"flows": [{k: f.get(k) for k in ("src", "dst", "requested_mbit", "mbit")}
                          for f in doc.get("load") or []],
                "uplink_bytes": {f"{lk.a}->{lk.b}": lk.tx_bytes[0] for lk in live.links
                                 if lk.a == truth["leaf"] and lk.b.startswith("spine")}}

    def check(self, answer, record, p):
        truth = record["truth"]
        slots = truth["slots"]
        load = dict.fromkeys(range(1, slots + 1), 0.0)
        v = Verdict()
        for f in truth["flows"]:
            d = answer.dscp.get(f["flow"])
            if d is None:
                v.add(False, f"{f['flow']} has no DSCP")
            elif not 1 <= d <= slots:
                v.add(False, f"{f['flow']}: DSCP {d} is " + (
                    "hashed (ECMP): it may land on any uplink" if d == 0 else
                    f"not a path slot (1..{slots})"))
            else:
                load[d] += f["mbit"]
        extra = sorted(set(answer.dscp) - {f["flow"] for f in truth["flows"]})
        if extra:
            v.add(False, f"no such flow: {' '.join(extra)}")
        mean = sum(f["mbit"] for f in truth["flows"]) / slots
        ratio = max(load.values()) / mean if mean else 0.0
        loads = " / ".join(f"{x:g}" for x in load.values())
        v.add(ratio <= 1 + p.tolerance, f"uplink loads {loads} Mbit/s: max/mean {ratio:.2f} "
              f"({'within' if ratio <= 1 + p.tolerance else 'above'} {1 + p.tolerance:g})")
        return v


def balanced_rates(rng: random.Random, n: int, step: int = 5, top: int = 45) -> list[int]:
    """``n`` (even) flow rates, Mbit/s, multiples of ``step`` up to ``top``, in random order,
    that split into two halves of equal sum (a perfect balance over two paths exists)."""
    while True:
        half = [rng.randrange(step, top + 1, step) for _ in range(n // 2)]
        other = [rng.randrange(step, top + 1, step) for _ in range(n // 2 - 1)]
        last = sum(half) - sum(other)
        if step <= last <= top and sorted(half) != sorted(other + [last]):
            rates = half + other + [last]
            rng.shuffle(rates)
            return rates


# -- pacer ---------------------------------------------------------------------------------
class PacerParams(_Strict):
    job: str = Field("incast", description="the scenario's incast job (its pacer: sense)")
    min_cut: float = Field(1.0, ge=0, le=1, description="fraction of the unpaced run's "
                           "drops the paced run must save (1: it drops nothing)")
    paced_runs: int = Field(2, ge=1, le=5, description="paced runs of the job in the check; "
                            "the best is judged (a pacer drop-free in most runs, not all)")


def paced_names(p: PacerParams) -> list[str]:
    """The check's paced jobs: ``paced``, ``paced_2``, ... (``p.paced_runs`` of them)."""
    return ["paced"] + [f"paced_{i}" for i in range(2, p.paced_runs + 1)]


class Pacer(Kind):
    """Tune the pacer under an incast. No hidden truth: the check runs the exercise's lab
    with the incast job unpaced (the pacers only measuring) and then ``paced_runs`` times
    paced with the student's ``pacer`` settings, and passes when the best paced run drops at
    least ``min_cut`` fewer packets than the unpaced one in the same lab (1, the default: none
    at all). Each run's drops are counted while it runs with its pacers up
    (``session.studies.placement``). A teacher may ask for less than 1 where a lab's pacer is
    drop-free in most runs, not all (``benchmarks/exercise_pacer.py`` measures the built-in
    exercise's answers)."""

    Answer = PacerSpec
    Params = PacerParams

    def observe(self, doc, agents, live, truth):
        return {"jobs": {j["name"]: {"fabric_drops": j.get("fabric_drops"),
                                     "drops_by_link": j.get("drops_by_link"),
                                     "completion_s": j.get("completion_s"),
                                     "retransmits": (j.get("edge") or {}).get("retransmits"),
                                     "rtos": (j.get("edge") or {}).get("rtos"),
                                     "error": j.get("error")}
                         for j in doc.get("jobs") or []}}

    def check_scenario(self, answer, record, p):
        sc = dict(record["scenario"])
        job = next(j for j in sc["jobs"] if j["name"] == p.job)
        sc["jobs"] = [{**job, "name": "unpaced", "pacer": "sense"}] + [
            {**job, "name": name, "pacer": "pace"} for name in paced_names(p)]
        sc["pacer"] = answer.model_dump()
        return sc

    def check(self, answer, record, p):
        jobs = {j["name"]: j for j in (record.get("check_results") or {}).get("jobs") or []}
        v = Verdict()
        for name in ["unpaced"] + paced_names(p):
            j = jobs.get(name) or {}
            ok = j.get("fabric_drops") is not None and not j.get("error")
            if not v.add(ok, f"the {name} run " + ("completed" if ok else
                                                   f"failed: {j.get('error') or 'no result'}")):
                return v
        base = jobs["unpaced"]["fabric_drops"]
        best = min((jobs[n] for n in paced_names(p)), key=lambda j: j["fabric_drops"])
        paced = best["fabric_drops"]
        if not base:
            v.add(False, f"drops paced {paced} vs unpaced 0: the unpaced run dropped nothing, "
                         "so there was no incast to cut (run the check again)")
            return v
        cut = 1 - paced / base
        need = ("none allowed" if p.min_cut == 1 else
                f"{math.floor(round(cut * 1000, 6)) / 10:.1f}% cut, "
                f"at least {math.ceil(round(p.min_cut * 1000, 6)) / 10:.1f}% needed")
        where = ", ".join(f"{k} {n}" for k, n in sorted(
            (best.get("drops_by_link") or {}).items(), key=lambda kv: -kv[1]))
        runs = ("" if p.paced_runs == 1 else ", the best of paced runs dropping " +
                ", ".join(str(jobs[n]["fabric_drops"]) for n in paced_names(p)))
        v.add(cut >= p.min_cut, f"drops paced {paced}{f' ({where})' if where else ''} vs "
                                f"unpaced {base} ({need}{runs})")
        return v


KINDS: dict[str, Kind] = {"colocated": Colocated(), "congested": Congested(),
                          "slowdown": Slowdown(), "ecmp": Ecmp(), "pacer": Pacer()}
"""Check kinds by the name an exercise file gives in ``check``."""
