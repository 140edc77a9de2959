"""``NslabApp``: the cockpit of an emulated cluster, over any ``tui.backend.Backend``.

Every backend call runs in a Textual thread worker that posts a message back
(``SnapshotReady``, ``ControlDone``); the UI thread never waits on the lab. Quitting (q,
ctrl+c) tears the lab down first; ``on_unmount`` and ``run_app``'s ``finally`` tear it down
again (idempotent), so a crash in a panel leaves no lab behind.

Focus follows the panel: ``1``-``4``, ``tab``/``shift+tab`` (next/previous panel, in
``PANELS`` order) and a click on a tab give the focus to the panel's main widget (the fabric,
the VM table; the tab bar for the others), so its arrow keys work and the number keys keep
working after a click anywhere (Textual's ``TabbedContent`` switches back to the pane of a
focused widget).

Every snapshot also goes into a ``tui.history.History``: the panels' plots (shown on tall
terminals, ``TALL``) and the detail screens (Enter on a link or a VM, ``tui.detail``) draw
from it; a replay that jumps (start, seek, loop) sends the frames before the new position
along (``SnapshotReady.past``) so the plots are rebuilt.

The controls live in mixins, one job each: ``tui.fault_keys`` (faults on the selected link
or VM), ``tui.scenario_keys`` (timeline, scenario switch, a recording's replay controls) and
``tui.exercise`` (exercises). What a backend can do beyond the core it declares in flags
(``tui.backend.Backend``: ``replays``, ``lab_results``), which the app reads.

``make_app`` is the one factory shared by ``nslab tui`` and the tests.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Header, TabbedContent, TabPane, Tabs

from agents.owd import natural_key
from tui.backend import Backend, EventView, Snapshot
from tui.commands import NslabCommands
from tui.detail import DetailScreen, LinkDetail, VMDetail
from tui.exercise import ExerciseKeys, RunningExercise
from tui.fault_keys import FaultKeys
from tui.history import History
from tui.messages import ControlDone, LabStopped, SnapshotReady
from tui.scenario_keys import ScenarioKeys
from tui.screens import HelpScreen
from tui.widgets import (
    CirclesView,
    CollocationView,
    EventLog,
    FabricView,
    JobsPanel,
    OwdHeatmap,
    SeriesPlot,
    StatusBar,
    VMTable,
)

PANELS = ("fabric", "vms", "owd", "jobs")  # the tab panes, in the order of their keys 1-4
WIDE = 120  # columns from which the log sits beside the fabric
TALL = {False: 38, True: 30}  # rows (narrow, wide) from which the panels show their plots


class NslabApp(FaultKeys, ScenarioKeys, ExerciseKeys, App):
    """See the module doc. ``backend_factory(scenario)`` makes a new backend when another
    scenario is picked (None: picking is disabled)."""

    CSS_PATH = "app.tcss"
    TITLE = "nslab"
    COMMANDS = App.COMMANDS | {NslabCommands}
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("question_mark", "help", "help"),
        Binding("1", "tab('fabric')", "fabric", show=False),
        Binding("2", "tab('vms')", "VMs", show=False),
        Binding("3", "tab('owd')", "OWD", show=False),
        Binding("4", "tab('jobs')", "jobs", show=False),
        Binding("tab", "next_panel(1)", "next panel", show=False, priority=True),
        Binding("shift+tab", "next_panel(-1)", "previous panel", show=False, priority=True),
        Binding("left_square_bracket", "cycle_link(-1)", "prev link", show=False),
        Binding("right_square_bracket", "cycle_link(1)", "next link", show=False),
        Binding("less_than_sign", "cycle_vm(-1)", "prev VM", show=False),
        Binding("greater_than_sign", "cycle_vm(1)", "next VM", show=False),
        Binding("d", "link_down", "down"),
        Binding("u", "link_up", "up"),
        Binding("f", "flap", "flap", show=False),
        Binding("l", "loss", "loss"),
        Binding("r", "rate", "rate"),
        Binding("h", "hog", "hog"),
        Binding("p", "pause_vm", "pause"),
        Binding("c", "clock_step", "clock"),
        Binding("m", "migrate", "migrate"),
        Binding("space", "toggle_timeline", "timeline"),
        Binding("n", "step", "step"),
        Binding("o", "pick_scenario", "scenario", show=False),
        Binding("x", "stop_lab", "stop", show=False),
        Binding("comma", "seek(-5)", "back 5", show=False),
        Binding("full_stop", "seek(5)", "on 5", show=False),
        Binding("minus", "speed(0.5)", "slower", show=False),
        Binding("plus", "speed(2)", "faster", show=False),
        Binding("asterisk", "loop", "loop", show=False),
    ]

    def __init__(self, backend: Backend, *, autostart: bool = True, poll_s: float = 1.0,
                 backend_factory: Callable[[str], Backend] | None = None,
                 screenshot: tuple[str, float] | None = None):
        super().__init__()
        self.screenshot = screenshot  # (SVG path, after s): save it then quit
        self.backend = backend
        self.backend_factory = backend_factory
        self.autostart, self.poll_s = autostart, poll_s
        self.snap: Snapshot | None = None
        self.timeline_paused = False
        self.stopped = False
        self.polling = False
        self.quitting = False
        self.done: list[str] = []  # labels of finished controls (tests, status)
        self.history = History()
        self.exercise: RunningExercise | None = None
        self.rates: dict[str, float] = {}  # link -> its configured rate, Mbit/s (``r``)

    # -- layout ----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="fabric", id="tabs"):
            with TabPane("1 Fabric", id="fabric"):
                with Horizontal(id="fabric-pane"):
                    with Vertical(id="fabric-col"):
                        yield FabricView(id="fabric-view")
                        with Horizontal(id="link-plots", classes="tall-only"):
                            yield SeriesPlot(id="mbit-plot")
                            yield SeriesPlot(id="queue-plot")
                            yield SeriesPlot(id="drops-plot")
                    yield EventLog(id="log")
            with TabPane("2 VMs", id="vms"):
                with Vertical():
                    yield VMTable(id="vm-table")
                    yield CollocationView(id="collocation")
                    with Horizontal(id="clock-plots", classes="tall-only"):
                        yield SeriesPlot(id="offset-plot")
                        yield SeriesPlot(id="drift-plot")
            with TabPane("3 One-way delay", id="owd"):
                with Vertical():
                    with VerticalScroll(id="owd-scroll"):
                        yield OwdHeatmap(id="owd-map")
                    yield SeriesPlot(id="owd-plot", classes="tall-only")
            with TabPane("4 Jobs", id="jobs"):
                with Vertical():
                    with VerticalScroll(id="jobs-scroll"):
                        yield JobsPanel(id="jobs-panel")
                        yield CirclesView(id="circles")
                    yield SeriesPlot(id="jobs-plot", classes="tall-only")
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        # references, not queries: a modal screen on top must not hide the panels
        self.w_fabric = self.query_one(FabricView)
        self.w_vms = self.query_one(VMTable)
        self.w_coll = self.query_one(CollocationView)
        self.w_owd = self.query_one(OwdHeatmap)
        self.w_jobs = self.query_one(JobsPanel)
        self.w_circles = self.query_one(CirclesView)
        self.w_log = self.query_one(EventLog)
        self.w_status = self.query_one(StatusBar)
        self.plots = {p.id: p for p in self.query(SeriesPlot)}
        self.sub_title = self.backend.scenario
        self._size_classes(self.size.width, self.size.height)
        self._focus_panel(PANELS[0])
        if self.autostart:
            self.start_backend()
        self.set_interval(self.poll_s, self.poll)
        if self.screenshot:
            self.set_timer(self.screenshot[1], self._shoot)

    async def _shoot(self) -> None:
        path = Path(self.screenshot[0])
        self.save_screenshot(path.name, str(path.parent or "."))
        await self.action_quit()

    def on_resize(self, event) -> None:
        self._size_classes(event.size.width, event.size.height)

    def _size_classes(self, width: int, height: int) -> None:
        """``-wide``: the log beside the fabric; ``-tall``: the panels' plots shown."""
        wide = width >= WIDE
        self.set_class(wide, "-wide")
        self.set_class(height >= TALL[wide], "-tall")

    # -- workers (never block the UI thread) -----------------------------------------------
    @work(thread=True, exclusive=True, group="lifecycle")
    def start_backend(self) -> None:
        try:
            self.backend.start()
        except Exception as e:  # noqa: BLE001 - shown to the user, the app stays up
            self.post_message(ControlDone("start", error=str(e).splitlines()[0][:200]))
            return
        self.post_message(ControlDone("start"))
        self.post_message(self._fetch())

    def _fetch(self) -> SnapshotReady:
        """The backend's snapshot now (in a worker), with the replay's past after a jump."""
        replay = self.backend.replays and self.backend.jumped
        before = self.backend.past() if replay else None
        return SnapshotReady(self.backend.snapshot(), before)

    def poll(self) -> None:
        if not self.polling and not self.stopped:
            self.polling = True
            self._poll()

    @work(thread=True, group="poll")
    def _poll(self) -> None:
        try:
            self.post_message(self._fetch())
        except Exception as e:  # noqa: BLE001
            self.post_message(ControlDone("snapshot", error=str(e)[:200]))
        finally:
            self.polling = False

    @work(thread=True, group="control")
    def control(self, label: str, fn: Callable[..., Any], *args, **kw) -> None:
        """Run ``fn`` (a backend method) off the UI thread; report through ``ControlDone``."""
        try:
            result = fn(*args, **kw)
        except Exception as e:  # noqa: BLE001 - a refused fault is a message, not a crash
            self.post_message(ControlDone(label, error=str(e).splitlines()[0][:200]))
            return
        self.post_message(ControlDone(label, result if isinstance(result, EventView) else None))
        if not self.stopped:
            self.post_message(self._fetch())

    @work(thread=True, exclusive=True, group="lifecycle")
    def teardown(self, then_exit: bool, restart: str | None = None,
                 hide: frozenset[str] = frozenset()) -> None:
        try:
            self.backend.stop()
        finally:
            self.post_message(LabStopped(then_exit))
        if restart is not None and self.backend_factory is not None:
            self.backend = self.backend_factory(restart)
            self.backend.hide = hide  # an exercise's truth stays out of the snapshots
            self.call_from_thread(self._restarted)

    def _restarted(self) -> None:
        self.stopped = False
        if self.exercise is not None and self.exercise.checking is not None:
            self.exercise.check_backend = self.backend
        self.sub_title = self.backend.scenario
        self.w_log.note(f"starting {self.backend.scenario}")
        self.start_backend()

    # -- messages --------------------------------------------------------------------------
    def on_snapshot_ready(self, msg: SnapshotReady) -> None:
        snap = self.snap = msg.snapshot
        if msg.past is not None:
            self.history = History()
            for frame in msg.past:
                self.history.add(frame)
        if snap.state in ("running", "paused"):
            self.timeline_paused = snap.state == "paused"
        self.w_fabric.update_snapshot(snap)
        self.w_vms.update_snapshot(snap)
        self.w_coll.update_snapshot(snap)
        self.w_owd.update_snapshot(snap)
        self.w_jobs.update_snapshot(snap)
        self.w_circles.update_snapshot(snap)
        self.w_log.update_snapshot(snap)
        self.history.add(snap)
        self.refresh_plots()
        if self.checked_lab_ended(snap):
            self.check_done(snap)
        top = self.screen_stack[-1] if self.screen_stack else None  # none while quitting
        if isinstance(top, DetailScreen):
            top.refresh_from(snap)
        self.refresh_status()

    def refresh_plots(self) -> None:
        """Redraw the plots of the panels (shown on tall terminals) from the history: the
        selected link's throughput, queue and drop rate; every VM's offset and drift error;
        the OWD of the heatmap's pair both ways; each job's iteration times."""
        if self.snap is None or not self.has_class("-tall"):
            return
        h, snap = self.history, self.snap
        lk = self.w_fabric.selected_link
        if lk is not None:
            for plot, field, title, unit in (
                    ("mbit-plot", "mbit", "throughput", "Mbit/s"),
                    ("queue-plot", "queue_pkts", "queue", "packets"),
                    ("drops-plot", "drop_rate", "drop rate", "packets/s")):
                self.plots[plot].show(f"{lk.key} {title}", unit,
                                      {lk.key: h.series(("link", lk.key, field))})
        names = [v.name for v in sorted(snap.vms, key=lambda v: natural_key(v.name))]
        ref = f" (vs {snap.reference})" if snap.reference else ""
        self.plots["offset-plot"].show(f"clock offset error{ref}", "us",
                                       {n: h.series(("vm", n, "err_offset_us")) for n in names})
        self.plots["drift-plot"].show(f"drift error{ref}", "ppm",
                                      {n: h.series(("vm", n, "err_drift_ppm")) for n in names})
        pair = self.w_owd.pair
        if pair is not None:
            a, b = pair.split("->")
            self.plots["owd-plot"].show(f"one-way delay {a}<->{b} (p50)", "us",
                                        {p: h.series(("owd", p)) for p in (pair, f"{b}->{a}")})
        self.plots["jobs-plot"].show("iteration time per job", "s", {
            j.name: (list(range(1, len(j.iteration_s) + 1)), j.iteration_s)
            for j in snap.jobs})

    def on_control_done(self, msg: ControlDone) -> None:
        self.done.append(msg.label)
        log = self.w_log
        t = self.snap.time_s if self.snap else 0.0
        if msg.error:
            log.note(f"{msg.label} refused: {msg.error}", t)
            self.notify(msg.error, title=msg.label, severity="error", timeout=4)
        elif msg.event is None and msg.label not in ("start", "snapshot"):
            log.note(msg.label, t)

    def on_lab_stopped(self, msg: LabStopped) -> None:
        self.stopped = True
        self.done.append("stopped")
        self.w_log.note("lab torn down", self.snap.time_s if self.snap else 0)
        if self.snap is not None:
            self.snap.state = "stopped"
            self.refresh_status()
        if msg.then_exit:
            self.exit()

    def on_fabric_view_link_selected(self, msg: FabricView.LinkSelected) -> None:
        self.refresh_status()
        self.refresh_plots()

    def on_fabric_view_node_clicked(self, msg: FabricView.NodeClicked) -> None:
        """A click on a VM's label selects it (VM faults act on it)."""
        self.select_vm(msg.name)

    def on_fabric_view_open(self, msg: FabricView.Open) -> None:
        lk = self.w_fabric.selected_link
        if lk is not None:
            self.push_screen(LinkDetail(self.history, lk.key))

    def on_data_table_row_selected(self, msg) -> None:
        """Enter on the VM table: the VM's detail."""
        if self.selected_vm is not None:
            self.push_screen(VMDetail(self.history, self.selected_vm))

    def on_owd_heatmap_pair_selected(self, msg: OwdHeatmap.PairSelected) -> None:
        self.refresh_plots()

    def on_data_table_row_highlighted(self, msg) -> None:
        self.refresh_status()

    def refresh_status(self) -> None:
        if self.snap is not None and hasattr(self, "w_status"):
            self.w_status.update_status(self.snap, self.selected_link_name,
                                                    self.selected_vm)

    # -- selection -------------------------------------------------------------------------
    @property
    def selected_link_name(self) -> str | None:
        if not hasattr(self, "w_fabric"):
            return None
        lk = self.w_fabric.selected_link
        return lk.key if lk else None

    @property
    def selected_vm(self) -> str | None:
        return self.w_vms.selected_vm if hasattr(self, "w_vms") else None

    def select_link(self, a: str, b: str) -> None:
        self.w_fabric.select_link(a, b)
        self.refresh_status()

    def select_vm(self, name: str) -> None:
        self.w_vms.select_vm(name)
        self.refresh_status()

    def action_cycle_link(self, delta: int) -> None:
        self.w_fabric.action_select(delta)

    def action_cycle_vm(self, delta: int) -> None:
        table = self.w_vms
        if table.row_count:
            table.move_cursor(row=(table.cursor_row + delta) % table.row_count)
        self.refresh_status()

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self._focus_panel(tab)

    def action_next_panel(self, delta: int) -> None:
        tab = self.query_one(TabbedContent).active
        self.action_tab(PANELS[(PANELS.index(tab) + delta) % len(PANELS)])

    def check_action(self, action: str, parameters: tuple) -> bool:
        # tab is a priority binding (the screen's focus_next would take it): over a modal
        # screen (help, picker, palette) it is that screen's key
        return action != "next_panel" or len(self.screen_stack) == 1

    def _focus_panel(self, tab: str) -> None:
        """Focus ``tab``'s main widget: a focused widget left in a hidden pane would pull
        ``TabbedContent`` back to that pane."""
        main = {"fabric": self.w_fabric, "vms": self.w_vms, "owd": self.w_owd}.get(tab)
        (main or self.query_one(TabbedContent).query_one(Tabs)).focus()

    def on_tabbed_content_tab_activated(self, msg: TabbedContent.TabActivated) -> None:
        """A tab clicked (or switched by the tab bar's arrow keys): the focus goes into the
        new pane unless it is there already."""
        if self.focused is None or msg.pane not in self.focused.ancestors:
            self._focus_panel(msg.pane.id)

    def refuse(self, why: str) -> None:
        """Refuse a control: ``why`` in the event log and a notice."""
        self.w_log.note(why, self.snap.time_s if self.snap else 0.0)
        self.notify(why, severity="warning", timeout=3)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        if self.quitting:
            return
        self.quitting = True
        if self.stopped:
            self.exit()
            return
        self.w_log.note("tearing the lab down, then quitting ...")
        self.teardown(True)

    def on_unmount(self) -> None:
        self.backend.stop()  # idempotent: a crash or an exit without action_quit


def make_app(backend: Backend, **kw) -> NslabApp:
    """The app over ``backend`` (the factory shared by the CLI and the tests)."""
    return NslabApp(backend, **kw)


def run_app(app: NslabApp, headless: bool = False,
            size: tuple[int, int] | None = None) -> int:
    """Run ``app``; the lab is torn down whatever happens (also on a crash or ctrl+c)."""
    try:
        app.run(headless=headless, size=size)
    finally:
        app.backend.stop()
    return app.return_code or 0
