"""Scenario validation: every error at once, each with the file, line, field path and what
was expected. Golden cases: tests/unit/data/scenario_errors/NAME.yaml -> NAME.txt, one
expected line per error."""
import textwrap
from pathlib import Path

import pytest

from cli.main import main
from lab.errors import ScenarioError, ScenarioProblem
from session.scenario import builtin_names, load

CASES = Path(__file__).parent / "data" / "scenario_errors"
GOLDEN = sorted(CASES.glob("*.yaml"))

GOOD = """
name: t
topology: {spines: 2, leaves: 2, vms_per_leaf: 2, host_bw: 100}
placement: {vms_per_host: 2}
"""


def write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def errors_of(path):
    with pytest.raises(ScenarioError) as exc:
        load(path)
    assert exc.value.source == path
    assert "nothing was built" in str(exc.value)
    return {e.path: e.message for e in exc.value.errors}


@pytest.mark.parametrize("case", GOLDEN, ids=lambda p: p.stem)
def test_golden_error_reports(case, monkeypatch):
    monkeypatch.chdir(case.parent)
    with pytest.raises(ScenarioError) as exc:
        load(case.name)
    assert [str(e) for e in exc.value.errors] == case.with_suffix(".txt").read_text().splitlines()


def test_errors_are_structured_for_scripts(monkeypatch):
    monkeypatch.chdir(CASES)
    with pytest.raises(ScenarioError) as exc:
        load("misspelt_keys.yaml")
    assert exc.value.errors[0] == ScenarioProblem(
        path="topology.fabirc_bw", message="unknown field `fabirc_bw`",
        hint="did you mean `fabric_bw`?", file="misspelt_keys.yaml", line=4, column=3)


def test_cli_prints_one_line_per_error_and_fails(monkeypatch, capsys):
    monkeypatch.chdir(CASES)
    assert main(["run", "ranks_and_others.yaml", "--check"]) == 1
    err = capsys.readouterr().err.splitlines()
    expected = Path("ranks_and_others.txt").read_text().splitlines()
    assert err == [f"nslab: ranks_and_others.yaml: {len(expected)} errors, nothing was built:"] \
        + [f"  {line}" for line in expected]


def test_builtins_are_valid():
    assert "quickstart" in builtin_names()
    for name in builtin_names():
        sc, topo = load(name)
        assert topo.hosts()


def test_good_scenario_builds_topology(tmp_path):
    sc, topo = load(write(tmp_path, GOOD))
    assert len(topo.hosts()) == 4
    assert {topo.nodeInfo(v)["phys"] for v in topo.hosts()} == {"phys1", "phys2"}


def test_hosts_reserve_reaches_the_lab(tmp_path):
    """``hosts.reserve`` (off unless asked; quickstart asks) becomes the lab's
    ``cpu_reserve``, which weighs its cgroups above the machine's other processes."""
    from session.session import make_lab
    sc, topo = load(write(tmp_path, GOOD))
    assert make_lab(sc, topo).cpu_reserve is False
    sc, topo = load(write(tmp_path, GOOD + "hosts: {cpu_cores: 0.25, reserve: true}\n"))
    assert make_lab(sc, topo).cpu_reserve is True
    assert load("quickstart")[0].hosts.reserve is True
    errs = errors_of(write(tmp_path, GOOD + "hosts: {reserve: maybe}\n"))
    assert "hosts.reserve" in errs


def test_unknown_field(tmp_path):
    errs = errors_of(write(tmp_path, GOOD + "topology_extra: 1\n"))
    assert errs == {"topology_extra": "unknown field `topology_extra`"}


def test_nested_unknown_field_and_negative_rate_reported_together(tmp_path):
    text = """
    name: t
    topology: {spines: 2, host_bw: -5, colour: red}
    """
    errs = errors_of(write(tmp_path, text))
    assert errs["topology.colour"] == "unknown field `colour`"
    assert errs["topology.host_bw"] == "must be greater than 0, got `-5`"


def test_vm_on_missing_host(tmp_path):
    text = GOOD + """
faults:
  - {at_s: 1, kind: migrate, vm: vm1, to: phys9}
  - {at_s: 1, kind: cpu_hog, vm: vm99}
hosts:
  overrides: {phys7: {cpu_cores: 1}}
"""
    errs = errors_of(write(tmp_path, text))
    assert "no physical host `phys9`" in errs["faults[0].to"]
    assert "no VM `vm99`" in errs["faults[1].vm"]
    assert "phys7" in errs["hosts.overrides.phys7"]


