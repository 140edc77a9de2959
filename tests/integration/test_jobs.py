"""Collective jobs in a real lab: every collective verifies, a noisy neighbour slows a job, a
link that fails mid-job ends in recovery or a clear error within the timeout."""
import threading
import time

from session import jobs
from topo import LeafSpine
from workloads.config import JobConfig

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather",
               "scatter", "all_to_all")


def test_every_collective_verifies_in_a_lab(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=2, leaves=2, vms_per_leaf=2, host_bw=200), name="it_coll")
    vms = ["vm1", "vm2", "vm3"]  # two leaves, ECMP between them
    for i, collective in enumerate(COLLECTIVES):
        nbytes = 4 * 1001 if i % 2 else 4 * 7  # counts not divisible by 3 ranks
        cfg = JobConfig(collective=collective, bytes=nbytes, iterations=2, warmup=0,
                        timeout_s=30)
        e = jobs.run(lab, f"j{i}", cfg, vms)
        assert e["verified"] is True and e["error"] is None, (collective, e)
        assert e["completion_s"] > 0


def test_pytorch_ddp_trains_across_vms(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=1, leaves=2, vms_per_leaf=1, host_bw=100), name="it_ddp")
    cfg = JobConfig(collective=jobs.DDP, iterations=3, warmup=1, timeout_s=60)
    e = jobs.run(lab, "ddp", cfg, ["vm1", "vm2"])
    assert e["error"] is None and e["verified"] is True, e
    assert e["iteration_s"]["p50"] > 0 and e["bytes"] > 100_000  # gradients AllReduced


def test_noisy_neighbour_slows_the_job(nslab_lab):
    topo = LeafSpine(spines=1, leaves=1, vms_per_leaf=4, vms_per_host=2)
    lab = nslab_lab(topo, name="it_jobcpu", cpu_cores=0.5)
    vms = ["vm1", "vm3"]  # one rank on each host; vm2 shares vm1's host
    cfg = JobConfig(collective="all_reduce", bytes=4096, iterations=4, warmup=1,
                    compute_units=150, timeout_s=60)
    quiet = jobs.run(lab, "quiet", cfg, vms)
    lab.faults.cpu_hog("vm2")
    noisy = jobs.run(lab, "noisy", cfg, vms)
    lab.faults.cpu_hog("vm2", enable=False)
    assert quiet["verified"] and noisy["verified"]
    assert noisy["completion_s"] > 1.3 * quiet["completion_s"], (quiet, noisy)


def test_link_down_mid_job_recovers_or_fails_clearly(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=1, leaves=2, vms_per_leaf=1, host_bw=100), name="it_jobfail")
    out = {}

    def job():
        cfg = JobConfig(collective="all_reduce", bytes=1 << 20, iterations=30, warmup=0,
                        timeout_s=20)
        out["e"] = jobs.run(lab, "flaky", cfg, ["vm1", "vm2"])

    t = threading.Thread(target=job)
    start = time.monotonic()
    t.start()
    time.sleep(3)
    lab.faults.link_down("leaf1", "spine1")
    time.sleep(2)
    lab.faults.link_up("leaf1", "spine1")
    t.join(60)
    assert not t.is_alive()
    assert time.monotonic() - start < 20 + 15  # timeout + the runner's grace
    e = out["e"]
    assert (e["verified"] and e["error"] is None) or (e["error"] and not e["verified"])
