"""The nslab command line, run as a user would (subprocesses, as root)."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

from contracts.events import FAULT_KINDS
from lab.lab import lab_netns

NSLAB = [sys.executable, "-m", "cli.main"]

SCENARIO = """
name: it_cli
seed: 3
duration_s: 2.5
topology: {spines: 2, leaves: 2, vms_per_leaf: 1, host_bw: 100, fabric_bw: 100}
placement: {vms_per_host: 1}
hosts: {cpu_cores: 0.5}
faults:
  - {at_s: 0.5, kind: link_down, link: [leaf1, spine1]}
  - {at_s: 1.0, kind: cpu_hog, vm: vm1}
  - {at_s: 1.5, kind: link_up, link: [leaf1, spine1]}
  - {at_s: 2.0, kind: clock_step, vm: vm2, step_ms: 1}
load:
  - {src: vm1, dst: vm2, at_s: 0.2, duration_s: 1.5}
"""


def nslab(*args, **kw):
    return subprocess.run(NSLAB + list(args), capture_output=True, text=True, timeout=120, **kw)


def test_run_writes_results_json(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    out, html = tmp_path / "r.json", tmp_path / "r.html"
    r = nslab("run", str(path), "--json", str(out), "--html", str(html))
    assert r.returncode == 0, r.stderr
    assert "teardown: clean" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["schema"] == "nslab.results/1"
    assert doc["lab"]["bringup_s"] > 0 and len(doc["lab"]["vms"]) == 2
    assert doc["lab"]["capabilities"]["root"]["ok"] is True
    assert doc["lab"]["fidelity"]["samples"] > 3
    kinds = [e["kind"] for e in doc["truth"]["faults"]]
    assert [k for k in kinds if k in FAULT_KINDS] == ["link_down", "cpu_hog", "link_up",
                                                        "clock_step"]
    assert doc["load"][0]["protocol"] == "tcp" and 70 < doc["load"][0]["mbit"] <= 105
    assert doc["truth"]["faults"][kinds.index("link_down")]["t_s"] >= 0.5
    assert set(doc["truth"]["clocks"]["oscillators"]) == {"phys1", "phys2"}
    assert doc["teardown"]["clean"] is True and doc["teardown"]["leftovers"] == []
    for absent in ("agents", "sync", "owd_us", "collocation", "jobs"):  # not run: never faked
        assert absent not in doc
    # the flow vm1 -> vm2 (0.2-1.7 s) in the utilization series: vm2's downlink carried it
    fid = doc["lab"]["fidelity"]["series"]
    assert max(u for u in fid["links"]["leaf2->vm2"] if u is not None) > 0.5, fid
    # the HTML report of the same document: the timeline, link utilization and CPU plots
    page = html.read_text()
    assert [k for k in ("timeline", "clock_error", "links", "cpu") if f'id="fig-{k}"' in page] \
        == ["timeline", "links", "cpu"]  # no agents: no clock error to plot


def test_bad_scenario_exits_1_and_builds_nothing(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: it_bad\ntopology: {spines: -1, wings: 2}\n")
    r = nslab("run", str(path))
    assert r.returncode == 1
    assert str(path) in r.stderr and "topology.wings: unknown field" in r.stderr
    assert "topology.spines" in r.stderr
    assert lab_netns("it_bad") == []


def test_doctor_reports_what_the_kernel_supports():
    r = nslab("doctor", "--json")
    assert r.returncode == 0, r.stderr
    caps = json.loads(r.stdout)
    assert caps["mnexec"]["ok"] and caps["nftables"]["ok"] and caps["cgroups"]["ok"]
    assert caps["netem"]["disables"] == "link delay, jitter and reorder"
    # what it creates and removes, with the names (stderr: stdout is the JSON)
    lines = r.stderr.splitlines()
    made, gone = lines[0], lines[-1]
    assert any("pacer's BPF object" in line for line in lines[1:-1]), lines
    ns = re.search(r"creates network namespace (nslab-probe-\d+) with a veth pair p0/p1", made)
    assert ns and gone == f"nslab doctor: removed {ns[1]} and everything in it"
    assert ns[1] not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                       text=True).stdout
    text = nslab("doctor").stdout
    assert ("MISS netem" in text) != caps["netem"]["ok"]


def test_doctor_says_what_brings_a_missing_qdisc():
    caps = json.loads(nslab("doctor", "--json").stdout)
    release = os.uname().release
    for qdisc in ("netem", "fq", "fq_codel", "red"):
        cap = caps[qdisc]
        if cap["ok"]:  # a kernel with the qdisc: nothing to bring
            assert cap["fix"] == "" and cap["detail"] == f"tc qdisc {qdisc} works"
            continue
        assert "Specified qdisc kind is unknown" in cap["detail"]
        assert f"modprobe sch_{qdisc}" in cap["fix"]
        assert "apt-get install linux-modules-extra-$(uname -r)" in cap["fix"]
        if not os.path.isdir(f"/lib/modules/{release}"):  # this machine: no modules at all
            assert cap["fix"].startswith(
                f"this kernel ({release}) has no /lib/modules/{release} and loads no modules: "
                f"boot a kernel built with CONFIG_NET_SCH_{qdisc.upper()}=y or =m")


def test_exec_enters_a_vm_of_a_running_lab(nslab_lab):
    from topo import LeafSpine
    lab = nslab_lab(LeafSpine(spines=1, leaves=1, vms_per_leaf=2), name="it_exec")
    r = nslab("exec", "it_exec", "vm2", "--", "sh", "-c",
              "ip -o -4 addr show dev vm2-eth0; echo $NSLAB_CLOCK; cat /proc/self/cgroup")
    assert r.returncode == 0, r.stderr
    assert "10.1.2.2/24" in r.stdout and lab.clocks.path("vm2") in r.stdout
    assert "/nslab-it_exec/" in r.stdout
    r = nslab("exec", "it_exec", "vm9", "--", "true")
    assert r.returncode == 1 and "no VM 'vm9'" in r.stderr


CRASH = textwrap.dedent("""
    import time
    from lab import Lab
    from topo import LeafSpine
    lab = Lab(LeafSpine(spines=1, leaves=1, vms_per_leaf=2), name="it_crash")
    lab.start()
    lab.faults.cpu_hog("vm1")
    print("up", flush=True)
    time.sleep(60)
