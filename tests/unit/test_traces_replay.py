"""The trace replay (workloads.traces.replay, summary): the accelerator and communication
streams in dependency order, collective references, the per-op summary on known times, and a
4-rank Chakra diamond on loopback (real processes, real TCP)."""
from __future__ import annotations

import time

import numpy as np
import pytest
from traces_synthetic import diamond_nodes

from workloads.config import JobConfig
from workloads.job import loopback_addresses, run_job
from workloads.traces import chakra, summary
from workloads.traces.graph import Op
from workloads.traces.replay import Runner, buffers


class Alone:
    """The mesh of a 1-rank job: collectives never exchange."""

    rank, world = 0, 1

    def exchange(self, sends=(), recvs=(), label=""):
        raise AssertionError("a 1-rank job has no peer")


class Clock:
    def now_ns(self) -> int:
        return time.monotonic_ns()


def test_runner_keeps_dependencies_and_one_kernel_at_a_time():
    ops = chakra.to_ops(diamond_nodes(0, 1), 1, passes=2, compute_scale=2.0)
    runner = Runner(ops, Alone(), Clock(), time.monotonic() + 10)
    runner.run()
    t = runner.times
    assert set(t) == {op.id for op in ops}
    for op in ops:
        for d in op.deps:
            assert t[op.id][0] >= t[d][1], (op.name, d)
    kernels = sorted(t[op.id] for op in ops if op.kind == "compute")
    for (_, e0), (s1, _) in zip(kernels, kernels[1:], strict=False):
        assert s1 >= e0  # the accelerator runs one kernel at a time
    byname = {(op.name, op.iteration): op.id for op in ops}
    left, right = t[byname[("left", 0)]], t[byname[("right", 0)]]
    assert left[1] - left[0] == 6_000_000  # 3 ms times 2, on the clock
    assert right[0] == left[1]  # queued behind left: starts at its end, as on a GPU stream
    assert t[byname[("embed", 1)]][0] >= t[byname[("join", 0)]][1]


def test_collective_buffers_know_their_results():
    op = Op(0, "ar", "collective", collective="all_reduce", bytes=16, group=(1, 3))
    send, recv, want = buffers(op, 3)
    assert send.tolist() == [4.0] * 4 and recv.shape == (4,)
    assert want.tolist() == [6.0] * 4  # (1 + 1) + (3 + 1)
    op = Op(0, "ag", "collective", collective="all_gather", bytes=16, group=(1, 3))
    assert buffers(op, 1)[2].tolist() == [2.0, 2.0, 4.0, 4.0]
    op = Op(0, "r", "collective", collective="reduce", bytes=16, group=(1, 3))
    assert buffers(op, 3)[2] is None  # not the root (the group's first)


def _doc(rank, times, iteration_s, compute_s):
    ops = [{"id": 0, "name": "l1 fwd compute", "kind": "compute", "layer": "l1",
            "phase": "fwd", "collective": None, "bytes": None, "group_size": None,
            "peer": None},
           {"id": 1, "name": "l1 wg ALLREDUCE", "kind": "collective", "layer": "l1",
            "phase": "wg", "collective": "all_reduce", "bytes": 1000, "group_size": 2,
            "peer": None}]
    return {"rank": rank, "iteration_s": iteration_s, "compute_s": compute_s,
            "comm_s": [i - c for i, c in zip(iteration_s, compute_s, strict=True)],
            "trace": {"info": {"format": "astra", "parallelism": "DATA", "layers": 1,
                               "model_parallel_group": None, "compute_s_per_pass": 0.001},
                      "ops": ops, "times": times}}


def test_summary_of_known_times():
    ms = 1_000_000
    # rank 0: pass at 100 ms: compute 1 ms, AllReduce 2..6 ms; rank 1's clock is 50 s ahead
    r0 = _doc(0, [[[100 * ms, 101 * ms], [102 * ms, 106 * ms]]], [0.006], [0.001])
    r1 = _doc(1, [[[50_000 * ms, 50_001 * ms], [50_001 * ms, 50_008 * ms]]], [0.008], [0.001])
    s = summary.summarize([r0, r1], "/x/w.txt", 1.0, 10.0, 0.5)
    ar = s["ops"][1]
    assert (ar["start_s"], ar["end_s"]) == (pytest.approx(0.001), pytest.approx(0.008))
    assert ar["duration_s"] == pytest.approx(0.007)  # the slower rank's
    assert ar["algbw_bit_s"] == pytest.approx(8000 / 0.007)
    assert ar["busbw_bit_s"] == pytest.approx(8000 / 0.007 * 1.0)  # 2(N-1)/N = 1 for N = 2
    assert s["by_layer"] == [{"layer": "l1", "compute_s": pytest.approx(0.001),
                              "comm_s": pytest.approx(0.007), "bytes": 1000}]
    assert s["passes"] == [{"iteration_s": 0.008, "compute_s": 0.001,
                            "exposed_comm_s": pytest.approx(0.007)}]
    assert s["file"] == "w.txt" and s["timeline"][1]["ops"][1] == [1, 0.001, 0.008]


def test_diamond_replays_in_dependency_order_on_loopback():
    cfg = JobConfig(trace="diamond", iterations=2, warmup=1, timeout_s=30)
    s = run_job("diamond", cfg, loopback_addresses(4))
    assert s["error"] is None and s["verified"], s["error"]
    ops = chakra.to_ops(diamond_nodes(0, 4), 4)
    index = {op.id: i for i, op in enumerate(sorted(ops, key=lambda o: o.id))}
    for doc in s["workers"]:
        for times in doc["trace"]["times"]:
            for op in ops:
                for d in op.deps:
                    assert times[index[op.id]][0] >= times[index[d]][1], (doc["rank"], op.name)
    tr = s["trace"]
    assert [o["name"] for o in tr["ops"]][3:] == ["grad all_reduce", "join", "send next",
                                                  "recv prev", "tail"]
    assert len(tr["passes"]) == 2 and len(tr["timeline"]) == 4
    for p in tr["passes"]:
        assert p["iteration_s"] >= 0.0075  # embed, left, right, join, tail: 7.5 ms of compute
        assert p["compute_s"] == pytest.approx(0.0075)
    assert s["bytes"] is None and s["algbw_bit_s"] is None
    assert np.isfinite(tr["ops"][3]["busbw_bit_s"])
