"""End to end without root: four agent processes on 127.0.0.1-4 (one UDP port), each with its
own emulated clock file (two share one oscillator: one physical host), and a coordinator
process; the API's estimates are checked against the clock truth.

Measured on this 2-core machine (loopback, kernel software timestamps, 20 pairs/s/peer,
2 s windows): |offset error| 5-40 ns and |drift error| 0.005-0.07 ppm per window after the
first (partial) window; the NTP-style baseline 10-70 ns. The tolerances below (2 us, 0.5 ppm)
leave room for a loaded CI machine, where scheduling delays hit the timestamps.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from scapy.packet import fuzz

from agents.clock import ClockSpec, Oscillator, Segment
from agents.probe import NslabProbe, Probe, encode, node_id
from contracts.messages import CoordinatorState, Health
from session.scoring import truth_at as truth

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = "5eed" * 8
IPS = {"vm1": "127.0.0.1", "vm2": "127.0.0.2", "vm3": "127.0.0.3", "vm4": "127.0.0.4"}
TRUTH_GROUPS = [["vm1", "vm2"], ["vm3"], ["vm4"]]
OFFSET_TOL_NS = 2_000
DRIFT_TOL_PPM = 0.5


def free_ports(n_tcp: int) -> tuple[int, list[int]]:
    """A UDP port free on all four addresses and ``n_tcp`` free TCP ports on 127.0.0.1."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            udp = s.getsockname()[1]
        try:
            for ip in IPS.values():
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.bind((ip, udp))
            break
        except OSError:
            continue
    tcp = []
    socks = []
    for _ in range(n_tcp):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        tcp.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return udp, tcp


class Mesh:
    """The processes of one loopback mesh; ``close`` kills every one of them by PID."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.udp, (self.coord_port, self.http_port) = free_ports(2)
        t0 = time.time_ns()
        h1 = Oscillator(t0, 23.0, ((0.3, 40.0, 0.5),))
        h2 = Oscillator(t0, -31.0, ((0.2, 30.0, 1.0),))
        h3 = Oscillator(t0, 7.5, ())
        self.specs = {"vm1": ClockSpec("vm1", [Segment(t0, 3.2e6, "h1", h1)]),
                      "vm2": ClockSpec("vm2", [Segment(t0, -4.1e6, "h1", h1)]),
                      "vm3": ClockSpec("vm3", [Segment(t0, 1.7e6, "h2", h2)]),
                      "vm4": ClockSpec("vm4", [Segment(t0, -0.9e6, "h3", h3)])}
        self.env = dict(os.environ, PYTHONPATH=REPO)
        self.procs: dict[str, subprocess.Popen] = {}
        self.start_coordinator()
        for vm, spec in self.specs.items():
            spec.write(str(tmp / f"{vm}.clock.json"))
            self.start_agent(vm)

    def start_agent(self, vm):
        peers = ",".join(f"{p}={ip}" for p, ip in IPS.items() if p != vm)
        self._spawn(vm, ["agent", "--name", vm, "--bind", IPS[vm], "--peers", peers,
                         "--coordinator", f"127.0.0.1:{self.coord_port}",
                         "--port", str(self.udp), "--key", KEY],
                    dict(self.env, NSLAB_CLOCK=str(self.tmp / f"{vm}.clock.json")))

    def _spawn(self, key, args, env):
        log = open(self.tmp / f"{key}.log", "a")
        self.procs[key] = subprocess.Popen([sys.executable, "-m", "agents", *args], env=env,
                                           cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def start_coordinator(self):
        self._spawn("coordinator", ["coordinator", "--bind", "127.0.0.1", "--port",
                                    str(self.coord_port), "--http-port", str(self.http_port)],
                    self.env)

    def state(self, path="/api/v1/state", model=CoordinatorState):
        """The coordinator's document at ``path`` as ``model`` (None: no answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}",
                                        timeout=2) as r:
                return model.model_validate_json(r.read())
        except OSError:
            return None

    def wait(self, cond, timeout_s, what):
        deadline = time.monotonic() + timeout_s
        st = None
        while time.monotonic() < deadline:
            for key, p in self.procs.items():
                assert p.poll() is None, f"{key} exited ({p.returncode}):\n{self.log(key)}"
            st = self.state()
            if st is not None and cond(st):
                return st
            time.sleep(0.25)
        brief = st and st.model_dump(mode="json", include={"windows", "t_ns", "collocation",
                                                             "counters"})
        pytest.fail(f"timed out after {timeout_s} s waiting for {what}; last state:\n"
                    f"{json.dumps(brief, indent=1)}\n"
                    f"{st and st.model_dump_json(indent=1)[:3000]}\n"
                    f"coordinator log:\n{self.log('coordinator')}")

    def log(self, key):
        return (self.tmp / f"{key}.log").read_text()[-3000:]

    def stop(self, key, sig=signal.SIGTERM):
        p = self.procs.pop(key)
        if p.poll() is None:
            p.send_signal(sig)
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        return p.returncode

    def close(self):
        for key in list(self.procs):
            self.stop(key)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    m = Mesh(tmp_path_factory.mktemp("mesh"))
    try:
        yield m
    finally:
        m.close()


