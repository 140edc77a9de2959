"""Jobs: progress, a sparkline of iteration times, completion time and the verified flag."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.backend import Snapshot

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """Unicode block sparkline of ``values`` (min to max)."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(BLOCKS[int((v - lo) / span * (len(BLOCKS) - 1))] for v in values)


def bar(fraction: float, width: int = 12) -> str:
    n = int(round(max(0.0, min(1.0, fraction)) * width))
    return "█" * n + "░" * (width - n)


def comparison_line(c: dict) -> str:
    """A comparison in one line: arm / baseline, the ratio of medians, its 95 % interval, the
    verdict and N, e.g. ``aware / naive completion_s 0.56 [0.47, 0.69] better (n=3)``."""
    lo, hi = ("?" if x is None else f"{x:.2f}" for x in c["ratio_ci95"])
    ratio = "-" if c["ratio_median"] is None else f"{c['ratio_median']:.2f}"
    return (f"{c['arm']} / {c['baseline']} {c['metric']} {ratio} [{lo}, {hi}] "
            f"{c['verdict'].replace('_', ' ')} (n={c['n']})")


class JobsPanel(Static):
    """One line per job of the scenario."""

    def update_snapshot(self, snap: Snapshot) -> None:
        self.update(self.render_jobs(snap))

    @staticmethod
    def render_jobs(snap: Snapshot) -> Text:
        if not snap.jobs:
            return Text("No jobs in this scenario (jobs run after the fault timeline).",
                        style="italic")
        t = Text()
        width = min(24, max(10, *(len(j.name) for j in snap.jobs)))
        for j in snap.jobs:
            t.append(f"{j.name:<{width}.{width}} ", "bold")
            t.append(bar(j.progress), "green" if j.progress >= 1 else "yellow")
            t.append(f" {j.progress:4.0%} ")
            if j.iteration_s:
                t.append(sparkline(j.iteration_s), "cyan")
                t.append(f" {min(j.iteration_s) * 1e3:.0f}-{max(j.iteration_s) * 1e3:.0f} ms ")
            if j.completion_s is not None:
                t.append(f" done {j.completion_s:.2f} s")
            if j.verified is not None:
                t.append(" verified ✓" if j.verified else " NOT verified",
                         "green" if j.verified else "bold red")
            if j.detail:
                t.append(f"\n   {j.detail}", "dim")
            if j.error:
                t.append(f"\n   {j.error[:70]}", "red")
            t.append("\n")
        for c in snap.comparisons:
            t.append(comparison_line(c) + "\n",
                     {"better": "green", "worse": "bold red"}.get(c["verdict"], "dim"))
        return t