""")


def test_clean_removes_a_crashed_lab():
    proc = subprocess.Popen([sys.executable, "-c", CRASH], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash: no teardown runs
        proc.wait()
    time.sleep(0.2)
    assert lab_netns("it_crash")  # named namespaces outlive the crashed process
    r = nslab("clean", "it_crash", "--dry-run")
    assert "would remove" in r.stdout and "netns nslab-it_crash-vm1" in r.stdout
    r = nslab("clean", "it_crash")
    assert r.returncode == 0, r.stderr
    assert lab_netns("it_crash") == []
    assert not os.path.exists("/sys/fs/cgroup/cpu/nslab-it_crash")
    assert not os.path.exists("/run/nslab/it_crash")


def test_clean_probe_removes_a_killed_probes_namespace():
    """A capability probe killed before its teardown leaves ``nslab-probe-<pid>``; ``nslab
    clean probe`` removes it once that process is gone, and leaves a live one's alone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, live = f"nslab-probe-{gone.pid}", f"nslab-probe-{os.getpid()}"
    for ns in (dead, live):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        r = nslab("clean", "probe", "--dry-run")
        assert f"would remove netns {dead}" in r.stdout and live not in r.stdout, r.stdout
        assert nslab("clean", "probe").returncode == 0
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert dead not in names and live in names
    finally:
        for ns in (dead, live):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_up_opens_mininet_cli_and_tears_down(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("it_cli", "it_up"))
    r = nslab("up", str(path), input="vm1 ping -c1 -W1 10.2.1.2\n")
    assert r.returncode == 0, r.stderr
    assert "lab it_up is up" in r.stdout
    assert "1 received" in r.stderr  # Mininet's CLI prints through its logger
    assert lab_netns("it_up") == []


def test_ctrl_c_during_a_run_tears_everything_down(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("it_cli", "it_int").replace("duration_s: 2.5",
                                                                 "duration_s: 30"))
    proc = subprocess.Popen(NSLAB + ["run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while not lab_netns("it_int") and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "torn down" in err
    assert lab_netns("it_int") == []
    assert not os.path.exists("/sys/fs/cgroup/cpu/nslab-it_int")
