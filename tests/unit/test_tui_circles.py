"""The TUI's CASSINI circles (tui.widgets.circles): rings drawn from a set's results entry where
the arcs are known by hand, and the Jobs panel showing them from a snapshot (Pilot)."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("textual")

from contracts.studies.cassini import CassiniSet  # noqa: E402
from tui.app import make_app  # noqa: E402
from tui.recorded import RecordedBackend  # noqa: E402
from tui.widgets.circles import RADIUS, CirclesView, draw_rings, render_sets  # noqa: E402
from tui.widgets.circles import communicating as up_of  # noqa: E402

# two jobs of 0.1 s compute then 0.1 s collective on 0.2 s slots: the collective is the second
# half of each circle (6 to 12 o'clock, the left half); b shifted by half a slot is the right
PROFILE = {"iteration_s": 0.2, "compute_s": 0.1, "comm_s": 0.1, "demand_mbit": 90.0}


def entry(shift_b: float, modes=None) -> dict:
    return {"name": "pair", "score": 1.0, "unshifted_score": 0.1, "predicted_compatible": True,
            "perimeter_s": 0.2, "slots_s": {"a": 0.2, "b": 0.2}, "shifts_s": {"a": 0.0,
                                                                           "b": shift_b},
            "profiles": {"a": PROFILE, "b": PROFILE}, "modes": modes or {}}


def marks(rows, mark: str) -> list[int]:
    """Columns of ``mark`` in the canvas rows (the centre column is 2 RADIUS)."""
    return [c for row in rows for c, ch in enumerate(row.plain) if ch == mark]


def test_arcs_sit_where_the_shift_puts_them():
    up = up_of(CassiniSet.model_validate(entry(0.1)))
    assert up["a"].mean() == pytest.approx(0.5) and not (up["a"] & up["b"]).any()
    apart, together = draw_rings(up), draw_rings(up_of(CassiniSet.model_validate(entry(0.0))))
    assert len(apart) == 2 * RADIUS + 1 and marks(apart, "×") == []  # no collision ring
    cols = marks(together, "×")
    assert cols and max(cols) <= 2 * RADIUS  # together: they meet on the left half only
    assert marks(together, "●") and max(marks(together, "●")) <= 2 * RADIUS
    # apart: a's arc on the left, b's on the right, so the jobs' rings cover both halves
    assert min(marks(apart, "●")) < 2 * RADIUS < max(marks(apart, "●"))


def test_legend_gives_score_shifts_and_each_mode():
    times = {"mean_iteration_s": 0.3, "p99_iteration_s": 0.4, "comm_overlap": 0.5}
    text = render_sets([entry(0.1, {"fair": times,
                                    "shifted_synced": {**times, "mean_iteration_s": 0.2,
                                                       "comm_overlap": 0.0},
                                    "unfair": {"mean_iteration_s": None,
                                               "p99_iteration_s": None, "error": "refused"}})
                        ]).plain
    assert "pair score 1.00 (unshifted 0.10), circle 0.20 s" in text
    assert "b: slot 0.20 s, shift 0.100 s, comm 0.100 s" in text
    assert "shifted_synced 0.200 s x1.50 meet 0%" in text and "unfair         refused" in text
    assert "not planned (lost)" in render_sets([{"name": "t", "score": None, "shifts_s": None,
                                                 "predicted_compatible": None, "modes": {},
                                                 "error": "lost"}]).plain


def test_jobs_panel_draws_the_snapshot_sets():
    async def run():
        backend = RecordedBackend(start_at=5, advance=False)
        for frame in backend.frames:
            frame.cassini = [entry(0.1)]
        app = make_app(backend, poll_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("4")
            for _ in range(50):
                await pilot.pause(0.05)
                if app.snap is not None:
                    break
            await pilot.pause(0.1)
            view = app.query_one(CirclesView)
            assert view.region.height > 0  # on screen in the Jobs panel
            assert "pair score 1.00" in str(view.render())
    asyncio.run(run())
