"""The two-step story's steps without a lab: the job runner and the pacers' edge replaced by
recorders, so which VMs each step got and how its ratios are computed are known truth."""
from contextlib import contextmanager

from session import two_step
from session.edge import Sensed
from session.scenario import JobSpec


def test_aware_steps_keep_the_first_aware_choice(monkeypatch):
    # the agents' groups change between steps (vm7 then vm6 picked for the fourth host): the
    # aware, paced and baseline steps must still compare one placement
    picks = iter([["vm1", "vm2", "vm3", "vm4"], ["vm1", "vm3", "vm5", "vm7"],
                  ["vm1", "vm3", "vm5", "vm6"]])
    asked = []

    def choose(policy):
        asked.append(policy)
        return next(picks)

    @contextmanager
    def edge(lab, mesh, vms, mode, pacer):
        yield Sensed(retransmits=1, rtos=0, owd_p99_us=50.0, probes_lost=0)

    times = iter([2.0, 1.5, 1.2, 1.4, 1.3])
    monkeypatch.setattr(two_step, "job_edge", edge)
    monkeypatch.setattr(two_step.jobs, "run", lambda lab, name, config, vms: {
        "completion_s": next(times), "verified": True, "error": None})
    spec = JobSpec(name="a2a", collective="all_to_all", ranks=4)
    section, _ = two_step.run(None, None, spec, None, choose, lambda: 0, lambda msg: None)
    assert asked == ["naive", "collocation_aware"]
    vms = {s["name"]: s["vms"] for s in section["steps"]}
    assert vms["naive"] == ["vm1", "vm2", "vm3", "vm4"]
    assert all(vms[n] == ["vm1", "vm3", "vm5", "vm7"]
               for n in ("aware", "aware_paced", "aware_bbr", "aware_cubic"))
    assert section["ratios"] == {"aware": 0.75, "aware_paced": 0.6}