def check_accuracy(st, specs, windows):
    """The last ``windows`` history entries against the truth; returns the max errors."""
    worst = [0.0, 0.0, 0.0]
    for h in st.history[-windows:]:
        tr = truth(specs, st.reference, h.t_ns)
        assert sorted(h.vms) == sorted(specs), h
        for vm, est in h.vms.items():
            off_err = abs(est.offset_ns - tr[vm][0])
            drift_err = abs(est.drift_ppm - tr[vm][1])
            assert off_err < OFFSET_TOL_NS, (vm, h, tr)
            assert drift_err < DRIFT_TOL_PPM, (vm, h, tr)
            worst = [max(worst[0], off_err), max(worst[1], drift_err),
                     max(worst[2], abs(est.ntp_offset_ns - tr[vm][0]))]
    return worst


def test_mesh_matches_clock_truth(mesh):
    st = mesh.wait(lambda s: s.windows >= 4
                   and sorted(g.members for g in s.collocation.groups) == TRUTH_GROUPS,
                   40, "4 windows and the true collocation groups")
    assert st.reference == "vm1"
    worst = check_accuracy(st, mesh.specs, st.windows - 1)
    print(f"max |offset error| {worst[0]:.0f} ns, |drift error| {worst[1]:.3f} ppm, "
          f"NTP-style |offset error| {worst[2]:.0f} ns")
    tr = truth(mesh.specs, "vm1", st.t_ns)
    for vm, d in st.vms.items():
        assert d.offset_ns == pytest.approx(tr[vm][0], abs=OFFSET_TOL_NS)
        assert d.probes_rx > 100 and d.probes_tx > 100 and d.connected
        assert d.rejects == {}
        assert sorted(d.peers_active) == sorted(set(IPS) - {vm})
    assert len(st.owd_us) == 12 and len(st.asymmetry_us) == 6
    for key, o in st.owd_us.items():
        assert 0 < o.min_us < 50 and o.n > 40, (key, o)
    assert st.drift_series["vm3"][-1] == pytest.approx(tr["vm3"][1], abs=DRIFT_TOL_PPM)


def test_garbage_and_forged_probes_are_counted_not_fatal(mesh):
    before = mesh.state().vms["vm1"]
    target = (IPS["vm1"], mesh.udp)
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.9", 0))  # an address no VM has
        for n in range(60):  # truncated and random bytes
            s.sendto(os.urandom(n), target)
            sent += 1
        tmpl = fuzz(NslabProbe(src=node_id("vm2"), dst=node_id("vm1")))
        for _ in range(100):  # fuzzed probes
            s.sendto(bytes(tmpl), target)
            sent += 1
        # a well-formed probe without the key, one with a wrong key
        for key in (None, bytes(16)):
            s.sendto(encode(Probe(node_id("vm2"), node_id("vm1"), 2**62, 1, 0, 0), key),
                     target)
            sent += 1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((IPS["vm2"], 0))  # vm2's address, forged tag
        s.sendto(encode(Probe(node_id("vm2"), node_id("vm1"), 2**62, 1, 0, 0), bytes(16)),
                 target)
        sent += 1

    def counted(st):
        return sum(st.vms["vm1"].rejects.values()) >= sent

    st = mesh.wait(counted, 10, f"{sent} rejects at vm1")
    rej = st.vms["vm1"].rejects
    assert sum(rej.values()) == sent, rej
    assert rej.get("short", 0) >= 56 and rej.get("bad_hmac", 0) >= 2, rej
    assert st.vms["vm1"].probes_rx > before.probes_rx  # still probing
    assert mesh.procs["vm1"].poll() is None


