"""The report's plots, one function per plot: a results document (``contracts.results.Results``)
in, a plotly ``Figure`` out, or None when the document lacks what the plot shows (a section
that was not measured, a document written before its series existed). Pure: no file, no
browser. The page around them is ``report.page``.

Times are s after bring-up (the truth timeline's clock); faults of the timeline are marked on
every plot over time (a dotted line and the fault's kind), jobs as shaded spans.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.colors import qualitative

from agents.owd import natural_key
from contracts.events import FAULT_KINDS, describe
from contracts.results import Results

PALETTE = qualitative.Plotly
LAYOUT = dict(template="plotly_white", height=380, margin=dict(l=60, r=20, t=50, b=45))


def _figure(title: str, **layout) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(**{**LAYOUT, "title": dict(text=title, x=0.01, y=0.98), **layout})
    return fig


def fault_times(doc: Results) -> list[tuple[float, str]]:
    """(t_s, kind) of every fault of the truth timeline (not the notes), in time order."""
    return [(e.t_s, e.kind) for e in doc.truth.faults if e.kind in FAULT_KINDS]


def job_spans(doc: Results) -> list[tuple[str, float, float]]:
    """(job, start, end) s after bring-up, from the timeline's ``job_start``/``job_end``
    notes; a job without its end is left out."""
    starts: dict[str, float] = {}
    spans = []
    for e in doc.truth.faults:
        if e.kind == "job_start":
            starts[e.target] = e.t_s
        elif e.kind == "job_end" and e.target in starts:
            spans.append((e.target, starts.pop(e.target), e.t_s))
    return spans


def _mark_timeline(fig: go.Figure, doc: Results) -> None:
    for name, a, b in job_spans(doc):
        fig.add_vrect(x0=a, x1=b, fillcolor="#9ecae1", opacity=0.18, line_width=0,
                      annotation_text=f"job {name}", annotation_position="top left",
                      annotation_font_size=9)
    for t, kind in fault_times(doc):
        fig.add_vline(x=t, line_dash="dot", line_color="#d62728", line_width=1,
                      annotation_text=kind, annotation_font_size=9,
                      annotation_font_color="#d62728", annotation_textangle=-90)


def worst_error(per_vm: dict[str, list[float | None]], n: int) -> list[float | None]:
    """Per window, the largest |error| over the VMs (None where no VM had one)."""
    out: list[float | None] = []
    for i in range(n):
        got = [abs(v[i]) for v in per_vm.values() if i < len(v) and v[i] is not None]
        out.append(max(got) if got else None)
    return out


def clock_error(doc: Results) -> go.Figure | None:
    """|offset error| (us, log scale) over time from ``sync.series``: per window the largest
    over the VMs, nslab's estimate (solid) against the NTP-style baseline on the same probes
    (dotted); each VM's own pair of lines is in the legend, hidden until clicked."""
    series = doc.sync.series if doc.sync else None
    if series is None or not series.offset_error_us:
        return None
    fig = _figure(f"Clock offset error vs truth (reference {doc.sync.reference}): nslab "
                  "(solid) against the NTP-style baseline (dotted)",
                  xaxis_title="s after bring-up", yaxis_title="|offset error|, us",
                  yaxis_type="log")
    n = len(series.t_s)
    for label, per_vm, dash in (("nslab", series.offset_error_us, "solid"),
                                ("NTP-style", series.baseline_ntp_offset_error_us, "dot")):
        fig.add_trace(go.Scatter(
            x=series.t_s, y=worst_error(per_vm, n), mode="lines+markers",
            name=f"{label}, worst VM", line=dict(color="#222", dash=dash, width=3),
            hovertemplate=f"{label} worst VM %{{x:.1f}} s: %{{y:.3f}} us<extra></extra>"))
    for k, (vm, errs) in enumerate(series.offset_error_us.items()):
        colour = PALETTE[k % len(PALETTE)]
        for label, values, dash in (
                ("nslab", errs, "solid"),
                ("NTP-style", series.baseline_ntp_offset_error_us.get(vm), "dot")):
            if values is None:
                continue
            fig.add_trace(go.Scatter(
                x=series.t_s, y=[abs(v) if v is not None else None for v in values],
                customdata=values, mode="lines+markers", name=f"{vm} {label}",
                legendgroup=vm, line=dict(color=colour, dash=dash), marker_size=4,
                visible="legendonly",
                hovertemplate=f"{vm} {label}<br>%{{x:.1f}} s: %{{customdata:.3f}} us"
                              "<extra></extra>"))
    _mark_timeline(fig, doc)
    return fig


