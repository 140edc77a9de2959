"""The results' time series (lab.series, lab.fidelity.series) and the HTML report's builder
(report.figures, report.page) on documents with known values; the page in a real browser is
test_report_browser.py.

``data/quickstart_report_results.json`` is a real, untrimmed ``nslab run quickstart --json``
document written by this branch's first commit (the first with the series), on this 2-core
machine.
"""
import copy
import json
import re
from pathlib import Path

import pytest

from cli.main import main
from contracts import results as R
from lab.fidelity import series as fidelity_series
from lab.saturation import Interval, LinkInterval
from lab.series import downsample, runs
from report import figures as F
from report import page
from report import text as T
from workloads.traces.summary import summarize

DATA = Path(__file__).parent / "data" / "quickstart_report_results.json"


@pytest.fixture
def doc() -> dict:
    return json.loads(DATA.read_text())


def test_downsample_reduces_runs_of_consecutive_samples():
    assert runs(6, 3) == [range(0, 2), range(2, 4), range(4, 6)]
    assert runs(2, 5) == [range(0, 1), range(1, 2)]
    values = [1, 2, 3, 4, 5, None]
    assert downsample(values, 10) == [1, 2, 3, 4, 5, None]
    assert downsample(values, 3) == [1.5, 3.5, 5.0]
    assert downsample(values, 3, how="max") == [2, 4, 5]
    assert downsample([None, None, 7, 8], 2, how="last") == [None, 8]
    with pytest.raises(ValueError):
        downsample(values, 0)
    with pytest.raises(ValueError):
        downsample(values, 2, how="median")


def test_fidelity_series_is_utilization_per_direction_over_time():
    def iv(busy, links):
        return Interval(core_busy=busy, core_softirq=(0.0, 0.0), busy=sum(busy) / 2,
                        softirq=0.0, links=links)
    up, idle = "leaf1->spine1", "spine1->leaf1"
    ivs = [iv((0.2, 0.4), {up: LinkInterval(100.0, 50.0, True),
                           idle: LinkInterval(100.0, 0.1, False)}),
           iv((0.6, 1.0), {up: LinkInterval(50.0, 50.0, True),
                           idle: LinkInterval(100.0, 0.2, False)}),
           iv((0.0, 0.2), {})]  # the queues could not be read in this one
    s = fidelity_series(ivs, [0.5, 1.0, 1.5])
    assert s["t_s"] == [0.5, 1.0, 1.5]
    assert s["cpu_busy"] == [0.3, 0.8, 0.1] and s["busiest_core"] == [0.4, 1.0, 0.2]
    assert s["links"] == {up: [0.5, 1.0, None]}  # the idle direction (< 1 %) is left out
    half = fidelity_series(ivs, [0.5, 1.0, 1.5], max_points=2)
    # two runs, [0.5 s, 1.0 s] and [1.5 s]: each point ends its run and is its mean
    assert half["t_s"] == [1.0, 1.5] and half["links"][up] == [0.75, None]
    assert half["cpu_busy"] == [0.55, 0.1]


def known(doc: dict) -> dict:
    """The real document with series and delays of known values."""
    d = copy.deepcopy(doc)
    d["sync"]["series"] = {
        "t_s": [1.0, 3.0, 5.0],
        "offset_error_us": {"vm2": [0.5, -2.0, None], "vm10": [-1.0, 0.25, 4.0]},
        "baseline_ntp_offset_error_us": {"vm2": [10.0, -20.0, 30.0], "vm10": [1.0, 2.0, -3.0]}}
    pair = {"min_us": 1.0, "p99_us": 9.0, "n": 5}
    d["owd_us"]["pairs"] = {"vm2->vm10": {**pair, "p50_us": 10.0},
                            "vm10->vm2": {**pair, "p50_us": 20.0},
                            "vm1->vm2": {**pair, "p50_us": 30.0}}
    d["jobs"][0]["iteration_times_s"] = [0.3, 0.2, 0.25]
    d["jobs"][0]["comm_times_s"] = [0.1, 0.1, 0.15]
    d["jobs"][1]["iteration_times_s"] = None  # a job whose ranks failed has none
    d["lab"]["fidelity"]["series"] = {"t_s": [0.5, 1.0], "cpu_busy": [0.25, 0.5],
                                      "busiest_core": [0.5, 1.0],
                                      "links": {"vm10->leaf1": [0.1, 0.2],
                                                "leaf1->spine1": [0.5, None]}}
    return d


