"""The TUI on a recorded backend (no root): navigation, every control, help, 80x24, teardown
on quit and on a crash, the command palette, recordings, and snapshots of the main screens."""
from __future__ import annotations

import asyncio
import functools
import json

import pytest

pytest.importorskip("textual")

from textual.widgets import TabbedContent  # noqa: E402

from contracts.events import (  # noqa: E402
    FAULT_KINDS,
    ClockStep,
    CpuHog,
    Flap,
    LinkDown,
    LinkUp,
    Loss,
    Migrate,
    Pause,
    Queue,
    Rate,
    Resume,
)
from lab.errors import LabError  # noqa: E402
from tui.app import make_app  # noqa: E402
from tui.backend import Snapshot  # noqa: E402
from tui.recorded import DEFAULT_RECORDING, RecordedBackend, Recorder, load_recording  # noqa: E402
from tui.screens import HelpScreen, ScenarioPicker  # noqa: E402
from tui.widgets import EventLog, FabricView, JobsPanel, OwdHeatmap, VMTable  # noqa: E402

SIZE = (80, 24)


def sync(fn):
    """Run an async test with asyncio.run (no pytest-asyncio needed)."""
    @functools.wraps(fn)
    def run(*args, **kw):
        return asyncio.run(fn(*args, **kw))
    return run


def _mid() -> int:
    """The first recorded frame with a link down, load on the fabric and a CPU hog."""
    _, frames = load_recording(DEFAULT_RECORDING)
    return next(i for i, f in enumerate(frames)
                if any(not lk.up for lk in f.links) and any(v.hog for v in f.vms)
                and any(lk.utilization > 0.3 for lk in f.links))


MID = _mid()


def app_on(backend=None, poll_s: float = 0.5, **kw):
    app = make_app(backend or RecordedBackend(start_at=MID, advance=False), poll_s=poll_s, **kw)
    app.animation_level = "none"
    return app


async def ready(pilot) -> None:
    """Wait until the first snapshot is drawn."""
    for _ in range(50):
        await pilot.pause(0.05)
        if pilot.app.snap is not None:
            return
    raise AssertionError("no snapshot")


async def press(pilot, *keys: str) -> None:
    for k in keys:
        await pilot.press(k)
        await pilot.pause(0.05)
    await pilot.app.workers.wait_for_complete()
    await pilot.pause(0.05)


def log_text(app) -> str:
    return "\n".join(app.query_one(EventLog).entries)


def test_recording_loads_and_is_from_a_real_run():
    scenario, frames = load_recording(DEFAULT_RECORDING)
    assert scenario.endswith("tui_demo.yaml") and len(frames) >= 10
    assert any(not lk.up for f in frames for lk in f.links)  # the timeline's link_down
    assert any(lk.utilization > 0.5 for f in frames for lk in f.links)  # real iperf3 load
    kinds = {e.kind for e in frames[-1].events}
    assert {"lab_up", "agents_up", "link_down", "link_up", "cpu_hog", "clock_step",
            "job_start", "job_end"} <= kinds
    assert "agents_failed" not in kinds


def test_demo_recording_tells_the_story_in_its_last_frames():
    """``make tui-recording``'s run: the agents converged (every VM's offset estimated within
    50 us of the truth, drift within 1 ppm, against a reference VM), a full OWD matrix, the
    collocation groups equal to the truth, and the job run naive (two ranks on one host) and
    collocation-aware (one per host), both verified."""
    _, frames = load_recording(DEFAULT_RECORDING)
    for snap in frames[-3:]:
        assert snap.agents == "running" and snap.reference in {v.name for v in snap.vms}
        for v in snap.vms:
            assert v.err_offset_us is not None and abs(v.err_offset_us) < 50, v
            assert v.err_drift_ppm is not None and abs(v.err_drift_ppm) < 1, v
        n = len(snap.vms)
        assert len(snap.owd_us) == n * (n - 1) and all(x > 0 for x in snap.owd_us.values())
        found = sorted(sorted(g.members) for g in snap.groups)
        assert found == sorted(sorted(g) for g in snap.truth_groups) and len(found) >= 2
    jobs = {j.name: j for j in frames[-1].jobs}
    assert jobs["naive"].verified and jobs["aware"].verified
    assert "2 ranks share a host" in jobs["naive"].detail
    assert "one rank per host" in jobs["aware"].detail
    assert len(jobs["naive"].iteration_s) == len(jobs["aware"].iteration_s) >= 4


