"""Captures: ``nslab run --pcap`` records chosen VMs' and links' traffic with tcpdump."""
import subprocess
import sys

from scapy.all import TCP, rdpcap

from lab.lab import lab_netns

SCENARIO = """
name: pc_run
seed: 3
duration_s: 1.5
topology: {spines: 1, leaves: 2, vms_per_leaf: 1, host_bw: 100, fabric_bw: 100}
placement: {vms_per_host: 1}
load:
  - {src: vm1, dst: vm2, at_s: 0.2, duration_s: 1}
"""


def nslab(*args):
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True,
                          text=True, timeout=120)


def test_run_records_a_vm_and_a_link(tmp_path):
    path = tmp_path / "pc.yaml"
    path.write_text(SCENARIO)
    pcaps = tmp_path / "pcaps"
    r = nslab("run", str(path), "--pcap", str(pcaps), "--capture", "vm1,leaf2-spine1")
    assert r.returncode == 0, r.stderr
    assert lab_netns("pc_run") == []
    for name in ("vm1", "leaf2-spine1"):
        packets = rdpcap(str(pcaps / f"{name}.pcap"))
        assert f"capture: {pcaps / name}.pcap ({len(packets)} packets)" in r.stdout
        # the iperf3 flow vm1 -> vm2 (10.2.1.2) crossed both: the VM's vNIC and the link
        # from spine1 to vm2's leaf, data one way and ACKs the other
        flow = [p for p in packets if TCP in p and 5201 in (p[TCP].sport, p[TCP].dport)]
        assert {p["IP"].dst for p in flow} == {"10.1.1.2", "10.2.1.2"}
        assert sum(len(p) for p in flow) > 1_000_000  # ~10 MB in 1 s at 100 Mbit/s


def test_an_unknown_capture_target_is_an_error_naming_the_vms(tmp_path):
    path = tmp_path / "pc.yaml"
    path.write_text(SCENARIO.replace("pc_run", "pc_bad"))
    r = nslab("run", str(path), "--pcap", str(tmp_path), "--capture", "vm7")
    assert r.returncode == 1
    assert "capture target 'vm7': not a VM nor a link 'a-b' of lab pc_bad (VMs: vm1, vm2)" \
        in r.stderr
    assert lab_netns("pc_bad") == []
