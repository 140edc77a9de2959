"""A PyTorch DDP job (gloo, unmodified) with ``balancer: ethereal``: the balancer daemon in
each VM pins gloo's connections (2 devices, so 2 connections per rank pair) to the spines, and
the lab's counters on the leaf-spine links show equal bytes on both spines."""
from session import jobs
from session.lb import per_spine, spine_bytes
from topo import LeafSpine
from workloads.config import DDP, JobConfig


def test_ddp_with_ethereal_puts_equal_bytes_on_both_spines(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=2, leaves=2, vms_per_leaf=2, host_bw=100, fabric_bw=100),
                    name="it_ddplb", fabric="entropy")
    vms = ["vm1", "vm2", "vm3", "vm4"]  # ring 0-1-2-3: two of its edges cross the spines
    # a daemon moves whole bursts, and DDP's two gradient buckets go out at once on the two
    # contexts' connections: a VM's spines differ by up to about one iteration's bytes
    # (~0.5 MB here), a few percent of 40 iterations' (~20 MB per VM)
    cfg = JobConfig(collective=DDP, iterations=40, warmup=1, conns_per_peer=2,
                    balancer="ethereal", timeout_s=60)
    before = spine_bytes(lab)
    e = jobs.run(lab, "ddp_eth", cfg, vms)
    spines = per_spine(before, spine_bytes(lab))
    assert e["error"] is None and e["verified"] is True, e
    daemons = e["balancer_daemons"]
    assert set(daemons) == set(vms) and all(d and d["connections"] >= 2 for d in daemons.values())
    far = [d for d in daemons["vm1"]["destinations"].values() if d["leaf"] is not None]
    assert far and all(len(d["dscp"]) == 2 for d in far), daemons["vm1"]
    assert min(spines.values()) > 5 * e["bytes"], spines  # the gradients crossed the spines
    assert max(spines.values()) <= 1.15 * min(spines.values()), (spines, daemons)