def test_figures_plot_the_documents_values(doc):
    res = R.validate(known(doc))
    figs = F.figures(res)
    assert set(figs) == {"timeline", "clock_error", "owd", "iterations", "links", "cpu"}

    clock = figs["clock_error"].data
    worst = {t.name: list(t.y) for t in clock if t.visible is None}
    assert worst == {"nslab, worst VM": [1.0, 2.0, 4.0], "NTP-style, worst VM": [10, 20, 30]}
    per_vm = {t.name: list(t.y) for t in clock if t.visible == "legendonly"}
    assert per_vm["vm2 nslab"] == [0.5, 2.0, None] and per_vm["vm10 NTP-style"] == [1, 2, 3]

    (owd,) = figs["owd"].data
    assert list(owd.x) == list(owd.y) == ["vm1", "vm2", "vm10"]  # natural order
    assert [list(r) for r in owd.z] == [[None, 30.0, None], [None, None, 10.0],
                                        [None, 20.0, None]]

    its = {t.name: list(t.y) for t in figs["iterations"].data}
    assert its == {"naive iteration": [0.3, 0.2, 0.25], "naive collective": [0.1, 0.1, 0.15]}

    (links,) = figs["links"].data
    assert list(links.y) == ["leaf1->spine1", "vm10->leaf1"] and list(links.x) == [0.5, 1.0]
    assert [list(r) for r in links.z] == [[0.5, None], [0.1, 0.2]]

    (events,) = figs["timeline"].data
    assert list(events.x) == [e.t_s for e in res.truth.faults]
    # faults (not notes) marked on the plots over time, jobs shaded between start and end
    faults = [(e.t_s, e.kind) for e in res.truth.faults if e.kind in ("link_down", "link_up")]
    assert F.fault_times(res) == faults
    for key in ("clock_error", "links", "cpu"):
        shapes = figs[key].layout.shapes
        assert [s.x0 for s in shapes if s.type == "line" and s.xref == "x"] == [
            t for t, _ in faults]
        assert [(s.x0, s.x1) for s in shapes if s.type == "rect"] == [
            (a, b) for _, a, b in F.job_spans(res)]
    assert [name for name, _, _ in F.job_spans(res)] == ["naive", "aware"]


def test_figures_leave_out_what_was_not_measured(doc):
    for key in ("sync", "owd_us", "collocation", "jobs", "placement_comparison", "agents",
                "load"):
        doc.pop(key)
    doc["lab"]["fidelity"]["series"] = None
    assert set(F.figures(R.validate(doc))) == {"timeline"}
    html = page.render(doc)
    assert "Clock synchronization" not in html and 'id="fig-owd"' not in html
    assert "<h2>Run</h2>" in html and 'id="fig-timeline"' in html


def test_page_is_one_offline_file_with_every_section(doc):
    html = page.render(known(doc))
    assert html.count("<script") == 1 + len(F.figures(R.validate(known(doc))))  # plotly + 1 each
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=", html)  # nothing loaded
    titles = re.findall(r"<h2>(.*?)</h2>", html)
    assert titles == ["Run", "Timeline", "Clock synchronization", "One-way delay",
                      "Collocation", "Jobs", "Links and CPU", "Background load",
                      "Agents&#x27; cost", "The printed report"]
    for key in ("timeline", "clock_error", "owd", "iterations", "links", "cpu"):
        assert html.count(f'id="fig-{key}"') == 1
    assert "fidelity: SATURATED - cpu0 busy &gt;= 90%" in html  # escaped, in its banner
    assert "<td>vm1 vm2 vm3 vm4</td><td class=\"n\">4</td><td class=\"n\">2.769</td>" in html


def test_page_numbers_read_as_a_person_reads_them():
    assert [page.number(x) for x in (2.159453744, 0.04231, 189880.4, -16.69775)] == [
        "2.159", "0.04231", "189880", "-16.7"]
    assert page.table(["a"], [[None], ["<b>"], [True]]) == (
        "<table><tr><th>a</th></tr><tr><td>-</td></tr><tr><td>&lt;b&gt;</td></tr>"
        "<tr><td>True</td></tr></table>")


