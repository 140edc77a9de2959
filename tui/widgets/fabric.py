"""The fabric: super-spines, spines, leaves and VMs drawn as a leaf-spine diagram.

Each link is a line coloured by its utilization; a down link is dotted with an ``X`` in the
middle; a link that dropped packets has a ``*`` in the middle; a VM's label shows a CPU hog or a
pause (colours and marks: ``tui.widgets.legend``). Nodes of a tier sort in natural order
(vm2 before vm10). The selected link (``[``/``]``, arrows) is drawn bold and described under
the drawing, above the legend.
"""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from agents.owd import natural_key
from tui.backend import LinkView, Snapshot
from tui.widgets.legend import DOWN, DROPS, HOG, PAUSED, SWITCH, legend, util_style


class FabricView(Widget, can_focus=True):
    """Leaf-spine drawing of a ``Snapshot`` with a selectable link."""

    BINDINGS = [
        Binding("right,down", "select(1)", "next link", show=False),
        Binding("left,up", "select(-1)", "prev link", show=False),
    ]

    selected: reactive[int] = reactive(0)

    @dataclass
    class LinkSelected(Message):
        """The selected link changed (``a``, ``b``)."""

        a: str
        b: str

    def __init__(self, **kw):
        super().__init__(**kw)
        self.snap: Snapshot | None = None

    def update_snapshot(self, snap: Snapshot) -> None:
        self.snap = snap
        if snap.links:
            self.selected = min(self.selected, len(snap.links) - 1)
        self.refresh()

    @property
    def selected_link(self) -> LinkView | None:
        if not self.snap or not self.snap.links:
            return None
        return self.snap.links[self.selected % len(self.snap.links)]

    def action_select(self, delta: int) -> None:
        if self.snap and self.snap.links:
            self.selected = (self.selected + delta) % len(self.snap.links)
            lk = self.selected_link
            self.post_message(self.LinkSelected(lk.a, lk.b))
            self.refresh()

    def select_link(self, a: str, b: str) -> bool:
        """Select the link between ``a`` and ``b``; False if there is none."""
        for i, lk in enumerate(self.snap.links if self.snap else []):
            if {lk.a, lk.b} == {a, b}:
                self.selected = i
                self.refresh()
                return True
        return False

    # -- drawing ---------------------------------------------------------------------------
    def render(self) -> Text:
        snap = self.snap
        width, height = max(20, self.size.width), max(6, self.size.height)
        if snap is None or not snap.nodes:
            return Text(f"waiting for the lab ({snap.state if snap else 'starting'}) ...",
                        style="italic")
        tiers = sorted({n.tier for n in snap.nodes}, reverse=True)
        rows = {t: sorted((n.name for n in snap.nodes if n.tier == t), key=natural_key)
                for t in tiers}
        info_lines = 2
        draw_h = max(len(tiers), height - info_lines)
        gaps = len(tiers) - 1
        gap = max(1, min(5, (draw_h - len(tiers)) // max(1, gaps)))
        y_of = {t: i * (gap + 1) for i, t in enumerate(tiers)}
        canvas_h = y_of[tiers[-1]] + 1
        grid = [[" "] * width for _ in range(canvas_h)]
        style = [[""] * width for _ in range(canvas_h)]
        pos: dict[str, tuple[int, int]] = {}
        for t in tiers:
            names = rows[t]
            slot = width / len(names)
            for i, n in enumerate(names):
                pos[n] = (int(slot * i + slot / 2), y_of[t])
        sel = self.selected_link
        for lk in snap.links:
            if lk.a not in pos or lk.b not in pos:
                continue
            self._line(grid, style, pos[lk.a], pos[lk.b], lk, lk is sel)
        for t in tiers:  # labels over the lines
            slot = width / len(rows[t])
            for n in rows[t]:
                x, y = pos[n]
                label = n if len(n) <= slot - 1 else n.lstrip("abcdefghijklmnopqrstuvwxyz")
                label = label[: max(1, int(slot) - 1)]
                x0 = max(0, min(width - len(label), x - len(label) // 2))
                vm = snap.vm(n)
                colour = "bold cyan" if t == 0 else SWITCH
                if vm and vm.paused:
                    colour = PAUSED
                elif vm and vm.hog:
                    colour = HOG
                for j, ch in enumerate(label):
                    grid[y][x0 + j] = ch
                    style[y][x0 + j] = colour
        out = Text()
        for y in range(canvas_h):
            row, st, x = grid[y], style[y], 0
            while x < width:  # one span per run of equal style
                end = x + 1
                while end < width and st[end] == st[x]:
                    end += 1
                out.append("".join(row[x:end]), st[x] or None)
                x = end
            out.append("\n")
        out.append(self._info(sel))
        return out

    def _line(self, grid, style, p, q, lk: LinkView, selected: bool) -> None:
        r"""Draw one link between label rows: steep parts as ``| / \``, shallow parts as runs
        of ``─``; a down link dotted (``:`` and ``·``) with an ``X``, drops marked ``*``."""
        (x1, y1), (x2, y2) = p, q
        if y1 < y2:
            (x1, y1), (x2, y2) = (x2, y2), (x1, y1)
        colour = DOWN if not lk.up else util_style(lk.utilization)
        if selected:
            colour = f"bold reverse {colour}"
        steps = y1 - y2
        cells: list[tuple[int, int]] = []
        for k in range(1, steps):
            y = y1 - k
            xa = x1 + (x2 - x1) * (k - 0.5) / steps
            xb = x1 + (x2 - x1) * (k + 0.5) / steps
            lo, hi = sorted((round(xa), round(xb)))
            if hi - lo <= 1:
                x = round((xa + xb) / 2)
                ch = "|" if abs(xb - xa) < 0.4 else ("/" if xb > xa else "\\")
                ch = ":" if not lk.up else ch
                cells.append((x, y))
                self._put(grid, style, x, y, ch, colour)
            else:
                for x in range(lo, hi + 1):
                    cells.append((x, y))
                    self._put(grid, style, x, y, "─" if lk.up else "·", colour)
        if cells and (not lk.up or lk.drops):
            x, y = cells[len(cells) // 2]
            self._put(grid, style, x, y, "X" if not lk.up else "*", DOWN if not lk.up else DROPS)

    @staticmethod
    def _put(grid, style, x: int, y: int, ch: str, colour: str) -> None:
        if 0 <= y < len(grid) and 0 <= x < len(grid[y]):
            grid[y][x] = ch
            style[y][x] = colour

    def _info(self, lk: LinkView | None) -> Text:
        t = Text()
        if lk is None:
            return t
        state = Text(" up ", "bold green") if lk.up else Text(" DOWN ", DOWN)
        rate = f"{lk.bw_mbit:g}" if lk.bw_mbit else "unshaped"
        t.append(f"{self.snap.fabric} ", "cyan")
        t.append(f"[{lk.key}]", "bold")
        t.append(state)
        t.append(f" {lk.mbit:.1f}/{rate} Mbit/s ({lk.utilization:.0%})",
                 util_style(lk.utilization))
        t.append(f" {lk.tx_bytes / 1e6:.1f} MB")
        t.append(f"  drops {lk.drops}", DROPS if lk.drops else "")
        if lk.loss_percent:
            t.append(f"  loss {lk.loss_percent:g}%", "yellow")
        t.append("\n")
        t.append(legend())
        return t
