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
along (``SnapshotReady.past``) so the plots are rebuilt. The replay keys (seek, speed, loop)
call the backend's ``seek``/``set_speed``/``toggle_loop`` where it has them
(``tui.recorded.RecordedBackend``) and are refused elsewhere.

``make_app`` is the one factory shared by ``nslab tui`` and the tests.
"""
from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Header, Static, TabbedContent, TabPane, Tabs

from agents.owd import natural_key
from contracts.events import (
    ClockStep,
    CpuHog,
    Fault,
    Flap,
    LinkDown,
    LinkUp,
    Loss,
    Migrate,
    Pause,
    Rate,
    Resume,
)
from lab.errors import LabError
from tui.backend import Backend, EventView, Snapshot, kind_of
from tui.commands import NslabCommands
from tui.detail import DetailScreen, LinkDetail, VMDetail
from tui.history import History
from tui.screens import ExerciseScreen, HelpScreen, ScenarioPicker
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

TUI_SCENARIOS = Path(__file__).parent / "scenarios"
PANELS = ("fabric", "vms", "owd", "jobs")  # the tab panes, in the order of their keys 1-4
WIDE = 120  # columns from which the log sits beside the fabric
TALL = {False: 38, True: 30}  # rows (narrow, wide) from which the panels show their plots


@dataclass
class RunningExercise:
    """An exercise started in the TUI: the exercise, the truth its seed drew, its scenario
    (dict), the directory of its files and the answer last typed; ``checking``: the answer
    (parsed) whose check's own lab runs now (``pacer``), until its jobs are done."""

    ex: Any
    truth: dict
    scenario: dict
    directory: Path
    answer: str
    checking: Any = None
    check_backend: Any = None  # the backend of the check's lab, once started
    verdict: str = ""  # the last verdict of a check that ran its own lab

    @property
    def title(self) -> str:
        return f"exercise {self.ex.name}: {self.ex.title}"


@dataclass
class SnapshotReady(Message):
    """A worker fetched a snapshot; ``past``: the frames before it when a replay jumped (its
    start, a seek, a loop), to rebuild the plots' history from."""

    snapshot: Snapshot
    past: list[Snapshot] | None = None


@dataclass
class ControlDone(Message):
    """A control finished: ``label``, the event it stamped (if any), or the ``error``."""

    label: str
    event: EventView | None = None
    error: str | None = None


@dataclass
class LabStopped(Message):
    """The backend tore the lab down; ``then_exit``: the app quits next."""

    then_exit: bool = False


