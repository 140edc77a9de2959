"""The session's Watcher (no lab): while it runs it asks the coordinator for its state without
the window history; ``stop`` takes the last state whole, asking again when the coordinator
misses a request, and keeps when collocation matched the truth."""
import time
from types import SimpleNamespace

from session.session import Watcher


class Mesh:
    """What a Watcher uses of an AgentMesh: ``state(history)``, answered from ``answers``
    (None: no answer), every request's ``history`` recorded."""

    def __init__(self, answers=None):
        self.asked, self.answers, self.steady = [], list(answers or []), 0
        self.started_ns = time.time_ns()

    def state(self, history=None):
        self.asked.append(history)
        if self.answers:
            return self.answers.pop(0)
        return SimpleNamespace(windows=3, history=[] if history == 0 else ["w1", "w2", "w3"],
                               collocation=SimpleNamespace(groups=[
                                   SimpleNamespace(members=["vm2", "vm1"])]))

    def mark_steady(self):
        self.steady += 1


LAB = SimpleNamespace(phys={"vm1": "phys1", "vm2": "phys1"})


def test_polls_without_history_and_stops_with_all_of_it():
    mesh = Mesh()
    w = Watcher(LAB, mesh, interval_s=0.01)
    w.start()
    time.sleep(0.2)
    w.stop()
    assert len(mesh.asked) >= 3 and set(mesh.asked[:-1]) == {0} and mesh.asked[-1] is None
    assert w.latest.history == ["w1", "w2", "w3"]
    assert w.detected_after_s is not None and mesh.steady == len(mesh.asked)


def test_stop_asks_again_when_the_coordinator_misses_a_request():
    mesh = Mesh(answers=[None, None])
    w = Watcher(LAB, mesh, interval_s=60)
    w.start()
    w.stop()
    assert mesh.asked == [None, None, None] and w.latest.history == ["w1", "w2", "w3"]
