"""The results document (``nslab.results/1``): typed models, dump, report, JSON Schema.

``data/quickstart_results.json`` is a real ``nslab run quickstart --json`` document (commit
9321354), trimmed to 4 VMs, 4 links, 3 capabilities and 3 VMs' one-way delays; every field
kind is kept.
"""
import copy
import json
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from contracts import results as R
from contracts.results.lab import Fidelity, fidelity_line
from contracts.studies.two_step import PacerSection
from lab.capabilities import Capability as ProbedCapability
from report import text as T
from session import document
from topo.leafspine import LeafSpine

DATA = Path(__file__).parent / "data" / "quickstart_results.json"


@pytest.fixture
def doc() -> dict:
    return json.loads(DATA.read_text())


def test_real_document_validates(doc):
    res = R.validate(doc)
    assert res.schema_ == R.SCHEMA
    assert res.lab.links[0].bw == 100.0 and res.lab.links[0].delay is None
    assert res.lab.capabilities["netem"].ok is False
    assert [e.kind for e in res.truth.faults][:4] == ["load", "load_done", "link_down",
                                                        "link_up"]
    assert all(e.source == "lab" for e in res.truth.faults)  # written before `source` existed
    assert res.load[0].requested_mbit is None and res.load[0].retransmits == 0
    assert res.sync.offset_error_us.n > 0 and res.sync.converged_s is not None
    assert res.jobs[0].placement.policy == "naive" and res.jobs[1].iteration_s.p99 > 0
    assert res.placement_comparison.aware_avoided_shared_hosts is True
    assert res.teardown.clean


def test_dump_round_trips_the_real_document(doc):
    out = R.dump(R.validate(doc))
    assert set(out) == set(doc)
    assert out["schema"] == R.SCHEMA
    # values are unchanged; fields the producer left out come back as null (or the default)
    # no chrony, no pacers in this run; written before the series existed
    assert out["sync"] == {**doc["sync"], "chrony": None, "clock_daemons": None, "series": None}
    assert out["jobs"] == [{**j, "edge": None, "iteration_times_s": None, "comm_times_s": None,
                            "fabric_drops": None, "drops_by_link": None, "compute": None,
                            "balancer_daemons": None, "trace": None}
                           for j in doc["jobs"]]
    assert out["lab"]["fidelity"]["series"] is None
    assert out["load"][0]["error"] is None and out["load"][0]["lost_percent"] is None
    assert out["lab"]["links"][0]["delay"] is None
    assert out["truth"]["faults"][0]["source"] == "lab"
    assert R.validate(out) == R.validate(doc)


def test_report_prints_the_real_document(doc):
    text = T.report(doc)
    assert text == T.report(R.validate(doc))
    lines = text.splitlines()
    assert lines[0] == "nslab run: quickstart (seed 7, 20.0 s)"
    for line in [
        "  lab quickstart: 12 nodes, 4 VMs, 4 links; up in 0.645 s, down in 0.023 s",
        "    phys1    drift   -1.048 ppm  VMs vm1 vm2",
        "       6.00 s  load        vm5->vm1: duration 4 s, TCP",
        "      12.01 s  link_down   leaf1-spine1",
        "  fidelity: ok - CPU busy p50 52% max 100%, softirq max 48%",  # before per core
        "  load tcp vm5->vm1 at 6.0 s for 4.0 s: 93.138 Mbit/s",
        "  agents: CPU per agent p50 3.8% max 3.9% of a core, coordinator 7.2%; probes p50 "
        "211.7 kbit/s per agent; RSS agent p50 20.4 MiB, coordinator 61.3 MiB",
        "  clock sync vs truth (reference vm1, 13 windows; within 10.0 us after 2.44 s):",
        "    nslab (Huygens)  offset |err| p50 0.046 p99 0.439 max 0.473 us",
        "                     drift  |err| p50 0.0411 p99 498.1347 max 498.139 ppm",
        "         vm1       -     5.6     3.7",
        "  collocation: found {vm1 vm2} 0.97, {vm3 vm4} 0.98, {vm5 vm6} 0.98, {vm7 vm8} 0.98",
        "               precision 1.0 recall 1.0, held since 8.04 s",
        "  job naive (all_reduce, 1000000 B) on vm1 vm2 vm3 vm4 [4 ranks share a host]: "
        "completion 2.080 s, iteration p50 0.2732 s, verified True",
        "  collocation-aware placement: 1.457 s vs naive 2.080 s (ratio 0.701); avoided "
        "shared hosts: True",
    ]:
        assert line in lines
    assert lines[-1] == "  teardown: clean"


