"""Collocation: the groups of VMs the agents found sharing a physical host, against the truth."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from agents.owd import natural_key
from tui.backend import Snapshot


def _group_key(members: list[str]) -> list[tuple]:
    return [natural_key(m) for m in members]


def _sorted(members) -> list[str]:
    return sorted(members, key=natural_key)


class CollocationView(Static):
    """Found groups (with confidence) beside the true ones; a tick when they agree. Members
    and groups sort in natural order (``{vm9 vm10}``)."""

    def update_snapshot(self, snap: Snapshot) -> None:
        self.update(self.render_groups(snap))

    @staticmethod
    def render_groups(snap: Snapshot) -> Text:
        truth = sorted((_sorted(g) for g in snap.truth_groups), key=_group_key)
        found = sorted((_sorted(g.members) for g in snap.groups), key=_group_key)
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
            for g in sorted(snap.groups, key=lambda g: _group_key(_sorted(g.members))):
                members = _sorted(g.members)
                conf = f" {g.confidence:.2f}" if g.confidence is not None else ""
                t.append("{" + " ".join(members) + "}" + conf + "  ",
                         "green" if members in truth else "yellow")
        return t