def test_snapshot_round_trip():
    _, frames = load_recording(DEFAULT_RECORDING)
    snap = frames[MID]
    assert Snapshot.from_dict(json.loads(json.dumps(snap.to_dict()))) == snap


@sync
async def test_start_draws_every_panel_in_80x24():
    backend = RecordedBackend(start_at=MID, advance=False)
    app = app_on(backend)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert backend.calls[0] == "start"
        assert app.size == SIZE
        fabric = app.query_one(FabricView)
        assert fabric.region.height >= 9 and fabric.region.width >= 70
        text = fabric.render().plain
        for name in ("spine1", "leaf2", "vm4", "X"):
            assert name in text
        assert app.query_one(VMTable).row_count == 4
        assert "link_down leaf1-spine1" in log_text(app)


@sync
async def test_navigation_tabs_and_selection():
    app = app_on()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        tabs = app.query_one(TabbedContent)
        for key, tab in (("2", "vms"), ("3", "owd"), ("4", "jobs"), ("1", "fabric")):
            await press(pilot, key)
            assert tabs.active == tab
        first = app.selected_link_name
        await press(pilot, "right_square_bracket")
        assert app.selected_link_name != first
        await press(pilot, "left_square_bracket")
        assert app.selected_link_name == first
        vm = app.selected_vm
        await press(pilot, "greater_than_sign")
        assert app.selected_vm != vm
        await press(pilot, "less_than_sign")
        assert app.selected_vm == vm
        app.query_one(FabricView).focus()
        await press(pilot, "down")
        assert app.selected_link_name != first


@sync
async def test_link_controls():
    backend = RecordedBackend(start_at=MID, advance=False)
    app = app_on(backend)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.select_link("leaf2", "spine2")
        await press(pilot, "d")
        assert not app.snap.link("leaf2", "spine2").up
        assert "tui      link_down leaf2-spine2" in log_text(app)
        assert "X" in app.query_one(FabricView).render().plain
        await press(pilot, "u")
        assert app.snap.link("leaf2", "spine2").up
        await press(pilot, "l")
        assert app.snap.link("leaf2", "spine2").loss_percent == 5.0
        await press(pilot, "l")
        assert app.snap.link("leaf2", "spine2").loss_percent == 0.0
        await press(pilot, "r")
        assert app.snap.link("leaf2", "spine2").bw_mbit == 50.0
        await press(pilot, "r")
        assert app.snap.link("leaf2", "spine2").bw_mbit == 100.0
        await press(pilot, "f")
        assert backend.calls[-1] == "inject flap leaf2-spine2"
        assert [c.split()[1] for c in backend.calls if c.startswith("inject")] == [
            "link_down", "link_up", "loss", "loss", "rate", "rate", "flap"]


@sync
async def test_vm_controls():
    backend = RecordedBackend(start_at=MID, advance=False)
    app = app_on(backend)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.select_vm("vm3")
        await press(pilot, "h")
        assert app.snap.vm("vm3").hog
        await press(pilot, "h")
        assert not app.snap.vm("vm3").hog
        await press(pilot, "p")
        assert app.snap.vm("vm3").paused
        await press(pilot, "p")
        assert not app.snap.vm("vm3").paused
        before = app.snap.vm("vm3").offset_ms
        await press(pilot, "c")
        assert app.snap.vm("vm3").offset_ms == pytest.approx(before + 2.0)
        assert app.snap.vm("vm3").phys == "phys2"
        await press(pilot, "m")
        assert app.snap.vm("vm3").phys == "phys1"
        log = log_text(app)
        for line in ("cpu_hog vm3: on", "pause vm3", "resume vm3",
                     "clock_step vm3: step 2 ms", "migrate vm3: to phys1"):
            assert line in log


@sync
async def test_timeline_pause_resume_step_and_stop():
    backend = RecordedBackend(start_at=2)
    app = app_on(backend, poll_s=3600)  # only the controls move the replay: steps stay pending
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await press(pilot, "space")
        assert backend.paused and app.timeline_paused
        held = backend.index
        await pilot.pause(0.4)
        assert backend.index == held  # the timeline does not move while paused
        nxt = backend.snapshot().pending[0]
        await press(pilot, "n")
        assert backend.stepped and backend.stepped[0].kind == nxt.kind
        assert f"step     {nxt.kind} {nxt.target}" in log_text(app)
        await press(pilot, "space")
        assert not backend.paused
        await press(pilot, "x")
        assert backend.stopped and app.stopped
        await press(pilot, "d")  # refused once stopped, said in the log
        assert "not running" in log_text(app)


