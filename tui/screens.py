"""Modal screens: the help screen and the scenario picker."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static

HELP = [
    ("Views", [("1 2 3 4", "fabric+log / VMs+collocation / one-way delay / jobs"),
               ("tab", "next panel"), ("[ ]", "previous / next link"),
               ("< >", "previous / next VM (or arrows in the VM table)")]),
    ("Link faults (selected link)", [("d", "take the link down"), ("u", "bring it up"),
                                     ("f", "flap it (3 x 1 s down / 1 s up)"),
                                     ("l", "loss 5 % on / off"),
                                     ("r", "rate: half the configured rate / back")]),
    ("VM faults (selected VM)", [("h", "CPU hog (noisy neighbour) on / off"),
                                 ("p", "pause / resume the VM"),
                                 ("c", "clock step +2 ms"),
                                 ("m", "migrate to the next physical host")]),
    ("Scenario", [("space", "pause / resume the timeline"), ("n", "play the next step now"),
                  ("o", "pick a scenario (restarts the lab)"),
                  ("x", "stop: tear the lab down")]),
    ("App", [("ctrl+p", "command palette (every action, with more values)"),
             ("?", "this help"), ("q / ctrl+c", "quit (tears the lab down)")]),
]


class HelpScreen(ModalScreen[None]):
    """Every key of the app."""

    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        t = Text()
        for section, keys in HELP:
            t.append(f"{section}\n", "bold underline")
            for k, what in keys:
                t.append(f"  {k:<11}", "bold cyan")
                t.append(f"{what}\n")
        t.append("\nFaults are stamped in the lab's truth timeline and the log. ", "italic")
        t.append("Esc closes.", "italic")
        with VerticalScroll(id="help-box"):
            yield Static(t, id="help-text")

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