def test_job_collective_names_are_checked(tmp_path):
    text = GOOD + "jobs:\n  - {name: j, collective: allreduce_typo, ranks: 2}\n"
    assert "allreduce_typo" in errors_of(write(tmp_path, text))["jobs[0].collective"]


def test_load_names_real_vms(tmp_path):
    text = GOOD + "load:\n  - {src: vm1, dst: vm7, duration_s: 2}\n"
    assert "no VM `vm7`" in errors_of(write(tmp_path, text))["load[0].dst"]


def test_fault_needs_its_arguments(tmp_path):
    text = GOOD + "faults:\n  - {at_s: 1, kind: loss, link: [leaf1, spine1]}\n"
    assert "`percent` is missing" in errors_of(write(tmp_path, text))["faults[0].percent"]


def test_fault_kinds_are_one_union(tmp_path):
    text = GOOD + "faults:\n  - {at_s: 1, kind: explode, vm: vm1}\n"
    msg = errors_of(write(tmp_path, text))["faults[0].kind"]
    assert "link_down" in msg and "migrate" in msg  # the union's tags, from contracts.events


def test_fault_after_the_end_is_an_error(tmp_path):
    text = GOOD + "duration_s: 5\nfaults:\n  - {at_s: 30, kind: pause, vm: vm1}\n"
    assert "after the scenario ends" in errors_of(write(tmp_path, text))["faults[0].at_s"]


def test_faults_name_real_links(tmp_path):
    text = GOOD + """
faults:
  - {at_s: 2, kind: link_down, link: [leaf1, leaf2]}
  - {at_s: 3, kind: rate, link: [leaf1, spine1], mbit: 10}
"""
    errs = errors_of(write(tmp_path, text))
    assert "no link between `leaf1` and `leaf2`" in errs["faults[0].link"]
    assert "has no bw" in errs["faults[1].link"]


def test_bad_link_values(tmp_path):
    errs = errors_of(write(tmp_path, "name: t\ntopology: {link: {delay: fast, loss: 120}}\n"))
    assert errs["topology.link.loss"] == "must be at most 100, got `120`"
    assert "expected a number with a unit" in errs["topology.link.delay"]  # at once
    errs = errors_of(write(tmp_path, "name: t\ntopology: {link: {reorder: 5}}\n"))
    assert "reorder needs a delay" in errs["topology.link"]


def test_bad_yaml_and_missing_file(tmp_path):
    errs = errors_of(write(tmp_path, "name: [unclosed\n"))
    assert errs[""].startswith("not valid YAML")
    with pytest.raises(ScenarioError, match="no such file"):
        load(str(tmp_path / "absent.yaml"))


def test_custom_mininet_topology_file(tmp_path):
    topos = CASES / "custom_topos.py"  # a Star(n) in a topos dict, as for mn --custom
    path = write(tmp_path, f"name: t\ntopology: {{kind: custom, file: {topos}, name: star, "
                           "args: {n: 4}}\nplacement: {vms_per_host: 2}\n")
    sc, topo = load(path)
    assert sorted(topo.hosts()) == ["h1", "h2", "h3", "h4"]
    assert {topo.nodeInfo(h)["phys"] for h in topo.hosts()} == {"phys1", "phys2"}


def test_custom_topology_file_that_does_not_load(tmp_path):
    (tmp_path / "broken.py").write_text("def build(:\n")
    path = write(tmp_path, "name: t\ntopology: {kind: custom, file: broken.py, name: x}\n")
    assert errors_of(path)["topology.file"].startswith(
        f"{tmp_path / 'broken.py'} does not load: SyntaxError")


def test_fabric_mode_is_checked_by_the_schema(tmp_path):
    sc, _ = load(write(tmp_path, GOOD + "fabric: {mode: spray}\n"))
    assert sc.fabric.mode == "spray"
    errors = errors_of(write(tmp_path, GOOD + "fabric: {mode: reps}\n"))
    assert errors["fabric.mode"] == "`reps` is not one of ecmp, spray, entropy"