# One valid fault of every kind, on the recording's fabric (frame MID).
EVERY_FAULT = [LinkDown(link=("leaf2", "spine2")), LinkUp(link=("leaf1", "spine1")),
               Flap(link=("leaf1", "spine2"), down_s=0.5, count=2),
               Loss(link=("vm1", "leaf1"), percent=2.5), Rate(link=("vm3", "leaf2"), mbit=20),
               Queue(link=("leaf2", "spine1"), packets=30), CpuHog(vm="vm1", enable=True),
               Pause(vm="vm4"), Resume(vm="vm4"), ClockStep(vm="vm2", step_ms=-1.5),
               Migrate(vm="vm3", to="phys1")]


def test_every_fault_kind_is_covered():
    assert sorted(f.kind for f in EVERY_FAULT) == sorted(FAULT_KINDS)


@pytest.mark.parametrize("fault", EVERY_FAULT, ids=lambda f: f.kind)
def test_recorded_inject_stamps_the_model(fault):
    backend = RecordedBackend(start_at=MID, advance=False)
    backend.start()
    ev = backend.inject(fault)
    assert (ev.kind, ev.target, ev.params, ev.source) == (
        fault.kind, fault.target, fault.params(), "tui")
    assert ev in backend.snapshot().events


def test_recorded_inject_applies_the_typed_effect():
    backend = RecordedBackend(start_at=MID, advance=False)
    backend.start()
    for fault in EVERY_FAULT:
        backend.inject(fault)
    snap = backend.snapshot()
    assert not snap.link("leaf2", "spine2").up and snap.link("leaf1", "spine1").up
    assert snap.link("vm1", "leaf1").loss_percent == 2.5
    assert snap.link("vm3", "leaf2").bw_mbit == 20.0
    assert snap.vm("vm1").hog and not snap.vm("vm4").paused
    assert snap.vm("vm2").offset_ms == pytest.approx(backend._frame().vm("vm2").offset_ms - 1.5)
    assert snap.vm("vm3").phys == "phys1"


@pytest.mark.parametrize("fault, why", [
    (Migrate(vm="vm3", to="phys2"), "already runs on phys2"),
    (Migrate(vm="vm3", to="phys9"), "no physical host 'phys9'"),
    (LinkDown(link=("vm1", "spine2")), "no link between vm1 and spine2"),
    (ClockStep(vm="vm9", step_ms=1), "no VM 'vm9'"),
], ids=["migrate-same-host", "migrate-unknown-host", "unknown-link", "unknown-vm"])
def test_recorded_refuses_as_the_lab_would(fault, why):
    backend = RecordedBackend(start_at=MID, advance=False)
    backend.start()
    with pytest.raises(LabError, match=why):
        backend.inject(fault)
    assert not backend.injected


def test_recorded_refuses_migrating_a_paused_vm_and_a_stopped_lab():
    backend = RecordedBackend(start_at=MID, advance=False)
    backend.start()
    backend.inject(Migrate(vm="vm3", to="phys1"))
    with pytest.raises(LabError, match="already runs on phys1"):  # where it is now
        backend.inject(Migrate(vm="vm3", to="phys1"))
    backend.inject(Pause(vm="vm3"))
    with pytest.raises(LabError, match="paused"):
        backend.inject(Migrate(vm="vm3", to="phys2"))
    backend.stop()
    with pytest.raises(LabError, match="not running"):
        backend.inject(Resume(vm="vm3"))


@sync
async def test_refused_fault_is_logged_not_fatal():
    backend = RecordedBackend(start_at=MID, advance=False)
    app = app_on(backend)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.inject(Migrate(vm="vm3", to="phys2"))  # the host it is on
        app.inject(LinkDown(link=("vm1", "spine2")))  # no such link
        await pilot.app.workers.wait_for_complete()
        await pilot.pause(0.1)
        log = log_text(app)
        assert "migrate vm3 refused: vm3 already runs on phys2" in log
        assert "link_down vm1-spine2 refused: no link between vm1 and spine2" in log
        assert app.is_running and not backend.injected


