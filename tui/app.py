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

``make_app`` is the one factory shared by ``nslab tui`` and the tests.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Footer, Header, TabbedContent, TabPane, Tabs

from lab.events import (
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
from tui.backend import Backend, EventView, Snapshot, kind_of
from tui.commands import NslabCommands
from tui.screens import HelpScreen, ScenarioPicker
from tui.widgets import (
    CollocationView,
    EventLog,
    FabricView,
    JobsPanel,
    OwdHeatmap,
    StatusBar,
    VMTable,
)

TUI_SCENARIOS = Path(__file__).parent / "scenarios"
PANELS = ("fabric", "vms", "owd", "jobs")  # the tab panes, in the order of their keys 1-4


@dataclass
class SnapshotReady(Message):
    """A worker fetched a snapshot."""

    snapshot: Snapshot


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

    # -- layout ----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="fabric", id="tabs"):
            with TabPane("1 Fabric", id="fabric"):
                with Horizontal(id="fabric-pane"):
                    yield FabricView(id="fabric-view")
                    yield EventLog(id="log")
            with TabPane("2 VMs", id="vms"):
                with Vertical():
                    yield VMTable(id="vm-table")
                    yield CollocationView(id="collocation")
            with TabPane("3 One-way delay", id="owd"):
                yield OwdHeatmap(id="owd-map")
            with TabPane("4 Jobs", id="jobs"):
                yield JobsPanel(id="jobs-panel")
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        # references, not queries: a modal screen on top must not hide the panels
        self.w_fabric = self.query_one(FabricView)
        self.w_vms = self.query_one(VMTable)
        self.w_coll = self.query_one(CollocationView)
        self.w_owd = self.query_one(OwdHeatmap)
        self.w_jobs = self.query_one(JobsPanel)
        self.w_log = self.query_one(EventLog)
        self.w_status = self.query_one(StatusBar)
        self.sub_title = self.backend.scenario
        self.set_class(self.size.width >= 120, "-wide")
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
        self.set_class(event.size.width >= 120, "-wide")

    # -- workers (never block the UI thread) -----------------------------------------------
    @work(thread=True, exclusive=True, group="lifecycle")
    def start_backend(self) -> None:
        try:
            self.backend.start()
        except Exception as e:  # noqa: BLE001 - shown to the user, the app stays up
            self.post_message(ControlDone("start", error=str(e).splitlines()[0][:200]))
            return
        self.post_message(ControlDone("start"))
        self.post_message(SnapshotReady(self.backend.snapshot()))

    def poll(self) -> None:
        if not self.polling and not self.stopped:
            self.polling = True
            self._poll()

    @work(thread=True, group="poll")
    def _poll(self) -> None:
        try:
            self.post_message(SnapshotReady(self.backend.snapshot()))
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
            self.post_message(SnapshotReady(self.backend.snapshot()))

    @work(thread=True, exclusive=True, group="lifecycle")
    def teardown(self, then_exit: bool, restart: str | None = None) -> None:
        try:
            self.backend.stop()
        finally:
            self.post_message(LabStopped(then_exit))
        if restart is not None and self.backend_factory is not None:
            self.backend = self.backend_factory(restart)
            self.call_from_thread(self._restarted)

    def _restarted(self) -> None:
        self.stopped = False
        self.sub_title = self.backend.scenario
        self.w_log.note(f"starting {self.backend.scenario}")
        self.start_backend()

    # -- messages --------------------------------------------------------------------------
    def on_snapshot_ready(self, msg: SnapshotReady) -> None:
        snap = self.snap = msg.snapshot
        if snap.state in ("running", "paused"):
            self.timeline_paused = snap.state == "paused"
        self.w_fabric.update_snapshot(snap)
        self.w_vms.update_snapshot(snap)
        self.w_coll.update_snapshot(snap)
        self.w_owd.update_snapshot(snap)
        self.w_jobs.update_snapshot(snap)
        self.w_log.update_snapshot(snap)
        self.refresh_status()

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
        main = {"fabric": self.w_fabric, "vms": self.w_vms}.get(tab)
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
        """Inject a link fault of ``fault_type`` (a ``lab.events`` class) on the selected link,
        e.g. ``inject_link(Loss, percent=5.0)``."""
        lk = self.w_fabric.selected_link
        self._inject_on(fault_type, "link", (lk.a, lk.b) if lk else None, params)

    def inject_vm(self, fault_type: type[Fault], **params) -> None:
        """Inject a VM fault of ``fault_type`` (a ``lab.events`` class) on the selected VM,
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

    def restart(self, scenario: str) -> None:
        """Tear the current lab down and start ``scenario`` with a new backend."""
        if self.backend_factory is None:
            return self._refuse("this backend cannot switch scenarios (a recording?)")
        self.w_log.note(f"switching to {scenario} ...")
        self.teardown(False, restart=scenario)

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
