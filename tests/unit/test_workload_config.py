"""JobConfig, the one definition of a job's configuration, and WorkerConfig, what a rank
receives: defaults, every rejected case with its message, the JSON round trip into a worker."""
import json
import re

import pytest
from pydantic import ValidationError

from workloads import worker as wk
from workloads.config import (
    DDP,
    JobConfig,
    WorkerConfig,
    as_job_config,
    describe,
)
from workloads.ddp_models import params

PEERS = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]


def test_defaults_and_normalized_names():
    c = JobConfig()
    assert (c.collective, c.bytes, c.count, c.dtype, c.op) == ("all_reduce", 1 << 20, None,
                                                               "float32", "sum")
    assert (c.iterations, c.warmup, c.timeout_s, c.connect_timeout_s) == (10, 1, 60.0, 10.0)
    assert c.hidden is None and c.dscp == () and c.src_port_base is None
    c = JobConfig(collective="ncclAllGather".removeprefix("nccl"), dtype="half", count=5)
    assert (c.collective, c.dtype, c.bytes, c.count) == ("all_gather", "float16", None, 5)
    assert JobConfig(collective="alltoall").collective == "all_to_all"
    d = JobConfig(collective=DDP, iterations=3)
    assert d.hidden == 256 and d.bytes is None and d.algorithm == "all_reduce"
    assert d.count_for(4) == params("mlp", 256, 4)


def test_sizes_follow_nccl_tests():
    c = JobConfig(collective="all_gather", bytes=1000, dtype="float64")
    # 1000 bytes // 8 = 125 elements in the larger (receive) buffer, 41 per rank on 3
    assert c.count_for(3) == 41 and c.size_for(3) == 41 * 3 * 8
    assert JobConfig(bytes=1000).count_for(3) == 250  # all_reduce: whole buffer


@pytest.mark.parametrize("fields, message", [
    ({"collective": "allreduce2"}, "collective: unknown 'allreduce2'; expected one of "
     "all_reduce, broadcast, reduce, all_gather, reduce_scatter, gather, scatter, all_to_all "
     "or ddp"),
    ({"dtype": "bfloat16"}, "dtype: unsupported 'bfloat16'; expected one of int8, uint8"),
    ({"op": "mean"}, "op: unknown 'mean'; expected one of sum, prod, max, min, avg"),
    ({"op": "avg", "dtype": "int32"}, "op: avg needs a floating dtype, not int32"),
    ({"bytes": 64, "count": 16}, "bytes, count: give at most one of them"),
    ({"bytes": 0}, "bytes: Input should be greater than or equal to 1"),
    ({"count": -1}, "count: Input should be greater than or equal to 1"),
    ({"iterations": 0}, "iterations: Input should be greater than or equal to 1"),
    ({"warmup": -1}, "warmup: Input should be greater than or equal to 0"),
    ({"compute_units": -2}, "compute_units: Input should be greater than or equal to 0"),
    ({"conns_per_peer": 0}, "conns_per_peer: Input should be greater than or equal to 1"),
    ({"src_port_base": 70000}, "src_port_base: Input should be less than or equal to 65535"),
    ({"dscp": [10, 64]}, "dscp.1: Input should be less than or equal to 63"),
    ({"timeout_s": 0}, "timeout_s: Input should be greater than 0"),
    ({"connect_timeout_s": -1}, "connect_timeout_s: Input should be greater than 0"),
    ({"root": -1}, "root: Input should be greater than or equal to 0"),
    ({"hidden": 64}, "hidden: only for collective ddp, not all_reduce"),
    ({"collective": DDP, "bytes": 1024}, "bytes: not used by ddp"),
    ({"collective": DDP, "count": 10}, "count: not used by ddp"),
    ({"collective": DDP, "dtype": "float64"}, "dtype: not used by ddp"),
    ({"collective": DDP, "dscp": [1]}, "dscp: not used by ddp"),
    ({"collective": DDP, "balancer": "reps", "conns_per_peer": 2},
     "balancer: reps is not for ddp"),
    ({"collective": DDP, "balancer": "ethereal"},
     "balancer: ethereal sets DSCP 1..conns_per_peer itself and needs one connection per path"),
    ({"collective": DDP, "hidden": 0}, "hidden: Input should be greater than or equal to 1"),
    ({"ranks": 4}, "ranks: Extra inputs are not permitted"),
])
def test_each_invalid_field_is_named_with_what_is_allowed(fields, message):
    with pytest.raises(ValidationError) as err:
        JobConfig(**fields)
    assert describe(err.value).startswith(message), describe(err.value)


