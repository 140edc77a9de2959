"""The HTML report of a results document (``nslab report RESULTS.json --html OUT``): one
self-contained page, plotly's JavaScript inlined once (about 4.7 MB), so it opens offline and
from CI artifacts; no file or address outside the page is loaded. Sections follow the
document: the run, its fidelity and timeline, clock sync, one-way delays, collocation, jobs,
links and CPU, load, CASSINI, two_step, pacer, the agents' cost, and the printed report.
A section the document lacks is left out. Plots: ``report.figures``.
"""
from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence

import plotly.io as pio
from plotly.offline import get_plotlyjs

from contracts.results import Results, validate
from contracts.results.agents import Stats
from contracts.results.lab import fidelity_line
from report import figures as F
from report.text import report as text_report

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 0 16px 40px; color: #222; }
h1 { font-size: 22px; margin: 18px 0 4px; } h2 { font-size: 17px; margin: 28px 0 6px;
  border-bottom: 1px solid #ddd; padding-bottom: 3px; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.banner { padding: 6px 10px; border-radius: 4px; margin: 8px 0; }
.ok { background: #e6f4ea; } .bad { background: #fde8e8; } .muted { color: #666; }
figure { margin: 8px 0; } pre { background: #f7f7f7; padding: 8px; overflow-x: auto; }
"""


def _e(x) -> str:
    return html.escape("-" if x is None else str(x))


def number(x: float) -> str:
    """A float as a person reads it: 4 significant digits, no exponent (``2.159``,
    ``0.04231``, ``189881``)."""
    return f"{x:.0f}" if abs(x) >= 1e4 else f"{x:.4g}"


def _cell(c) -> str:
    if isinstance(c, bool) or not isinstance(c, int | float):
        return f"<td>{_e(c)}</td>"
    return f'<td class="n">{_e(number(c) if isinstance(c, float) else c)}</td>'


def table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    """An HTML table, every cell escaped; numbers right-aligned (floats as ``number``), None
    shown as ``-``."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _p(text: str, cls: str = "") -> str:
    return f'<p class="{cls}">{_e(text)}</p>' if cls else f"<p>{_e(text)}</p>"


def _figure(figs: Mapping, key: str) -> str:
    fig = figs.get(key)
    if fig is None:
        return ""
    div = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"plot-{key}",
                      config={"displaylogo": False, "responsive": True})
    return f'<figure id="fig-{key}">{div}</figure>'


def _stats_row(name: str, off: Stats, drift: Stats, converged) -> list:
    return [name, off.p50, off.p99, off.max, drift.p50, drift.p99, drift.max, off.n,
            converged]


def _run(doc: Results) -> str:
    sc, lab, fid = doc.scenario, doc.lab, doc.lab.fidelity
    td = doc.teardown
    out = [_p(f"scenario {sc.source}, seed {sc.seed}, {sc.duration_s} s; written "
              f"{doc.created}", "muted"),
           table(["lab", "fabric", "nodes", "VMs", "links", "bring-up s", "teardown s",
                  "teardown"],
                 [[lab.name, lab.fabric, lab.nodes, len(lab.vms), len(lab.links),
                   lab.bringup_s, lab.teardown_s,
                   "clean" if td.clean else "LEFTOVERS " + ", ".join(td.leftovers)]])]
    if fid.samples and fid.cpu_busy and fid.softirq:
        cls = "bad" if fid.saturated else "ok"
        out.append(f'<div class="banner {cls}">{_e(fidelity_line(fid))}</div>')
    missing = [c for c in lab.capabilities.values() if not c.ok]
    if missing:
        out.append("<p>Missing on this machine (<code>nslab doctor</code>):</p>" + table(
            ["feature", "disables", "fix"], [[c.name, c.disables, c.fix] for c in missing]))
    hosts: dict[str, list[str]] = {}
    for vm, host in doc.truth.placements.items():
        hosts.setdefault(host, []).append(vm)
    oscs = doc.truth.clocks.oscillators
    out.append(table(["physical host", "VMs (start)", "base drift ppm"],
                     [[h, " ".join(vms), oscs[h].base_ppm if h in oscs else None]
                      for h, vms in sorted(hosts.items())]))
    return "".join(out)


def _sync(doc: Results, figs: Mapping) -> str:
    s = doc.sync
    rows = [_stats_row("nslab (Huygens)", s.offset_error_us, s.drift_error_ppm,
                       s.converged_s),
            _stats_row("NTP-style (same probes)", s.baseline_ntp.offset_error_us,
                       s.baseline_ntp.drift_error_ppm, None)]
    if s.chrony:
        rows.append(_stats_row(f"chrony (server {s.chrony.server})", s.chrony.offset_error_us,
                               s.chrony.drift_error_ppm, s.chrony.converged_s))
    if s.clock_daemons:
        rows += [_stats_row(f"{r.daemon} in {r.vm} (against {s.clock_daemons.server})",
                            r.offset_error_us, r.drift_error_ppm, r.converged_s)
                 for r in s.clock_daemons.rows]
    return (_p(f"Against the truth, reference VM {s.reference}, {s.windows} windows; "
               f"converged: every later window's offset errors within {s.converged_us} us.")
            + table(["estimate", "offset |err| p50 us", "p99 us", "max us",
                     "drift |err| p50 ppm", "p99 ppm", "max ppm", "n", "converged after s"],
                    rows)
            + _figure(figs, "clock_error"))


def _collocation(doc: Results) -> str:
    c = doc.collocation
    return table(["found by the agents", "confidence"],
                 [[" ".join(g.members), g.confidence] for g in c.groups]) + _p(
        f"truth: {', '.join('{' + ' '.join(g) + '}' for g in c.truth_groups)}; pairwise "
        f"precision {c.precision}, recall {c.recall}; equal to the truth from "
        f"{c.detected_after_s} s after the agents started")


def _jobs(doc: Results, figs: Mapping) -> str:
    rows = []
    for j in doc.jobs:
        it, pl = j.iteration_s, j.placement
        rows.append([j.name, j.collective, j.bytes, " ".join(pl.vms) if pl else None,
                     pl.shared_host_ranks if pl else None, j.completion_s,
                     it.p50 if it else None, it.p99 if it else None,
                     round(j.busbw_bit_s / 1e6, 1) if j.busbw_bit_s else None,
                     j.verified, j.error])
    out = table(["job", "collective", "bytes", "VMs (rank order)", "ranks sharing a host",
                 "completion s", "iteration p50 s", "p99 s", "busbw Mbit/s", "verified",
                 "error"], rows)
    cmp_ = doc.placement_comparison
    if cmp_:
        out += _p(f"collocation-aware placement: {number(cmp_.aware_s)} s against naive "
                  f"{number(cmp_.naive_s)} s (ratio {cmp_.ratio}); avoided shared hosts: "
                  f"{cmp_.aware_avoided_shared_hosts}")
    return out + _figure(figs, "iterations") + _figure(figs, "trace")


def _links(doc: Results, figs: Mapping) -> str:
    out = _figure(figs, "links") + _figure(figs, "cpu")
    queues = doc.lab.fidelity.queues
    if queues:
        out += _p("Link directions whose queue held packets (lab.saturation):") + table(
            ["direction", "rate Mbit/s", "queued samples", "sent/rate p50 while queued",
             "starved samples", "CPU-limited"],
            [[q.link, q.bw_mbit, q.queued_samples, q.rate_ratio.p50, q.starved_samples,
              q.cpu_limited] for q in queues])
    return out


def _load(doc: Results) -> str:
    return table(["flow", "protocol", "at s", "for s", "requested Mbit/s", "goodput Mbit/s",
                  "retransmits", "lost %", "error"],
                 [[f"{f.src}->{f.dst}", f.protocol, f.at_s, f.duration_s, f.requested_mbit,
                   f.mbit, f.retransmits, f.lost_percent, f.error] for f in doc.load])


def _cassini(doc: Results, figs: Mapping) -> str:
    rows = [[s.name, s.score, s.unshifted_score, s.predicted_compatible,
             " ".join(f"{j} {t:.3f}" for j, t in (s.shifts_s or {}).items()), s.error]
            for s in doc.cassini.sets]
    return (table(["set", "score", "unshifted", "predicted compatible", "shifts s", "error"],
                  rows)
            + _p(f"the scores rank the sets as their measured gains: "
                 f"{doc.cassini.score_ranks_gains}") + _figure(figs, "cassini"))


def _two_step(doc: Results, figs: Mapping) -> str:
    ts = doc.two_step
    rows = [[s.name, " ".join(s.vms), s.pacer, s.cc, s.completion_s, s.fabric_drops,
             s.probes_lost, s.retransmits, s.rtos, s.owd_p99_us, s.verified, s.error]
            for s in ts.steps]
    ratios = ", ".join(f"{k} {v} (seed product {ts.seed_ratios.get(k)})"
                       for k, v in ts.ratios.items())
    return (table(["step", "VMs", "pacer", "cc", "completion s", "fabric drops",
                   "pacer probes lost", "retransmits", "RTOs", "OWD p99 us", "verified",
                   "error"], rows)
            + _p(f"completion as a fraction of naive: {ratios}") + _figure(figs, "two_step"))


def _pacer(doc: Results) -> str:
    p = doc.pacer
    rows = [[vm, r.mode, r.synced, r.status, r.net.retrans_segs, r.net.timeouts,
             sum(d.holds for d in r.dests.values()),
             round(sum(d.held_ms for d in r.dests.values()), 1),
             sum(d.probes_sent for d in r.dests.values()),
             sum(d.probes_lost for d in r.dests.values())]
            for vm, r in p.reports.items()]
    return _p(f"threshold T {p.threshold_us} us, longest hold {p.max_hold_us} us, probes "
              f"every {p.probe_us} us; each VM's last report of the paced step:") + table(
        ["VM", "mode", "synced", "status", "retransmitted segments", "RTOs", "holds",
         "held ms", "probes sent", "probes lost"], rows)


def _comparisons(doc: Results, figs: Mapping) -> str:
    rows = [[c.study, c.arm, c.baseline, c.metric, c.n, c.medians.get(c.arm),
             c.medians.get(c.baseline), c.ratio_median,
             " - ".join("?" if x is None else number(x) for x in c.ratio_ci95), c.verdict,
             c.saturated_n, "" if c.reference is None else f"{c.reference_source} {c.reference}"]
            for c in doc.comparisons]
    return _figure(figs, "comparisons") + table(
        ["study", "arm", "baseline", "metric", "n", "arm median", "baseline median",
         "ratio", "95 % interval", "verdict", "saturated", "reference"], rows)


def _agents(doc: Results) -> str:
    a = doc.agents
    if a.error:
        return _p(a.error, "bad")
    return table(["run s", "CPU per agent p50", "max", "coordinator CPU", "probe bit/s p50",
                  "agent RSS MiB p50", "coordinator RSS MiB"],
                 [[a.run_s, a.agent_cpu_core.p50, a.agent_cpu_core.max,
                   a.coordinator_cpu_core, a.probe_bit_s.p50, a.agent_rss_mb.p50,
                   a.coordinator_rss_mb]])


def sections(doc: Results) -> list[tuple[str, str]]:
    """(title, HTML) of every section the document has, in page order."""
    figs = F.figures(doc)
    out = [("Run", _run(doc)), ("Timeline", _figure(figs, "timeline"))]
    if doc.sync:
        out.append(("Clock synchronization", _sync(doc, figs)))
    if doc.owd_us and doc.owd_us.pairs:
        out.append(("One-way delay", _figure(figs, "owd")))
    if doc.collocation:
        out.append(("Collocation", _collocation(doc)))
    if doc.jobs:
        out.append(("Jobs", _jobs(doc, figs)))
    out.append(("Links and CPU", _links(doc, figs)))
    if doc.comparisons:
        out.append(("Comparisons", _comparisons(doc, figs)))
    optional = (("load", "Background load", lambda: _load(doc)),
                ("cassini", "CASSINI", lambda: _cassini(doc, figs)),
                ("two_step", "two_step", lambda: _two_step(doc, figs)),
                ("pacer", "Pacer", lambda: _pacer(doc)),
                ("agents", "Agents' cost", lambda: _agents(doc)))
    out += [(title, make()) for key, title, make in optional if getattr(doc, key)]
    out.append(("The printed report", f"<details><summary>nslab run's text</summary><pre>"
                                      f"{_e(text_report(doc))}</pre></details>"))
    return [(t, body) for t, body in out if body]


def render(results: Results | Mapping) -> str:
    """The whole page (HTML text) of a results document.

    Raises:
        pydantic.ValidationError: not a valid ``nslab.results/1`` document.
    """
    doc = validate(results)
    sc = doc.scenario
    title = f"nslab report: {sc.name} (seed {sc.seed})"
    body = "".join(f'<section id="{_e(t.lower().replace(" ", "-"))}"><h2>{_e(t)}</h2>{b}'
                   "</section>" for t, b in sections(doc))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{_e(title)}</title><style>{CSS}</style>"
            f'<script type="text/javascript">{get_plotlyjs()}</script></head>'
            f"<body><h1>{_e(title)}</h1>{body}</body></html>\n")


def write(results: Results | Mapping, path: str) -> None:
    """Write ``render(results)`` to ``path``.

    Raises:
        pydantic.ValidationError: not a valid document. OSError: the file.
    """
    text = render(results)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