def test_agent_restart(mesh):
    before = mesh.state().vms
    assert mesh.stop("vm4") == 0  # SIGTERM: a clean exit
    restarted_ref_ns = mesh.specs["vm1"].to_vm_ns(time.time_ns())
    mesh.start_agent("vm4")
    # its new sequence numbers start ahead of the old ones: the peers take its probes
    st = mesh.wait(lambda s: s.t_ns > restarted_ref_ns + 2e9
                   and "vm4" in s.history[-1].vms and s.vms["vm4"].connected,
                   30, "vm4 back in a window after its restart")
    for vm in ("vm1", "vm2", "vm3"):
        assert st.vms[vm].rejects.get("replay", 0) == \
            before[vm].rejects.get("replay", 0), st.vms[vm]
    check_accuracy(st, mesh.specs, 1)


def test_coordinator_restart(mesh):
    windows_before = mesh.state().windows
    assert windows_before >= 1
    assert mesh.stop("coordinator", signal.SIGKILL) == -signal.SIGKILL
    time.sleep(1.0)
    mesh.start_coordinator()
    st = mesh.wait(lambda s: s.windows >= 2 and all(
        v.connected for v in s.vms.values()) and len(s.vms) == 4,
        30, "agents to reconnect and 2 new windows")
    assert st.windows < windows_before + 2  # a new coordinator: its own history
    check_accuracy(st, mesh.specs, 1)
    health = mesh.state("/api/v1/health", Health)
    assert health.ok and health.agents_connected == 4


def test_cli_help_and_errors():
    env = dict(os.environ, PYTHONPATH=REPO)

    def run(*args):
        return subprocess.run([sys.executable, "-m", "agents", *args], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=30)

    top = run("--help")
    assert top.returncode == 0 and "agent" in top.stdout and "coordinator" in top.stdout
    agent = run("agent", "--help")
    for opt in ("--name", "--bind", "--peers", "--coordinator", "--port", "--rate", "--key",
                "--window", "--max-peers"):
        assert opt in agent.stdout
    assert "--http-port" in run("coordinator", "--help").stdout
    bad = run("agent", "--name", "vm1", "--bind", "127.0.0.1", "--peers", "vm2",
              "--coordinator", "127.0.0.1:1")
    assert bad.returncode == 2 and "NAME=IP" in bad.stderr
    bad = run("agent", "--name", "vm1", "--bind", "127.0.0.1", "--peers", "vm2=127.0.0.2",
              "--coordinator", "127.0.0.1:1", "--key", "xyz")
    assert bad.returncode == 2 and "hexadecimal" in bad.stderr


def test_peer_subset_reciprocation_and_clock_refresh(tmp_path):
    from agents.agent import Agent, AgentConfig
    from agents.clock import Clock

    udp, _ = free_ports(0)
    peers = {f"vm{i}": f"127.0.0.{i}" for i in range(2, 8)}
    t0 = time.time_ns()
    spec = ClockSpec("vm1", [Segment(t0, 1e6, "h1", Oscillator(t0, 10.0))])
    path = str(tmp_path / "vm1.json")
    spec.write(path)
    a = Agent(AgentConfig(name="vm1", bind="127.0.0.1", peers=peers,
                          coordinator=("127.0.0.1", 9), port=udp, max_peers=2, window_s=1.0,
                          seed=3), clock=Clock(path))
    try:
        a._redraw(100.0)
        assert len(a.chosen) == 2 and set(a.chosen) <= set(peers)
        assert a.next_redraw == 100.0 + a.cfg.redraw_s
        other = sorted(set(peers) - set(a.chosen))[0]
        a.last_rx[other] = 100.0  # it probed us: probe it back for two windows
        assert a.active_peers(101.9) == set(a.chosen) | {other}
        assert a.active_peers(102.1) == set(a.chosen)
        # the clock file is re-read on refresh: a 5 ms step shows at once
        t = time.time_ns()
        before = a.clock.to_vm_ns(t)
        assert before == spec.to_vm_ns(t)
        spec.append(t - 1000, step_ns=5e6)
        spec.write(path)
        a.clock.refresh()
        assert a.clock.to_vm_ns(t) - before == pytest.approx(5e6, abs=2)
    finally:
        a.sock.close()
