"""PyTorch DDP (gloo) workload on loopback: replicas stay identical, timings are reported."""
from workloads.ddp import DDPJob, n_params
from workloads.job import loopback_addresses


def test_ddp_job_on_loopback_verifies():
    with DDPJob("ddp_unit", loopback_addresses(2), hidden=32, iterations=3, warmup=1,
                timeout=60) as job:
        job.start()
        s = job.wait()
    assert s["error"] is None and s["verified"] is True, s
    assert s["count"] == n_params(32) == 64 * 32 + 32 + 32 * 32 + 32 + 32 * 8 + 8
    assert len(s["workers"][0]["iteration_s"]) == 3
    assert s["workers"][0]["framework"].startswith("torch")