class NslabApp(App):
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
        past = getattr(self.backend, "past", None)
        before = past() if past is not None and self.backend.jumped else None
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
        if self.exercise is not None and self.exercise.check_backend is self.backend \
                and self.exercise.checking is not None and snap.state in ("done", "stopped",
                                                                          "error"):
            self._check_done(snap)
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

    # -- faults ----------------------------------------------------------------------------
    def _refuse(self, why: str) -> None:
        self.w_log.note(why, self.snap.time_s if self.snap else 0.0)
        self.notify(why, severity="warning", timeout=3)

    def inject(self, fault: Fault) -> None:
        """Apply ``fault`` through the backend (a worker); a refusal is logged."""
        self.control(f"{fault.kind} {fault.target}", self.backend.inject, fault)

    def inject_link(self, fault_type: type[Fault], **params) -> None:
        """Inject a link fault of ``fault_type`` (a ``contracts.events`` class) on the selected
        link, e.g. ``inject_link(Loss, percent=5.0)``."""
        lk = self.w_fabric.selected_link
        self._inject_on(fault_type, "link", (lk.a, lk.b) if lk else None, params)

    def inject_vm(self, fault_type: type[Fault], **params) -> None:
        """Inject a VM fault of ``fault_type`` (a ``contracts.events`` class) on the selected VM,
        e.g. ``inject_vm(Migrate, to="phys2")``."""
        self._inject_on(fault_type, "vm", self.selected_vm, params)

    def _inject_on(self, fault_type: type[Fault], field: str, target, params: dict) -> None:
        """Build ``fault_type(field=target, **params)`` and inject it; a fault that does not
        validate (pydantic) is refused with its reasons, as is one with nothing selected."""
        kind = kind_of(fault_type)
        if target is None or self.stopped:
            noun = "VM" if field == "vm" else field
            return self._refuse(f"{kind}: no {noun} selected or lab not running")
        try:
            fault = fault_type(**{field: target}, **params)
        except ValidationError as e:
            why = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
                            for err in e.errors())
            return self._refuse(f"{kind} refused: {why}")
        self.inject(fault)

    def action_link_down(self) -> None:
        self.inject_link(LinkDown)

    def action_link_up(self) -> None:
        self.inject_link(LinkUp)

    def action_flap(self) -> None:
        self.inject_link(Flap, down_s=1.0, up_s=1.0, count=3)

    def action_loss(self) -> None:
        lk = self.w_fabric.selected_link
        self.inject_link(Loss, percent=0.0 if lk and lk.loss_percent else 5.0)

    def action_rate(self) -> None:
        lk = self.w_fabric.selected_link
        if lk is None:
            return self._refuse("rate: no link selected")
        if not lk.bw_mbit:
            return self._refuse(f"rate: {lk.key} is unshaped (no rate to change)")
        base = self._configured_rate.setdefault(lk.key, lk.bw_mbit)
        self.inject_link(Rate, mbit=base / 2 if lk.bw_mbit >= base else base)

    @property
    def _configured_rate(self) -> dict[str, float]:
        if not hasattr(self, "_rates"):
            self._rates: dict[str, float] = {}
        return self._rates

    def action_hog(self) -> None:
        v = self.snap.vm(self.selected_vm) if self.snap and self.selected_vm else None
        self.inject_vm(CpuHog, enable=not (v and v.hog))

    def action_pause_vm(self) -> None:
        v = self.snap.vm(self.selected_vm) if self.snap and self.selected_vm else None
        if v is None:
            return self._refuse("pause: no VM selected")
        self.inject_vm(Resume if v.paused else Pause)

    def action_clock_step(self) -> None:
        self.inject_vm(ClockStep, step_ms=2.0)

    def action_migrate(self) -> None:
        v = self.snap.vm(self.selected_vm) if self.snap and self.selected_vm else None
        hosts = self.snap.hosts if self.snap else []
        if v is None or len(hosts) < 2:
            return self._refuse("migrate: needs a selected VM and two physical hosts")
        nxt = hosts[(hosts.index(v.phys) + 1) % len(hosts)] if v.phys in hosts else hosts[0]
        self.inject_vm(Migrate, to=nxt)

    # -- scenario --------------------------------------------------------------------------
    def action_toggle_timeline(self) -> None:
        if self.stopped:
            return self._refuse("the lab is stopped")
        if self.timeline_paused:
            self.timeline_paused = False
            self.control("timeline resumed", self.backend.resume)
        else:
            self.timeline_paused = True
            self.control("timeline paused", self.backend.pause)

    def action_step(self) -> None:
        if self.stopped:
            return self._refuse("the lab is stopped")
        self.control("step", self.backend.step)

    def action_stop_lab(self) -> None:
        if not self.stopped:
            self.w_log.note("tearing the lab down ...")
            self.teardown(False)

    def scenario_choices(self) -> list[tuple[str, str]]:
        from session.scenario import builtin_names
        out = [(n, n) for n in builtin_names()]
        out += [(p.stem, str(p)) for p in sorted(TUI_SCENARIOS.glob("*.yaml"))]
        return out

    def action_pick_scenario(self) -> None:
        if self.backend_factory is None:
            return self._refuse("this backend cannot switch scenarios (a recording?)")

        def chosen(value: str | None) -> None:
            if value:
                self.restart(value)
        self.push_screen(ScenarioPicker(self.scenario_choices()), chosen)

    def restart(self, scenario: str, exercise: RunningExercise | None = None) -> None:
        """Tear the current lab down and start ``scenario`` with a new backend (for
        ``exercise``: its lab, its truth hidden)."""
        if self.backend_factory is None:
            return self._refuse("this backend cannot switch scenarios (a recording?)")
        self.exercise = exercise
        self.w_log.note(f"switching to {exercise.title if exercise else scenario} ...")
        self.teardown(False, restart=scenario,
                      hide=frozenset(exercise.ex.hide) if exercise else frozenset())

    # -- exercises -------------------------------------------------------------------------
    def exercise_choices(self) -> list[tuple[str, str]]:
        """(name, title) of every built-in exercise."""
        from session.exercise import load_exercise, names
        return [(n, load_exercise(n).title) for n in names()]

    def start_exercise(self, name: str) -> None:
        """Draw exercise ``name``'s hidden truth from a random seed, start its lab in place
        of the current one (the truth hidden from the panels) and show its task."""
        from session.exercise import load_exercise, prepare
        if self.backend_factory is None:
            return self._refuse("exercises need a live lab (nslab tui as root)")
        ex = load_exercise(name)
        directory = Path(tempfile.mkdtemp(prefix="nslab-exercise-"))
        prep = prepare(ex, random.randrange(1_000_000), directory)
        self.restart(str(prep.path), RunningExercise(ex, prep.truth, prep.data, directory,
                                                     ex.answer))
        self.action_exercise()

    def action_exercise(self) -> None:
        """The running exercise's task and answer box."""
        ex = self.exercise
        if ex is None:
            return self._refuse("no exercise running: ctrl+p, then 'Exercise'")
        self.push_screen(ExerciseScreen(ex.title, ex.ex.task, ex.answer, self.check_exercise,
                                        ex.verdict))

    def check_exercise(self, text: str) -> str:
        """Check the answer ``text`` against the running exercise's truth; the verdict's
        text, or why it was not checked. A kind that measures (``pacer``) runs its check's
        own lab in place of the exercise's, in view; the verdict comes when its jobs are
        done (``on_snapshot_ready``)."""
        from session.exercise import read_answer, write_scenario
        run = self.exercise
        run.answer = text
        path = run.directory / "answer.yaml"
        path.write_text(text)
        record = {"truth": run.truth, "scenario": run.scenario}
        try:
            answer = read_answer(run.ex, path)
            if hasattr(self.backend, "truth"):  # the lab's, shaped as the results' section
                record["results"] = {"truth": self.backend.truth()}
        except LabError as e:
            return str(e)
        params = run.ex.parsed_params
        data = run.ex.kind.check_scenario(answer, record, params)
        if data is not None:
            run.checking = answer
            self.restart(str(write_scenario(data, run.directory, f"{run.ex.name}.check.yaml")),
                         run)
            text = (f"checking: {run.ex.name}'s check runs a lab of its own now, in view "
                    f"(its jobs: {', '.join(j['name'] for j in data['jobs'])}); the verdict "
                    "comes to the event log and here when they are done")
            self.w_log.note(text, self.snap.time_s if self.snap else 0.0)
            return text
        return self._verdict(run, answer, record)

    def _verdict(self, run: RunningExercise, answer, record: dict) -> str:
        """``run``'s verdict on ``answer`` from ``record``, noted in the event log."""
        verdict = run.ex.kind.check(answer, record, run.ex.parsed_params)
        self.w_log.note(f"exercise {run.ex.name}: {'passed' if verdict.passed else 'not yet'}",
                        self.snap.time_s if self.snap else 0.0)
        return verdict.text()

    def _check_done(self, snap: Snapshot) -> None:
        """The check's own lab finished its jobs (state "done"): the verdict from its jobs'
        results; or it ended before ("stopped", "error": bring-up or agents failed, or it was
        stopped): no verdict, and why. Either in the event log and the exercise screen
        (shown)."""
        run = self.exercise
        answer, run.checking, run.check_backend = run.checking, None, None
        if snap.state == "done":
            record = {"truth": run.truth, "scenario": run.scenario,
                      "check_results": {"jobs": self.backend.job_results()}}
            text = self._verdict(run, answer, record)
        else:
            why = getattr(self.backend, "error", None) or f"its lab was {snap.state}"
            text = f"no verdict: the check's lab ended before its jobs were done ({why})"
        for line in text.splitlines():
            self.w_log.note(line, snap.time_s)
        run.verdict = text
        if isinstance(self.screen, ExerciseScreen):
            self.screen.query_one("#exercise-verdict", Static).update(text)
        else:
            self.action_exercise()  # shows run.verdict

    # -- replay ----------------------------------------------------------------------------
    def _replay(self, what: str):
        """The backend's replay control ``what``, or None (refused: not a recording)."""
        fn = getattr(self.backend, what, None)
        if fn is None:
            self._refuse("seek, speed and loop work on a recording (--replay)")
        return fn

    def action_seek(self, frames: int) -> None:
        fn = self._replay("seek")
        if fn is not None:
            self.control(f"seek {frames:+d} frames", fn, frames)

    def action_speed(self, factor: float) -> None:
        fn = self._replay("set_speed")
        if fn is not None:
            self.control(f"replay speed x{factor:g}", fn, factor)

    def action_loop(self) -> None:
        fn = self._replay("toggle_loop")
        if fn is not None:
            self.control("replay loop on/off", fn)

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
