"""Modal screens: the help screen, the scenario picker and an exercise's task and answer."""
from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static, TextArea

HELP = [
    [("Panels", [("1 2 3 4", "fabric, VMs, OWD, jobs"),
                 ("tab", "next panel; shift+tab back"),
                 ("[ ] < >", "previous / next link, VM"),
                 ("arrows", "link, VM, OWD pair; click"),
                 ("enter", "detail of the link or VM")]),
     ("Link faults (selected link)", [("d u", "down / up"),
                                      ("f", "flap 3 times, 1 s each"),
                                      ("l", "loss 5 % on / off"),
                                      ("r", "half the rate / back")])],
    [("VM faults (selected VM)", [("h", "CPU hog on / off"), ("p", "pause / resume"),
                                  ("c", "clock step +2 ms"),
                                  ("m", "migrate to the next host")]),
     ("Scenario", [("space", "pause / resume timeline"), ("n", "play the next step now"),
                   ("o", "pick a scenario (restarts)"), ("x", "stop: tear the lab down")]),
     ("Replay (--replay)", [(", .", "back / on 5 frames"), ("- + *", "slower, faster, loop")]),
     ("App", [("ctrl+p", "every action, more values"), ("?", "this help"),
              ("q ctrl+c", "quit, tears the lab down")])],
]
"""Two columns of (section, [(keys, what)]); each line fits a column of 36, so the whole
help fits in 80x24."""


def help_column(sections) -> Text:
    """One column of the help screen."""
    t = Text()
    for section, keys in sections:
        t.append(f"{section}\n", "bold underline")
        for k, what in keys:
            t.append(f" {k:<9}", "bold cyan")
            t.append(f"{what}\n")
    t.rstrip()
    return t


class HelpScreen(ModalScreen[None]):
    """Every key of the app, in two columns."""

    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            with Horizontal(id="help-columns"):
                for column in HELP:
                    yield Static(help_column(column), classes="help-column")
            yield Static(Text("Faults are stamped in the lab's truth timeline and the log. "
                              "Esc closes.", "italic"))

    def action_dismiss(self) -> None:
        self.dismiss(None)


class ScenarioPicker(ModalScreen[str | None]):
    """Pick a built-in scenario (or the TUI demo); returns its name or path."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, choices: list[tuple[str, str]]):
        super().__init__()
        self.choices = choices  # (label, value)

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box"):
            yield Static("Start which scenario? (enter picks, esc cancels)", id="picker-title")
            yield OptionList(*[label for label, _ in self.choices], id="picker")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.choices[event.option_index][1])

    def action_cancel(self) -> None:
        self.dismiss(None)


class ExerciseScreen(ModalScreen[None]):
    """A running exercise: its task, an answer box (the answer file's YAML, prefilled with
    the last answer or the format's example) and the verdict (the last one, if any).
    ``check(text)`` returns what to show: the verdict, or why the answer was not checked."""

    BINDINGS = [Binding("escape", "dismiss", "close"), Binding("ctrl+s", "check", "check")]

    def __init__(self, title: str, task: str, answer: str, check: Callable[[str], str],
                 verdict: str = ""):
        super().__init__()
        self.heading, self.task_text, self.answer_text = title, task, answer
        self.check_answer, self.verdict = check, verdict

    def compose(self) -> ComposeResult:
        with Vertical(id="exercise-box"):
            with VerticalScroll(id="exercise-task"):
                yield Static(Text(self.heading, "bold"))
                yield Static(self.task_text.rstrip())
            yield Static(Text("Answer (YAML) - ctrl+s checks it, esc closes:", "italic"))
            yield TextArea(self.answer_text, id="exercise-answer")
            yield Static(self.verdict, id="exercise-verdict")

    def action_check(self) -> None:
        self.query_one("#exercise-verdict", Static).update(
            self.check_answer(self.query_one(TextArea).text))

    def action_dismiss(self) -> None:
        self.dismiss(None)
