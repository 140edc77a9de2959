"""The pytest plugin (``nslab_pytest``) as its users run it: test files outside the package, in
a pytester directory, run by pytest subprocesses that load the plugin through its entry point
and build real labs: the docs' example (docs/pytest-plugin.md), a failing test that keeps its
logs and pcap (read back with scapy and with the Wireshark dissector), xdist workers side by
side, and Ctrl-C."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import examples
from scapy.all import UDP, bind_layers, rdpcap

from agents.probe import NslabProbe, node_id
from lab.capabilities import probe
from lab.lab import alive, lab_netns
from lab.names import check_lab_name

LUA = Path(__file__).resolve().parents[2] / "tools" / "wireshark" / "nslab_probe.lua"
AGENT_PORT = 7701


FAILING = """
from nslab_pytest import spawn, wait_agents
from topo import LeafSpine


def test_keeps_what_it_saw(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=1, leaves=2, vms_per_leaf=1),  # --nslab-pcap: every VM
                    pcap_filter="udp port 7701", agents={"rate": 50, "window_s": 1})
    spawn(lab, ["vm2"], ["sh", "-c", "echo kept-marker; sleep 30"], name="marker")[
        "vm2"].wait_for("kept-marker", timeout_s=10)
    wait_agents(lab, lambda state: state.windows >= 1, timeout_s=30)
    assert False, "deliberate"


def test_a_scenario_keeps_its_report(nslab_lab):
    nslab_lab("tiny.yaml")
    assert False, "deliberate"
"""

TINY = """
name: pt_tiny
duration_s: 1
topology: {spines: 1, leaves: 2, vms_per_leaf: 1}
"""

NEEDS_NETEM = """
import pytest


@pytest.mark.nslab(needs=["netem"])
def test_needs_netem():
    pass
"""


def probes(pcap: Path) -> list:
    bind_layers(UDP, NslabProbe, dport=AGENT_PORT)
    return [p[NslabProbe] for p in rdpcap(str(pcap)) if NslabProbe in p]


def test_users_tests_run_fail_and_keep_their_labs(pytester):
    for name, source in examples.files("pytest-plugin.md").items():
        pytester.path.joinpath(name).write_text(source)
    pytester.makepyfile(test_fails=FAILING, test_needs=NEEDS_NETEM)
    pytester.path.joinpath("tiny.yaml").write_text(TINY)
    r = pytester.runpytest_subprocess("-rs", "--nslab-pcap", timeout=180)
    netem = probe()["netem"].ok
    r.assert_outcomes(passed=2 + netem, failed=2, skipped=1 - netem)
    if not netem:
        r.stdout.fnmatch_lines(["*SKIPPED*nslab: this machine lacks netem*link delay*"])
    # the failing test's labs are kept, and said where in its report and in the summary
    kept = pytester.path / "nslab-artifacts" / "test_fails.py_test_keeps_what_it_saw"
    r.stdout.fnmatch_lines([f"*kept in {kept}*", "*nslab: failing tests' labs kept*",
                            str(kept)])
    (labdir,) = kept.iterdir()
    assert check_lab_name(labdir.name) and lab_netns(labdir.name) == []
    assert (labdir / "marker-vm2.log").read_text() == "kept-marker\n"
    truth = json.loads((labdir / "truth.json").read_text())
    assert set(truth["placements"]) == {"vm1", "vm2"}
    assert (labdir / "logs" / "agent-vm1.log").exists()
    assert (labdir / "pcap" / "vm2.pcap").exists()
    # its capture: the agents' probes between vm1 and vm2, dissected by the scapy layer ...
    pcap = labdir / "pcap" / "vm1.pcap"
    seen = probes(pcap)
    assert {(p.src, p.dst) for p in seen} == {(node_id("vm1"), node_id("vm2")),
                                               (node_id("vm2"), node_id("vm1"))}
    assert all(p.magic == 0x4E53 and p.version == 1 and p.idx in (0, 1) for p in seen)
    # ... and by the Wireshark dissector shipped in tools/, field for field
    out = subprocess.run(["tshark", "-X", f"lua_script:{LUA}", "-r", str(pcap), "-Y", "nslab",
                          "-T", "fields", "-E", "separator=,", "-e", "nslab.src", "-e",
                          "nslab.seq", "-e", "nslab.pair_id", "-e", "nslab.idx", "-e",
                          "nslab.tx_ns", "-e", "nslab.flags.followup", "-e", "nslab.fu_tx1_ns"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [line.split(",") for line in out.stdout.splitlines()]
    assert rows == [[f"0x{p.src:08x}", str(p.seq), str(p.pair_id), str(p.idx), str(p.tx_ns),
                     str(int(bool(p.flags.FOLLOWUP))), str(p.fu_tx1_ns)] for p in seen]
    # a scenario's lab: also its results document and the HTML report (nslab report)
    (labdir,) = (kept.parent / "test_fails.py_test_a_scenario_keeps_its_report").iterdir()
    doc = json.loads((labdir / "results.json").read_text())
    assert doc["scenario"]["name"] == "pt_tiny" and doc["lab"]["name"] == labdir.name
    assert doc["teardown"]["clean"] is True
    assert 'id="fig-timeline"' in (labdir / "report.html").read_text()


PARALLEL = """
import os
import time
from pathlib import Path