def test_absent_sections_are_omitted_not_null(doc, tmp_path):
    for key in R.OPTIONAL_SECTIONS:
        doc.pop(key, None)
    res = R.validate(doc)
    assert res.sync is None and res.jobs is None
    out = R.dump(res)
    assert set(out) == {"schema", "created", "scenario", "lab", "truth", "teardown"}
    path = tmp_path / "r.json"
    R.write(res, str(path))
    assert set(json.loads(path.read_text())) == set(out)
    lines = T.report(res).splitlines()
    assert not [x for x in lines if x.startswith(("  clock sync", "  job ", "  load ",
                                                   "  agents", "  collocation",
                                                   "  cassini"))]
    assert lines[-1] == "  teardown: clean"


def test_null_inside_a_present_section_stays_null(doc):
    doc["sync"]["converged_s"] = None
    doc["sync"]["drift_error_ppm"] = {"p50": None, "p99": None, "max": None, "n": 0}
    doc["agents"]["coordinator_rss_mb"] = None
    out = R.dump(doc)
    assert out["sync"]["converged_s"] is None
    assert out["sync"]["drift_error_ppm"]["p50"] is None
    assert out["agents"]["coordinator_rss_mb"] is None
    text = T.report(doc)
    assert "after not reached" in text and "drift  |err| no data" in text


def test_job_that_failed_before_starting(doc):
    doc["jobs"].append({"name": "aware2", "collective": "all_reduce", "verified": False,
                        "error": "collocation_aware placement: the agents reported no groups "
                                 "yet", "completion_s": None})
    res = R.validate(doc)
    job = res.jobs[-1]
    assert job.placement is None and job.world is None and job.iteration_s is None
    assert R.dump(res)["jobs"][-1]["completion_s"] is None
    assert ("  job aware2 (all_reduce) on -: ERROR collocation_aware placement: the agents "
            "reported no groups yet") in T.report(res).splitlines()


def test_failed_job_and_load_error_report(doc):
    job = doc["jobs"][0]
    job.update(completion_s=None, iteration_s=None, comm_s=None, algbw_bit_s=None,
               busbw_bit_s=None, verified=False, error="rank 2: timed out", failed_ranks=[2])
    doc["load"][0] = {**{k: doc["load"][0][k] for k in ("src", "dst", "at_s", "duration_s",
                                                         "protocol", "requested_mbit")},
                      "error": "unable to connect to server"}
    lines = T.report(doc).splitlines()
    assert "  job naive (all_reduce) on vm1 vm2 vm3 vm4: ERROR rank 2: timed out" in lines
    assert ("  load tcp vm5->vm1 at 6.0 s for 4.0 s: error: unable to connect to server"
            in lines)


def test_fault_source(doc):
    doc["truth"]["faults"][2]["source"] = "timeline"
    doc["truth"]["faults"][3]["source"] = "tui"
    res = R.validate(doc)
    assert [e.source for e in res.truth.faults[2:4]] == ["timeline", "tui"]
    doc["truth"]["faults"][3]["source"] = "cron"
    with pytest.raises(ValidationError) as e:
        R.validate(doc)
    assert ("truth", "faults", 3, "source") in [err["loc"] for err in e.value.errors()]


