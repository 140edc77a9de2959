"""Time-series plots (textual-plotext): one titled plot of named series over the lab's time.

``SeriesPlot.show(title, unit, series)`` redraws with ``series`` ``{label: (times s,
values)}``; labels and colours keep the order given (natural order of VMs, a->b before b->a).
"""
from __future__ import annotations

from textual_plotext import PlotextPlot

COLOURS = ("cyan", "orange", "green", "magenta", "yellow", "blue", "red", "white")


class SeriesPlot(PlotextPlot):
    """A line plot of time series; ``shown`` keeps the last title and labels (tests)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.shown: tuple[str, list[str]] = ("", [])

    def show(self, title: str, unit: str, series: dict[str, tuple[list, list]]) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        drawn = [k for k, (xs, _) in series.items() if xs]
        plt.title(title if drawn else f"{title}: no data yet")
        plt.xlabel("s")
        plt.ylabel(unit)
        many = len(drawn) > len(COLOURS)
        for i, label in enumerate(drawn):
            xs, ys = series[label]
            plt.plot(xs, ys, label=None if many else label, color=COLOURS[i % len(COLOURS)],
                     marker="braille")
        self.shown = (title, drawn)
        self.refresh()
