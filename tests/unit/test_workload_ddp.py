"""PyTorch DDP (gloo) workload on loopback: replicas stay identical, timings are reported."""
import json
import time

import pytest

from workloads import ddp
from workloads.config import DDP, DDP_LABEL, JobConfig
from workloads.ddp_models import params
from workloads.job import Job, loopback_addresses, run_job
from workloads.schedule import Schedule


def test_ddp_job_on_loopback_verifies():
    config = JobConfig(collective=DDP, hidden=32, iterations=3, warmup=1, seed=3, timeout_s=60)
    with Job("ddp_unit", config, loopback_addresses(2)) as job:
        assert job.worker_argv(0)[1:3] == ["-m", "workloads.ddp"]
        s = job.run()
    assert s["error"] is None and s["verified"] is True, s
    assert s["collective"] == DDP_LABEL and s["nccl_name"] == "AllReduce"
    assert s["count"] == params("mlp", 32, 2) == 64 * 32 + 32 + 32 * 32 + 32 + 32 * 8 + 8
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


def test_ddp_transformer_and_moe_on_loopback():
    for model, world in (("transformer", 2), ("moe", 3)):
        config = JobConfig(collective=DDP, model=model, hidden=16, iterations=2, warmup=1,
                           timeout_s=60)
        s = run_job(f"ddp_{model}", config, loopback_addresses(world))
        assert s["error"] is None and s["verified"] is True, (model, s["error"])
        assert s["count"] == params(model, 16, world)
    with pytest.raises(ValueError, match="hidden: 18 is not a multiple"):
        JobConfig(collective=DDP, model="transformer", hidden=18)
    with pytest.raises(ValueError, match="model: only for collective ddp"):
        JobConfig(model="moe")
    with pytest.raises(ValueError, match="moe needs 2 to 32 ranks"):
        JobConfig(collective=DDP, model="moe").count_for(1)


def test_ddp_iterations_wait_for_their_slots():
    sched = Schedule(start_ns=time.time_ns(), period_s=0.4, shift_s=0.1)
    config = JobConfig(collective=DDP, hidden=16, iterations=3, warmup=1, schedule=sched,
                       timeout_s=60)
    s = run_job("ddp_slots", config, loopback_addresses(2))
    assert s["error"] is None and s["verified"], s["error"]
    for w in s["workers"]:
        first = w["first_slot"]  # the first slot the rank could catch once the group was up
        assert first is not None and w["skipped_slots"] == 0
        # each timed iteration starts at its slot (warm-up took slot `first`)
        for k, t in enumerate(w["comm_start_ns"], start=first + 1):
            slot = sched.slot_ns(k, w["rank"])
            assert slot <= t < slot + 100_000_000, (k, t - slot)