def test_missing_required_fields_name_their_path(doc):
    del doc["sync"]["baseline_ntp"]["drift_error_ppm"]
    del doc["jobs"][1]["verified"]
    del doc["lab"]["fidelity"]["samples"]
    with pytest.raises(ValidationError) as e:
        R.validate(doc)
    locs = {err["loc"] for err in e.value.errors() if err["type"] == "missing"}
    assert locs == {("sync", "baseline_ntp", "drift_error_ppm"), ("jobs", 1, "verified"),
                    ("lab", "fidelity", "samples")}
    assert "sync.baseline_ntp.drift_error_ppm" in str(e.value)


def test_unknown_and_mistyped_fields_fail(doc):
    bad = copy.deepcopy(doc)
    bad["sync"]["offset_error_us"]["p95"] = 1.0
    with pytest.raises(ValidationError, match="offset_error_us.p95"):
        R.validate(bad)
    bad = copy.deepcopy(doc)
    bad["placement_comparison"]["ratio"] = "fast"
    with pytest.raises(ValidationError, match="placement_comparison.ratio"):
        R.validate(bad)
    bad = copy.deepcopy(doc)
    bad["schema"] = "nslab.results/2"
    with pytest.raises(ValidationError, match="schema"):
        R.validate(bad)


def test_schema_has_every_section():
    schema = R.results_schema()
    top = set(schema["properties"])
    assert top == {"schema", "created", "scenario", "lab", "truth", "teardown",
                   *R.OPTIONAL_SECTIONS}
    assert set(schema["required"]) == {"schema", "created", "scenario", "lab", "truth",
                                       "teardown"}
    defs = schema["$defs"]
    for name in ("LabSection", "Fidelity", "Capability", "TruthSection", "FaultEvent",
                 "SyncSection", "Stats", "OwdSection", "CollocationSection", "JobEntry",
                 "Percentiles", "Placement", "LoadEntry", "AgentsCost", "PlacementComparison",
                 "Teardown"):
        assert name in defs
    assert defs["FaultEvent"]["properties"]["source"]["enum"] == ["lab", "timeline", "step",
                                                                  "tui", "test"]
    json.dumps(schema)


def _models(model: type[BaseModel], seen: set) -> None:
    if model in seen:
        return
    seen.add(model)
    for f in model.model_fields.values():
        for t in _leaves(f.annotation):
            if isinstance(t, type) and issubclass(t, BaseModel):
                _models(t, seen)


def _leaves(tp) -> list:
    args = typing.get_args(tp)
    return [x for a in args for x in _leaves(a)] if args else [tp]


def test_every_numeric_field_says_its_unit():
    seen: set = set()
    _models(R.Results, seen)
    missing = [f"{m.__name__}.{name}" for m in seen for name, f in m.model_fields.items()
               if {int, float} & set(_leaves(f.annotation)) and not f.description]
    assert not missing


NIC = {"host": "phys1", "leaf": "leaf1", "vms": ["vm1", "vm2"], "bw_mbit": 100.0,
       "queue_packets": None, "link_up": True,
       "to_leaf": {"sent_bytes": 12_000_000, "drops": 3, "backlog_packets": 0},
       "from_leaf": {"sent_bytes": 400_000, "drops": 0, "backlog_packets": 0}}
"""A host NIC as ``lab.hostnic.HostLayer.read`` gives it."""


def _fake_lab(doc: dict):
    topo = LeafSpine(spines=1, leaves=2, vms_per_leaf=2, host_bw=100, fabric_bw=100,
                     host_queue=100, fabric_queue=100, vms_per_host=2)
    phys = {vm: topo.nodeInfo(vm)["phys"] for vm in topo.hosts()}
    event = types.SimpleNamespace(t_s=1.5, true_ns=1_800_000_000_000_000_000,
                                  kind="link_down", target="leaf1-spine1", params={},
                                  source="timeline")  # e.g. contracts.events.Event: attributes
    return types.SimpleNamespace(
        topo=topo, name="t", fabric="spray", bringup_s=0.5, teardown_s=0.1, phys=phys,
        leftovers=[], server_clocks=[], server_sync_us=0.0,
        host_layer=types.SimpleNamespace(read=lambda: [NIC]),
        clocks=types.SimpleNamespace(truth=lambda: doc["truth"]["clocks"]),
        timeline=[event, doc["truth"]["faults"][0]])


