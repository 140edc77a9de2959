"""The event log: faults (timeline, stepped or injected from the TUI), lab notes and UI
messages, each stamped with its time after bring-up; long lines wrap (never cut)."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import RichLog

from contracts.events import LinkDown, kind_of
from tui.backend import EventView, Snapshot

SOURCE_STYLE = {"tui": "bold yellow", "step": "bold cyan", "timeline": "cyan", "lab": "grey62",
                "ui": "magenta"}
ALARMS = (kind_of(LinkDown), "fault_failed", "agents_failed", "error")  # kinds shown in red


class EventLog(RichLog):
    """Appends events it has not shown yet; ``entries`` keeps the plain lines (tests)."""

    def __init__(self, **kw):
        super().__init__(markup=False, wrap=True, min_width=20, max_lines=500, **kw)
        self.seen: set[tuple] = set()
        self.entries: list[str] = []

    def update_snapshot(self, snap: Snapshot) -> None:
        for ev in snap.events:
            key = (ev.t_s, ev.kind, ev.target, ev.source)
            if key not in self.seen:
                self.seen.add(key)
                self.add_event(ev)

    def add_event(self, ev: EventView) -> None:
        line = f"{ev.t_s:7.2f}s {ev.source:<8} {ev.describe()}"
        self.entries.append(line)
        t = Text(f"{ev.t_s:7.2f}s ", "grey62")
        t.append(f"{ev.source:<8} ", SOURCE_STYLE.get(ev.source, ""))
        t.append(ev.describe(), "bold red" if ev.kind in ALARMS else "")
        self.write(t)

    def note(self, message: str, t_s: float = 0.0) -> None:
        """A message from the UI itself (a refused fault, a state change)."""
        self.add_event(EventView(t_s, "", message, {}, "ui"))
