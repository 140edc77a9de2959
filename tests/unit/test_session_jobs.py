"""The scenario's jobs without a lab: the job runner, the pacers' edge and the drop counter
replaced by recorders, the agents' groups by a stub whose groups change once the first job
runs (split, as {vm1, vm2} did under quickstart's naive job): every job is placed from the
groups as the jobs begin, or at its turn when there were none then."""
from contextlib import contextmanager
from types import SimpleNamespace

from session import session as ses
from session.edge import Sensed
from session.scenario import load
from session.studies import placement

TRUE = [["vm1", "vm2"], ["vm3", "vm4"], ["vm5", "vm6"], ["vm7"], ["vm8"]]
SPLIT = [["vm1"], ["vm2"], ["vm3", "vm4"], ["vm5", "vm6"], ["vm7"], ["vm8"]]


class Watcher:
    """The agents' latest state: ``before`` until a job has run (None: no state yet), then
    ``after``."""

    def __init__(self, ran: list, before, after):
        self.ran, self.before, self.after = ran, before, after

    @property
    def latest(self):
        groups = self.after if self.ran else self.before
        return None if groups is None else SimpleNamespace(collocation=SimpleNamespace(
            groups=[SimpleNamespace(members=g) for g in groups]))


def run_jobs(monkeypatch, before, after) -> tuple[list, dict]:
    """Quickstart's jobs with the agents' groups ``before`` and ``after`` the first job ran:
    (job name, VMs) in the order they ran, and the job entries."""
    sc, _ = load("quickstart")
    ran: list[tuple[str, list[str]]] = []

    @contextmanager
    def edge(lab, mesh, vms, mode, pacer):
        yield Sensed(retransmits=0, rtos=0, owd_p99_us=None, probes_lost=0)

    def run(lab, name, config, vms):
        ran.append((name, list(vms)))
        return {"completion_s": 1.0, "verified": True, "placement": {"vms": list(vms)}}

    monkeypatch.setattr(placement, "job_edge", edge)
    monkeypatch.setattr(placement.jobs, "run", run)
    monkeypatch.setattr(placement.incast, "drops", lambda lab: {})
    s = ses.Session.__new__(ses.Session)
    s.sc, s.mesh = sc, None
    s.lab = SimpleNamespace(phys={f"vm{i}": f"phys{(i + 1) // 2}" for i in range(1, 9)})
    s.watcher = Watcher(ran, before, after)
    s.progress = lambda msg: None
    s.sampler = SimpleNamespace(saturated_between=lambda start_ns, end_ns: None)
    s.call = lambda fn, *a, **kw: fn(*a, **kw)
    s._halt = ses.threading.Event()
    study = placement.Placement(s)
    study.run()
    return ran, study.live


def test_every_job_is_placed_as_the_jobs_begin(monkeypatch):
    ran, entries = run_jobs(monkeypatch, TRUE, SPLIT)
    assert ran == [("naive", ["vm1", "vm2", "vm3", "vm4"]),
                   ("aware", ["vm1", "vm3", "vm5", "vm7"])]
    assert entries["aware"]["placement"]["policy"] == "collocation_aware"


def test_a_job_without_groups_as_the_jobs_begin_is_placed_at_its_turn(monkeypatch):
    # a timeline shorter than the agents take to find groups: none yet when the jobs begin
    ran, entries = run_jobs(monkeypatch, None, TRUE)
    assert ran[1] == ("aware", ["vm1", "vm3", "vm5", "vm7"])
    assert "error" not in entries["aware"]