@sync
async def test_invalid_fault_values_are_refused_readably():
    backend = RecordedBackend(start_at=MID, advance=False)
    app = app_on(backend)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.select_link("vm1", "leaf1")
        app.inject_link(Loss, percent=150.0)
        app.select_vm("vm1")
        app.inject_vm(ClockStep)  # step_ms missing
        await pilot.app.workers.wait_for_complete()
        await pilot.pause(0.1)
        log = log_text(app)
        assert "loss refused: percent: Input should be less than or equal to 100" in log
        assert "clock_step refused: step_ms: Field required" in log
        assert app.is_running and not backend.injected


# The keys that inject a fault (docs/tui.md); every other key must not inject.
FAULT_KEYS = ("d", "u", "f", "l", "r", "h", "p", "c", "m")
NOT_PRESSED = ("q", "ctrl+c", "x", "o")  # quit, stop and restart end the run under test


@sync
async def test_every_injecting_key_stamps_a_known_fault_kind():
    backend = RecordedBackend(start_at=MID, advance=False)
    app = app_on(backend)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.select_link("leaf2", "spine2")
        app.select_vm("vm3")
        injecting = {}
        # pause last: the lab refuses to migrate a paused VM
        for binding in sorted(app.BINDINGS, key=lambda b: b.key == "p"):
            if binding.key in NOT_PRESSED:
                continue
            before = len(backend.injected)
            await press(pilot, binding.key)
            if len(app.screen_stack) > 1:
                await press(pilot, "escape")  # the help screen
            new = backend.injected[before:]
            if new:
                injecting[binding.key] = [ev.kind for ev in new]
        assert sorted(injecting) == sorted(FAULT_KEYS)
        assert all(len(kinds) == 1 and kinds[0] in FAULT_KINDS for kinds in injecting.values())
        log = log_text(app)
        for kinds in injecting.values():
            assert f"tui      {kinds[0]} " in log




@sync
async def test_command_palette_runs_commands():
    backend = RecordedBackend(start_at=MID, advance=False)
    app = app_on(backend)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.select_link("vm1", "leaf1")
        await press(pilot, "ctrl+p")
        await pilot.press(*"Loss 20%")
        await pilot.pause(0.5)
        await press(pilot, "enter")
        await pilot.pause(0.2)
        assert backend.calls[-1] == "inject loss vm1-leaf1"
        assert app.snap.link("vm1", "leaf1").loss_percent == 20.0


def restartable_app():
    """(app, its first backend, the scenarios its backend factory was asked for): an app
    that can switch scenarios, each a recorded backend."""
    made = []

    def factory(scenario):
        made.append(scenario)
        return RecordedBackend(start_at=MID, advance=False)
    first = RecordedBackend(start_at=MID, advance=False)
    return app_on(first, backend_factory=factory), first, made


@sync
async def test_pick_scenario_restarts_with_a_new_backend():
    app, first, made = restartable_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await press(pilot, "o")
        assert isinstance(app.screen, ScenarioPicker)
        await press(pilot, "enter")
        await pilot.pause(0.3)
        await app.workers.wait_for_complete()
        assert first.stopped and made and app.backend is not first
        assert app.backend.calls[0] == "start"


@sync
async def test_quit_tears_the_lab_down():
    backend = RecordedBackend(start_at=MID, advance=False)
    app = app_on(backend)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("q")
        await pilot.pause(0.3)
    assert backend.stopped and backend.calls.count("stop") == 1


@sync
async def test_crash_in_a_panel_still_tears_down(monkeypatch):
    backend = RecordedBackend(start_at=MID, advance=False)

    def boom(self, snap):
        raise RuntimeError("panel bug")
    monkeypatch.setattr(JobsPanel, "update_snapshot", boom)
    app = app_on(backend)
    with pytest.raises(RuntimeError, match="panel bug"):
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.5)
    assert backend.stopped


def test_recorder_writes_a_replayable_recording(tmp_path):
    path = tmp_path / "rec.json"
    rec = Recorder(RecordedBackend(start_at=MID), path)
    rec.start()
    rec.snapshot()
    rec.inject(LinkDown(link=("leaf1", "spine2")))
    rec.snapshot()
    rec.stop()
    _, frames = load_recording(path)
    assert len(frames) == 2 and not frames[1].link("leaf1", "spine2").up


