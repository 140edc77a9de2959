"""One-way delay: a heatmap of the agents' OWD matrix (p50, us) and its asymmetry."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from agents.owd import natural_key
from tui.backend import Snapshot

HEAT = ("grey23", "dark_green", "green4", "yellow4", "dark_orange3", "red3")


class OwdHeatmap(Static):
    """Rows: sender; columns: receiver; cell: p50 one-way delay in us, coloured by value."""

    def update_snapshot(self, snap: Snapshot) -> None:
        self.update(self.render_matrix(snap))

    @staticmethod
    def render_matrix(snap: Snapshot) -> Text:
        if not snap.owd_us:
            return Text(f"No one-way delays yet (agents: {snap.agents}). They come from the "
                        "agents' probe mesh once it reports (agents/API.md).", style="italic")
        vms = sorted({v for pair in snap.owd_us for v in pair.split("->")}, key=natural_key)
        vals = list(snap.owd_us.values())
        lo, hi = min(vals), max(vals)
        w = max(6, max(len(v) for v in vms) + 1)
        t = Text("OWD p50 us (row -> column)\n", "bold")
        t.append(" " * w + "".join(v.rjust(w) for v in vms) + "\n")
        for a in vms:
            t.append(a.ljust(w), "bold")
            for b in vms:
                v = snap.owd_us.get(f"{a}->{b}")
                if v is None:
                    t.append(("." if a != b else "").rjust(w))
                    continue
                k = 0 if hi == lo else int((v - lo) / (hi - lo) * (len(HEAT) - 1))
                t.append(f"{v:.0f}".rjust(w), f"white on {HEAT[k]}")
            t.append("\n")
        t.append(f"scale {lo:.0f} ", "")
        for c in HEAT:
            t.append("  ", f"on {c}")
        t.append(f" {hi:.0f} us\n")
        if snap.asymmetry_us:
            worst = sorted(snap.asymmetry_us.items(), key=lambda kv: -abs(kv[1]))[:6]
            t.append("asymmetry owd(a->b)-owd(b->a): ", "bold")
            t.append("  ".join(f"{k} {v:+.0f}us" for k, v in worst))
        return t
