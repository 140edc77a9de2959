"""Collocation: the groups of VMs the agents found sharing a physical host, against the truth."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.backend import Snapshot


class CollocationView(Static):
    """Found groups (with confidence) beside the true ones; a tick when they agree."""

    def update_snapshot(self, snap: Snapshot) -> None:
        self.update(self.render_groups(snap))

    @staticmethod
    def render_groups(snap: Snapshot) -> Text:
        truth = sorted(sorted(g) for g in snap.truth_groups)
        found = sorted(sorted(g.members) for g in snap.groups)
        t = Text("Collocation  ", "bold")
        if not snap.groups:
            t.append(f"found: none yet (agents: {snap.agents})", "italic")
        elif found == truth:
            t.append("found = truth ✓", "bold green")
        else:
            t.append("found ≠ truth", "bold yellow")
        t.append("\n truth: ")
        t.append("  ".join("{" + " ".join(g) + "}" for g in truth), "cyan")
        if snap.groups:
            t.append("\n found: ")
            for g in sorted(snap.groups, key=lambda g: sorted(g.members)):
                ok = sorted(g.members) in truth
                conf = f" {g.confidence:.2f}" if g.confidence is not None else ""
                t.append("{" + " ".join(sorted(g.members)) + "}" + conf + "  ",
                         "green" if ok else "yellow")
        return t