from topo import LeafSpine

SYNC = Path(__file__).parent / "names"


def test_side_by_side(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=1, leaves=2, vms_per_leaf=1))
    SYNC.mkdir(exist_ok=True)
    (SYNC / os.environ["PYTEST_XDIST_WORKER"]).write_text(lab.name)
    deadline = time.monotonic() + 60
    while len(list(SYNC.iterdir())) < 2:  # both workers' labs are up at once
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert lab.pingAll() == 0.0
"""


def test_xdist_workers_build_labs_side_by_side(pytester):
    pytester.makepyfile(test_parallel=PARALLEL)
    r = pytester.runpytest_subprocess("-n", "2", "--dist", "each", timeout=180)
    r.assert_outcomes(passed=2)
    names = [p.read_text() for p in (pytester.path / "names").iterdir()]
    assert len(set(names)) == 2 and all(check_lab_name(n) for n in names)
    assert all(lab_netns(n) == [] for n in names)


INTERRUPTED = """
import os
import time
from pathlib import Path

from nslab_pytest import spawn
from topo import LeafSpine


def test_interrupted(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=1, leaves=1, vms_per_leaf=2))
    proc = spawn(lab, ["vm1"], ["sleep", "60"])["vm1"]
    Path("up").write_text(f"{lab.name} {proc.popen.pid}")
    time.sleep(60)
"""


def test_ctrl_c_tears_the_lab_down(pytester):
    pytester.makepyfile(test_int=INTERRUPTED)
    proc = pytester.popen([sys.executable, "-m", "pytest", "-q", "test_int.py"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL)
    up = pytester.path / "up"
    deadline = time.monotonic() + 60
    while not up.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0].decode()
    name, pid = up.read_text().split()
    assert proc.returncode == 2, out  # pytest: interrupted
    assert "KeyboardInterrupt" in out
    assert lab_netns(name) == [] and not alive(int(pid))
    assert (pytester.path / "nslab-artifacts" / "test_int.py_test_interrupted" / name).is_dir()


SCENARIO = """
name: pt_scen
seed: 2
duration_s: 30
topology: {spines: 1, leaves: 2, vms_per_leaf: 1}
placement: {vms_per_host: 1}
agents: {enabled: true, rate: 50, window_s: 1}
faults:
  - {at_s: 0.2, kind: clock_step, vm: vm2, step_ms: 1}
"""


def test_a_scenario_runs_its_session_under_the_fixture(nslab_lab, tmp_path):
    from nslab_pytest import inject, truth, wait_agents
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    lab = nslab_lab(str(path))  # the Session: timeline, agents
    assert lab.name.startswith("t") and lab.name != "pt_scen"  # unique, not the scenario's
    state = wait_agents(lab, lambda s: set(s.vms) == {"vm1", "vm2"} and s.windows >= 1,
                        timeout_s=30)
    assert state.reference in ("vm1", "vm2")
    inject(lab, {"kind": "link_down", "link": ["leaf2", "spine1"]})
    faults = [(e.kind, e.target, e.source) for e in truth(lab).faults
              if e.kind in ("clock_step", "link_down")]
    assert faults == [("clock_step", "vm2", "timeline"), ("link_down", "leaf2-spine1", "test")]
    assert "100% packet loss" in lab["vm1"].cmd("ping -c1 -W1 10.2.1.2")
    assert truth(lab).placements == {"vm1": "phys1", "vm2": "phys2"}
