"""Detail screens (Enter on a VM or a link): what it is now, its counters, its flows, and its
time series from the app's ``tui.history.History`` (truth against the agents' estimate for a
VM; throughput, queue and drop rate for a link). Esc closes.

Flows are the scenario's load (``load`` events, ``src->dst``) and jobs (``job_start`` with its
VMs): a VM's are those it sends or receives; a link's are those of the VMs under it (a VM's
link) or of its leaf's VMs (a fabric link: ECMP hashes each flow to one spine, which the lab
does not report, so they are the flows that may cross it).
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.backend import LinkView, Snapshot, VMView
from tui.history import History
from tui.widgets.plots import SeriesPlot
from tui.widgets.vmtable import num


def flows_of(snap: Snapshot, vms: set[str]) -> list[str]:
    """The load and jobs of ``snap``'s events that involve any of ``vms``, in words."""
    out = []
    for e in snap.events:
        if e.kind == "load" and set(e.target.split("->")) & vms:
            out.append(e.describe())
        elif e.kind == "job_start" and set(e.params.get("vms") or []) & vms:
            out.append(e.describe())
    return out


def vms_under(snap: Snapshot, lk: LinkView) -> set[str]:
    """The VMs whose traffic may cross ``lk``: the VM of a VM's link, else the VMs of the
    leaf at its lower end (all VMs for a link above the leaves)."""
    names = {v.name for v in snap.vms}
    if lk.a in names:
        return {lk.a}
    leaf_vms = {v.name for v in snap.vms if v.leaf == lk.a}
    return leaf_vms or names


class DetailScreen(ModalScreen[None]):
    """Base: a text block and a grid of plots, redrawn on every snapshot (``refresh_from``)."""

    BINDINGS = [Binding("escape,enter,q", "dismiss", "close")]
    PLOTS = 0

    def __init__(self, history: History):
        super().__init__()
        self.history = history

    def compose(self) -> ComposeResult:
        with Vertical(id="detail-box"):
            yield Static(id="detail-text")
            with Grid(id="detail-plots"):
                for i in range(self.PLOTS):
                    yield SeriesPlot(id=f"detail-plot-{i}")

    def on_mount(self) -> None:
        if self.app.snap is not None:
            self.refresh_from(self.app.snap)

    def plots(self) -> list[SeriesPlot]:
        return list(self.query(SeriesPlot))

    def action_dismiss(self) -> None:
        self.dismiss(None)

    def refresh_from(self, snap: Snapshot) -> None:
        raise NotImplementedError


class VMDetail(DetailScreen):
    """A VM: host, CPU, clock truth and estimate against the reference VM, collocation, flows;
    plots of its offset (estimate and truth), offset error, drift error and CPU."""

    PLOTS = 4

    def __init__(self, history: History, vm: str):
        super().__init__(history)
        self.vm = vm

    def refresh_from(self, snap: Snapshot) -> None:
        v = snap.vm(self.vm)
        if v is None:
            return
        self.query_one("#detail-text", Static).update(self.text(snap, v))
        h, name = self.history, self.vm
        off, err, drift, cpu = self.plots()
        ref = snap.reference or "the reference VM"
        off.show(f"{name} offset vs {ref}", "ms",
                 {"estimate": h.series(("vm", name, "est_offset_ms")),
                  "truth": h.series(("vm", name, "truth_offset_ms"))})
        err.show("offset error (estimate - truth)", "us",
                 {name: h.series(("vm", name, "err_offset_us"))})
        drift.show("drift error", "ppm", {name: h.series(("vm", name, "err_drift_ppm"))})
        cpu.show("CPU (one core = 100)", "%", {name: h.series(("vm", name, "cpu_pct"))})

    @staticmethod
    def text(snap: Snapshot, v: VMView) -> Text:
        t = Text(f"{v.name}", "bold")
        t.append(f"  on {v.phys} under {v.leaf}  CPU {v.cpu_pct:.0f}%  "
                 f"{'paused' if v.paused else 'hog' if v.hog else 'running'}\n")
        t.append(f"clock truth: offset {num(v.offset_ms, '+.3f')} ms, drift "
                 f"{num(v.drift_ppm, '+.2f')} ppm (against the lab's clock; - hidden)\n")
        ref = snap.reference
        if v.est_offset_ms is None:
            t.append(f"estimate: none yet (agents: {snap.agents})\n", "italic")
        else:
            t.append(f"estimate vs reference {ref}: offset {num(v.est_offset_ms, '+.3f')} ms, "
                     f"drift {num(v.est_drift_ppm, '+.2f')} ppm; error "
                     f"{num(v.err_offset_us, '+.1f')} us, {num(v.err_drift_ppm, '+.3f')} ppm\n")
        found = next((g.members for g in snap.groups if v.name in g.members), None)
        truth = next((g for g in snap.truth_groups if v.name in g), [v.name])
        others = " ".join(m for m in truth if m != v.name) or "none"
        seen = "not yet" if found is None else " ".join(m for m in found if m != v.name) or "none"
        t.append(f"shares its host with: {others}; the agents found: {seen}\n")
        flows = flows_of(snap, {v.name})
        t.append("flows: " + ("; ".join(flows) if flows else "none"))
        return t


class LinkDetail(DetailScreen):
    """A link: state, rate, counters, flows; plots of throughput, queue and drop rate."""

    PLOTS = 3

    def __init__(self, history: History, key: str):
        super().__init__(history)
        self.key = key

    def refresh_from(self, snap: Snapshot) -> None:
        lk = next((x for x in snap.links if x.key == self.key), None)
        if lk is None:
            return
        self.query_one("#detail-text", Static).update(self.text(snap, lk))
        h = self.history
        mbit, queue, drops = self.plots()
        mbit.show(f"{lk.key} throughput (busier direction)", "Mbit/s",
                  {lk.key: h.series(("link", lk.key, "mbit"))})
        queue.show("queue (fuller direction)", "packets",
                   {lk.key: h.series(("link", lk.key, "queue_pkts"))})
        drops.show("drop rate", "packets/s", {lk.key: h.series(("link", lk.key, "drop_rate"))})

    @staticmethod
    def text(snap: Snapshot, lk: LinkView) -> Text:
        t = Text(f"{lk.key}", "bold")
        t.append(f"  {'up' if lk.up else 'DOWN'}  rate "
                 f"{f'{lk.bw_mbit:g} Mbit/s' if lk.bw_mbit else 'unshaped'}  now "
                 f"{lk.mbit:.1f} Mbit/s ({lk.utilization:.0%})  loss {lk.loss_percent:g}%\n")
        queue = "-" if lk.queue_pkts is None else f"{lk.queue_pkts} packets"
        t.append(f"sent {lk.tx_bytes / 1e6:.1f} MB  drops {lk.drops} ({lk.drop_rate:g}/s)  "
                 f"queue {queue}\n")
        flows = flows_of(snap, vms_under(snap, lk))
        t.append("flows that may cross it: " + ("; ".join(flows) if flows else "none"))
        return t
