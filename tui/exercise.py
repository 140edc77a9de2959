"""Exercises in ``tui.app.NslabApp`` (a mixin): start one in place of the current lab, its
truth hidden from the panels, show its task and answer box, and check the answer with
``session.exercise``'s steps (``new_record``, ``check_lab``, ``judge``), as ``nslab exercise
check`` does. A kind that measures (``pacer``) runs its check's lab in place of the
exercise's, in view; the verdict comes when that lab's jobs are done.
"""
from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel
from textual.widgets import Static

from lab.errors import LabError
from tui.backend import Backend, Snapshot
from tui.screens import ExerciseScreen

if TYPE_CHECKING:  # pragma: no cover - session.exercise loads Mininet: imported when used
    from session.exercise import Exercise, Prepared


@dataclass
class RunningExercise:
    """An exercise started in the TUI: the exercise, its lab prepared from a seed (scenario,
    truth) and the answer last typed. ``checking``: the answer (parsed) whose check's own
    lab runs now, until its jobs are done, with the ``record`` it is judged against;
    ``check_backend``: that lab's backend once started; ``verdict``: the last verdict of a
    check that ran its own lab."""

    ex: Exercise
    prep: Prepared
    answer: str
    checking: BaseModel | None = None
    record: dict = field(default_factory=dict)
    check_backend: Backend | None = None
    verdict: str = ""

    @property
    def title(self) -> str:
        return f"exercise {self.ex.name}: {self.ex.title}"

    @property
    def directory(self) -> Path:
        """Where its files are (scenario, answer, the check's scenario)."""
        return self.prep.path.parent


class ExerciseKeys:
    """Needs the app's ``backend``, ``backend_factory``, ``exercise``, ``snap``, ``w_log``,
    ``restart``, ``refuse``, ``push_screen`` and ``screen``."""

    def exercise_choices(self) -> list[tuple[str, str]]:
        """(name, title) of every built-in exercise."""
        from session.exercise import load_exercise, names
        return [(n, load_exercise(n).title) for n in names()]

    def start_exercise(self, name: str) -> None:
        """Draw exercise ``name``'s hidden truth from a random seed, start its lab in place
        of the current one (the truth hidden from the panels) and show its task."""
        from session.exercise import load_exercise, prepare
        if self.backend_factory is None:
            return self.refuse("exercises need a live lab (nslab tui as root)")
        ex = load_exercise(name)
        directory = Path(tempfile.mkdtemp(prefix="nslab-exercise-"))
        prep = prepare(ex, random.randrange(1_000_000), directory)
        self.restart(str(prep.path), RunningExercise(ex, prep, ex.answer))
        self.action_exercise()

    def action_exercise(self) -> None:
        """The running exercise's task and answer box."""
        ex = self.exercise
        if ex is None:
            return self.refuse("no exercise running: ctrl+p, then 'Exercise'")
        self.push_screen(ExerciseScreen(ex.title, ex.ex.task, ex.answer, self.check_exercise,
                                        ex.verdict))

    def check_exercise(self, text: str) -> str:
        """Check the answer ``text`` against the running exercise's truth; the verdict's
        text, or why it was not checked. A kind that measures (``pacer``) runs its check's
        own lab in place of the exercise's, in view; the verdict comes when its jobs are
        done (``check_done``)."""
        from session.exercise import check_lab, check_path, new_record, read_answer
        run = self.exercise
        run.answer = text
        path = run.directory / "answer.yaml"
        path.write_text(text)
        try:
            answer = read_answer(run.ex, path)
            known = {"truth": self.backend.truth()} if self.backend.lab_results else {}
        except LabError as e:
            return str(e)
        record = new_record(run.ex, run.prep, known)
        data = check_lab(run.ex, answer, record, run.directory)
        if data is None:
            return self._verdict(run, answer, record)
        run.checking, run.record = answer, record
        self.restart(str(check_path(run.directory, run.ex.name)), run)
        text = (f"checking: {run.ex.name}'s check runs a lab of its own now, in view "
                f"(its jobs: {', '.join(j['name'] for j in data['jobs'])}); the verdict "
                "comes to the event log and here when they are done")
        self.w_log.note(text, self.snap.time_s if self.snap else 0.0)
        return text

    def _verdict(self, run: RunningExercise, answer, record: dict,
                 check_results: dict | None = None) -> str:
        """``run``'s verdict on ``answer`` (``session.exercise.judge``), noted in the event
        log."""
        from session.exercise import judge
        verdict = judge(run.ex, answer, record, check_results)
        self.w_log.note(f"exercise {run.ex.name}: {'passed' if verdict.passed else 'not yet'}",
                        self.snap.time_s if self.snap else 0.0)
        return verdict.text()

    def checked_lab_ended(self, snap: Snapshot) -> bool:
        """``snap`` is of the check's own lab, ended (its jobs done, or it failed or was
        stopped)."""
        run = self.exercise
        return (run is not None and run.checking is not None
                and run.check_backend is self.backend
                and snap.state in ("done", "stopped", "error"))

    def check_done(self, snap: Snapshot) -> None:
        """The check's own lab finished its jobs (state "done"): the verdict from its jobs'
        results; or it ended before ("stopped", "error": bring-up or agents failed, or it was
        stopped): no verdict, and why. Either in the event log and the exercise screen
        (shown)."""
        run = self.exercise
        answer, run.checking, run.check_backend = run.checking, None, None
        if snap.state == "done":
            jobs = self.backend.job_results() if self.backend.lab_results else []
            text = self._verdict(run, answer, run.record, {"jobs": jobs})
        else:
            why = self.backend.error or f"its lab was {snap.state}"
            text = f"no verdict: the check's lab ended before its jobs were done ({why})"
        for line in text.splitlines():
            self.w_log.note(line, snap.time_s)
        run.verdict = text
        if isinstance(self.screen, ExerciseScreen):
            self.screen.query_one("#exercise-verdict", Static).update(text)
        else:
            self.action_exercise()  # shows run.verdict
