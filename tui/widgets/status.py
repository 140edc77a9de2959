"""Status bar: scenario, lab time, timeline state, agents, selection, fidelity of the machine,
and the next timeline step."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.backend import Snapshot

STATE_STYLE = {"running": "bold green", "paused": "bold yellow", "done": "bold blue",
               "stopped": "bold red", "starting": "italic", "error": "bold white on red"}


def agents_summary(snap: Snapshot) -> str:
    """What the agents achieved, short: the reference VM, the largest offset error now and
    whether the collocation groups equal the truth ("ref vm1 err<=0.6us groups=truth ");
    empty before they report."""
    errs = [abs(v.err_offset_us) for v in snap.vms if v.err_offset_us is not None]
    if not snap.reference or not errs:
        return ""
    found = sorted(sorted(g.members) for g in snap.groups)
    same = found == sorted(sorted(g) for g in snap.truth_groups)
    return (f"ref {snap.reference} err<={max(errs):.1f}us "
            f"groups{'=' if same else '≠'}truth ")


class StatusBar(Static):
    """One line, two on narrow terminals when it wraps."""

    def update_status(self, snap: Snapshot, link: str | None, vm: str | None) -> None:
        t = Text()
        t.append(f"{snap.scenario or '?'} ", "bold")
        t.append(f"{snap.time_s:6.1f}s ")
        t.append(f"{snap.state} ", STATE_STYLE.get(snap.state, ""))
        t.append(f"agents:{snap.agents} ")
        t.append(agents_summary(snap), "cyan")
        f = snap.fidelity
        t.append(f"cpu {f.busy:.0%} sirq {f.softirq:.0%} ",
                 "bold white on red" if f.saturated else "")
        if f.saturated:
            t.append("SATURATED ", "bold red")
        t.append(f"│ link {link or '-'} vm {vm or '-'} ", "cyan")
        if snap.pending:
            p = snap.pending[0]
            t.append(f"│ next {p.t_s:.0f}s {p.kind} {p.target}", "grey62")
        self.update(t)