def test_build_and_document_from_a_lab(doc, tmp_path):
    lab = _fake_lab(doc)
    sc = types.SimpleNamespace(name="t", seed=1, duration_s=5.0)
    caps = {"root": ProbedCapability("root", True, "euid 0", "everything")}
    fid = {"samples": 0, "saturated": None}
    res = document.build(sc, "t.yaml", lab, caps, fid, dict(lab.phys), jobs=doc["jobs"],
                  sync=doc["sync"], placement_comparison=None)
    assert [v.name for v in res.lab.vms] == ["vm1", "vm2", "vm3", "vm4"]
    assert res.lab.links[0].bw == 100 and res.lab.fidelity.cpu_busy is None
    assert res.lab.fabric == "spray"
    assert res.truth.faults[0].source == "timeline" and res.truth.faults[1].kind == "load"
    assert res.truth.host_nics[0].to_leaf.drops == 3 and res.truth.host_nics[0].bw_mbit == 100
    assert res.placement_comparison is None and res.jobs[1].name == "aware"
    out = document.document(sc, "t.yaml", lab, caps, fid, dict(lab.phys), sync=doc["sync"])
    assert "jobs" not in out and "placement_comparison" not in out and "sync" in out
    out["load"] = doc["load"]  # callers may still add sections to the dict
    R.write(out, str(tmp_path / "r.json"))
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["load"][0]["mbit"] == 93.138
    assert "fidelity:" not in T.report(written)
    assert "phys1    NIC to leaf1 100 Mbit/s: sent 12.0 MB up, 0.4 MB down, drops 3 up" in \
        T.report(written)
    with pytest.raises(TypeError, match="unknown results sections: owd"):
        document.build(sc, "t.yaml", lab, caps, fid, {}, owd={})


def test_write_to_stdout(doc, capsys):
    R.write(doc, "-")
    assert json.loads(capsys.readouterr().out)["scenario"]["name"] == "quickstart"


def test_cassini_section_validates_and_reports(doc):
    times = {"mean_iteration_s": 0.3, "p99_iteration_s": 0.4,
             "jobs": {"a": {"p50_s": 0.3, "p99_s": 0.4}}}
    doc["cassini"] = {"score_ranks_gains": None, "sets": [
        {"name": "pair", "score": 1.0, "unshifted_score": 0.5, "predicted_compatible": True,
         "perimeter_s": 0.3, "slots_s": {"a": 0.3}, "shifts_s": {"a": 0.0},
         "profiles": {"a": {"iteration_s": 0.2, "compute_s": 0.1, "comm_s": 0.1,
                            "demand_mbit": 95.0}},
         "modes": {"fair": {**times, "mean_iteration_s": 0.45, "p99_iteration_s": 0.8},
                   "shifted_synced": {**times, "comm_overlap": 0.125},
                   "shifted_raw": {"mean_iteration_s": None, "p99_iteration_s": None,
                                   "error": "rank 0: lost"}}},
        {"name": "trio", "score": None, "predicted_compatible": None, "shifts_s": None,
         "error": "job c: no timings to profile", "modes": {}}]}
    res = R.validate(doc)
    assert res.cassini.sets[0].modes["shifted_synced"].jobs["a"].p99_s == 0.4
    assert R.dump(res)["cassini"]["sets"][1]["profiles"] is None
    text = T.report(res)
    for line in ["  cassini pair: score 1.000 (unshifted 0.500), compatible True, shifts s: "
                 "a 0.000",
                 "    shifted_synced  iteration mean 0.300 s, p99 0.400 s (fair / this: mean "
                 "1.50, p99 2.00), collectives overlapping 12%",
                 "    shifted_raw     rank 0: lost",
                 "  cassini trio: not planned (job c: no timings to profile)",
                 "  cassini: scores rank the sets' gains: None"]:
        assert line in text.splitlines(), text


