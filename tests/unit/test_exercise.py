"""Teaching exercises (session.exercise, session.exercise_checks, nslab exercise): each
check kind on synthetic truth with a right and a wrong answer, the built-ins' scenarios, the
listing, and the errors of malformed exercise and answer files. No root, no lab."""
from __future__ import annotations

import json
import random
import textwrap
import time
from itertools import combinations
from types import SimpleNamespace

import pytest

from cli.main import main
from contracts.messages import CoordinatorState
from lab.errors import ScenarioError
from lab.observe import LinkState, VmState
from session import exercise
from session.exercise_checks import (
    KINDS,
    CauseAnswer,
    DscpAnswer,
    GroupsAnswer,
    LinkAnswer,
    Live,
    PacerParams,
    balanced_rates,
)
from session.scenario import load

PLACEMENTS = {"vm1": "phys1", "vm2": "phys2", "vm3": "phys1", "vm4": "phys2",
              "vm5": "phys3", "vm6": "phys3", "vm7": "phys4"}


def params(kind: str):
    return KINDS[kind].Params()


def verdict(kind: str, answer, record: dict):
    return KINDS[kind].check(answer, record, params(kind))


# -- checks on known truth -----------------------------------------------------------------
def test_colocated_right_and_wrong():
    rec = {"results": {"truth": {"placements": PLACEMENTS}}}
    right = verdict("colocated", GroupsAnswer(groups=[["vm3", "vm1"], ["vm2", "vm4"],
                                                      ["vm5", "vm6"]]), rec)
    assert right.passed and "3 of the 3 shared hosts found" in right.text()
    wrong = verdict("colocated", GroupsAnswer(groups=[["vm1", "vm2"], ["vm5", "vm6"]]), rec)
    assert not wrong.passed
    assert [ok for ok, _ in wrong.items] == [False, True, False]
    assert "vm1 vm2 are not the VMs of one physical host" in wrong.text()
    assert "1 of the 3 shared hosts found" in wrong.text()
    bad = verdict("colocated", GroupsAnswer(groups=[["vm1", "vm3"], ["vm3", "vm9"]]), rec)
    assert not bad.passed and "no such VM: vm9" in bad.text()
    assert "a VM is in two groups" in bad.text()


def test_congested_link_and_direction():
    rec = {"truth": {"link": "leaf2->vm3"}}
    assert verdict("congested", LinkAnswer(link="leaf2->vm3"), rec).passed
    reverse = verdict("congested", LinkAnswer(link="vm3->leaf2"), rec)
    assert [ok for ok, _ in reverse.items] == [True, False]
    assert "vm3->leaf2 is not the direction" in reverse.text()
    other = verdict("congested", LinkAnswer(link="leaf1->vm1"), rec)
    assert [ok for ok, _ in other.items] == [False]


def test_slowdown_cause():
    rec = {"truth": {"cause": "noisy_neighbour", "vm": "vm3", "hog": "vm4"}}
    assert verdict("slowdown", CauseAnswer(cause="noisy_neighbour"), rec).passed
    wrong = verdict("slowdown", CauseAnswer(cause="link"), rec)
    assert not wrong.passed and "the cause is not link" in wrong.text()


ECMP_TRUTH = {"truth": {"slots": 2, "leaf": "leaf1", "flows": [
    {"flow": "vm1->vm5", "mbit": 10}, {"flow": "vm2->vm6", "mbit": 40},
    {"flow": "vm3->vm7", "mbit": 20}, {"flow": "vm4->vm8", "mbit": 30}]}}


def test_ecmp_balanced_and_not():
    right = verdict("ecmp", DscpAnswer(dscp={"vm1->vm5": 1, "vm2->vm6": 1, "vm3->vm7": 2,
                                             "vm4->vm8": 2}), ECMP_TRUTH)
    assert right.passed and "uplink loads 50 / 50 Mbit/s: max/mean 1.00" in right.text()
    skewed = verdict("ecmp", DscpAnswer(dscp={"vm1->vm5": 1, "vm2->vm6": 2, "vm3->vm7": 1,
                                              "vm4->vm8": 2}), ECMP_TRUTH)
    assert not skewed.passed and "30 / 70" in skewed.text()
    hashed = verdict("ecmp", DscpAnswer(dscp={"vm1->vm5": 0, "vm2->vm6": 1, "vm3->vm7": 2,
                                              "vm9->vm5": 1}), ECMP_TRUTH)
    text = hashed.text()
    assert not hashed.passed
    assert "vm1->vm5: DSCP 0 is hashed" in text and "vm4->vm8 has no DSCP" in text
    assert "no such flow: vm9->vm5" in text


