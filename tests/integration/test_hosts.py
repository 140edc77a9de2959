"""The host layer with real TCP: VMs of one physical host share its NIC, and traffic between
two VMs of one host turns in the host's virtual switch."""
import pytest
from traffic import iperf3, iperf3_together

from lab.capabilities import probe
from lab.errors import CapabilityError, LabError
from lab.fidelity import FidelitySampler
from lab.lab import Lab
from lab.queues import QueueReader
from topo import LeafSpine

VNIC = 50
"""Mbit/s: every VM's vNIC. Four at full rate (200 Mbit/s) fit this 2-core machine."""
NIC = 100
"""Mbit/s: the host NIC of the issue's scenario, half of its four VMs' vNICs together."""
GOODPUT = 0.95
"""TCP goodput over an HTB rate that counts Ethernet headers (1448/1514 = 0.956)."""


def hosts_topo(nic_bw):
    """Two hosts of four VMs, one per leaf: vm1-vm4 on phys1, vm5-vm8 on phys2."""
    return LeafSpine(spines=1, leaves=2, vms_per_leaf=4, vms_per_host=4, host_bw=VNIC,
                     hosts={"nic_bw": nic_bw} if nic_bw else {})


def mbit(doc):
    return doc["end"]["sum_received"]["bits_per_second"] / 1e6


@pytest.mark.parametrize("nic_bw", [NIC, None], ids=["nic100", "nic_unset"])
def test_four_vms_of_a_host_share_its_nic(nslab_lab, nic_bw):
    lab = nslab_lab(hosts_topo(nic_bw), name="it_nic")
    pairs = [(lab[f"vm{i}"], lab[f"vm{i + 4}"]) for i in range(1, 5)]
    with FidelitySampler(interval_s=0.25) as sampler:
        sampler.watch(QueueReader(lab))
        rates = [mbit(d) for d in iperf3_together(pairs, "-t", "5", "-O", "2")]
    if nic_bw:
        assert sum(rates) <= nic_bw * 1.02, rates  # the NIC's rate bounds the four together
        assert sum(rates) >= nic_bw * GOODPUT * 0.9, rates
        for r in rates:  # the NIC serves its VMs in turn: each near a quarter
            assert 0.6 * nic_bw / 4 <= r <= 1.4 * nic_bw / 4, rates
    else:
        for r in rates:
            assert VNIC * GOODPUT * 0.9 <= r <= VNIC * 1.02, rates
    (nic,) = [n for n in lab.host_layer.read() if n["host"] == "phys1"]
    assert nic["bw_mbit"] == nic_bw and nic["vms"] == ["vm1", "vm2", "vm3", "vm4"]
    # the fidelity sampler watches the NIC's queue like any shaped link's
    queues = {q["link"]: q for q in sampler.summary()["queues"]}
    if nic_bw:
        assert nic["to_leaf"]["sent_bytes"] >= 4 * 1e6 * nic_bw / 8 * GOODPUT * 0.9
        assert queues["phys1->leaf1"]["queued_samples"] >= 10, queues["phys1->leaf1"]
    else:
        assert "phys1->leaf1" not in queues  # unshaped: no emulated queue to watch


def test_vms_of_one_host_talk_inside_it(nslab_lab):
    lab = nslab_lab(hosts_topo(NIC), name="it_vswitch")
    nic = [i for i in lab.faults.ends("phys1", "leaf1") if i.node.name == "phys1"][0]
    before = nic.node.ipr.get_links(nic.index)[0].get_attr("IFLA_STATS64")["tx_bytes"]
    rate = mbit(iperf3(lab["vm1"], lab["vm2"], "-t", "2"))
    after = nic.node.ipr.get_links(nic.index)[0].get_attr("IFLA_STATS64")["tx_bytes"]
    assert VNIC * GOODPUT * 0.9 <= rate <= VNIC * 1.02, rate
    assert after - before < 100_000  # ARP and the like; the 12 MB stayed in the host


def test_vswitch_delay_without_netem_is_a_clear_error():
    topo = LeafSpine(spines=1, leaves=1, vms_per_leaf=2, vms_per_host=2,
                     hosts={"vswitch_delay_us": 20})
    if probe()["netem"].ok:
        pytest.skip("this kernel has sch_netem: the delay is emulated, not refused")
    with pytest.raises(CapabilityError, match="delay need the kernel qdisc sch_netem"):
        Lab(topo, name="it_vsdelay").start()


def nic_sent(lab, host):
    """Bytes the host's NIC sent toward its leaf since bring-up."""
    (doc,) = [n for n in lab.host_layer.read() if n["host"] == host]
    return doc["to_leaf"]["sent_bytes"]


def test_migration_moves_a_vms_traffic_to_its_new_hosts_nic(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=1, leaves=2, vms_per_leaf=2, vms_per_host=1,
                              hosts={"nic_bw": 20, "nic_queue": 50}), name="it_nicmove")
    vm1, vm3 = lab["vm1"], lab["vm3"]
    lab.faults.migrate("vm1", "phys2")
    before = {h: nic_sent(lab, h) for h in ("phys1", "phys2")}
    rate = mbit(iperf3(vm1, vm3, "-t", "2"))
    assert 20 * GOODPUT * 0.9 <= rate <= 20 * 1.02, rate
    sent = {h: nic_sent(lab, h) - before[h] for h in before}
    assert sent["phys2"] > 2e6 and sent["phys1"] < 100_000, sent
    (nic,) = [n for n in lab.host_layer.read() if n["host"] == "phys2"]
    assert nic["vms"] == ["vm1", "vm2"] and nic["bw_mbit"] == 20 and nic["queue_packets"] == 50
    # the NIC is the link (host, leaf): a rate fault applies to its every VM class
    lab.faults.rate("phys2", "leaf1", 10)
    rate = mbit(iperf3(vm1, vm3, "-t", "2"))
    assert 10 * GOODPUT * 0.9 <= rate <= 10 * 1.02, rate
    with pytest.raises(LabError, match="under leaf1"):
        lab.faults.migrate("vm1", "phys3")