def test_panels_render_estimates_owd_and_jobs():
    """Fields the recording lacks while the agents are not there yet (agents/API.md)."""
    from tui.backend import GroupView, JobView
    _, frames = load_recording(DEFAULT_RECORDING)
    snap = frames[MID]
    snap.owd_us = {"vm1->vm2": 40.0, "vm2->vm1": 55.0}
    snap.asymmetry_us = {"vm1<->vm2": -15.0}
    snap.groups = [GroupView(["vm1", "vm2"], 0.9), GroupView(["vm3", "vm4"], 0.8)]
    snap.jobs = [JobView("naive", 1.0, [0.2, 0.3, 0.25], 2.5, True)]
    assert "vm1<->vm2 -15us" in OwdHeatmap.render_matrix(snap).plain
    assert "verified" in JobsPanel.render_jobs(snap).plain
    from tui.widgets import CollocationView
    assert "found = truth" in CollocationView.render_groups(snap).plain


# -- snapshots (pytest-textual-snapshot; Textual version pinned in the `tui` extra) ----------
def _snap_app():
    return make_app(RecordedBackend(start_at=MID, advance=False), poll_s=3600)


@pytest.fixture
def snap_compare_or_skip(request):
    pytest.importorskip("pytest_textual_snapshot")
    return request.getfixturevalue("snap_compare")


async def _settle(pilot):
    for _ in range(50):
        await pilot.pause(0.05)
        if pilot.app.snap is not None:
            break
    await pilot.pause(0.2)


@pytest.mark.parametrize("keys", [("2",), ("question_mark",)], ids=["vms", "help"])
def test_snapshot_80x24(snap_compare_or_skip, keys):
    async def run_before(pilot):
        await _settle(pilot)
        for k in keys:
            await pilot.press(k)
        await pilot.pause(0.2)
    assert snap_compare_or_skip(_snap_app(), terminal_size=SIZE, run_before=run_before)


class Synthetic32(RecordedBackend):
    """The recording's controls over a 32-VM snapshot (8 leaves, 4 spines; no lab)."""

    def snapshot(self):
        from tui_synthetic import leafspine_snapshot
        return leafspine_snapshot(spines=4, leaves=8, vms_per_leaf=4)


@pytest.mark.parametrize("vms", [4, 32])
@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_snapshot_fabric(snap_compare_or_skip, size, vms):
    """The fabric panel at 80x24 and 160x48 with 4 VMs (the recording: hosts, a link down,
    a CPU hog; plots under the fabric at 160x48) and 32 VMs (labels on two rows, numbers at
    80 columns, hosts as numbered brackets)."""
    backend = (RecordedBackend(start_at=MID, advance=False) if vms == 4 else
               Synthetic32(start_at=MID, advance=False))
    app = make_app(backend, poll_s=3600)
    assert snap_compare_or_skip(app, terminal_size=size, run_before=_settle)


def test_fabric_info_shows_the_mode_and_the_link_bytes():
    from tui.widgets.fabric import FabricView
    _, frames = load_recording(DEFAULT_RECORDING)
    snap = frames[MID]
    snap.fabric = "spray"
    lk = snap.link("leaf1", "spine1")
    lk.tx_bytes = 12_345_678
    view = FabricView()
    view.snap = snap
    assert view._info(lk).plain.startswith("spray [leaf1-spine1]")
    assert " 12.3 MB" in view._info(lk).plain


def test_two_step_steps_show_as_they_finish():
    """The Jobs panel lists the two_step job's steps: done ones with their drops and
    retransmissions (from the session's live list), the running one, the ones to come."""
    import types

    from session.scenario import load
    from tui.live import LiveBackend
    sc, _ = load("two_step")
    done = {"name": "naive", "pacer": "sense", "cc": None, "completion_s": 2.3,
            "verified": True, "error": None, "fabric_drops": 8275, "retransmits": 4927,
            "rtos": 7}
    backend = LiveBackend.__new__(LiveBackend)
    backend.session = types.SimpleNamespace(
        sc=sc, live={"two_step": [done], "placement": {}}.get,
        timeline=[types.SimpleNamespace(kind="job_start", target="a2a_naive"),
                  types.SimpleNamespace(kind="job_start", target="a2a_aware")])
    views = backend._job_views()
    assert [(v.name, v.progress) for v in views] == [
        ("a2a naive", 1.0), ("a2a aware", 0.5), ("a2a aware_paced", 0.0),
        ("a2a aware_probe", 0.0), ("a2a aware_bbr", 0.0), ("a2a aware_cubic", 0.0)]
    snap = Snapshot(jobs=views)
    text = JobsPanel.render_jobs(snap).plain
    assert "a2a aware_paced " in text  # the step names are not cut
    assert "pacer sense, cc -: drops 8275, retransmits 4927, RTOs 7" in text


