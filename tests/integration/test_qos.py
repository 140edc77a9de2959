"""Traffic classes on the fabric (lab.qos): two bulk flows that share leaf1-spine1, marked with
two DSCPs; the class with HTB prio 0 takes the spare bandwidth first, so a flow that joins a
running one in that class is served as if alone, and in the other class it waits; a rate
change keeps the classes; none restores one queue per link."""
import json
import sys
import time

from lab import qos, tc
from lab.tc import TrafficClass
from topo import LeafSpine

BIG, SMALL = 20_000_000, 2_000_000  # ~1.6 s and ~0.17 s alone at 100 Mbit/s


def uplink_sent(lab) -> int:
    up = next(i for i in qos.fabric_ends(lab) if i.node.name == "leaf1")
    return tc.qdisc_stats(up.node.ipr, up.index)["sent_bytes"]


def small_after_big(lab, dscps: tuple[int, int]) -> float:
    """vm1->vm3 sends BIG bytes marked ``dscps[0]``; once 1 MB of it crossed leaf1-spine1,
    vm2->vm4 sends SMALL marked ``dscps[1]`` on the same link: the small flow's seconds until
    its receiver had every byte."""
    bulk = [sys.executable, "-m", "workloads.bulk"]
    procs = []
    try:
        for (src, dst), size, d in zip(((lab["vm1"], lab["vm3"]), (lab["vm2"], lab["vm4"])),
                                       (BIG, SMALL), dscps, strict=True):
            if procs:
                sent = uplink_sent(lab)
                while uplink_sent(lab) < sent + 1_000_000 and procs[-1].poll() is None:
                    time.sleep(0.01)
            procs.append(dst.popen(bulk + ["recv", "5401"], text=True))
            procs.append(src.popen(bulk + ["send", dst.IP(), "5401", str(size), "--dscp",
                                           str(d)], text=True))
        return json.loads(procs[-1].communicate(timeout=60)[0])["seconds"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_priority_classes_serve_the_marked_flow_first(nslab_lab):
    topo = LeafSpine(spines=1, leaves=2, vms_per_leaf=2, host_bw=1000, fabric_bw=100,
                     fabric_queue=100)
    lab = nslab_lab(topo, name="cas_qos")
    qos.set_classes(lab, [TrafficClass(dscp=8, share=0.05, prio=0),
                          TrafficClass(dscp=16, share=0.05, prio=1)])
    # the small flow in the prio-0 class runs as if alone; in the prio-1 class it gets 5 %
    # until the big one ends
    ahead, behind = small_after_big(lab, (16, 8)), small_after_big(lab, (8, 16))
    assert ahead < 0.6 * behind, (ahead, behind)
    uplink = next(i for i in qos.fabric_ends(lab) if i.node.name == "leaf1")
    lab.faults.rate("leaf1", "spine1", 50)
    shown = lab["leaf1"].cmd(f"tc class show dev {uplink.name}")
    assert "1:11" in shown and "ceil 50Mbit" in shown, shown
    ev = qos.set_classes(lab, [])
    assert ev.kind == "classes" and ev.params["dscp"] == [] and lab.classes == ()
    shown = lab["leaf1"].cmd(f"tc class show dev {uplink.name}")
    assert "1:11" not in shown and "rate 50Mbit" in shown, shown
