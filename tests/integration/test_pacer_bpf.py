"""The pacer's kernel datapath (agents/native/pacer.bpf.c, agents.bpf) on real VMs: real tc
programs, real TCP, maps read back; and the daemon's fallback and its clear error where this
kernel lacks a piece (sch_fq for EDT)."""
import json
import subprocess
import sys
import time

import pytest

from topo import LeafSpine

DATAPATH = r"""
import json, sys, time
from agents.bpf import Cfg, Datapath
from agents.bpfpacer import kernel_monotonic_ns, quantile_ns
from agents.tcpsense import netstat

ifname, pins, peer, skew_ns, threshold_ns = sys.argv[1], sys.argv[2], sys.argv[3], \
    int(sys.argv[4]), int(sys.argv[5])
d = Datapath(ifname, pins)
k = kernel_monotonic_ns()
# this VM's synchronized clock reads skew_ns ahead of the kernel's: the receiver's skew is the
# OWD error its samples must show
d.set_cfg(Cfg(k0=k, ref0=k + skew_ns, ppb=0, synced=1, pace=1, threshold_ns=threshold_ns,
              max_hold_ns=2_000_000, max_cont_ns=20_000_000, max_transit_ns=80_000_000,
              ps_per_byte=80, burst_ns=250_000))
d.set_peer(peer, 0, True)
net0 = netstat()
print("ready", d.attach, flush=True)
sys.stdin.readline()
x = d.dest(0)
out = {f: getattr(x, f) for f, _ in x._fields_}
out["owd_p50_ns"] = quantile_ns(d.histogram(0, 0), 0.5)
out["retrans"] = netstat().since(net0).retrans_segs
d.close()
print(json.dumps(out), flush=True)
"""


def _start(vm, peer, pins, skew_ns, threshold_ns):
    p = vm.popen([sys.executable, "-c", DATAPATH, vm.defaultIntf().name, pins, peer.IP(),
                  str(skew_ns), str(threshold_ns)], stdin=subprocess.PIPE,
                 stdout=subprocess.PIPE, text=True)
    ready, p.attach = p.stdout.readline().split()
    assert ready == "ready"
    return p


def _stop(p) -> dict:
    out, _ = p.communicate("go\n", timeout=30)
    return json.loads(out.strip().splitlines()[-1])


SENT = 1_000_000  # bytes: held throughout (T below the skewed OWD), the transfer takes ~15 s


def test_datapath_measures_each_segments_owd_on_the_given_clocks_echoes_and_holds(nslab_lab):
    """vm1 sends 1 MB to vm2. Both datapaths map the kernel clock to the synchronized clock
    through the anchor the daemon writes; vm2's clock is set 3 ms ahead, so every data segment
    it measures shows about 3 ms (the true OWD is tens of us): the samples vm1 gets back in
    vm2's ACKs have their median within [3, 3.5] ms (the histogram's bucket is 6 % wide), one
    per ACK at least. With T = 1 ms, vm1 holds vm2: segments are refused and TCP sends them
    later, with no retransmission. Afterwards both interfaces are as they were: no clsact,
    no pinned map."""
    lab = nslab_lab(LeafSpine(spines=1, leaves=1, vms_per_leaf=2, host_bw=100, host_queue=100),
                    name="bpf_owd")
    vm1, vm2 = lab["vm1"], lab["vm2"]
    pins = f"/run/nslab/{lab.name}/bpf"
    tx_dp = _start(vm1, vm2, f"{pins}/vm1", 0, 1_000_000)
    rx_dp = _start(vm2, vm1, f"{pins}/vm2", 3_000_000, 1_000_000)
    # tcx links where the kernel has them (no qdisc grafted), else the clsact qdisc's hooks
    if tx_dp.attach == "clsact":
        assert "bpf" in vm1.cmd("tc filter show dev vm1-eth0 egress")
    else:
        assert tx_dp.attach == "tcx" and "clsact" not in vm1.cmd("tc qdisc show dev vm1-eth0")
    bulk = [sys.executable, "-m", "workloads.bulk"]
    rx = vm2.popen(bulk + ["recv", "5401"])
    time.sleep(0.5)
    tx = vm1.popen(bulk + ["send", vm2.IP(), "5401", str(SENT)])
    assert tx.wait(timeout=60) == 0
    rx.wait(timeout=10)
    tx_st, rx_st = _stop(tx_dp), _stop(rx_dp)
    segments = SENT // 1448
    assert rx_st["rx_samples"] >= segments, (tx_st, rx_st)           # every data segment measured
    assert tx_st["fb_samples"] >= segments // 3, tx_st      # echoed back on the ACKs
    assert tx_st["fb_samples"] <= rx_st["echoes"], (tx_st, rx_st)
    assert 3_000_000 <= tx_st["owd_p50_ns"] <= 3_500_000, tx_st
    assert tx_st["holds"] > 0 and tx_st["refused"] > 0, tx_st
    assert tx_st["retrans"] == 0, tx_st                     # refused, not lost
    for vm in (vm1, vm2):
        intf = vm.defaultIntf().name
        assert "clsact" not in vm.cmd(f"tc qdisc show dev {intf}")
        assert vm.cmd(f"ls {pins}/{vm.name} 2>/dev/null").strip() == ""