def test_lb_runs_show_their_balancer_imbalance_and_link_bytes():
    """The Jobs panel lists lb_compare's runs as they finish (balancer, collective, case,
    imbalance, the leaf-spine links' MB in natural order) and the one running."""
    import types

    from session.scenario import load
    from tui.live import LiveBackend
    sc, _ = load("lb_compare")
    done = {"mode": "spray", "collective": "all_to_all", "case": "symmetric",
            "oversubscription": 1.0, "completion_s": 1.4, "finished": True, "error": None,
            "imbalance": 1.03, "retransmits": 120,
            "link_bytes": {"leaf1-spine10": 2_000_000, "leaf1-spine2": 4_100_000}}
    backend = LiveBackend.__new__(LiveBackend)
    backend.session = types.SimpleNamespace(
        sc=sc, live={"lb": [done], "placement": {}, "two_step": []}.get, state="jobs",
        timeline=[types.SimpleNamespace(kind="job_start", target="lb_spray_all_to_all_symmetric"),
                  types.SimpleNamespace(kind="job_start", target="lb_reps_all_to_all_symmetric")])
    views = backend._lb_views()
    assert [(v.name, v.progress) for v in views] == [
        ("lb spray all_to_all symmetric 1:1", 1.0), ("lb_reps_all_to_all_symmetric", 0.5)]
    assert views[0].detail == ("imbalance 1.03, retransmits 120; "
                               "MB leaf1-spine2 4.1 leaf1-spine10 2.0")
    backend.session.state = "done"
    assert len(backend._lb_views()) == 1


# -- focus and keys (issue 15: after tab or a click, 1-4 must still switch panels) -----------
def focused_pane(app) -> str | None:
    """The id of the tab pane holding the focused widget (None: outside the panes)."""
    from textual.widgets import TabPane
    return next((a.id for a in app.focused.ancestors if isinstance(a, TabPane)), None)


async def settled_active(pilot) -> str:
    await pilot.pause(0.3)  # a snap-back would have happened by now
    return pilot.app.query_one(TabbedContent).active


FOCUS_PATHS = {
    "tab": ("tab",), "shift+tab": ("shift+tab",), "click fabric": ("#fabric-view",),
    "click log": ("#log",), "2 then click table": ("2", "#vm-table"),
    "click a tab": ("#fabric-view", "#--content-tab-owd"),
}


@pytest.mark.parametrize("path", FOCUS_PATHS.values(), ids=FOCUS_PATHS.keys())
@sync
async def test_number_keys_switch_panels_after_any_focus(path):
    app = app_on()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for step in path:
            await (pilot.click(step) if step.startswith("#") else press(pilot, step))
        for key, tab in (("2", "vms"), ("3", "owd"), ("4", "jobs"), ("1", "fabric"),
                         ("3", "owd"), ("2", "vms")):
            await press(pilot, key)
            assert await settled_active(pilot) == tab, (path, key)
            assert focused_pane(app) in (tab, None)  # never left in a hidden pane


@sync
async def test_tab_goes_to_the_next_panel_and_focuses_it():
    app = app_on()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.focused is app.query_one(FabricView)  # arrows pick links from the start
        seen = []
        for _ in range(4):
            await press(pilot, "tab")
            seen.append(await settled_active(pilot))
        assert seen == ["vms", "owd", "jobs", "fabric"]
        await press(pilot, "shift+tab")
        assert await settled_active(pilot) == "jobs"
        await press(pilot, "2")
        assert app.focused is app.query_one(VMTable)
        vm = app.selected_vm
        await press(pilot, "down")  # the table has the focus: arrows move its cursor
        assert app.selected_vm != vm