def test_two_step_and_pacer_sections(doc):
    """``data/two_step_sections.json``: the two_step and pacer sections of a real
    ``nslab run two_step`` (pacer reports trimmed to vm1; its aware_cubic step failed: the
    congestion control was then set per VM, which a VM may not do for CUBIC here)."""
    doc.update(json.loads((DATA.parent / "two_step_sections.json").read_text()))
    res = R.validate(doc)
    assert [s.name for s in res.two_step.steps] == ["naive", "aware", "aware_paced",
                                                    "aware_bbr", "aware_cubic"]
    assert res.pacer.reports["vm1"].mode == "pace"
    text = T.report(doc)
    naive = res.two_step.steps[0]
    assert f"naive          {naive.completion_s:.3f} s  drops  {naive.fabric_drops}" in text
    assert "aware_cubic  ERROR" in text
    rounds = copy.deepcopy(doc)  # with repeat 3: each round's drops beside the first's
    rounds["two_step"]["steps"][2]["drops_by_round"] = [0, 4, 0]
    assert f"drops {res.two_step.steps[2].fabric_drops:5d} [rounds 0 4 0]" in T.report(rounds)
    assert (f"aware {res.two_step.ratios['aware']} (seed 0.92), aware_paced "
            f"{res.two_step.ratios['aware_paced']} (seed 0.74)") in text
    bad = copy.deepcopy(doc)
    bad["two_step"]["steps"][0]["name"] = "step0"
    with pytest.raises(ValidationError, match="two_step.steps.0.name"):
        R.validate(bad)


def _fidelity(saturated, hot=(), limited=(), **kw) -> Fidelity:
    frac = {"p50": 0.5, "max": 1.0}
    cores = [{"cpu": c, "busy": {"p50": 0.97 if c in hot else 0.4, "max": 1.0},
              "softirq": {"p50": 0.41, "max": 0.6}, "hot_share": 0.62 if c in hot else 0.1,
              "saturated": c in hot} for c in (0, 1)]
    queues = [{"link": q, "bw_mbit": 100.0, "queued_samples": 9,
               "rate_ratio": {"p50": 0.55, "max": 0.9}, "starved_samples": 6,
               "cpu_limited": True} for q in limited]
    return Fidelity.model_validate({
        "samples": 40, "interval_s": 0.5, "cpu_busy": frac, "busiest_core": frac,
        "softirq": frac, "saturated_share": 0.1, "cores": cores, "queues": queues,
        "saturated": saturated, **kw})


def test_fidelity_line_says_where_in_one_line():
    assert fidelity_line(_fidelity(True, hot=[1], limited=["leaf1->spine1"])) == (
        "fidelity: SATURATED - cpu1 busy >= 90% for 62% of the run (softirq p50 41%); "
        "links probably CPU-limited: leaf1->spine1 (sent 55% of its rate while queued); "
        "distrust timings")
    assert fidelity_line(_fidelity(False, hot=[0])) == (
        "fidelity: ok - CPU busy p50 50% max 100%, softirq max 100%; cpu0 busy >= 90% for "
        "62% of the run (softirq p50 41%); no link queue limited by the CPU")
    assert fidelity_line(_fidelity(False, queues=None, queues_error="OSError: gone")) == (
        "fidelity: ok - CPU busy p50 50% max 100%, softirq max 100%; no core saturated; "
        "link queues not read: OSError: gone")


def test_pacer_section_takes_every_pacer_setting():
    """The session writes the scenario's pacer settings (``PacerSpec.model_dump``) into the
    results' pacer section: a setting added to one and not the other failed only in a lab."""
    from session.daemons import PacerSpec
    section = PacerSection(**PacerSpec(spread=True).model_dump(), reports={})
    assert section.spread is True