def test_nslab_report_text_html_and_errors(doc, tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    assert main(["report", str(path)]) == 0
    assert capsys.readouterr().out.strip() == T.report(doc)
    out = tmp_path / "r.html"
    assert main(["report", str(path), "--html", str(out)]) == 0
    assert out.read_text() == page.render(doc)
    del doc["lab"]["fidelity"]
    doc["scenario"]["seed"] = "x"
    path.write_text(json.dumps(doc))
    assert main(["report", str(path)]) == 1
    err = capsys.readouterr().err
    assert "not a nslab.results/1 document (2 problems: scenario.seed" in err
    assert "lab.fidelity: Field required" in err
    path.write_text("{")
    assert main(["report", str(path)]) == 1
    assert "not JSON" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.json")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_two_step_pacer_and_cassini_sections(doc):
    """The two_step and pacer sections of a real ``nslab run two_step``
    (``data/two_step_sections.json``, see test_results.py) and a CASSINI section of known
    values."""
    doc.update(json.loads((DATA.parent / "two_step_sections.json").read_text()))
    mode = {"mean_iteration_s": 0.3, "p99_iteration_s": 0.4, "jobs": {}}
    doc["cassini"] = {"score_ranks_gains": True, "sets": [
        {"name": "pair", "score": 0.9, "unshifted_score": 0.5, "predicted_compatible": True,
         "shifts_s": {"a": 0.05},
         "modes": {"fair": {**mode, "mean_iteration_s": 0.5}, "shifted_synced": mode}},
        {"name": "trio", "score": 0.2, "unshifted_score": 0.1, "predicted_compatible": False,
         "shifts_s": {"c": 0.0},
         "modes": {"fair": mode}}]}
    res = R.validate(doc)
    figs = F.figures(res)
    bars, drops, retrans = figs["two_step"].data
    steps = doc["two_step"]["steps"]
    assert list(bars.x) == [s["name"] for s in steps]
    assert list(bars.y) == [s["completion_s"] for s in steps]
    assert list(drops.y) == [s["fabric_drops"] for s in steps]
    assert list(retrans.y) == [s["retransmits"] for s in steps]
    cas = {t.name: list(t.y) for t in figs["cassini"].data}
    assert cas == {"fair mean": [0.5, 0.3], "fair p99": [0.4, 0.4],
                   "shifted_synced mean": [0.3, None], "shifted_synced p99": [0.4, None]}
    html = page.render(res)
    assert re.findall(r"<h2>(.*?)</h2>", html)[-5:] == [
        "CASSINI", "two_step", "Pacer", "Agents&#x27; cost", "The printed report"]
    vm1 = res.pacer.reports["vm1"]
    assert (f"<td>vm1</td><td>pace</td><td>{vm1.synced}</td><td>{vm1.status}</td>"
            f'<td class="n">{vm1.net.retrans_segs}</td>') in html
    assert "<td>pair</td><td class=\"n\">0.9</td>" in html and 'id="fig-cassini"' in html


def test_comparisons_in_text_page_and_plot(doc):
    """Repeated comparisons (``session.stats``) show in the printed report with their
    interval and verdict, and in the page as a table and a plot of every repetition."""
    from session import stats
    doc = copy.deepcopy(doc)
    doc["comparisons"] = [
        stats.comparison("placement", "aware", "naive", "completion_s",
                         {"aware": [2.0, 2.1, 1.9, 2.05], "naive": [4.0, 4.2, 3.9, 4.1]},
                         {"aware": [False, True, False, False], "naive": [False] * 4}),
        stats.comparison("sync", "nslab", "ntp", "offset_p99_us",
                         {"nslab": [0.5], "ntp": [0.6]})]
    text = T.report(doc)
    assert re.search(r"placement: aware / naive completion_s 0\.500 \[0\.46\d, 0\.53\d\] "
                     r"n=4, saturated in 1 of 4: BETTER", text), text
    assert "sync: nslab / ntp offset_p99_us 0.833 [?, ?] n=1: no difference at N=1" in text
    figs = F.figures(R.validate(doc))
    pts = figs["comparisons"].data[0].x
    assert len(pts) == 4 and min(pts) == pytest.approx(1.9 / 4.05)
    html = page.render(doc)
    assert "Comparisons" in html and "no_difference" in html and "better" in html


def test_trace_jobs_draw_each_ranks_pass(doc):
    ops = [{"id": 0, "name": "l1 fwd compute", "kind": "compute", "layer": "l1", "phase": "fwd",
            "collective": None, "bytes": None, "group_size": None, "peer": None},
           {"id": 1, "name": "l1 wg ALLREDUCE", "kind": "collective", "layer": "l1",
            "phase": "wg", "collective": "all_reduce", "bytes": 800, "group_size": 2,
            "peer": None}]
    ranks = [{"rank": r, "iteration_s": [0.004], "compute_s": [0.001], "comm_s": [0.003],
              "trace": {"info": {"format": "astra", "parallelism": "DATA", "layers": 1,
                                 "model_parallel_group": None, "compute_s_per_pass": 0.001},
                        "ops": ops, "times": [[[t0, t0 + 1_000_000],
                                               [t0 + 1_000_000, t0 + 4_000_000]]]}}
             for r, t0 in enumerate((10_000_000, 7_000_000_000))]
    doc["jobs"][0]["trace"] = summarize(ranks, "w.txt", 1.0, 1.0, 1.0)
    figs = F.figures(R.validate(doc))
    bars = {t.name: t for t in figs["trace"].data}
    assert set(bars) == {"compute", "collective"}
    assert list(bars["collective"].y) == ["naive rank 0", "naive rank 1"]
    assert list(bars["collective"].base) == [0.001, 0.001]  # each rank's own pass start
    assert list(bars["collective"].x) == pytest.approx([0.003, 0.003])
    assert 'id="fig-trace"' in page.render(doc)
    assert "job naive (all_reduce, w.txt, exposed communication p50 " in T.report(doc)