@sync
async def test_clicking_a_tab_moves_the_focus_into_it():
    app = app_on()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.click("#fabric-view")
        await pilot.click("#--content-tab-vms")
        assert await settled_active(pilot) == "vms"
        assert app.focused is app.query_one(VMTable)


@sync
async def test_help_screen_fits_in_80x24_and_keeps_its_keys():
    app = app_on()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await press(pilot, "question_mark", "tab")
        assert isinstance(app.screen, HelpScreen)
        assert await settled_active(pilot) == "fabric"  # tab over the help: no panel switch
        box = app.screen.query_one("#help-box")
        await pilot.pause(0.2)
        assert box.max_scroll_y == 0 and box.region.height <= SIZE[1]
        columns = list(app.screen.query(".help-column"))
        for w in columns:  # no line wraps
            assert w.region.height == len(str(w.render()).splitlines())
        shown = "\n".join(str(w.render()) for w in columns)
        for binding in app.BINDINGS:  # every key of the app is explained
            key = {"question_mark": "?", "left_square_bracket": "[",
                   "right_square_bracket": "]", "less_than_sign": "<",
                   "greater_than_sign": ">", "comma": ",", "full_stop": ".", "minus": "-",
                   "plus": "+", "asterisk": "*"}.get(binding.key, binding.key)
            assert key in shown, key
        await press(pilot, "escape")
        assert not isinstance(app.screen, HelpScreen)


# -- legend: one colour or mark per meaning ---------------------------------------------------
def test_legend_colours_are_distinct():
    from rich.style import Style

    from tui.widgets import legend as lg
    colours = [c for _, c in lg.SCALE] + [lg.SATURATED]
    marks = [lg.DOWN, lg.DROPS, lg.HOG, lg.PAUSED]
    seen = [Style.parse(s).color for s in colours + marks[:2]] + \
        [Style.parse(s).bgcolor for s in marks[2:]]
    assert len({c.triplet for c in seen}) == len(seen)
    assert [lg.util_style(u) for u in (0.0, 0.1, 0.5, 0.7, 0.9, 1.0)] == colours + [colours[-1]]
    text = lg.legend()
    assert len(text.plain) <= 70  # one line of the fabric beside the log at 120 columns
    styles = {str(span.style) for span in text.spans}
    assert set(colours + marks) <= styles
    for word in ("≥85%", "down", "drop", "hog", "paused"):
        assert word in text.plain


def test_fabric_draws_the_host_layer_between_vms_and_leaves():
    from tui_synthetic import leafspine_snapshot
    snap = leafspine_snapshot(2, 2, 4, hosts={"nic_bw": 100})
    view = FabricView()
    view.snap = snap
    rows = view.draw(120, 30).plain.split("\n")

    def first_row(word):
        return next(i for i, r in enumerate(rows) if word in r.split())
    assert first_row("spine1") < first_row("leaf1") < first_row("phys1") < first_row("vm1")
    nic = next(lk for lk in snap.links if {lk.a, lk.b} == {"phys1", "leaf1"})
    view.selected = snap.links.index(nic)  # the NIC is a link like any other
    assert "phys1" in view.draw(120, 30).plain.split("\n")[-2]


def test_fabric_draws_down_saturated_dropping_and_hog_apart():
    from tui.widgets import legend as lg
    _, frames = load_recording(DEFAULT_RECORDING)
    snap = frames[MID]
    down = next(lk for lk in snap.links if not lk.up)
    busy = next(lk for lk in snap.links if lk.up and lk is not down)
    busy.utilization, busy.drops = 0.95, 0
    dropping = next(lk for lk in snap.links if lk.up and lk not in (busy,))
    dropping.utilization, dropping.drops, dropping.drop_rate = 0.1, 7, 3.5
    for lk in snap.links:  # drops long ago are no mark: only a drop rate now is
        if lk is not dropping:
            lk.drop_rate = 0.0
            lk.drops = 1000
    snap.vms[0].hog = True
    view = FabricView()
    view.snap = snap
    view.selected = snap.links.index(next(lk for lk in snap.links  # bold reverse: not these
                                          if lk not in (down, busy, dropping)))
    drawn = [(s.start, str(s.style)) for s in view.render().spans]
    assert {lg.SATURATED, lg.DOWN, lg.DROPS, lg.HOG} <= {style for _, style in drawn}
    assert view.render().plain.count("*") == 1


