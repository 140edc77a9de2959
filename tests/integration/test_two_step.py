"""The two-step story in a real lab, short: one job run naive, collocation-aware, aware with
the pacers holding, and with BBR and CUBIC set on its sockets; every step verified, with the
lab's drop counters and the pacers' sensing in the results."""
import pytest
from scenario_run import run_text

SCENARIO = """
name: ts_short
seed: 5
duration_s: 8
topology: {spines: 2, leaves: 4, vms_per_leaf: 2, host_bw: 50, fabric_bw: 50,
           host_queue: 20, fabric_queue: 20}
placement: {vms_per_host: 2}
hosts: {cpu_cores: 0.5}
agents: {enabled: true, rate: 20, window_s: 2}
jobs:
  - {name: a2a, collective: all_to_all, ranks: 4, bytes: 2000000, iterations: 3}
two_step: {job: a2a}
"""


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    return run_text(tmp_path_factory.mktemp("ts"), SCENARIO)


def test_every_step_runs_verified_with_drops_and_sensing(doc):
    steps = {s.name: s for s in doc.two_step.steps}
    assert list(steps) == ["naive", "aware", "aware_paced", "aware_probe", "aware_bbr",
                           "aware_cubic"]
    for s in steps.values():
        assert s.error is None and s.verified, s
        assert s.completion_s > 0 and s.fabric_drops >= 0
        assert s.retransmits is not None and s.rtos is not None and s.owd_p99_us > 0, s
        assert s.probes_lost is not None and s.probes_lost >= 0, s
    # the aware steps run on one VM per detected host; naive shares hosts (2 VMs per host)
    placements = doc.truth.placements
    aware = steps["aware"].vms
    assert len({placements[v] for v in aware}) == 4
    assert len({placements[v] for v in steps["naive"].vms}) == 2
    assert all(steps[n].vms == aware
               for n in ("aware_paced", "aware_probe", "aware_bbr", "aware_cubic"))
    assert (steps["aware_bbr"].cc, steps["aware_cubic"].cc) == ("bbr", "cubic")
    assert set(doc.two_step.ratios) == {"aware", "aware_paced"}
    assert doc.two_step.ratios["aware"] == round(steps["aware"].completion_s
                                                 / steps["naive"].completion_s, 3)


def test_the_paced_step_reports_its_pacers(doc):
    aware = doc.two_step.steps[1].vms
    assert set(doc.pacer.reports) == set(aware)
    for vm, rep in doc.pacer.reports.items():
        assert rep.mode == "pace" and rep.name == vm
        # a pacer probes only the job's other VMs, and only those it saw with data in flight
        # (one pacer of a step of ~1 s measured one OWD per peer on a quiet machine, none in
        # CI: the pacers together, not each, must have measured)
        probed = {d for d, st in rep.dests.items() if st.owd_samples}
        assert probed <= set(aware) - {vm}, rep
        assert rep.datapath == "bpf", rep  # the paced step's: the default datapath
    assert any(st.owd_samples for rep in doc.pacer.reports.values()
               for st in rep.dests.values()), doc.pacer.reports
    assert doc.teardown.clean
