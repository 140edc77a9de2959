"""One-way delay: a heatmap of the agents' OWD matrix (p50, us), its asymmetry, and a cursor
on one pair (arrows when focused) whose delays the OWD tab plots over time.

The matrix never wraps: cells are as wide as the widget allows, with the delay in us when it
fits and a coloured block when it does not (32 VMs in 80 columns: two columns a cell, the
column labels the VMs' numbers); the cursor's pair and its delays are spelled out under it.
"""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.geometry import Region
from textual.message import Message
from textual.widgets import Static

from agents.owd import natural_key
from tui.backend import Snapshot

HEAT = ("grey23", "dark_green", "green4", "yellow4", "dark_orange3", "red3")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def owd_vms(snap: Snapshot) -> list[str]:
    """The VMs of the OWD matrix, natural order."""
    return sorted({v for pair in snap.owd_us for v in pair.split("->")}, key=natural_key)


def _header(labels: list[str], cw: int) -> str:
    """Column labels over cells ``cw`` wide: every label right-aligned when all fit with a
    space, else one label every five columns (1, 6, 11, ...) where it does not run into the
    last one."""
    if max(len(s) for s in labels) < cw:
        return "".join(s.rjust(cw) for s in labels)
    row = [" "] * (len(labels) * cw)
    free = 0
    for i, s in enumerate(labels):
        at = i * cw
        if i % 5 == 0 and at >= free and at + len(s) <= len(row):
            row[at:at + len(s)] = s
            free = at + len(s) + 1
    return "".join(row)


class OwdHeatmap(Static, can_focus=True):
    """Rows: sender; columns: receiver; cell: p50 one-way delay in us, coloured by value.
    ``cursor`` (row, column) picks the pair ``pair`` (a->b)."""

    BINDINGS = [Binding("up", "move(-1, 0)", show=False), Binding("down", "move(1, 0)", show=False),
                Binding("left", "move(0, -1)", show=False),
                Binding("right", "move(0, 1)", show=False)]

    @dataclass
    class PairSelected(Message):
        """The cursor moved to pair ``a->b``."""

        pair: str

    def __init__(self, **kw):
        super().__init__(**kw)
        self.snap: Snapshot | None = None
        self.cursor = (0, 1)

    @property
    def pair(self) -> str | None:
        """The cursor's pair ``a->b`` (None: no matrix yet)."""
        vms = owd_vms(self.snap) if self.snap else []
        if len(vms) < 2:
            return None
        r, c = self.cursor
        return f"{vms[r % len(vms)]}->{vms[c % len(vms)]}"

    def action_move(self, dr: int, dc: int) -> None:
        n = len(owd_vms(self.snap)) if self.snap else 0
        if n < 2:
            return
        r, c = (self.cursor[0] + dr) % n, (self.cursor[1] + dc) % n
        if r == c:  # no pair with itself: one more step
            r, c = (r + dr) % n, (c + dc) % n
        self.cursor = (r, c)
        self.post_message(self.PairSelected(self.pair))
        self.update_snapshot(self.snap)
        self.scroll_to_region(Region(0, r + 2, 1, 1), animate=False)  # the cursor's row in view

    def update_snapshot(self, snap: Snapshot) -> None:
        self.snap = snap
        self.update(self.render_matrix(snap, self.size.width or 80, self.cursor))

    def on_resize(self) -> None:
        if self.snap is not None:
            self.update_snapshot(self.snap)

    @staticmethod
    def render_matrix(snap: Snapshot, width: int = 80,
                      cursor: tuple[int, int] | None = None) -> Text:
        """The matrix in ``width`` columns (see the module doc)."""
        if not snap.owd_us:
            return Text(f"No one-way delays yet (agents: {snap.agents}). They come from the "
                        "agents' probe mesh once it reports (agents/API.md).", style="italic")
        vms = owd_vms(snap)
        n = len(vms)
        vals = list(snap.owd_us.values())
        lo, hi = min(vals), max(vals)
        lw = max(len(v) for v in vms) + 1
        cw = max(1, min(max(6, lw), (width - lw) // n))
        numbers = cw >= max(len(f"{v:.0f}") for v in vals) + 1
        short = [v if len(v) < cw else v.lstrip(LETTERS) for v in vms]
        t = Text("OWD p50 us (row -> column)" + ("" if numbers else ", colour only: "
                                                 "the cursor's pair below") + "\n", "bold")
        t.append(" " * lw + _header(short, cw) + "\n")
        cr, cc = cursor if cursor is not None else (-1, -1)
        for i, a in enumerate(vms):
            t.append(a.ljust(lw), "bold")
            for j, b in enumerate(vms):
                v = snap.owd_us.get(f"{a}->{b}")
                mark = " reverse" if (i, j) == (cr % n, cc % n) else ""
                if v is None:
                    t.append(("." if a != b else "").rjust(cw), mark.strip() or None)
                    continue
                k = 0 if hi == lo else int((v - lo) / (hi - lo) * (len(HEAT) - 1))
                cell = f"{v:.0f}".rjust(cw) if numbers else " " * cw
                t.append(cell, f"white on {HEAT[k]}{mark}")
            t.append("\n")
        t.append(f"scale {lo:.0f} ", "")
        for c in HEAT:
            t.append("  ", f"on {c}")
        t.append(f" {hi:.0f} us\n")
        if cursor is not None and n >= 2:
            a, b = vms[cr % n], vms[cc % n]
            fwd, back = snap.owd_us.get(f"{a}->{b}"), snap.owd_us.get(f"{b}->{a}")
            t.append(f"{a}->{b}", "bold reverse")
            t.append(f" {'-' if fwd is None else f'{fwd:.0f} us'}, back {b}->{a} "
                     f"{'-' if back is None else f'{back:.0f} us'} (arrows move)\n")
        if snap.asymmetry_us:
            worst = sorted(snap.asymmetry_us.items(), key=lambda kv: -abs(kv[1]))
            t.append("asymmetry owd(a->b)-owd(b->a): ", "bold")
            line, room = [], width - 33
            for k, v in worst:
                item = f"{k} {v:+.0f}us"
                if len("  ".join([*line, item])) > room:
                    break
                line.append(item)
            t.append("  ".join(line))
        return t