# -- words, not Python, in the log --------------------------------------------------------------
@pytest.mark.parametrize("kind, params, words", [
    ("load", {"duration_s": 8.0, "mbit": None, "udp": False}, "load t: duration 8 s, TCP"),
    ("load", {"duration_s": 6.0, "mbit": 40.0, "udp": True},
     "load t: duration 6 s, 40 Mbit/s, UDP"),
    ("cpu_hog", {"enable": False, "phys": "phys1"}, "cpu_hog t: off, on phys1"),
    ("clock_step", {"step_ms": -1.5, "at_ns": 17}, "clock_step t: step -1.5 ms"),
    ("migrate", {"src": "phys2", "dst": "phys1"}, "migrate t: from phys2, to phys1"),
    ("job_end", {"completion_s": 2.5, "verified": False}, "job_end t: completion 2.5 s, "
                                                          "not verified"),
    ("job_start", {"vms": ["vm1", "vm2"]}, "job_start t: vms vm1 vm2"),
    ("link_up", {}, "link_up t"),
])
def test_events_are_described_in_words(kind, params, words):
    from contracts.events import describe
    assert describe(kind, "t", params) == words


def test_recorded_log_has_no_python_values():
    backend = RecordedBackend(start_at=MID, advance=False)
    backend.start()
    for f in EVERY_FAULT:
        backend.inject(f)
    for ev in backend.snapshot().events:
        line = ev.describe()
        for raw in ("None", "True", "False", "=", "[", "{"):
            assert raw not in line, line


# -- natural order (vm9 before vm10) -----------------------------------------------------------
def ten_vms() -> Snapshot:
    from tui.backend import GroupView, NodeView, VMView
    names = [f"vm{i}" for i in (10, 9, 2, 1, 11)]
    return Snapshot(nodes=[NodeView(n, "vm", 0) for n in names],
                    vms=[VMView(n, "phys1", "leaf1") for n in names],
                    truth_groups=[["vm10", "vm9"], ["vm2", "vm11", "vm1"]],
                    groups=[GroupView(["vm10", "vm9"], 0.9)],
                    owd_us={"vm10->vm9": 50.0, "vm9->vm10": 40.0, "vm2->vm10": 30.0})


def test_collocation_and_owd_sort_naturally():
    from tui.widgets import CollocationView
    snap = ten_vms()
    text = CollocationView.render_groups(snap).plain
    assert "truth: {vm1 vm2 vm11}  {vm9 vm10}" in text
    assert "found: {vm9 vm10} 0.90" in text
    header = OwdHeatmap.render_matrix(snap).plain.splitlines()[1].split()
    assert header == ["vm2", "vm9", "vm10"]


@sync
async def test_vm_table_and_fabric_sort_naturally():
    from tui.recorded import RecordedBackend as Rec

    class Ten(Rec):
        def snapshot(self):
            return ten_vms()
    app = app_on(Ten(start_at=MID, advance=False))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        table = app.query_one(VMTable)
        assert [str(table.get_row_at(i)[0]) for i in range(table.row_count)] == [
            "vm1", "vm2", "vm9", "vm10", "vm11"]
        row = app.query_one(FabricView).render().plain.splitlines()[0].split()
        assert row == ["vm1", "vm2", "vm9", "vm10", "vm11"]


def test_jobs_panel_shows_comparisons_with_interval_and_verdict():
    """A repeated comparison (``--repeat``) shows under the jobs: ratio of medians, its 95 %
    interval and the verdict; an unbounded interval reads '?'."""
    from session import stats
    from tui.backend import JobView
    from tui.widgets.jobs import JobsPanel
    snap = Snapshot(jobs=[JobView("naive", 1.0)], comparisons=[
        stats.comparison("placement", "aware", "naive", "completion_s",
                         {"aware": [2.0, 2.1, 1.9], "naive": [4.0, 4.2, 3.9]}),
        stats.comparison("two_step", "aware_paced", "aware", "completion_s",
                         {"aware_paced": [2.0], "aware": [2.2]})])
    text = JobsPanel.render_jobs(snap).plain
    assert "aware / naive completion_s 0.50 [0.4" in text and "better (n=3)" in text
    assert "aware_paced / aware completion_s 0.91 [?, ?] no difference (n=1)" in text
    assert Snapshot.from_dict(snap.to_dict()).comparisons == snap.comparisons
