"""The fabric: super-spines, spines, leaves, the physical hosts of a host layer (their NIC
the line up to their leaf) and VMs drawn as a leaf-spine diagram.

Each link is a line coloured by its utilization; a down link is dotted with an ``X`` in the
middle; a link dropping packets now (the last interval) has a ``*`` in the middle; a VM's label
shows a CPU hog or a pause (colours and marks: ``tui.widgets.legend``). Under the VMs, a bracket
per physical host spans the VMs it runs (VMs ordered by leaf, host, name), so collocation is
seen on the fabric. Switches sort in natural order (vm2 before vm10). VM labels shrink to fit
(``vm_labels``): names, names on two staggered rows, their numbers, then a ``·`` per VM. The
selected link (``[``/``]``, arrows, a click near it) is drawn bold and described under the
drawing (rate, bytes, drops, queue), above the legend.
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
from tui.widgets.legend import DOWN, DROPS, HOG, HOST, PAUSED, SWITCH, legend, util_style

LETTERS = "abcdefghijklmnopqrstuvwxyz"
ROOMY = 4
"""Rows between two tiers when the widget has room (more draws long thin lines)."""
INFO_ROWS = 2
"""The selected link's line and the legend under the drawing."""


@dataclass(frozen=True)
class LabelFit:
    """VM labels that fit their slots: ``labels`` one per VM (full names, or their numbers
    when the names do not fit, or ``·``), ``staggered``: every other label one row lower."""

    labels: list[str]
    staggered: bool


def vm_labels(names: list[str], slot: float) -> LabelFit:
    """The widest labels that fit ``slot`` columns per VM with a space between neighbours:
    the names on one row, on two staggered rows (twice the room), the names' numbers
    (``vm17`` -> ``17``) on one or two rows, else a ``·`` per VM (about 3 VMs per column of
    text and more: the VM table names them)."""
    numbers = [n.lstrip(LETTERS) or n for n in names]
    for labels in (names, numbers):
        longest = max((len(x) for x in labels), default=0)
        if longest <= slot - 1:
            return LabelFit(labels, False)
        if longest <= 2 * slot - 1:
            return LabelFit(labels, True)
    return LabelFit(["·"] * len(names), False)