@pytest.mark.parametrize("seed", range(20))
def test_balanced_rates_split_evenly(seed):
    rates = balanced_rates(random.Random(seed), 4)
    assert all(5 <= r <= 45 and r % 5 == 0 for r in rates)
    assert any(2 * sum(half) == sum(rates) for half in combinations(rates, 2))


def pacer_record(unpaced: int | None, *paced: int | None, error: str | None = None) -> dict:
    """A check's results: the unpaced run's drops, then each paced run's (the first one
    failed with ``error``, if given)."""
    names = ["paced"] + [f"paced_{i}" for i in range(2, len(paced) + 1)]
    return {"check_results": {"jobs": [{"name": "unpaced", "fabric_drops": unpaced,
                                        "error": None}] + [
        {"name": n, "fabric_drops": d, "error": error if n == "paced" else None}
        for n, d in zip(names, paced, strict=True)]}}


def test_pacer_drops_nothing_in_the_best_of_two_paced_runs():
    answer = KINDS["pacer"].Answer(threshold_us=2000)
    right = verdict("pacer", answer, pacer_record(430, 16, 0))   # 16 of 430 measured, then 0
    assert right.passed and "drops paced 0 vs unpaced 430 (none allowed, the best of paced " \
        "runs dropping 16, 0)" in right.text()
    one = verdict("pacer", answer, pacer_record(457, 21, 30))
    assert not one.passed and "drops paced 21 vs unpaced 457 (none allowed" in one.text()
    rec = pacer_record(395, 3, 16)
    rec["check_results"]["jobs"][1]["drops_by_link"] = {"leaf1-vm5": 1, "leaf1-vm1": 2}
    assert "drops paced 3 (leaf1-vm1 2, leaf1-vm5 1) vs unpaced 395 (none allowed" in \
        verdict("pacer", answer, rec).text()
    assert not verdict("pacer", answer, pacer_record(504, 494, 480)).passed  # On-Ramp
    nothing = verdict("pacer", answer, pacer_record(0, 0, 0))
    assert not nothing.passed and "no incast to cut" in nothing.text()
    failed = verdict("pacer", answer, pacer_record(1000, None, 0, error="rank 1 timed out"))
    assert not failed.passed and "the paced run failed: rank 1 timed out" in failed.text()
    once = verdict("pacer", answer, pacer_record(1000, 0))
    assert not once.passed and "the paced_2 run failed: no result" in once.text()


def test_a_verdict_says_its_check_labs_fidelity():
    frac = {"p50": 0.4, "max": 0.9}
    verdict = KINDS["pacer"].check(KINDS["pacer"].Answer(), pacer_record(494, 0, 0),
                                   params("pacer"))
    assert "fidelity" not in verdict.text()
    verdict.fidelity = {"samples": 40, "interval_s": 0.5, "cpu_busy": frac,
                        "busiest_core": frac, "softirq": frac, "saturated_share": 0.0,
                        "saturated": False}
    assert verdict.text().endswith("PASSED: 4 of 4 right\nthe check's lab fidelity: ok - CPU "
                                   "busy p50 40% max 90%, softirq max 90%")


def test_pacer_cut_a_teacher_asks_for():
    check = KINDS["pacer"].check
    answer = KINDS["pacer"].Answer(threshold_us=300)
    most, tenth = PacerParams(min_cut=0.95, paced_runs=1), PacerParams(min_cut=0.1, paced_runs=1)
    right = check(answer, pacer_record(457, 21), most)
    assert right.passed and "drops paced 21 vs unpaced 457 (95.4% cut, at least 95.0% needed)" \
        in right.text()
    short = check(answer, pacer_record(1000, 51), most)  # 94.9 %: not rounded up to 95
    assert not short.passed and "(94.9% cut, at least 95.0% needed)" in short.text()
    right = check(answer, pacer_record(1000, 600), tenth)
    assert right.passed and "drops paced 600 vs unpaced 1000 (40.0% cut, at least 10.0% " \
        "needed)" in right.text()
    assert not check(answer, pacer_record(1000, 950), tenth).passed


