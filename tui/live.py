"""``LiveBackend``: a real lab under the TUI (root).

Threads: every kernel operation (bring-up, counters, faults, teardown) runs on one dedicated
*lab thread* (a single-worker executor). The app's Textual thread workers submit to it and
wait; the UI thread never does. One thread also means the pyroute2 sockets that the lab's
nodes open per thread (``LabNode.ipr``) are opened on, and used by, that thread only (STYLE.md:
namespace sockets and threads). Around it run the lab's own helper threads: the timeline
player here (it only waits and submits), the agents' ``Watcher``, the fidelity sampler and the
iperf3 load.

``stop()`` is idempotent and callable from any thread; the app calls it on quit and the CLI
again in a ``finally``, so a crash anywhere still tears the lab down.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from session import runner, scoring
from lab.errors import LabError
from lab.fidelity import FidelitySampler
from session.load import Flow, LoadRunner
from session.scenario import load
from tui.backend import (
    TIERS,
    EventView,
    FidelityView,
    GroupView,
    JobView,
    LinkView,
    NodeView,
    Snapshot,
    VMView,
)

UNSHAPED_MBIT = 1000.0  # utilization of links without a rate is shown against 1 Gbit/s


def _event(d: dict, source: str) -> EventView:
    return EventView(t_s=round(float(d.get("t_s", 0.0)), 3), kind=d["kind"],
                     target=str(d.get("target", "")),
                     params={k: v for k, v in (d.get("params") or {}).items()
                             if isinstance(v, (int, float, str, bool, type(None)))},
                     source=source)


def _spec_event(f, shift_s: float = 0.0) -> EventView:
    args = f.call_args()
    target = f"{args.pop('a')}-{args.pop('b')}" if "a" in args else args.pop("vm", "")
    return EventView(t_s=round(f.at_s + shift_s, 3), kind=f.kind, target=target, params=args,
                     source="timeline")


class LiveBackend:
    """A scenario's lab, its agents, load, jobs and fault timeline, driven by the TUI.

    Args:
        scenario: built-in name or YAML path (``session.scenario.load``).
        name: lab name (default: the scenario's).
        run_jobs: run the scenario's jobs after its timeline.
        progress: called with bring-up messages (from the lab thread).
    """

    def __init__(self, scenario: str = "quickstart", name: str | None = None,
                 run_jobs: bool = True, progress=None):
        self.scenario, self.name, self.run_jobs = scenario, name, run_jobs
        self.progress = progress or (lambda msg: None)
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nslab-lab")
        self._lock = threading.RLock()
        self._halt = threading.Event()
        self.lab = self.sc = self.topo = None
        self.mesh = self.watcher = self.sampler = self.loadrunner = None
        self.notes: list[EventView] = []
        self.pending: list = []  # FaultSpec, in time order
        self.tui_ns: set[int] = set()  # true_ns of events injected from the TUI
        self.step_ns: set[int] = set()
        self.job_entries: dict[str, dict] = {}
        self.paused_at: float | None = None
        self.shift_s = 0.0
        self.state = "starting"
        self._prev: dict = {}
        self._player: threading.Thread | None = None
        self._stopped = False

    # -- plumbing --------------------------------------------------------------------------
    def _on_lab(self, fn, *args, **kw):
        """Run ``fn`` on the lab thread and wait for it (re-raises its exception)."""
        if threading.current_thread().name.startswith("nslab-lab"):
            return fn(*args, **kw)
        return self._exec.submit(fn, *args, **kw).result()

    def _note(self, kind: str, target: str = "", **params) -> None:
        t = self.lab.now_s() if self.lab is not None and self.lab.t0_ns else 0.0
        self.notes.append(EventView(round(t, 3), kind, target, params, "lab"))

    # -- Backend ---------------------------------------------------------------------------
    def start(self, scenario: str | None = None) -> None:
        """Build the lab, start agents, load and the timeline.

        Raises:
            LabError: the scenario is invalid or the lab could not be built (torn down).
        """
        if scenario:
            self.scenario = scenario
        self._on_lab(self._start)

    def _start(self) -> None:
        self.sc, self.topo = load(self.scenario)
        self.pending = sorted(self.sc.faults, key=lambda f: f.at_s)
        self.lab = runner.make_lab(self.sc, self.topo, self.name, self.progress)
        self.sampler = FidelitySampler(interval_s=0.5).__enter__()
        try:
            self.lab.start()
        except BaseException:
            self.sampler.__exit__(None, None, None)
            raise
        self._note("lab_up", self.lab.name, bringup_s=round(self.lab.bringup_s, 2))
        self._links = self._link_ends()
        self.mesh = runner.make_mesh(self.sc, self.lab)
        if self.mesh is not None:
            try:
                self.mesh.start()
                self.watcher = runner.Watcher(self.lab, self.mesh)
                self.watcher.start()
                self._note("agents_up", f"{len(self.lab.vms)} VMs")
            except (LabError, OSError) as e:
                self._note("agents_failed", "", error=str(e).splitlines()[0][:120])
                self.mesh.stop()
                self.mesh = None
        self.loadrunner = LoadRunner(self.lab, [Flow(port=5201 + i, **f.model_dump())
                                                for i, f in enumerate(self.sc.load)])
        self.loadrunner.start()
        self.state = "running"
        self._player = threading.Thread(target=self._play, daemon=True, name="nslab-timeline")
        self._player.start()

    def _link_ends(self) -> list[tuple[str, str, list]]:
        out = []
        for a, b in self.topo.links():
            ta = TIERS.get(self.topo.nodeInfo(a).get("role", "vm"), 0)
            tb = TIERS.get(self.topo.nodeInfo(b).get("role", "vm"), 0)
            if tb < ta:
                a, b = b, a
            lk = self.lab.net.linksBetween(self.lab[a], self.lab[b])[0]
            out.append((a, b, [lk.intf1, lk.intf2]))
        return out

    def _play(self) -> None:
        """The timeline player: waits for each step's time (shifted by pauses) and applies it
        on the lab thread; then runs the jobs."""
        while not self._halt.is_set():
            with self._lock:
                if not self.pending:
                    break
                if self.paused_at is not None:
                    f = None
                else:
                    f = self.pending[0]
                    if f.at_s + self.shift_s > self.lab.now_s():
                        f = None
                    else:
                        self.pending.pop(0)
            if f is None:
                self._halt.wait(0.05)
                continue
            try:
                self._on_lab(self.lab.faults.apply, f.kind, **f.call_args())
            except Exception as e:  # noqa: BLE001 - reported in the log, the run goes on
                self._note("fault_failed", f.kind, error=str(e)[:120])
        if self._halt.is_set():
            return
        if self.run_jobs and self.sc.jobs:
            self._jobs()
        if not self._halt.is_set():
            self.state = "done"

    def _jobs(self) -> None:
        for spec in self.sc.jobs:
            if self._halt.is_set():
                return
            try:
                vms = runner.choose(self.lab, spec, self.watcher)
                from session import jobs
                entry = jobs.run(self.lab, spec.name, spec.collective, vms,
                                 timeout_s=spec.timeout_s, nbytes=spec.bytes, dtype=spec.dtype,
                                 iterations=spec.iterations, warmup=spec.warmup,
                                 compute_units=spec.compute_units,
                                 conns_per_peer=spec.conns_per_peer)
            except Exception as e:  # noqa: BLE001 - a failed job is shown, not fatal
                entry = {"name": spec.name, "error": str(e)[:160], "verified": False,
                         "completion_s": None}
            self.job_entries[spec.name] = entry

    def inject(self, kind: str, **args) -> EventView:
        """Apply a fault now, stamped in the lab's truth timeline.

        Raises:
            LabError: the lab refused it (unknown node, bad value, not running).
        """
        if self.lab is None or self._stopped:
            raise LabError("the lab is not running")
        ev = self._on_lab(self.lab.faults.apply, kind, **args)
        self.tui_ns.add(ev["true_ns"])
        return _event(ev, "tui")

    def pause(self) -> None:
        with self._lock:
            if self.paused_at is None and self.lab is not None:
                self.paused_at = self.lab.now_s()
                self.state = "paused"
                self._note("timeline_paused")

    def resume(self) -> None:
        with self._lock:
            if self.paused_at is not None:
                self.shift_s += self.lab.now_s() - self.paused_at
                self.paused_at = None
                self.state = "running"
                self._note("timeline_resumed")

    def step(self) -> EventView | None:
        with self._lock:
            if not self.pending or self.lab is None:
                return None
            f = self.pending.pop(0)
        ev = self._on_lab(self.lab.faults.apply, f.kind, **f.call_args())
        self.step_ns.add(ev["true_ns"])
        return _event(ev, "step")

    def stop(self) -> None:
        """Stop agents, load and timeline, tear the lab down (idempotent, any thread)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._halt.set()
        try:
            self._on_lab(self._stop)
        finally:
            self._exec.shutdown(wait=False)

    def _stop(self) -> None:
        try:
            if self.watcher is not None:
                self.watcher.stop()
            if self.mesh is not None:
                self.mesh.stop()
        finally:
            if self.lab is not None:
                self.lab.stop()
            if self.sampler is not None:
                self.sampler.__exit__(None, None, None)
            self.state = "stopped"

    # -- snapshot --------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        if self.lab is None or self.lab.net is None:
            return Snapshot(scenario=self.scenario, state=self.state,
                            events=list(self.notes))
        return self._on_lab(self._snapshot)

    def _snapshot(self) -> Snapshot:
        lab, topo = self.lab, self.topo
        if lab.net is None:
            return Snapshot(scenario=self.scenario, lab=lab.name, state=self.state,
                            events=list(self.notes))
        now_ns, now_s = time.time_ns(), lab.now_s()
        nodes = [NodeView(n, r, TIERS.get(r, 0))
                 for n in topo.nodes() for r in [topo.nodeInfo(n).get("role", "vm")]]
        snap = Snapshot(time_s=round(now_s, 2), scenario=self.sc.name, lab=lab.name,
                        state=self.state, nodes=nodes, hosts=sorted(set(lab.phys.values())),
                        truth_groups=scoring.truth_groups(lab.phys))
        snap.links = self._link_views(now_ns)
        snap.vms = self._vm_views(now_ns)
        self._agent_views(snap)
        snap.events = self._events()
        with self._lock:
            shift = self.shift_s + ((now_s - self.paused_at) if self.paused_at is not None
                                    else 0.0)
            snap.pending = [_spec_event(f, shift) for f in self.pending]
        snap.jobs = self._job_views()
        if self.sampler is not None and self.sampler.busy:
            snap.fidelity = FidelityView(busy=round(self.sampler.busy[-1], 3),
                                         softirq=round(self.sampler.softirq[-1], 3),
                                         saturated=bool(self.sampler.summary()["saturated"]))
        return snap

    def _counters(self, node) -> dict[str, tuple[int, int]]:
        """{ifname: (tx_bytes, drops)} of a node, from one link dump and one qdisc dump."""
        ipr = node.ipr
        qdrops = {}
        for q in ipr.get_qdiscs():
            st = q.get_attr("TCA_STATS")
            if q["parent"] == 0xFFFFFFFF and st is not None:
                qdrops[q["index"]] = st["drop"]
        out = {}
        for link in ipr.get_links():
            st = link.get_attr("IFLA_STATS64") or {}
            drops = st.get("tx_dropped", 0) + st.get("rx_dropped", 0)
            out[link.get_attr("IFLA_IFNAME")] = (st.get("tx_bytes", 0),
                                                 drops + qdrops.get(link["index"], 0))
        return out

    def _link_views(self, now_ns: int) -> list[LinkView]:
        counters: dict[str, dict] = {}
        views = []
        for a, b, intfs in self._links:
            tx, drops = [], 0
            for intf in intfs:
                c = counters.get(intf.node.name)
                if c is None:
                    c = counters[intf.node.name] = self._counters(intf.node)
                byte, d = c.get(intf.name, (0, 0))
                tx.append(byte)
                drops += d
            key = f"{a}-{b}"
            prev = self._prev.get(key)
            self._prev[key] = (now_ns, tx)
            bw = intfs[0].shaping.bw
            mbit = 0.0
            if prev is not None and now_ns > prev[0]:
                dt = (now_ns - prev[0]) / 1e9
                mbit = max(max(0, x - y) for x, y in zip(tx, prev[1], strict=True)) * 8 / dt / 1e6
            views.append(LinkView(a=a, b=b, utilization=round(min(1.0, mbit / (bw or
                                                                              UNSHAPED_MBIT)), 3),
                                  up=frozenset((a, b)) not in self.lab.down_links, drops=drops,
                                  mbit=round(mbit, 2), bw_mbit=bw,
                                  loss_percent=intfs[0].shaping.loss or 0.0))
        return views

    def _vm_views(self, now_ns: int) -> list[VMView]:
        lab, out = self.lab, []
        for vm in sorted(lab.phys, key=lambda v: (len(v), v)):
            phys = lab.phys[vm]
            cpu = 0.0
            try:
                used = lab.cgroups.cpu_usage_ns(phys, vm)
                prev = self._prev.get("cpu:" + vm)
                self._prev["cpu:" + vm] = (now_ns, used)
                if prev is not None and now_ns > prev[0]:
                    cpu = 100.0 * (used - prev[1]) / (now_ns - prev[0])
            except OSError:
                pass
            spec = lab.clocks.specs[vm]
            out.append(VMView(name=vm, phys=phys, leaf=self.topo.nodeInfo(vm).get("leaf", ""),
                              cpu_pct=round(max(0.0, cpu), 1),
                              offset_ms=round(spec.offset_at(now_ns) / 1e6, 4),
                              drift_ppm=round(spec.frequency_ppm(now_ns), 3),
                              paused=vm in lab.faults.paused, hog=vm in lab.faults.hogs))
        return out

    def _agent_views(self, snap: Snapshot) -> None:
        """Estimates, OWD and collocation from the coordinator's latest state (read defensively:
        ``agents/API.md`` is the contract)."""
        if self.mesh is None:
            snap.agents = "off" if not self.sc.agents.enabled else "failed"
            return
        state = self.watcher.latest if self.watcher else None
        if not state:
            snap.agents = "waiting"
            return
        snap.agents = "running"
        ref = state.get("reference")
        snap.reference = ref
        t_ns = state.get("t_ns")
        if t_ns is None and state.get("history"):
            t_ns = state["history"][-1].get("t_ns")
        truth = {}
        if ref in self.lab.clocks.specs and t_ns is not None:
            truth = scoring.truth_at(self.lab.clocks.specs, ref, int(t_ns))
        for v in snap.vms:
            est = (state.get("vms") or {}).get(v.name) or {}
            if est.get("offset_ns") is None:
                continue
            v.est_offset_ms = round(est["offset_ns"] / 1e6, 4)
            if est.get("drift_ppm") is not None:
                v.est_drift_ppm = round(est["drift_ppm"], 3)
            if v.name in truth:
                off, drift = truth[v.name]
                v.err_offset_us = round((est["offset_ns"] - off) / 1e3, 2)
                if est.get("drift_ppm") is not None:
                    v.err_drift_ppm = round(est["drift_ppm"] - drift, 3)
        for pair, d in (state.get("owd_us") or {}).items():
            val = d.get("p50_us") if isinstance(d, dict) else d
            if val is not None:
                snap.owd_us[pair] = round(float(val), 1)
        snap.asymmetry_us = asymmetry(snap.owd_us)
        coll = state.get("collocation") or {}
        snap.groups = [GroupView(sorted(g["members"]), g.get("confidence"))
                       for g in coll.get("groups", [])]

    def _events(self) -> list[EventView]:
        out = []
        for d in list(self.lab.timeline):
            ns = d.get("true_ns")
            src = "tui" if ns in self.tui_ns else "step" if ns in self.step_ns else (
                "timeline" if d["kind"] in _FAULT_KINDS else "lab")
            out.append(_event(d, src))
        return sorted(out + self.notes, key=lambda e: e.t_s)

    def _job_views(self) -> list[JobView]:
        started = {d["target"] for d in self.lab.timeline if d["kind"] == "job_start"}
        out = []
        for spec in self.sc.jobs:
            e = self.job_entries.get(spec.name)
            if e is None:
                out.append(JobView(spec.name, 0.5 if spec.name in started else 0.0))
                continue
            its = e.get("iteration_s")  # a list when the job API gives one; percentiles now
            series = its if isinstance(its, list) else []
            out.append(JobView(spec.name, 1.0, [float(x) for x in series],
                               e.get("completion_s"), e.get("verified"), e.get("error")))
        return out


_FAULT_KINDS = {"link_down", "link_up", "flap", "loss", "rate", "queue", "cpu_hog", "pause",
                "resume", "clock_step", "migrate"}


def asymmetry(owd_us: dict[str, float]) -> dict[str, float]:
    """``{"a<->b": owd(a->b) - owd(b->a)}`` for every pair measured both ways (a < b)."""
    out = {}
    for pair, v in owd_us.items():
        a, b = pair.split("->")
        back = owd_us.get(f"{b}->{a}")
        if back is not None and (len(a), a) < (len(b), b):
            out[f"{a}<->{b}"] = round(v - back, 1)
    return out