class FabricView(Widget, can_focus=True):
    """Leaf-spine drawing of a ``Snapshot`` with a selectable link."""

    BINDINGS = [
        Binding("right,down", "select(1)", "next link", show=False),
        Binding("left,up", "select(-1)", "prev link", show=False),
        Binding("enter", "open", "detail", show=False),
    ]

    selected: reactive[int] = reactive(0)

    @dataclass
    class LinkSelected(Message):
        """The selected link changed (``a``, ``b``)."""

        a: str
        b: str

    @dataclass
    class NodeClicked(Message):
        """A click on the label of node ``name``."""

        name: str

    class Open(Message):
        """Enter: open the selected link's detail."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.snap: Snapshot | None = None
        self._hits: dict[tuple[int, int], tuple[str, object]] = {}  # drawn cell -> what

    def action_open(self) -> None:
        self.post_message(self.Open())

    def on_click(self, event) -> None:
        """A click on (or next to) a link's line selects it; on a node's label, posts
        ``NodeClicked``."""
        at = event.get_content_offset(self)
        if at is None:
            return
        for dx in (0, -1, 1, -2, 2):
            hit = self._hits.get((at.x + dx, at.y))
            if hit is None:
                continue
            kind, what = hit
            if kind == "node":
                self.post_message(self.NodeClicked(what))
            else:
                self.selected = what
                lk = self.selected_link
                self.post_message(self.LinkSelected(lk.a, lk.b))
                self.refresh()
            return

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
    def get_content_height(self, container, viewport, width: int) -> int:
        """Rows the drawing wants (``height: auto``): tiers ``ROOMY`` rows apart, the VM
        labels, the hosts and the two info lines."""
        snap = self.snap
        if snap is None or not snap.nodes:
            return 1
        tiers = len({n.tier for n in snap.nodes})
        vms = self._tier_rows(snap)[0]
        return (tiers - 1) * (ROOMY + 1) + 1 + self._extra_rows(snap, vms, width) + INFO_ROWS

    def _tier_rows(self, snap: Snapshot) -> dict[int, list[str]]:
        """Node names per tier; VMs ordered by leaf, then physical host, then name, so the VMs
        of a host sit side by side under their leaf."""
        rows = {t: sorted((n.name for n in snap.nodes if n.tier == t), key=natural_key)
                for t in {n.tier for n in snap.nodes}}
        leaves = {n: i for i, n in enumerate(rows.get(1, []))}
        where = {v.name: (leaves.get(v.leaf, -1), natural_key(v.phys)) for v in snap.vms}
        rows[0] = sorted(rows.get(0, []),
                         key=lambda n: (*where.get(n, (-1, ())), natural_key(n)))
        return rows

    @staticmethod
    def _extra_rows(snap: Snapshot, vms: list[str], width: int) -> int:
        """Rows under the VM row: a second, staggered label row and the hosts row."""
        fit = vm_labels(vms, width / max(1, len(vms)))
        return (1 if fit.staggered else 0) + (1 if snap.hosts else 0)

    def render(self) -> Text:
        return self.draw(self.size.width, self.size.height)

    def draw(self, width: int, height: int) -> Text:
        """The drawing in ``width`` x ``height`` cells (at least 20 x 6)."""
        snap = self.snap
        width, height = max(20, width), max(6, height)
        if snap is None or not snap.nodes:
            return Text(f"waiting for the lab ({snap.state if snap else 'starting'}) ...",
                        style="italic")
        rows = self._tier_rows(snap)
        tiers = sorted(rows, reverse=True)
        extra = self._extra_rows(snap, rows[0], width)
        draw_h = max(len(tiers), height - INFO_ROWS - extra)
        gap = max(1, min(ROOMY, (draw_h - len(tiers)) // max(1, len(tiers) - 1)))
        y_of = {t: i * (gap + 1) for i, t in enumerate(tiers)}
        canvas_h = y_of[tiers[-1]] + 1 + extra
        grid = [[" "] * width for _ in range(canvas_h)]
        style = [[""] * width for _ in range(canvas_h)]
        pos: dict[str, tuple[int, int]] = {}
        for t in tiers:
            slot = width / len(rows[t])
            for i, n in enumerate(rows[t]):
                pos[n] = (int(slot * i + slot / 2), y_of[t])
        sel = self.selected_link
        self._hits = {}
        for i, lk in enumerate(snap.links):
            if lk.a in pos and lk.b in pos:
                for cell in self._line(grid, style, pos[lk.a], pos[lk.b], lk, lk is sel):
                    self._hits[cell] = ("link", i)
        for t in tiers:  # labels over the lines
            slot = width / len(rows[t])
            fit = vm_labels(rows[t], slot) if t == 0 else None
            for i, n in enumerate(rows[t]):
                x, y = pos[n]
                if fit is not None:
                    label, y = fit.labels[i], y + (i % 2 if fit.staggered else 0)
                else:
                    label = n if len(n) <= slot - 1 else n.lstrip(LETTERS)
                    label = label[: max(1, int(slot) - 1)]
                vm = snap.vm(n)
                colour = "bold cyan" if t == 0 else SWITCH
                if vm and vm.paused:
                    colour = PAUSED
                elif vm and vm.hog:
                    colour = HOG
                x0 = max(0, min(width - len(label), x - len(label) // 2))
                for j, ch in enumerate(label):
                    self._put(grid, style, x0 + j, y, ch, colour)
                    self._hits[(x0 + j, y)] = ("node", n)
        if snap.hosts:
            self._hosts(grid, style, rows[0], pos, width / max(1, len(rows[0])))
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
        for line in self._info(sel).split("\n"):  # one row each, whatever the width
            line.truncate(width)
            out.append(line)
            out.append("\n")
        out.rstrip()
        return out

    def _hosts(self, grid, style, vms: list[str], pos, slot: float) -> None:
        """The physical hosts on the last row: one bracket ``└─phys1─┘`` under each run of
        side-by-side VMs of a host (a host whose VMs sit under two leaves gets two)."""
        y = len(grid) - 1
        runs: list[tuple[str, list[str]]] = []
        for n in vms:
            v = self.snap.vm(n)
            host = v.phys if v else "?"
            if runs and runs[-1][0] == host:
                runs[-1][1].append(n)
            else:
                runs.append((host, [n]))
        for host, members in runs:
            lo = max(0, int(pos[members[0]][0] - slot / 2 + 1))
            hi = min(len(grid[y]) - 1, int(pos[members[-1]][0] + slot / 2 - 1))
            span = hi - lo + 1
            if span < 1:
                continue
            name = host if len(host) + 2 <= span else host.lstrip(LETTERS)
            bar = (["└"] + ["─"] * (span - 2) + ["┘"]) if span >= 2 else ["╵"]
            if len(name) + 2 <= span:
                at = (span - len(name)) // 2
                bar[at:at + len(name)] = list(name)
            for j, ch in enumerate(bar):
                self._put(grid, style, lo + j, y, ch, HOST)

    def _line(self, grid, style, p, q, lk: LinkView, selected: bool) -> list[tuple[int, int]]:
        r"""Draw one link between label rows: steep parts as ``| / \``, shallow parts as runs
        of ``/`` or ``\`` (a run of ``─`` would read as a link between two switches of a
        tier); a down link dotted (``:`` and ``·``) with an ``X``, a link dropping packets now
        (last interval) marked ``*``. Returns the cells drawn."""
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
                for x in range(lo, hi + 1):  # slanted, so it never reads as a flat link
                    cells.append((x, y))
                    self._put(grid, style, x, y,
                              ("/" if xb > xa else "\\") if lk.up else "·", colour)
        if cells and (not lk.up or lk.drop_rate):
            x, y = cells[len(cells) // 2]
            self._put(grid, style, x, y, "X" if not lk.up else "*", DOWN if not lk.up else DROPS)
        return cells

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
        t.append(f"  drops {lk.drops}", DROPS if lk.drop_rate else "")
        if lk.drop_rate:
            t.append(f" ({lk.drop_rate:g}/s)", DROPS)
        if lk.queue_pkts is not None:
            t.append(f"  queue {lk.queue_pkts}")
        if lk.loss_percent:
            t.append(f"  loss {lk.loss_percent:g}%", "yellow")
        t.append("\n")
        t.append(legend())
        return t