@pytest.mark.parametrize("jobs, sets, message", [
    ("[{name: a, ranks: 2, placement: [vm1, vm3]}]", "[{name: s, jobs: [a, z]}]",
     "no job `z` in jobs"),
    ("[{name: a, ranks: 2}]", "[{name: s, jobs: [a]}]", "needs its VMs listed"),
    ("[{name: a, ranks: 2, placement: [vm1, vm3]}, {name: b, ranks: 2, placement: [vm2, vm3]}]",
     "[{name: s, jobs: [a, b]}]", "share a VM"),
    ("[{name: a, ranks: 2, placement: [vm1, vm3]}]", "[{name: s, jobs: [a, a]}]",
     "names a job twice"),
])
def test_cassini_sets_name_jobs_with_their_own_vms(tmp_path, jobs, sets, message):
    text = GOOD + f"jobs: {jobs}\ncassini: {{capacity_mbit: 100, sets: {sets}}}\n"
    errs = errors_of(write(tmp_path, text))
    assert any(message in m for m in errs.values()), errs


def test_cassini_jobs_leave_the_sequential_turn():
    sc, _ = load("cassini")
    assert sc.cassini_jobs() == {"a", "b", "c", "d", "e"}
    assert sc.cassini.modes == ["shifted_raw", "fair", "shifted_synced", "unfair"]
    assert [sc.cassini.unfair_share(k) for k in range(3)] == [0.05] * 3


@pytest.mark.parametrize("fabric, shares, message", [
    ("ecmp", "[0.6, 0.4]", "keep the sum below 1"),
    ("entropy", "[0.05]", "entropy fabric reads as path slots"),
])
def test_cassini_unfair_mode_checks(tmp_path, fabric, shares, message):
    jobs = ("[{name: a, ranks: 2, placement: [vm1, vm3]}, "
            "{name: b, ranks: 2, placement: [vm2, vm4]}]")
    text = (GOOD + f"jobs: {jobs}\nfabric: {{mode: {fabric}}}\ncassini: {{capacity_mbit: 100, "
            f"sets: [{{name: s, jobs: [a, b]}}], unfair_shares: {shares}}}\n")
    errs = errors_of(write(tmp_path, text))
    assert any(message in m for m in errs.values()), errs
    sc, _ = load(write(tmp_path, text.replace("cassini: {", "cassini: {modes: [fair], ")))
    assert sc.cassini.modes == ["fair"]  # without the unfair mode, nothing to refuse


def test_two_step_names_one_of_the_jobs_and_needs_the_agents(tmp_path):
    sc, _ = load("two_step")
    assert sc.own_turn_jobs() == {sc.two_step.job}
    assert sc.pacer.threshold_us > 0
    job = "jobs: [{name: a, ranks: 2, collective: all_to_all}]\n"
    errs = errors_of(write(tmp_path, GOOD + job + "two_step: {job: z}\n"))
    assert errs["two_step.job"] == "no job `z` in jobs"
    assert "run the pacers" in errs["two_step"]  # and the agents are off: both at once
    sc, _ = load(write(tmp_path, GOOD + job + "agents: {enabled: true}\ntwo_step: {job: a}\n"))
    assert sc.own_turn_jobs() == {"a"}
    errs = errors_of(write(tmp_path, GOOD + "jobs: [{name: a, ranks: 2, pacer: pace}, "
                                            "{name: b, ranks: 2, cc: vegas}]\n"))
    assert "synchronized clocks" in errs["jobs[0].pacer"]
    assert "cubic" in errs["jobs[1].cc"] and "bbr" in errs["jobs[1].cc"], errs
    errs = errors_of(write(tmp_path, GOOD + "pacer: {fresh: false, spread: true}\n"))
    assert any("spread needs pacer.fresh" in m for m in errs.values()), errs


def test_lb_section_names_modes_and_needs_a_leaf_spine_it_can_run_on(tmp_path):
    sc, _ = load("lb_compare")
    assert sc.lb.modes == ["ecmp", "spray", "reps", "ethereal"]
    errs = errors_of(write(tmp_path, GOOD + "lb: {modes: [ecmp, flowlet]}\n"))
    assert errs["lb.modes[1]"] == "`flowlet` is not one of ecmp, spray, reps, ethereal"
    errs = errors_of(write(tmp_path, GOOD + "lb: {link: [vm1, leaf1]}\n"))
    assert errs["lb"] == "the comparison sets leaf-spine rates: the links need one"
    rated = GOOD.replace("host_bw: 100", "host_bw: 100, fabric_bw: 100, vms_per_leaf: 3")
    errs = errors_of(write(tmp_path, rated.replace("vms_per_leaf: 2, ", "")
                           + "lb: {link: [vm1, leaf1]}\n"))
    assert errs["lb.link"] == "vm1-leaf1 is not a leaf-spine link"
    assert errs["lb.collectives"].startswith("halving_doubling needs a power-of-two number")
