"""When a fault is refused (``lab.fault_rules``): the lab (``lab.faults.Faults``, over a
Mininet-shaped network built from a recorded frame: its checks run before any kernel call)
and the TUI's recorded backend over that same frame refuse the same faults in the same
words, and accept the same ones. No root, no lab."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from contracts.events import (
    ClockStep,
    CpuHog,
    Flap,
    LinkDown,
    LinkUp,
    Loss,
    Migrate,
    Pause,
    Queue,
    Rate,
    Resume,
)
from lab.errors import LabError
from lab.fault_rules import check
from lab.faults import Faults
from tui.backend import SCHEMA
from tui.recorded import DEFAULT_RECORDING, RecordedBackend, load_recording


class Net:
    """What ``Faults`` reads of a Mininet network, built from a recorded frame."""

    def __init__(self, frame):
        self.nameToNode = {n.name: SimpleNamespace(name=n.name, remote=False)
                           for n in frame.nodes}
        self.hosts = [self.nameToNode[v.name] for v in frame.vms]
        self.links = [SimpleNamespace(**{
            f"intf{i}": SimpleNamespace(node=self.nameToNode[end],
                                        shaping=SimpleNamespace(bw=lk.bw_mbit))
            for i, end in ((1, lk.a), (2, lk.b))}) for lk in frame.links]

    def __getitem__(self, name: str):
        return self.nameToNode[name]

    def linksBetween(self, a, b):  # noqa: N802 - Mininet's name
        return [lk for lk in self.links
                if {lk.intf1.node.name, lk.intf2.node.name} == {a.name, b.name}]


@pytest.fixture
def frame():
    """A running frame of the demo recording with vm2's link unshaped and vm1 paused."""
    _, frames = load_recording(DEFAULT_RECORDING)
    snap = frames[len(frames) // 2]
    assert snap.state == "running"
    snap.link("vm2", "leaf1").bw_mbit = None
    snap.vm("vm1").paused = True
    return snap


@pytest.fixture
def replay(frame, tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"schema": SCHEMA, "scenario": "x",
                                "frames": [frame.to_dict()]}))
    backend = RecordedBackend(path, advance=False)
    backend.start()
    return backend


@pytest.fixture
def lab(frame):
    faults = Faults(SimpleNamespace(name=frame.lab, net=Net(frame), tunnels={},
                                    phys={v.name: v.phys for v in frame.vms}))
    faults.paused.add("vm1")
    return faults


REFUSED = [LinkDown(link=("vm1", "spine9")), LinkUp(link=("vm1", "spine2")),
           Rate(link=("vm2", "leaf1"), mbit=10), ClockStep(vm="vm9", step_ms=1),
           CpuHog(vm="leaf1"), Migrate(vm="vm3", to="phys9"), Migrate(vm="vm3", to="phys2"),
           Migrate(vm="vm1", to="phys2")]
ACCEPTED = [LinkDown(link=("leaf2", "spine2")), LinkUp(link=("leaf1", "spine1")),
            Flap(link=("leaf1", "spine2")), Loss(link=("vm2", "leaf1"), percent=3),
            Rate(link=("vm3", "leaf2"), mbit=20), Queue(link=("leaf2", "spine1"), packets=30),
            CpuHog(vm="vm1"), Pause(vm="vm4"), Resume(vm="vm1"), ClockStep(vm="vm2", step_ms=1),
            Migrate(vm="vm3", to="phys1")]


def refusal(apply, fault) -> str:
    with pytest.raises(LabError) as e:
        apply(fault)
    return str(e.value)


@pytest.mark.parametrize("fault", REFUSED, ids=lambda f: f"{f.kind}-{f.target}")
def test_the_replay_and_the_lab_refuse_in_the_same_words(fault, lab, replay):
    assert refusal(replay.inject, fault) == refusal(lab.apply, fault)
    assert not replay.injected


def test_a_stopped_lab_and_a_stopped_replay_refuse_alike(frame, lab, replay):
    lab.lab.net = None
    replay.stop()
    fault = Pause(vm="vm2")
    assert refusal(replay.inject, fault) == refusal(lab.apply, fault) == \
        f"lab {frame.lab} is not running"


@pytest.mark.parametrize("fault", ACCEPTED, ids=lambda f: f"{f.kind}-{f.target}")
def test_the_replay_and_the_lab_accept_the_same_faults(fault, lab, replay):
    check(fault, lab.facts())
    assert replay.inject(fault).kind == fault.kind


def test_a_fault_value_out_of_range_is_a_lab_error(lab):
    with pytest.raises(LabError, match="loss: percent: Input should be less than or equal"):
        lab.loss("vm2", "leaf1", 150)
