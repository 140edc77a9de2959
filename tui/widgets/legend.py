"""The fabric's colours and marks, one each, and the legend line that explains them.

Utilization runs grey, green, yellow, orange to red (saturated, >= 85 % of the rate); the other
states have their own mark and a colour no utilization uses: a down link is a dotted magenta
line with ``X``, a link dropping packets now has a white ``*``, a VM under a CPU hog is a
black-on-cyan label, a paused VM a grey one. Colours are RGB, not the terminal's ANSI palette
(which draws yellow and orange alike).
"""
from __future__ import annotations

from rich.text import Text

SCALE = ((0.05, "#808080"), (0.3, "#2eb82e"), (0.6, "#e6e600"), (0.85, "#ff9900"))
"""(utilization below, colour) in increasing order; at and above the last: ``SATURATED``."""
SATURATED = "#ff2020"
DOWN = "bold #ff40ff"
DROPS = "bold #ffffff"
HOG = "bold #000000 on #00d7ff"
PAUSED = "bold #ffffff on #5f5f5f"
SWITCH = "bold #87afff"
"""Leaf and spine labels: a blue apart from the down magenta."""
HOST = "#af87d7"
"""The physical hosts' brackets under their VMs."""


def util_style(u: float) -> str:
    """Colour of a link at utilization ``u`` (0..1)."""
    for limit, colour in SCALE:
        if u < limit:
            return colour
    return SATURATED


def legend() -> Text:
    """One line of 66 columns (it fits the fabric beside the log at 120): the utilization
    scale up to saturated (red, >= 85 %), then down, dropping now, CPU hog and paused."""
    t = Text()
    for limit, colour in SCALE:
        t.append("──", colour)
        t.append(f"<{limit:.0%} ")
    for mark, style, what in (("──", SATURATED, f"≥{SCALE[-1][0]:.0%} "), (":X", DOWN, " down "),
                              ("*", DROPS, " drop "), ("vm", HOG, " hog "),
                              ("vm", PAUSED, " paused")):
        t.append(mark, style)
        t.append(what)
    return t
