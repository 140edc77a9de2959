"""PyTorch DDP (gloo) workload on loopback: replicas stay identical, timings are reported."""
import json

from workloads import ddp
from workloads.config import DDP, DDP_LABEL, JobConfig, ddp_params
from workloads.job import Job, loopback_addresses


def test_ddp_job_on_loopback_verifies():
    config = JobConfig(collective=DDP, hidden=32, iterations=3, warmup=1, seed=3, timeout_s=60)
    with Job("ddp_unit", config, loopback_addresses(2)) as job:
        assert job.worker_argv(0)[1:3] == ["-m", "workloads.ddp"]
        s = job.run()
    assert s["error"] is None and s["verified"] is True, s
    assert s["collective"] == DDP_LABEL and s["nccl_name"] == "AllReduce"
    assert s["count"] == ddp_params(32) == 64 * 32 + 32 + 32 * 32 + 32 + 32 * 8 + 8
    assert s["bytes"] == 4 * s["count"]
    w = s["workers"][0]
    assert len(w["iteration_s"]) == 3 and w["comm_s"] == w["iteration_s"]
    assert w["compute_s"] == [0.0] * 3 and w["framework"].startswith("torch")
    assert w["params"] == s["count"] and w["seed"] == 3 and w["clock"] == "system"
    assert s["iteration_s"]["p50"] > 0 and s["completion_s"] > 0


def test_ddp_cli_refuses_a_collective_configuration(capsys):
    cfg = {"name": "j", "rank": 0, "peers": ["127.0.0.1:1"], "job": {"collective": "gather"}}
    rc = ddp.main(["--config", json.dumps(cfg), "--quiet"])
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 2 and doc["error_kind"] == "config"
    assert "gather runs with python -m workloads.worker" in doc["error"]