def test_pacer_check_scenario_runs_both_with_the_answer(tmp_path):
    ex = exercise.load_exercise("pacer")
    prep = exercise.prepare(ex, 4, tmp_path)
    answer = ex.kind.Answer(threshold_us=250, max_hold_us=3000)
    data = ex.kind.check_scenario(answer, {"scenario": prep.data}, ex.parsed_params)
    sc, _ = load(str(exercise.write_scenario(data, tmp_path, "check.yaml")))
    assert [(j.name, j.pacer) for j in sc.jobs] == [("unpaced", "sense"), ("paced", "pace"),
                                                    ("paced_2", "pace")]
    assert all(j.placement == ["vm5", "vm1", "vm2", "vm3", "vm4"] for j in sc.jobs)
    assert (sc.pacer.threshold_us, sc.pacer.max_hold_us) == (250, 3000)
    # no drop in the better of two paced runs, the Gather after 0.3 s of compute, 50 packets
    assert (ex.parsed_params.min_cut, ex.parsed_params.paced_runs) == (1, 2)
    assert all(j.gpu_s == 0.3 for j in sc.jobs) and sc.topology.host_queue == 50


# -- what the seed hides, what the student sees ---------------------------------------------
@pytest.mark.parametrize("name", exercise.names())
def test_builtin_exercises_prepare_valid_scenarios(name, tmp_path):
    ex = exercise.load_exercise(name)
    prep = exercise.prepare(ex, 11, tmp_path)
    assert prep.scenario.seed == 11 and prep.path.is_file()
    assert load(str(prep.path))[0] == prep.scenario


def test_congested_hides_a_rate_cut_and_load_in_the_drawn_direction(tmp_path):
    ex = exercise.load_exercise("congested")
    seen = set()
    for seed in range(12):
        prep = exercise.prepare(ex, seed, tmp_path)
        a, b = prep.truth["link"].split("->")
        vm = a if a.startswith("vm") else b
        (fault,) = prep.scenario.faults
        assert fault.kind == "rate" and set(fault.link) == {a, b} and fault.mbit == 20
        assert {(f.src == vm, f.dst == vm) for f in prep.scenario.load} == {
            (a == vm, b == vm)}
        assert all(f.udp and f.bw == 40 for f in prep.scenario.load)
        seen.add(a == vm)
    assert seen == {True, False}  # both directions occur


def test_slowdown_hides_a_hog_beside_a_slow_rank_or_its_link(tmp_path):
    ex = exercise.load_exercise("slowdown")
    causes = set()
    for seed in range(10):
        prep = exercise.prepare(ex, seed, tmp_path)
        truth, (fault,) = prep.truth, prep.scenario.faults
        assert truth["vm"] in ("vm3", "vm7")
        if truth["cause"] == "noisy_neighbour":
            assert fault.kind == "cpu_hog" and fault.vm == truth["hog"]
            assert prep.topo.nodeInfo(fault.vm)["phys"] == prep.topo.nodeInfo(truth["vm"])[
                "phys"]
        else:
            assert fault.kind == "rate" and truth["vm"] in fault.link
        causes.add(truth["cause"])
    assert causes == {"noisy_neighbour", "link"}


def test_colocated_placement_follows_the_seed(tmp_path):
    ex = exercise.load_exercise("colocated")
    groups = set()
    for seed in range(8):
        topo = exercise.prepare(ex, seed, tmp_path).topo
        groups.add(frozenset(v for v in ("vm2", "vm3", "vm4")
                             if topo.nodeInfo(v)["phys"] == topo.nodeInfo("vm1")["phys"]))
    assert len(groups) > 1  # vm1's neighbour changes with the seed


