"""The scenario controls of ``tui.app.NslabApp`` (a mixin): the timeline (pause, resume,
step), stopping the lab, switching to another scenario, and a recording's replay controls
(seek, speed, loop), which only a backend that declares ``replays`` offers.
"""
from __future__ import annotations

from pathlib import Path

from tui.screens import ScenarioPicker

TUI_SCENARIOS = Path(__file__).parent / "scenarios"


class ScenarioKeys:
    """Needs the app's ``backend``, ``backend_factory``, ``stopped``, ``timeline_paused``,
    ``exercise``, ``w_log``, ``control``, ``teardown``, ``refuse`` and ``push_screen``."""

    def action_toggle_timeline(self) -> None:
        if self.stopped:
            return self.refuse("the lab is stopped")
        if self.timeline_paused:
            self.timeline_paused = False
            self.control("timeline resumed", self.backend.resume)
        else:
            self.timeline_paused = True
            self.control("timeline paused", self.backend.pause)

    def action_step(self) -> None:
        if self.stopped:
            return self.refuse("the lab is stopped")
        self.control("step", self.backend.step)

    def action_stop_lab(self) -> None:
        if not self.stopped:
            self.w_log.note("tearing the lab down ...")
            self.teardown(False)

    def scenario_choices(self) -> list[tuple[str, str]]:
        """(label, name or path) of every built-in scenario and the TUI's own."""
        from session.scenario import builtin_names
        out = [(n, n) for n in builtin_names()]
        out += [(p.stem, str(p)) for p in sorted(TUI_SCENARIOS.glob("*.yaml"))]
        return out

    def action_pick_scenario(self) -> None:
        if self.backend_factory is None:
            return self.refuse("this backend cannot switch scenarios (a recording?)")

        def chosen(value: str | None) -> None:
            if value:
                self.restart(value)
        self.push_screen(ScenarioPicker(self.scenario_choices()), chosen)

    def restart(self, scenario: str, exercise=None) -> None:
        """Tear the current lab down and start ``scenario`` with a new backend (for
        ``exercise``, a ``tui.exercise.RunningExercise``: its lab, its truth hidden)."""
        if self.backend_factory is None:
            return self.refuse("this backend cannot switch scenarios (a recording?)")
        self.exercise = exercise
        self.w_log.note(f"switching to {exercise.title if exercise else scenario} ...")
        self.teardown(False, restart=scenario,
                      hide=frozenset(exercise.ex.hide) if exercise else frozenset())

    # -- replay ----------------------------------------------------------------------------
    def _replays(self) -> bool:
        """The backend has a recording's controls; else refused."""
        if not self.backend.replays:
            self.refuse("seek, speed and loop work on a recording (--replay)")
        return self.backend.replays

    def action_seek(self, frames: int) -> None:
        if self._replays():
            self.control(f"seek {frames:+d} frames", self.backend.seek, frames)

    def action_speed(self, factor: float) -> None:
        if self._replays():
            self.control(f"replay speed x{factor:g}", self.backend.set_speed, factor)

    def action_loop(self) -> None:
        if self._replays():
            self.control("replay loop on/off", self.backend.toggle_loop)
