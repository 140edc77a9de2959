"""The two-step story's steps without a lab: the job runner and the pacers' edge replaced by
recorders, so which VMs each step got, the order of the rounds, its ratios and its
comparisons are known truth."""
from contextlib import contextmanager
from types import SimpleNamespace

from session import session as ses
from session import two_step
from session.edge import Sensed
from session.scenario import load
from session.studies.two_step import TwoStep


def _study(monkeypatch, repeat: int, picks, times):
    sc, _ = load("two_step")
    sc = sc.model_copy(update={"repeat": repeat})
    asked, ran, edges = [], [], []

    @contextmanager
    def edge(lab, mesh, vms, mode, pacer):
        edges.append((mode, pacer.datapath))
        yield Sensed(retransmits=1, rtos=0, owd_p99_us=50.0, probes_lost=0)

    def run(lab, name, config, vms):
        ran.append(name)
        return {"completion_s": next(times), "verified": True, "error": None}

    monkeypatch.setattr(two_step, "job_edge", edge)
    monkeypatch.setattr(two_step.jobs, "run", run)
    s = ses.Session.__new__(ses.Session)
    s.sc, s.lab, s.mesh = sc, None, None
    s.progress = lambda msg: None
    s.call = lambda fn, *a, **kw: 0
    s.sampler = SimpleNamespace(saturated_between=lambda start_ns, end_ns: False)
    s._halt = ses.threading.Event()
    s.choose = lambda spec: asked.append(spec.placement) or next(picks)
    study = TwoStep(s)
    study.run()
    return study, asked, ran, edges


def test_aware_steps_keep_the_first_aware_choice(monkeypatch):
    # the agents' groups change between steps (vm7 then vm6 picked for the fourth host): the
    # aware, paced and baseline steps must still compare one placement
    picks = iter([["vm1", "vm2", "vm3", "vm4"], ["vm1", "vm3", "vm5", "vm7"],
                  ["vm1", "vm3", "vm5", "vm6"]])
    study, asked, _, edges = _study(monkeypatch, 1, picks,
                                    iter([2.0, 1.5, 1.2, 1.25, 1.4, 1.3]))
    out: dict = {}
    study.sections(out)
    section = out["two_step"]
    assert asked == ["naive", "collocation_aware"]
    # the kernel datapath (the default) in every step but the probe pacer's, paced beside it
    assert edges == [("sense", "bpf"), ("sense", "bpf"), ("pace", "bpf"), ("pace", "probe"),
                     ("sense", "bpf"), ("sense", "bpf")]
    assert [s["datapath"] for s in section["steps"]] == [d for _, d in edges]
    vms = {s["name"]: s["vms"] for s in section["steps"]}
    assert vms["naive"] == ["vm1", "vm2", "vm3", "vm4"]
    assert all(vms[n] == ["vm1", "vm3", "vm5", "vm7"]
               for n in ("aware", "aware_paced", "aware_probe", "aware_bbr", "aware_cubic"))
    assert section["ratios"] == {"aware": 0.75, "aware_paced": 0.6}
    cmp_ = {(c["arm"], c["baseline"]): c for c in out["comparisons"]}
    assert set(cmp_) == set(two_step.COMPARISONS)
    paced = cmp_[("aware_paced", "naive")]
    assert paced["n"] == 1 and paced["ratio_median"] == 0.6
    assert paced["verdict"] == "no_difference" and paced["reference"] == 0.74


def test_rounds_rotate_and_every_sample_is_kept(monkeypatch):
    picks = iter([["vm1", "vm2", "vm3", "vm4"], ["vm1", "vm3", "vm5", "vm7"]])
    times = iter([2.0, 1.5, 1.2, 1.25, 1.4, 1.3] * 3)
    study, _, ran, _ = _study(monkeypatch, 3, picks, times)
    names = [n.removeprefix("a2a_") for n in ran]
    steps = [s[0] for s in two_step.STEPS]
    assert names == steps + steps[1:] + steps[:1] + steps[2:] + steps[:2]
    assert len(study.live) == 6 and all(len(v) == 3 for v in study.samples.values())
    out: dict = {}
    study.sections(out)
    assert {c["n"] for c in out["comparisons"]} == {3}