def test_observations():
    window = {"vm2": {"offset_ns": 1500.0, "drift_ppm": 3.21},
              "vm1": {"offset_ns": 0.0, "drift_ppm": 0.0}, "vm3": {"offset_ns": None}}
    provisional = {"vm2": {"offset_ns": 1600.0, "drift_ppm": 4.0}}
    state = CoordinatorState.model_validate({
        "schema": "nslab.coordinator/1", "time_ns": 1, "window_s": 2, "drift_windows": 5,
        "reference": "vm1", "history": [{"t_ns": 1, "vms": window}] + [
            {"t_ns": 2 + i, "vms": provisional} for i in range(2)]})
    assert KINDS["colocated"].observe({}, state.model_copy(update={"history": state.history[
        1:]}), Live(), {}) == {"error": "the agents settled no window"}
    seen = KINDS["colocated"].observe({}, state, Live(), {})
    assert seen == {"reference": "vm1", "clocks": {"vm1": {"offset_us": 0.0, "drift_ppm": 0.0},
                                                   "vm2": {"offset_us": 1.5,
                                                           "drift_ppm": 3.21}}}
    doc = {"jobs": [{"name": "slow", "iteration_s": {"p50": 0.5}, "comm_s": {"p50": 0.2},
                     "placement": {"vms": ["vm3", "vm7"], "phys": ["phys2", "phys4"]}}]}
    vms = [VmState("vm4", "phys2", "leaf1", False, True, 3_456_000_000, 0, 0.0),
           VmState("vm3", "phys2", "leaf1", False, False, None, 0, 0.0)]
    seen = KINDS["slowdown"].observe(doc, None, Live([], vms), {})
    assert seen["jobs"]["slow"]["compute_p50_s"] == 0.3 and "phys" not in seen["jobs"]["slow"]
    assert seen["cpu_s"] == {"vm4": 3.46}
    links = [LinkState("leaf1", "spine1", True, 100, 0, 100, (7000, 10), 0),
             LinkState("leaf1", "spine2", True, 100, 0, 100, (3000, 10), 0),
             LinkState("vm1", "leaf1", True, 100, 0, 100, (5000, 10), 0)]
    seen = KINDS["ecmp"].observe({"load": []}, None, Live(links), {"leaf": "leaf1"})
    assert seen["uplink_bytes"] == {"leaf1->spine1": 7000, "leaf1->spine2": 3000}
    failed = {"jobs": [{"name": "incast", "error": "rank 2 timed out", "completion_s": None}]}
    assert KINDS["pacer"].observe(failed, None, Live(), {})["jobs"]["incast"] == {
        "fabric_drops": None, "drops_by_link": None, "completion_s": None, "retransmits": None,
        "rtos": None, "error": "rank 2 timed out"}


def test_start_waits_until_every_vm_is_in_a_settled_window():
    """A late VM (its agent started late on a loaded machine) keeps the lab running until a
    settled window holds it; without agents nothing is waited for."""
    def state(windows):  # each window: the VMs with an estimate in it
        return CoordinatorState.model_validate({
            "schema": "nslab.coordinator/1", "time_ns": 1, "window_s": 2, "drift_windows": 3,
            "history": [{"t_ns": k, "vms": {v: {"offset_ns": 1.0, "drift_ppm": 0.5}
                                            for v in vms}}
                        for k, vms in enumerate(windows)]})

    answers = [None, state([["vm1"]]),                       # no answer, no settled window
               state([["vm1"], ["vm1", "vm2"]]),            # vm2 only in the newest one
               state([["vm1"], ["vm1", "vm2"], ["vm1", "vm2"]]), state([])]
    asked = []

    def ask(history):
        asked.append(history)
        return answers.pop(0)

    session = SimpleNamespace(mesh=SimpleNamespace(state=ask), sc=SimpleNamespace(
        agents=SimpleNamespace(drift_windows=3)), lab=SimpleNamespace(
        vms=[SimpleNamespace(name="vm1"), SimpleNamespace(name="vm2")]))
    exercise.wait_settled(session, timeout_s=30)
    assert len(answers) == 1 and asked == [3] * 4  # the settled window: the 2nd newest
    answers[:] = [state([["vm1"]])] * 100
    t = time.monotonic()
    exercise.wait_settled(session, timeout_s=0.6)  # gives up, the observations say so
    assert time.monotonic() - t >= 0.6
    exercise.wait_settled(SimpleNamespace(mesh=None))