UDP = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    s.sendto(bytes(100), (sys.argv[1], 9))
    time.sleep(0.0002)
"""


def test_attaching_and_detaching_drops_nothing_the_vm_sends(nslab_lab):
    """vm1 sends a datagram every 0.2 ms while its datapath is attached and detached three
    times: as tcx links nothing is grafted on its vNIC, so nothing it sends is dropped (a
    qdisc graft deactivates the device and drops what meets it: agents.bpf). On a kernel
    without tcx the datapath takes clsact, and the test says so and stops."""
    lab = nslab_lab(LeafSpine(spines=1, leaves=1, vms_per_leaf=2, host_bw=100, host_queue=1000),
                    name="bpf_attach")
    vm1, vm2 = lab["vm1"], lab["vm2"]
    before = vm1.link_stats("vm1-eth0")
    udp = vm1.popen([sys.executable, "-c", UDP, vm2.IP(), "30"])
    try:
        for _ in range(3):
            dp = _start(vm1, vm2, f"/run/nslab/{lab.name}/bpf/vm1", 0, 10**9)
            attach = dp.attach
            _stop(dp)
    finally:
        udp.kill()
        udp.wait()
    if attach != "tcx":
        pytest.skip(f"this kernel has no tcx: the datapath attached with {attach}")
    after = vm1.link_stats("vm1-eth0")
    assert after["tx_bytes"] - before["tx_bytes"] > 100 * 1000, (before, after)  # it sent
    assert after["tx_dropped"] == before["tx_dropped"], (before, after)


PACER = [sys.executable, "-m", "agents", "pacer", "--name", "vm1", "--ifname", "vm1-eth0",
         "--peers", "vm2={peer}", "--bind", "{ip}", "--coordinator", "{peer}:7700",
         "--api", "{peer}:7780", "--line-mbit", "100"]


def test_pacer_falls_back_to_probe_and_edt_needs_sch_fq(nslab_lab):
    """Where the kernel datapath cannot run (here: its pin directory cannot take a bpffs) the
    pacer says why and runs the probe datapath; asking for EDT holds on this kernel, which has
    no sch_fq, is an error naming it (nslab doctor reports hold refuse here)."""
    lab = nslab_lab(LeafSpine(spines=1, leaves=1, vms_per_leaf=2, host_bw=100),
                    name="bpf_fallback")
    vm1, vm2 = lab["vm1"], lab["vm2"]
    args = [a.format(peer=vm2.IP(), ip=vm1.IP()) for a in PACER]
    p = vm1.popen(args + ["--pin-dir", "/proc/nslab-no-bpffs"], stderr=subprocess.PIPE,
                  text=True)
    try:
        deadline, seen = time.monotonic() + 30, ""
        while "datapath probe" not in seen and time.monotonic() < deadline:
            seen += p.stderr.readline()
        assert "the kernel datapath cannot run here: cannot mount a bpffs at " \
               "/proc/nslab-no-bpffs" in seen, seen
        while "htb" not in vm1.cmd("tc qdisc show dev vm1-eth0") and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert "htb" in vm1.cmd("tc qdisc show dev vm1-eth0")   # the probe pacer's classes
    finally:
        p.terminate()
        p.wait(timeout=10)
    r = vm1.popen(args + ["--pin-dir", f"/run/nslab/{lab.name}/bpf/vm1", "--hold", "edt"],
                  stderr=subprocess.PIPE, text=True)
    _, err = r.communicate(timeout=30)
    assert r.returncode == 1 and "hold edt needs sch_fq" in err, err
    assert "clsact" not in vm1.cmd("tc qdisc show dev vm1-eth0")