@pytest.mark.parametrize("job, world, message", [
    ({"collective": "broadcast", "root": 3}, 3, "root: 3 is outside 0..2 (3 ranks)"),
    ({"collective": "all_gather", "bytes": 11}, 3,
     "bytes: 11 is too small for all_gather of float32 on 3 ranks; allowed >= 12"),
    ({"src_port_base": 65530, "conns_per_peer": 2}, 3,
     "src_port_base: 65530 + 3*3*2 connections would need port 65547; allowed 1..65518"),
])
def test_checks_that_need_the_world(job, world, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        JobConfig(**job).count_for(world)
    with pytest.raises(ValidationError) as err:
        WorkerConfig(name="j", rank=0, peers=PEERS[:world], job=JobConfig(**job))
    assert describe(err.value).startswith(message)


def test_worker_config_rejects_a_rank_outside_the_world_and_bad_addresses():
    with pytest.raises(ValidationError) as err:
        WorkerConfig(name="j", rank=3, peers=PEERS, job=JobConfig())
    assert describe(err.value) == "rank: 3 is outside 0..2 (3 peer addresses)"
    with pytest.raises(ValidationError) as err:
        WorkerConfig(name="j", rank=0, peers=["10.0.0.1:99999"], job=JobConfig())
    assert describe(err.value) == "peers: address '10.0.0.1:99999': port 99999 is outside " \
                                  "0..65535"
    with pytest.raises(ValidationError, match="job.iterations"):
        WorkerConfig.model_validate_json(json.dumps(
            {"name": "j", "rank": 0, "peers": PEERS, "job": {"iterations": "many"}}))


def test_json_round_trip_into_the_worker():
    job = JobConfig(collective="reduce_scatter", count=7, dtype="int32", op="max",
                    iterations=4, warmup=0, compute_units=1, conns_per_peer=2,
                    src_port_base=20000, dscp=[10, 18], connect_timeout_s=2.5, timeout_s=9,
                    seed=5)
    cfg = WorkerConfig(name="rt", rank=1, peers=PEERS, job=job)
    back = WorkerConfig.model_validate_json(cfg.model_dump_json())
    assert back == cfg and back.job == job and back.job.model_dump() == job.model_dump()
    assert JobConfig.model_validate_json(JobConfig(collective=DDP).model_dump_json()) == \
        JobConfig(collective=DDP)  # the filled-in hidden survives, bytes stays absent
    doc = wk.base_document(back)  # what the worker reports before it runs
    assert (doc["job"], doc["rank"], doc["world"], doc["host"]) == ("rt", 1, 3, PEERS[1])
    assert (doc["collective"], doc["count"], doc["bytes"], doc["op"]) == (
        "reduce_scatter", 7, 7 * 3 * 4, "max")
    assert doc["dscp"] == [10, 18] and doc["src_port_base"] == 20000 and doc["root"] is None


def test_a_subclass_such_as_the_scenario_jobspec_reduces_to_a_job_config():
    class Spec(JobConfig):
        name: str
        ranks: int = 4

    spec = Spec(name="a", collective="Broadcast", bytes=4096)
    plain = as_job_config(spec)
    assert type(plain) is JobConfig and plain == JobConfig(collective="broadcast", bytes=4096)
    with pytest.raises(ValidationError, match="hidden: only for collective ddp"):
        Spec(name="b", hidden=3)


@pytest.mark.parametrize("fields, compute", [
    ({"gpu_s": 0.05}, {"kind": "accelerator", "s_per_iteration": 0.05, "units": 0}),
    ({"compute_units": 300}, {"kind": "cpu", "s_per_iteration": None, "units": 300}),
    ({"gpu_s": 0.1, "compute_units": 3}, {"kind": "both", "s_per_iteration": 0.1, "units": 3}),
    ({}, {"kind": "none", "s_per_iteration": None, "units": 0}),
])
def test_compute_says_what_a_rank_computes(fields, compute):
    assert JobConfig(**fields).compute() == compute


def test_a_ddp_job_takes_gloo_devices_and_ethereal():
    c = JobConfig(collective=DDP, conns_per_peer=2, balancer="ethereal")
    assert (c.conns_per_peer, c.balancer) == (2, "ethereal")
