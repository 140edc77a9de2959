"""Exercises in the TUI (no root): the palette starts one in place of the current lab with
its truth hidden from the backend's snapshots, shows its task, and checks the typed answer;
``tui.backend.hidden`` leaves out what an exercise hides, and the panels still draw."""
from __future__ import annotations

import pytest

pytest.importorskip("textual")

from textual.widgets import Static, TextArea  # noqa: E402

from tests.tui_synthetic import leafspine_snapshot  # noqa: E402
from tests.unit.test_tui import MID, app_on, press, ready, restartable_app, sync  # noqa: E402
from tui.backend import EventView, hidden  # noqa: E402
from tui.commands import NslabCommands  # noqa: E402
from tui.detail import VMDetail  # noqa: E402
from tui.recorded import RecordedBackend  # noqa: E402
from tui.screens import ExerciseScreen  # noqa: E402
from tui.widgets import VMTable  # noqa: E402


def test_hidden_leaves_out_what_an_exercise_hides():
    snap = leafspine_snapshot(2, 2, 4)
    snap.events = [EventView(1.0, "lab_up", "syn"), EventView(2.0, "rate", "vm3-leaf1",
                                                              {"mbit": 20}, "timeline"),
                   EventView(3.0, "load", "vm3->vm5", {}, "timeline"),
                   EventView(4.0, "link_down", "leaf1-spine1", {}, "tui")]
    assert snap.hosts and snap.truth_groups and snap.groups
    hidden(snap, {"placement", "collocation", "links", "faults"})
    assert snap.hosts == [] and snap.truth_groups == [] and snap.groups == []
    assert {v.phys for v in snap.vms} == {"?"}
    assert all(v.offset_ms is v.drift_ppm is v.err_offset_us is v.err_drift_ppm is None
               for v in snap.vms)
    assert all((lk.utilization, lk.mbit, lk.drops, lk.queue_pkts, lk.bw_mbit, lk.tx_bytes)
               == (0.0, 0.0, 0, None, None, 0) for lk in snap.links)
    assert [(e.kind, e.source) for e in snap.events] == [("lab_up", "lab"),
                                                        ("link_down", "tui")]


def test_hidden_clock_truth_reads_as_a_dash():
    snap = hidden(leafspine_snapshot(2, 2, 4), {"placement"})
    v = snap.vms[0]
    row = VMTable._row(v)
    assert row[1] == "?" and row[4:6] == ["-", "-"]
    text = VMDetail.text(snap, v).plain
    assert "on ? under leaf1" in text and "offset - ms, drift - ppm" in text


@sync
async def test_palette_starts_an_exercise_and_checks_the_answer():
    app, first, made = restartable_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await ready(pilot)
        names = [name for name, *_ in NslabCommands(app.screen)._commands()]
        assert "Exercise congested: Find the congested link and its direction from the OWD " \
               "matrix" in names and "Exercise: task and answer" in names
        app.start_exercise("congested")  # what the palette's entry calls
        await pilot.pause(0.3)
        await app.workers.wait_for_complete()
        assert first.stopped and made and made[0].endswith("congested.scenario.yaml")
        assert app.backend.hide == frozenset({"links", "faults"})
        assert isinstance(app.screen, ExerciseScreen)
        truth = app.exercise.prep.truth["link"]
        a, b = truth.split("->")
        box = app.screen.query_one(TextArea)
        verdict = app.screen.query_one("#exercise-verdict", Static)
        box.text = f"link: {b}->{a}\n"
        await press(pilot, "ctrl+s")
        assert "wrong: " in str(verdict.render()) and "NOT YET" in str(verdict.render())
        box.text = f"link: {truth}\n"
        await press(pilot, "ctrl+s")
        assert "PASSED: 2 of 2 right" in str(verdict.render())
        box.text = "link: 3\nlinks: x\n"
        await press(pilot, "ctrl+s")
        assert "2 errors, not checked" in str(verdict.render())
        await press(pilot, "escape")
        assert not isinstance(app.screen, ExerciseScreen)
        app.action_exercise()  # the palette's "Exercise: task and answer" reopens it
        await pilot.pause(0.2)
        assert app.screen.query_one(TextArea).text == "link: 3\nlinks: x\n"


class CheckLab(RecordedBackend):
    """The lab of a check that runs its own (``pacer``): in ``state`` ("done": its jobs done,
    with these drops; "error": ended with ``error``); a live lab's results."""

    lab_results = True

    def __init__(self, drops: dict[str, int], state: str = "done", error: str | None = None):
        super().__init__(start_at=MID, advance=False)
        self.drops, self.state, self.error = drops, state, error

    def snapshot(self):
        snap = super().snapshot()
        snap.state = self.state
        return snap

    def truth(self) -> dict:
        return {"placements": {}}

    def job_results(self) -> list[dict]:
        return [{"name": n, "fabric_drops": d} for n, d in self.drops.items()]


@sync
async def test_a_check_with_a_lab_of_its_own_runs_it_in_view_and_gives_the_verdict():
    made, labs = [], iter([RecordedBackend(start_at=MID, advance=False),
                           CheckLab({"unpaced": 900, "paced": 3, "paced_2": 0}),
                           CheckLab({"unpaced": 900, "paced": 880, "paced_2": 870}),
                           CheckLab({"unpaced": 900, "paced": 0, "paced_2": 0}, state="jobs"),
                           CheckLab({}, state="jobs")])

    def factory(scenario):
        made.append(scenario)
        return next(labs)
    app = app_on(RecordedBackend(start_at=MID, advance=False), backend_factory=factory)
    async with app.run_test(size=(100, 40)) as pilot:
        await ready(pilot)
        app.start_exercise("pacer")
        await pilot.pause(0.3)
        await app.workers.wait_for_complete()
        assert made[-1].endswith("pacer.scenario.yaml") and isinstance(app.screen,
                                                                       ExerciseScreen)
        for lab, verdict in ((1, "PASSED"), (2, "NOT YET")):
            await press(pilot, "ctrl+s")
            for _ in range(40):  # the check's lab starts, polls, is done
                if app.exercise.checking is None:
                    break
                await pilot.pause(0.1)
            assert sum("runs a lab of its own now" in line for line in app.w_log.entries) == lab
            assert made[-1].endswith("pacer.check.yaml") and len(made) == lab + 1
            text = str(app.screen.query_one("#exercise-verdict", Static).render())
            assert verdict in text and "drops paced" in text, text
            note = "passed" if verdict == "PASSED" else "not yet"
            assert any(line.endswith(f"exercise pacer: {note}") for line in app.w_log.entries)
        # the student closes the answer box while the check's lab runs: the verdict reopens it
        await press(pilot, "ctrl+s")
        await press(pilot, "escape")
        assert not isinstance(app.screen, ExerciseScreen) and app.exercise.checking is not None
        app.backend.state = "done"
        for _ in range(40):
            if app.exercise.checking is None:
                break
            await pilot.pause(0.1)
        await pilot.pause(0.2)
        assert isinstance(app.screen, ExerciseScreen)
        assert "PASSED" in str(app.screen.query_one("#exercise-verdict", Static).render())
        # a check's lab that fails before its jobs are done: no verdict, and why
        await press(pilot, "ctrl+s")
        app.backend.state, app.backend.error = "error", "the coordinator did not come up"
        for _ in range(40):
            if app.exercise.checking is None:
                break
            await pilot.pause(0.1)
        text = str(app.screen.query_one("#exercise-verdict", Static).render())
        assert "no verdict" in text and "the coordinator did not come up" in text, text
