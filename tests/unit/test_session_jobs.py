"""The scenario's jobs without a lab: the job runner, the pacers' edge and the drop counter
replaced by recorders, the agents' groups by a stub whose groups split once the first job
runs (as {vm1, vm2} did under quickstart's naive job): every job is placed from the groups as
the jobs begin."""
from contextlib import contextmanager
from types import SimpleNamespace

from session import session as ses
from session.edge import Sensed
from session.scenario import load

TRUE = [["vm1", "vm2"], ["vm3", "vm4"], ["vm5", "vm6"], ["vm7"], ["vm8"]]
SPLIT = [["vm1"], ["vm2"], ["vm3", "vm4"], ["vm5", "vm6"], ["vm7"], ["vm8"]]


class Watcher:
    """The agents' latest state: the true groups until a job has run, then split ones."""

    def __init__(self, ran: list):
        self.ran = ran

    @property
    def latest(self):
        groups = SPLIT if self.ran else TRUE
        return SimpleNamespace(collocation=SimpleNamespace(
            groups=[SimpleNamespace(members=g) for g in groups]))


def test_every_job_is_placed_as_the_jobs_begin(monkeypatch):
    sc, _ = load("quickstart")
    ran: list[tuple[str, list[str]]] = []

    @contextmanager
    def edge(lab, mesh, vms, mode, pacer):
        yield Sensed(retransmits=0, rtos=0, owd_p99_us=None, probes_lost=0)

    def run(lab, name, config, vms):
        ran.append((name, list(vms)))
        return {"completion_s": 1.0, "verified": True, "placement": {"vms": list(vms)}}

    monkeypatch.setattr(ses, "job_edge", edge)
    monkeypatch.setattr(ses.jobs, "run", run)
    monkeypatch.setattr(ses.incast, "drops", lambda lab: {})
    s = ses.Session.__new__(ses.Session)
    s.sc, s.mesh, s.job_entries = sc, None, {}
    s.lab = SimpleNamespace(phys={f"vm{i}": f"phys{(i + 1) // 2}" for i in range(1, 9)})
    s.watcher = Watcher(ran)
    s.progress = lambda msg: None
    s.call = lambda fn, *a, **kw: fn(*a, **kw)
    s._halt = ses.threading.Event()
    s._jobs()
    assert ran == [("naive", ["vm1", "vm2", "vm3", "vm4"]),
                   ("aware", ["vm1", "vm3", "vm5", "vm7"])]
    assert s.job_entries["aware"]["placement"]["policy"] == "collocation_aware"