# -- the command line ----------------------------------------------------------------------
def test_list_prints_one_exercise_a_line(capsys):
    assert main(["exercise", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == exercise.names()
    assert len(lines) >= 5
    for ln in lines:
        name, title = ln.split(None, 1)
        assert title == exercise.load_exercise(name).title


def write_record(directory, name: str, truth: dict) -> None:
    (directory / f"{name}.record.json").write_text(json.dumps(
        {"schema": exercise.RECORD, "exercise": name, "seed": 1, "truth": truth}))


def test_check_exit_codes_and_what_was_right(tmp_path, capsys):
    write_record(tmp_path, "congested", {"link": "vm2->leaf1"})
    answer = tmp_path / "a.yaml"
    answer.write_text("link: vm2->leaf1\n")
    assert main(["exercise", "check", "congested", str(answer), "--dir", str(tmp_path)]) == 0
    assert "right: vm2->leaf1 is the direction that queues" in capsys.readouterr().out
    answer.write_text("link: leaf1->vm2  # the other way\n")
    assert main(["exercise", "check", "congested", str(answer), "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "right: leaf1-vm2 is the congested link" in out
    assert "wrong: leaf1->vm2 is not the direction that queues" in out
    assert "NOT YET: 1 of 2 right" in out


def test_check_without_a_record(tmp_path, capsys):
    answer = tmp_path / "a.yaml"
    answer.write_text("cause: link\n")
    assert main(["exercise", "check", "slowdown", str(answer), "--dir", str(tmp_path)]) == 1
    assert "run 'nslab exercise start slowdown' first" in capsys.readouterr().err


def test_malformed_answer_is_not_checked(tmp_path, capsys):
    write_record(tmp_path, "ecmp", ECMP_TRUTH["truth"])
    answer = tmp_path / "a.yaml"
    answer.write_text("dscp:\n  vm1->vm5: one\ndscps: {}\n")
    assert main(["exercise", "check", "ecmp", str(answer), "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "a.yaml: 2 errors, not checked:" in err
    assert "a.yaml:2:3: dscp.vm1->vm5: expected a whole number" in err
    assert "a.yaml:3:1: dscps: unknown field `dscps`; did you mean `dscp`?" in err
    answer.write_text("- cause: link\n")
    with pytest.raises(ScenarioError, match="expected a mapping of sections at the top "
                                            "level, e.g. `cause: link"):
        exercise.read_answer(exercise.load_exercise("slowdown"), answer)


def test_malformed_exercise_file(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text(textwrap.dedent("""\
        name: mine
        title: A teacher's exercise
        check: colocatd
        scenario:
          name: mine
          topology: {spines: 0}
        task: find them
        answer: "groups: []"
        extra: 1
        """))
    with pytest.raises(ScenarioError) as exc:
        exercise.load_exercise(str(bad))
    text = str(exc.value)
    assert text.startswith(f"{bad}: 3 errors, nothing was loaded:")
    assert "mine.yaml:3:1: check: `colocatd` is not one of colocated" in text
    assert "did you mean `colocated`?" in text
    assert "mine.yaml:6:14: scenario.topology.spines: must be greater than 0" in text
    assert "mine.yaml:9:1: extra: unknown field `extra`" in text
    bad.write_text(bad.read_text().replace("colocatd", "congested").replace(
        "spines: 0", "spines: 2").replace("extra: 1\n", "params: {rate_mbit: -1}\n"))
    with pytest.raises(ScenarioError, match=r"params: rate_mbit: Input should be greater "
                                            "than 0"):
        exercise.load_exercise(str(bad))
    with pytest.raises(ScenarioError, match="built-ins: colocated, congested"):
        exercise.load_exercise("nosuch")


def test_the_docs_example_exercise_loads(tmp_path):
    page = (exercise.EXERCISE_DIR.parents[1] / "docs" / "exercises.md").read_text()
    block = page.split("```yaml\nname: colocated_big")[1].split("```")[0]
    path = tmp_path / "colocated_big.yaml"
    path.write_text("name: colocated_big" + block)
    ex = exercise.load_exercise(str(path))
    prep = exercise.prepare(ex, 2, tmp_path)
    assert ex.check == "colocated" and len(prep.topo.hosts()) == 16
