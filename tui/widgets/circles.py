"""CASSINI's circles: per job set, the unified circle with each job's collective arcs where its
time shift puts them, and what every mode measured.

Drawn from the results' ``cassini.sets`` entries (``contracts.studies.cassini.CassiniSet``) in the
snapshot: each job's circle is rebuilt from its measured profile, slot and shift
(``scheduler.plan.circle``) and laid on the unified circle (perimeter ``perimeter_s``), as in
the paper's figures (Rajasekaran et al., CASSINI, NSDI 2024, section 3). Rings, outside in:
``×`` where two or more jobs' collectives meet, then one ring per job (``●`` communicating,
``·`` computing); 12 o'clock is time 0, time runs clockwise.
"""
from __future__ import annotations

import math

import numpy as np
from rich.text import Text
from textual.widgets import Static

from contracts.studies.cassini import CassiniSet
from scheduler.plan import Profile, circle
from tui.backend import Snapshot

RADIUS = 5
"""Rows from the centre to the outer ring; a ring is twice as wide in columns (cells are
about twice as tall as wide)."""
JOB_STYLES = ("cyan", "magenta", "yellow", "green", "blue", "bright_red", "white")
RESOLUTION_S = 0.005


def ring_cells(radius: int, bins: int) -> dict[tuple[int, int], list[int]]:
    """The cells of a ring of ``radius`` rows on a (2 RADIUS + 1) x (4 RADIUS + 1) canvas,
    each with the bins of a ``bins``-bin circle it shows (bin 0 at 12 o'clock, clockwise)."""
    cells: dict[tuple[int, int], list[int]] = {}
    steps = max(bins, 8 * radius)
    for k in range(steps):
        angle = 2 * math.pi * (k + 0.5) / steps
        cell = (RADIUS - round(radius * math.cos(angle)),
                2 * RADIUS + round(2 * radius * math.sin(angle)))
        cells.setdefault(cell, []).append(k * bins // steps)
    return cells


def communicating(cs: CassiniSet) -> dict[str, np.ndarray]:
    """Per job, on the unified circle (the LCM of the slots, in bins of ``RESOLUTION_S``):
    True where the job is in its collective, its circle delayed by its shift."""
    circles = {name: circle(Profile(**prof.model_dump()), cs.slots_s[name], RESOLUTION_S)
               for name, prof in cs.profiles.items()}
    total = math.lcm(*(c.bins for c in circles.values()))
    return {name: c.on(total, round(cs.shifts_s[name] / RESOLUTION_S)) > 0
            for name, c in circles.items()}


def draw_rings(up: dict[str, np.ndarray]) -> list[Text]:
    """The canvas rows: the collision ring, then one ring per job (module docstring)."""
    rows = [[(" ", "")] * (4 * RADIUS + 1) for _ in range(2 * RADIUS + 1)]
    n = min(len(u) for u in up.values())
    meet = sum(u[:n].astype(int) for u in up.values()) >= 2
    rings = [(meet, "×", "bold red")] + [(u, "●", JOB_STYLES[i % len(JOB_STYLES)])
                                          for i, u in enumerate(up.values())]
    for depth, (bits, mark, style) in enumerate(rings):
        radius = RADIUS - depth
        if radius < 1:
            break
        for (r, c), bins in ring_cells(radius, len(bits)).items():
            on = bool(bits[bins].any())
            rows[r][c] = (mark, style) if on else ("·", "dim")
    return [Text.assemble(*row) for row in rows]


def describe_set(cs: CassiniSet) -> list[Text]:
    """The legend beside the rings: score, each job's slot and shift, each mode's times."""
    lines = [Text.assemble((cs.name, "bold"), f" score {cs.score:.2f} (unshifted "
                           f"{cs.unshifted_score:.2f}), circle {cs.perimeter_s:.2f} s")]
    for i, (name, prof) in enumerate(cs.profiles.items()):
        lines.append(Text.assemble(("●", JOB_STYLES[i % len(JOB_STYLES)]),
                                   f" {name}: slot {cs.slots_s[name]:.2f} s, shift "
                                   f"{cs.shifts_s[name]:.3f} s, comm {prof.comm_s:.3f} s"))
    fair = cs.modes.get("fair")
    for mode, m in cs.modes.items():
        if m.mean_iteration_s is None:
            lines.append(Text(f"{mode:14s} {m.error or 'no times'}"[:56], "red"))
            continue
        gain = (f" x{fair.mean_iteration_s / m.mean_iteration_s:.2f}"
                if fair and fair.mean_iteration_s and mode != "fair" else "")
        overlap = "" if m.comm_overlap is None else f" meet {m.comm_overlap:.0%}"
        lines.append(Text(f"{mode:14s} {m.mean_iteration_s:.3f} s{gain}{overlap}"))
    return lines


def render_sets(entries: list[dict]) -> Text:
    """Every planned set: its rings with its legend to the right."""
    if not entries:
        return Text("No CASSINI job sets planned yet (scenario section cassini).",
                    style="italic")
    out = Text()
    for entry in entries:
        cs = CassiniSet.model_validate(entry)
        if cs.score is None or not cs.profiles:
            out.append(f"{cs.name}: not planned ({cs.error})\n", "red")
            continue
        rings, legend = draw_rings(communicating(cs)), describe_set(cs)
        for i in range(max(len(rings), len(legend))):
            out.append_text(rings[i] if i < len(rings) else Text(" " * (4 * RADIUS + 1)))
            out.append("  ")
            out.append_text(legend[i] if i < len(legend) else Text())
            out.append("\n")
    return out


class CirclesView(Static):
    """The CASSINI sets of the snapshot, drawn as circles."""

    def update_snapshot(self, snap: Snapshot) -> None:
        self.update(render_sets(snap.cassini))
