"""The TUI's story, sizes, plots, drill-down and replay on the demo recording (no root):
stepped events stamped now and logged once, hosts drawn, labels and the OWD matrix that fit
from 80x24 to 200x60 and from 4 to 32 VMs, the plots' history, Enter on a link or a VM,
clicks, seek/speed/loop."""
from __future__ import annotations

import pytest

pytest.importorskip("textual_plotext")

from test_tui import MID, SIZE, app_on, log_text, press, ready, sync  # noqa: E402
from tui_synthetic import leafspine_snapshot  # noqa: E402

from tui.backend import Snapshot  # noqa: E402
from tui.detail import LinkDetail, VMDetail  # noqa: E402
from tui.history import History  # noqa: E402
from tui.recorded import DEFAULT_RECORDING, RecordedBackend, load_recording  # noqa: E402
from tui.widgets import EventLog, FabricView, OwdHeatmap, VMTable  # noqa: E402
from tui.widgets.fabric import vm_labels  # noqa: E402

FRAMES = load_recording(DEFAULT_RECORDING)[1]


class Synthetic(RecordedBackend):
    """The recording's controls over a synthetic snapshot of ``vms`` VMs (4 per leaf)."""

    def __init__(self, vms: int):
        super().__init__(start_at=MID, advance=False)
        self.snap = leafspine_snapshot(spines=4, leaves=vms // 4, vms_per_leaf=4)

    def snapshot(self) -> Snapshot:
        return self.snap


# -- the timeline: a step is stamped now and shown once -------------------------------------
def test_a_stepped_event_is_stamped_now_and_shown_once():
    backend = RecordedBackend(start_at=1)
    backend.start()
    now = backend.snapshot().time_s  # frame 1 (it moves on to frame 2)
    planned = backend._frame().pending[0]
    assert planned.t_s > backend._frame().time_s  # still to come in the recording
    ev = backend.step()
    assert ev.source == "step" and ev.t_s == backend._frame().time_s and ev.t_s > now
    assert ev.t_s < planned.t_s  # not the future time it was planned for
    while backend.index < len(backend.frames) - 1:
        snap = backend.snapshot()
    snap = backend.snapshot()
    same = [e for e in snap.events if (e.kind, e.target) == (ev.kind, ev.target)]
    assert same == [ev]  # the recorded timeline event it replaced is gone


@sync
async def test_a_stepped_event_is_logged_once():
    backend = RecordedBackend(start_at=1)
    backend.paused = True  # held from the start: no poll moves it on before the step
    app = app_on(backend)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.timeline_paused
        nxt = backend.snapshot().pending[0]  # step, resume and play to the end
        await press(pilot, "n")
        backend.speed = 4  # play the rest 4 frames a snapshot
        await press(pilot, "space")
        while backend.index < len(backend.frames) - 1:
            await pilot.pause(0.2)
        await pilot.pause(1.2)
        lines = [x for x in app.query_one(EventLog).entries if f"{nxt.kind} {nxt.target}" in x]
        assert len(lines) == 1 and " step " in lines[0], lines


# -- physical hosts and labels -------------------------------------------------------------
def fabric_text(snap: Snapshot, width: int, height: int) -> list[str]:
    view = FabricView()
    view.snap = snap
    return view.draw(width, height).plain.splitlines()


def test_hosts_are_drawn_under_their_vms():
    snap = FRAMES[MID]
    lines = fabric_text(snap, 78, 16)
    vm_row = next(i for i, x in enumerate(lines) if "vm1" in x and "vm4" in x)
    hosts = lines[vm_row + 1]
    brackets = [(lo, hosts.index("┘", lo)) for lo, ch in enumerate(hosts) if ch == "└"]
    assert len(brackets) == len(snap.hosts) == 2
    for lo, hi in brackets:  # each bracket: a host's name over the columns of its VMs
        host = hosts[lo:hi + 1].strip("└─┘")
        members = {v.name for v in snap.vms if v.phys == host}
        under = {v.name for v in snap.vms if lo <= lines[vm_row].index(v.name) <= hi}
        assert members == under and len(members) == 2, (host, under)


@pytest.mark.parametrize("slot, expect, staggered", [
    (10.0, ["vm1", "vm32"], False), (4.0, ["vm1", "vm32"], True),
    (2.4, ["1", "32"], True), (1.0, ["·", "·"], False)])
def test_vm_labels_shrink_to_fit(slot, expect, staggered):
    fit = vm_labels(["vm1", "vm32"], slot)
    assert (fit.labels, fit.staggered) == (expect, staggered)


@pytest.mark.parametrize("width", [78, 158, 198])
def test_32_vms_labels_are_never_cut(width):
    """8 leaves, 4 spines, 32 VMs: every VM label whole (names from 160 columns, their
    numbers at 80), and one bracket per host (16)."""
    snap = leafspine_snapshot(spines=4, leaves=8, vms_per_leaf=4)
    lines = fabric_text(snap, width, 30)
    words = " ".join(lines).split()
    names = [v.name for v in snap.vms]
    want = names if width >= 158 else [n[2:] for n in names]
    assert set(want) <= set(words), sorted(set(want) - set(words))
    assert sum(x.count("┘") for x in lines) == len(snap.hosts) == 16
    assert all(len(x) <= width for x in lines)


@pytest.mark.parametrize("width", [78, 158])
@pytest.mark.parametrize("vms", [4, 32])
def test_owd_matrix_never_wraps(width, vms):
    snap = FRAMES[-1] if vms == 4 else leafspine_snapshot(spines=4, leaves=8, vms_per_leaf=4)
    text = OwdHeatmap.render_matrix(snap, width, cursor=(0, 1))
    lines = text.plain.splitlines()
    assert all(len(x) <= width for x in lines), max(len(x) for x in lines)
    rows = [x for x in lines if x[:1] != " " and x.split()[0] in {v.name for v in snap.vms}]
    assert len(rows) == vms  # one line per sender
    a, b = sorted({v.name for v in snap.vms}, key=lambda n: int(n[2:]))[:2]
    assert f"{a}->{b} {snap.owd_us[f'{a}->{b}']:.0f} us" in text.plain


# -- sizes: 80x24 up to 200x60 -------------------------------------------------------------
@pytest.mark.parametrize("size", [(80, 24), (120, 34), (160, 48), (200, 60)])
@sync
async def test_layout_fills_the_screen_and_cuts_no_log_line(size):
    app = app_on(RecordedBackend(start_at=-1, advance=False))
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await pilot.pause(0.3)
        col, fabric = app.query_one("#fabric-col"), app.query_one(FabricView)
        plots = app.query_one("#link-plots")
        tall = size[1] >= 30 if size[0] >= 120 else size[1] >= 38
        assert app.has_class("-tall") == tall
        used = fabric.region.height + (plots.region.height if tall else 0)
        assert used == col.region.height  # no empty rows under the fabric
        if tall:
            assert plots.region.height >= 8 and app.plots["mbit-plot"].shown[1]
        log = app.query_one(EventLog)
        longest = max(log.entries, key=len)
        if size[0] in (120, 160):  # the log beside the fabric is narrower than its lines
            assert len(longest) > log.scrollable_content_region.width
        shown = "".join(strip.text for strip in log.lines).replace(" ", "")
        assert longest.replace(" ", "") in shown  # wrapped, not cut


# -- plots and their history ---------------------------------------------------------------
def test_history_keeps_series_and_starts_over_when_time_goes_back():
    h = History()
    for f in FRAMES:
        h.add(f)
    ts, errs = h.series(("vm", "vm3", "err_offset_us"))
    assert len(ts) >= 5 and ts == sorted(ts) and ts[-1] == FRAMES[-1].time_s
    assert errs[-1] == FRAMES[-1].vm("vm3").err_offset_us
    ts, truth = h.series(("vm", "vm3", "truth_offset_ms"))
    v = FRAMES[-1].vm("vm3")
    assert truth[-1] == pytest.approx(v.est_offset_ms - v.err_offset_us / 1000)
    rates = h.series(("link", "leaf1-spine1", "drop_rate"))[1]
    assert len(rates) == len(FRAMES) and min(rates) == 0.0
    h.add(FRAMES[2])  # a seek back
    assert h.series(("vm", "vm3", "err_offset_us")) == ([], [])
    assert len(h.series(("link", "vm1-leaf1", "mbit"))[0]) == 1


@sync
async def test_tall_panels_plot_clock_errors_owd_and_iterations():
    app = app_on(RecordedBackend(start_at=-1, advance=False))
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        await pilot.pause(0.3)
        names = sorted(v.name for v in app.snap.vms)
        ref = app.snap.reference
        assert app.plots["offset-plot"].shown == (f"clock offset error (vs {ref})", names)
        assert app.plots["drift-plot"].shown[1] == names
        assert app.plots["jobs-plot"].shown[1] == ["naive", "aware"]
        await press(pilot, "3", "right")
        pair = app.query_one(OwdHeatmap).pair
        a, b = pair.split("->")
        assert app.plots["owd-plot"].shown[1] == [pair, f"{b}->{a}"]
        await press(pilot, "1", "right_square_bracket")
        key = app.w_fabric.selected_link.key
        assert app.plots["queue-plot"].shown == (f"{key} queue", [key])


# -- drill-down and the mouse ---------------------------------------------------------------
@sync
async def test_enter_on_a_link_and_on_a_vm_opens_its_detail():
    app = app_on(RecordedBackend(start_at=-1, advance=False))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.select_link("vm1", "leaf1")
        await press(pilot, "enter")
        assert isinstance(app.screen, LinkDetail)
        text = str(app.screen.query_one("#detail-text").render())
        assert "vm1-leaf1" in text and "load vm1->vm3" in text and "job_start naive" in text
        assert [p.shown[0] for p in app.screen.plots()] == [
            "vm1-leaf1 throughput (busier direction)", "queue (fuller direction)", "drop rate"]
        await press(pilot, "escape", "2", "down", "down", "enter")
        assert isinstance(app.screen, VMDetail) and app.screen.vm == "vm3"
        text = str(app.screen.query_one("#detail-text").render())
        assert f"reference {app.snap.reference}" in text and "vm4" in text  # its host mate
        assert "load vm1->vm3" in text
        assert app.screen.plots()[0].shown[1] == ["estimate", "truth"]
        await press(pilot, "escape")
        assert not isinstance(app.screen, VMDetail)


@sync
async def test_clicks_select_links_and_vms_on_the_fabric():
    app = app_on(RecordedBackend(start_at=MID, advance=False))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        fabric = app.w_fabric
        fabric.render()
        hits = fabric._hits
        (lx, ly), (_, i) = next((c, h) for c, h in sorted(hits.items()) if h[0] == "link"
                                and app.snap.links[h[1]].key == "leaf2-spine2")
        await pilot.click(FabricView, offset=(lx + 1, ly))  # + the widget's left padding
        assert app.selected_link_name == "leaf2-spine2"
        (vx, vy), _ = next((c, h) for c, h in hits.items() if h == ("node", "vm4"))
        await pilot.click(FabricView, offset=(vx + 1, vy))
        await pilot.pause(0.1)
        assert app.selected_vm == "vm4"


# -- the reference VM -----------------------------------------------------------------------
@sync
async def test_the_reference_vm_is_shown():
    app = app_on(RecordedBackend(start_at=-1, advance=False))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        table = app.query_one(VMTable)
        ref = app.snap.reference
        row = [str(c) for c in table.get_row(ref)]
        assert row[6] == "ref" and all(
            str(table.get_row(v.name)[6]) != "ref" for v in app.snap.vms if v.name != ref)
        status = str(app.w_status.render())
        assert f"ref {ref} err<=" in status and "groups=truth" in status


# -- replay ----------------------------------------------------------------------------------
def test_replay_seek_speed_and_loop():
    backend = RecordedBackend()
    backend.start()
    last = len(backend.frames) - 1
    assert backend.seek(5) == 5 and backend.seek(-100) == 0 and backend.seek(10**6) == last
    assert backend.jumped and backend.past() == backend.frames[:last] and not backend.jumped
    backend.seek(-last)
    backend.set_speed(2)
    backend.snapshot()
    assert backend.index == 2
    assert backend.set_speed(0.01) == 0.125 and backend.set_speed(1000) == 8.0
    backend.seek(last)
    backend.snapshot()
    assert backend.index == last  # held at the end ...
    assert backend.toggle_loop()
    backend.snapshot()
    assert backend.index == 0 and backend.jumped  # ... or starting over


@sync
async def test_replay_keys_seek_change_speed_and_loop():
    backend = RecordedBackend()
    app = app_on(backend)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await press(pilot, "space")  # hold the replay: only the keys move it
        at = backend.index
        await press(pilot, "full_stop")
        assert backend.index == at + 5
        assert app.history.last_t == backend.frames[at + 5].time_s  # plots rebuilt up to it
        await press(pilot, "comma")
        assert backend.index == at
        await press(pilot, "plus", "plus", "minus")
        assert backend.speed == 2.0
        await press(pilot, "asterisk")
        assert backend.loop
        assert "seek +5 frames" in log_text(app) and "replay loop on/off" in log_text(app)