def owd_heatmap(doc: Results) -> go.Figure | None:
    """One-way delay p50 (us) from each VM (row) to each VM (column), from ``owd_us``; the
    hover gives min, p50, p99 and the probes counted."""
    owd = doc.owd_us
    if owd is None or not owd.pairs:
        return None
    vms = sorted({v for k in owd.pairs for v in k.split("->")}, key=natural_key)
    z, info = [], []
    for a in vms:
        row, row_info = [], []
        for b in vms:
            p = owd.pairs.get(f"{a}->{b}")
            row.append(p.p50_us if p else None)
            row_info.append([p.min_us, p.p99_us, p.n] if p else [None, None, 0])
        z.append(row)
        info.append(row_info)
    fig = _figure("One-way delay p50, us (row -> column)", height=120 + 40 * len(vms),
                  xaxis_title="to", yaxis_title="from")
    fig.add_trace(go.Heatmap(
        z=z, x=vms, y=vms, customdata=info, colorscale="Viridis", colorbar_title="us",
        texttemplate="%{z:.1f}", hoverongaps=False,
        hovertemplate="%{y} -> %{x}<br>p50 %{z:.1f} us<br>min %{customdata[0]:.1f} us, "
                      "p99 %{customdata[1]:.1f} us<br>%{customdata[2]} probes<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return fig


def iteration_times(doc: Results) -> go.Figure | None:
    """Each job's iteration time (s; its slowest rank) per iteration, and its collective
    time (dotted), from ``jobs[].iteration_times_s`` and ``comm_times_s``."""
    jobs = [j for j in doc.jobs or [] if j.iteration_times_s]
    if not jobs:
        return None
    fig = _figure("Job iteration times (slowest rank): iteration (solid), collective "
                  "(dotted)", xaxis_title="iteration", yaxis_title="s")
    for k, j in enumerate(jobs):
        colour = PALETTE[k % len(PALETTE)]
        where = " ".join(j.placement.vms) if j.placement else ""
        for label, values, dash in (("iteration", j.iteration_times_s, "solid"),
                                    ("collective", j.comm_times_s, "dot")):
            if values:
                fig.add_trace(go.Scatter(
                    x=list(range(1, len(values) + 1)), y=values, mode="lines+markers",
                    name=f"{j.name} {label}", legendgroup=j.name, marker_size=4,
                    line=dict(color=colour, dash=dash),
                    hovertemplate=f"{j.name} ({where}) {label} %{{x}}: %{{y:.4f}} s"
                                  "<extra></extra>"))
    return fig


TRACE_COLOURS = {"compute": "#1f77b4", "collective": "#ff7f0e", "send": "#2ca02c",
                 "recv": "#2ca02c", "delay": "#bbbbbb"}


def trace_timeline(doc: Results) -> go.Figure | None:
    """Every trace job's last timed pass per rank: one bar per operation from its start to
    its end (s from the rank's pass start on its VM clock), coloured by kind, from
    ``jobs[].trace.timeline``."""
    jobs = [j for j in doc.jobs or [] if j.trace is not None]
    if not jobs:
        return None
    fig = _figure("Trace jobs: the last pass per rank (compute, collectives, send/recv, "
                  "delays)", xaxis_title="s from the pass start", barmode="overlay",
                  height=max(LAYOUT["height"], 60 + 22 * sum(len(j.trace.timeline)
                                                            for j in jobs)))
    rows: dict[str, dict[str, list]] = {}
    for j in jobs:
        for tl in j.trace.timeline:
            for i, start, end in tl.ops:
                op = j.trace.ops[i]
                r = rows.setdefault(op.kind, {"y": [], "base": [], "x": [], "text": []})
                r["y"].append(f"{j.name} rank {tl.rank}")
                r["base"].append(start)
                r["x"].append(end - start)
                r["text"].append(op.name)
    for kind, r in rows.items():
        fig.add_trace(go.Bar(y=r["y"], base=r["base"], x=r["x"], orientation="h", name=kind,
                             hovertext=r["text"], marker_color=TRACE_COLOURS[kind],
                             opacity=0.5 if kind == "collective" else 0.9,
                             hovertemplate="%{hovertext}: %{base:.4f} + %{x:.4f} s"
                                           "<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return fig


def link_utilization(doc: Results) -> go.Figure | None:
    """Each shaped link direction's utilization (rate sent / configured rate, 0-1) over
    time, one row per direction, from ``lab.fidelity.series``."""
    series = doc.lab.fidelity.series
    if series is None or not series.links:
        return None
    labels = sorted(series.links, key=lambda k: [natural_key(n) for n in k.split("->")])
    fig = _figure("Link utilization (rate sent / configured rate)",
                  height=160 + 18 * len(labels), xaxis_title="s after bring-up")
    fig.add_trace(go.Heatmap(
        z=[series.links[k] for k in labels], x=series.t_s, y=labels, zmin=0, zmax=1,
        colorscale="YlOrRd", colorbar_title="sent / rate", hoverongaps=False,
        hovertemplate="%{y}<br>%{x:.1f} s: %{z:.0%}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", tickfont_size=10)
    _mark_timeline(fig, doc)
    return fig


def cpu_busy(doc: Results) -> go.Figure | None:
    """The machine's CPU over time: busy fraction of all cores and of the busiest core, with
    the 90 % line of the fidelity rules (``lab.saturation``)."""
    series = doc.lab.fidelity.series
    if series is None or not series.t_s:
        return None
    fig = _figure("Machine CPU (fidelity): busy fraction", xaxis_title="s after bring-up",
                  yaxis_title="busy", yaxis_range=[0, 1.05], yaxis_tickformat=".0%")
    for name, values in (("all cores", series.cpu_busy), ("busiest core",
                                                          series.busiest_core)):
        fig.add_trace(go.Scatter(x=series.t_s, y=values, mode="lines", name=name,
                                 hovertemplate=f"{name} %{{x:.1f}} s: %{{y:.0%}}"
                                               "<extra></extra>"))
    fig.add_hline(y=0.9, line_dash="dash", line_color="grey", annotation_text="90 %: hot",
                  annotation_font_size=9)
    _mark_timeline(fig, doc)
    return fig


def timeline(doc: Results) -> go.Figure | None:
    """The truth timeline: every event at its time, one row per kind; faults red, the lab's
    notes (jobs, load, bring-up) grey; the hover says it in words."""
    events = doc.truth.faults
    if not events:
        return None
    kinds = list(dict.fromkeys(e.kind for e in events))
    fig = _figure("Timeline (truth): faults and notes", height=140 + 22 * len(kinds),
                  xaxis_title="s after bring-up", showlegend=False)
    fig.add_trace(go.Scatter(
        x=[e.t_s for e in events], y=[e.kind for e in events], mode="markers",
        marker=dict(size=10, symbol=["diamond" if e.kind in FAULT_KINDS else "circle"
                                     for e in events],
                    color=["#d62728" if e.kind in FAULT_KINDS else "#7f7f7f" for e in events]),
        text=[f"{describe(e.kind, e.target, e.params)} ({e.source})" for e in events],
        hovertemplate="%{x:.2f} s: %{text}<extra></extra>"))
    fig.update_yaxes(categoryorder="array", categoryarray=kinds[::-1], tickfont_size=10)
    return fig


def two_step(doc: Results) -> go.Figure | None:
    """The two-step story per step: completion (s, bars) and the fabric's queue drops and
    TCP retransmissions (lines, right axis)."""
    ts = doc.two_step
    if ts is None:
        return None
    names = [s.name for s in ts.steps]
    fig = _figure(f"two_step (job {ts.job}): completion, drops and retransmissions per step",
                  yaxis_title="completion, s", barmode="group",
                  yaxis2=dict(title="packets, segments", overlaying="y", side="right",
                              showgrid=False, rangemode="tozero"),
                  legend=dict(orientation="h", yanchor="top", y=-0.12, x=0))
    fig.add_trace(go.Bar(x=names, y=[s.completion_s for s in ts.steps], name="completion s",
                         marker_color="#1f77b4", text=[s.error or "" for s in ts.steps]))
    for label, attr, colour in (("fabric drops", "fabric_drops", "#d62728"),
                                ("retransmits", "retransmits", "#ff7f0e")):
        fig.add_trace(go.Scatter(x=names, y=[getattr(s, attr) for s in ts.steps], yaxis="y2",
                                 name=label, mode="lines+markers",
                                 line=dict(color=colour)))
    return fig


def cassini(doc: Results) -> go.Figure | None:
    """CASSINI: per job set and mode, the mean and p99 iteration time over every job's
    iterations (s, bars)."""
    cs = doc.cassini
    if cs is None or not cs.sets:
        return None
    fig = _figure("CASSINI: iteration time per set and mode (fair, shifted on synced "
                  "clocks, shifted on raw clocks, unfair shares)", barmode="group",
                  yaxis_title="s")
    modes = list(dict.fromkeys(m for s in cs.sets for m in s.modes))
    for k, mode in enumerate(modes):
        for stat, pattern in (("mean_iteration_s", ""), ("p99_iteration_s", "/")):
            fig.add_trace(go.Bar(
                x=[s.name for s in cs.sets], name=f"{mode} {stat.split('_')[0]}",
                y=[getattr(s.modes[mode], stat) if mode in s.modes else None
                   for s in cs.sets],
                marker=dict(color=PALETTE[k % len(PALETTE)], pattern_shape=pattern)))
    return fig


def comparisons(doc: Results) -> go.Figure | None:
    """Every comparison's ratio of medians with its 95 % interval (error bars; a side
    unbounded at this N has none), one row per compared pair, and each
    repetition's ratio to the baseline's median as a strip of points; 1 marked."""
    cmps = doc.comparisons or []
    if not cmps:
        return None
    fig = _figure("Comparisons: arm / baseline, ratio of medians with 95 % interval",
                  xaxis_title="ratio (below 1: the arm's metric is lower)", height=120 + 40 *
                  len(cmps), yaxis=dict(autorange="reversed"), showlegend=False)
    rows = [f"{c.study}: {c.arm} / {c.baseline} ({c.metric}, n={c.n}, {c.verdict})"
            for c in cmps]
    colour = {"better": "#2ca02c", "worse": "#d62728", "no_difference": "#7f7f7f"}
    for row, c in zip(rows, cmps, strict=True):
        base = c.medians.get(c.baseline)
        pts = [x / base for x in c.samples.get(c.arm, []) if x is not None and base]
        fig.add_trace(go.Scatter(x=pts, y=[row] * len(pts), mode="markers",
                                 marker=dict(size=6, opacity=0.5, color="#1f77b4")))
        if c.ratio_median is None:
            continue
        lo, hi = c.ratio_ci95
        fig.add_trace(go.Scatter(
            x=[c.ratio_median], y=[row], mode="markers",
            marker=dict(size=11, symbol="diamond", color=colour[c.verdict]),
            error_x=dict(type="data", symmetric=False,
                         array=[(hi - c.ratio_median) if hi is not None else 0],
                         arrayminus=[(c.ratio_median - lo) if lo is not None else 0])))
    fig.add_vline(x=1.0, line_dash="dash", line_color="#444")
    return fig


FIGURES = {"timeline": timeline, "clock_error": clock_error, "owd": owd_heatmap,
           "iterations": iteration_times, "trace": trace_timeline,
           "links": link_utilization, "cpu": cpu_busy,
           "two_step": two_step, "cassini": cassini, "comparisons": comparisons}
"""Every plot of the report by its id (``report.page`` places them in its sections)."""


def figures(doc: Results) -> dict[str, go.Figure]:
    """The plots the document can show, by id (``FIGURES``); the others left out."""
    return {k: fig for k, make in FIGURES.items() if (fig := make(doc)) is not None}
