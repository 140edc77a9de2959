"""Trace parsers and graphs (workloads.traces): ASTRA-sim text workloads and Chakra files
against values read off the files, the groups and dependencies each parallelism defines, and
the errors for what is not replayed."""
from __future__ import annotations

import pytest
from traces_synthetic import diamond_nodes, node, write_diamond

from workloads import traces
from workloads.config import JobConfig
from workloads.traces import astra, chakra
from workloads.traces import chakra_et_pb2 as pb
from workloads.traces.graph import Op, comm_order, topological

RESNET = traces.resolve("Resnet50_DataParallel.txt")
HYBRID = traces.resolve("transformer_hybrid.txt")


def by_name(ops):
    return {(op.name, op.iteration): op for op in ops}


def test_resnet_file_parses_to_its_numbers():
    wl = astra.load(RESNET)
    assert wl.parallelism == "DATA" and len(wl.layers) == 54
    conv1, fc = wl.layers[0], wl.layers[-1]
    assert (conv1.name, conv1.cycles, conv1.comm["wg"], conv1.size["wg"], conv1.update_cycles) \
        == ("conv1", {"fwd": 13003, "ig": 12864, "wg": 32291}, "ALLREDUCE", 37632, 3229)
    assert (fc.name, fc.size["wg"]) == ("fc1000", 8192000)
    # sums of columns 3, 6, 9 and 11 of the layer lines (awk)
    assert wl.total_cycles() == 1095314
    assert sum(la.size["wg"] for la in wl.layers) == 102011648


def test_data_parallel_graph_overlaps_weight_gradients_with_backward():
    ops = astra.build(astra.load(RESNET), rank=2, world=8, passes=2, clock_ghz=2.0,
                      compute_scale=10.0, bytes_scale=0.5)
    ops_1 = [o for o in ops if o.iteration == 0]
    assert len(ops_1) == 54 * 5  # fwd, ig, wg compute, wg AllReduce, update per layer
    n = by_name(ops)
    ar = n[("conv1 wg ALLREDUCE", 0)]
    assert ar.group == tuple(range(8)) and ar.collective == "all_reduce"
    assert ar.bytes == 37632 // 2  # whole float32 elements, divisible by 8 ranks here
    assert n[("conv1 fwd compute", 0)].duration_ns == round(13003 / 2.0 * 10)
    # the AllReduce does not block: the next backward compute waits only for the wg compute
    fc_ar = n[("fc1000 wg ALLREDUCE", 0)]
    nxt = n[("layer_512_3_conv3 ig compute", 0)]
    assert fc_ar.id not in nxt.deps and n[("fc1000 wg compute", 0)].id in nxt.deps
    # the next pass's forward of a layer waits for its update, which follows its AllReduce
    upd = n[("conv1 update", 0)]
    assert upd.deps == (ar.id,) and upd.duration_ns == round(3229 / 2.0 * 10)
    assert upd.id in n[("conv1 fwd compute", 1)].deps
    assert n[("conv1 fwd compute", 0)].deps == ()


def test_hybrid_transformer_groups_and_blocking_collectives():
    wl = astra.load(HYBRID)
    assert (wl.parallelism, wl.option) == ("HYBRID_TRANSFORMER", 2)
    assert astra.groups(wl, 3, 8) == {"fwd": (2, 3), "ig": (2, 3), "wg": (1, 3, 5, 7)}
    ops = astra.build(wl, rank=3, world=8, passes=1)
    n = by_name(ops)
    fwd = n[("attention fwd ALLREDUCE", 0)]
    assert fwd.group == (2, 3)
    assert fwd.id in n[("mlp fwd compute", 0)].deps  # blocking in the model-parallel group
    ig = n[("output ig REDUCESCATTER", 0)]
    assert ig.group == (2, 3) and ig.id in n[("output wg compute", 0)].deps
    wg = n[("output wg ALLREDUCE", 0)]
    assert wg.group == (1, 3, 5, 7) and wg.id not in n[("mlp ig compute", 0)].deps
    assert n[("output fwd ALLGATHER", 0)].bytes == 65536  # all_gather: N * count elements
    with pytest.raises(ValueError, match="does not divide 5 ranks"):
        astra.groups(wl, 0, 5)


def test_dlrm_waits_for_the_embedding_all_to_all():
    text = ("HYBRID_DLRM 1\n4\n"
            "emb -1 10 ALLTOALL 4096 10 ALLTOALL 4096 10 NONE 0 0\n"
            "bot -1 20 NONE 0 20 NONE 0 20 ALLREDUCE 1024 5\n"
            "top1 -1 30 NONE 0 30 NONE 0 30 ALLREDUCE 2048 5\n"
            "top2 -1 40 NONE 0 40 NONE 0 40 ALLREDUCE 2048 5\n")
    ops = astra.build(astra.parse(text), rank=0, world=4, passes=2)
    n = by_name(ops)
    a2a = n[("emb fwd ALLTOALL", 0)]
    assert a2a.id not in n[("bot fwd compute", 0)].deps  # not blocking
    assert a2a.id in n[("top1 fwd compute", 0)].deps  # layer B+1 = 2 waits for it
    ig0 = n[("emb ig ALLTOALL", 0)]
    assert n[("top1 ig compute", 0)].id in ig0.deps  # issued after layer B+1's ig compute
    assert ig0.id in n[("emb fwd compute", 1)].deps  # the pass ends with it
    assert ("emb ig compute", 0) not in n  # layer 0 has no ig compute in DLRM


@pytest.mark.parametrize("text, error", [
    ("MODEL\n1\nl -1 1 NONE 0 1 NONE 0 1 NONE 0 0\n", "parallelism MODEL is not replayed"),
    ("DATA\n1\nl -1 1 ALLREDUCE 8 1 NONE 0 1 NONE 0 0\n", "l fwd; set them to NONE"),
    ("DATA\n2\nl -1 1 NONE 0 1 NONE 0 1 NONE 0 0\n", "announces 2 layers and has 1"),
    ("DATA\n1\nl -1 1 NONE 0 1 NONE 0 1 NONE 0\n", ":3: a layer line has 12 fields"),
    ("DATA\n1\nl -1 1 NONE 0 1 BCAST 0 1 NONE 0 0\n", "ig collective 'BCAST'"),
    ("HYBRID_TRANSFORMER 4\n1\nl -1 1 NONE 0 1 NONE 0 1 NONE 0 0\n",
     "model_parallel_NPU_group: N"),
])
def test_astra_errors_name_what_is_wrong(text, error):
    with pytest.raises(ValueError, match=error):
        astra.parse(text, "w.txt")


def test_chakra_files_round_trip_and_replay_in_dependency_order(tmp_path):
    write_diamond(tmp_path / "d", world=2)
    meta, nodes = chakra.read(tmp_path / "d.1.et")
    assert meta.version == "0.0.4" and [n.name for n in nodes][:3] == ["embed", "left", "right"]
    assert chakra.attrs(nodes[5]) == {"comm_size": 16384, "comm_dst": 0}
    ops, info = traces.ops_for(str(tmp_path / "d"), "auto", 1, 2, passes=2, compute_scale=2)
    assert info["format"] == "chakra" and info["compute_s_per_pass"] == pytest.approx(0.015)
    n = by_name(ops)
    join = n[("join", 0)]
    assert set(join.deps) == {3, 4}  # data and control dependencies
    assert n[("send next", 0)].peer == 0 and n[("recv prev", 0)].bytes == 16384
    # pass 1 starts after pass 0's last node (tail, id 8): ids offset by max id + 1 = 9
    assert n[("embed", 1)].id == 10 and n[("embed", 1)].deps == (8,)
    order = [o.name for o in comm_order(ops) if o.iteration == 0]
    assert order == ["grad all_reduce", "send next", "recv prev"]
    assert traces.detect(str(tmp_path / "d")) == "chakra"


def test_shipped_diamond_is_what_the_builder_writes(tmp_path):
    write_diamond(tmp_path / "d")
    for r in range(4):
        shipped = traces.resolve("diamond").replace("diamond", f"diamond.{r}.et")
        assert open(shipped, "rb").read() == (tmp_path / f"d.{r}.et").read_bytes()
    traces.check(traces.resolve("diamond"), "auto", 4)


def test_chakra_errors_name_the_node(tmp_path):
    bad = [node(1, "load", pb.MEM_LOAD_NODE)]
    with pytest.raises(ValueError, match=r"node 1 \(load\): MEM_LOAD_NODE is not replayed"):
        chakra.to_ops(bad, 1)
    pg = [node(1, "ar", pb.COMM_COLL_NODE, comm_type=pb.ALL_REDUCE, comm_size=8, pg_name="7")]
    with pytest.raises(ValueError, match="process group '7'"):
        chakra.to_ops(pg, 2)
    cyc = [node(1, "a", pb.COMP_NODE, data=[2]), node(2, "b", pb.COMP_NODE, data=[1])]
    chakra.write(tmp_path / "c.0.et", cyc)
    with pytest.raises(ValueError, match=r"dependency cycle among nodes \[1, 2\]"):
        traces.ops_for(str(tmp_path / "c"), "chakra", 0, 1, 1)
    (tmp_path / "t.0.et").write_bytes(b"\x05ab")
    with pytest.raises(ValueError, match="truncated"):
        chakra.read(tmp_path / "t.0.et")


def test_check_finds_ranks_that_disagree(tmp_path):
    for r in range(2):
        nodes = diamond_nodes(r, 2)
        if r == 1:
            nodes[3].attr[1].int64_val = 4096  # rank 1's AllReduce is smaller
        chakra.write(tmp_path / f"x.{r}.et", nodes)
    with pytest.raises(ValueError, match="ranks 0 and 1 of group .0, 1. disagree at their "
                                         "collective 0"):
        traces.check(str(tmp_path / "x"), "auto", 2)
    with pytest.raises(ValueError, match="2 Chakra files for 3 ranks"):
        traces.check(str(tmp_path / "x"), "auto", 3)


def test_topological_order_takes_the_lowest_ready_id():
    ops = [Op(5, "e", "compute", deps=(1,)), Op(1, "a", "compute"), Op(3, "c", "compute"),
           Op(2, "b", "collective", deps=(3,))]
    assert [o.id for o in topological(ops)] == [1, 3, 2, 5]
    with pytest.raises(ValueError, match="depends on node 9"):
        topological([Op(1, "a", "compute", deps=(9,))])


def test_trace_jobs_in_the_job_config():
    cfg = JobConfig(trace="transformer_hybrid.txt", iterations=2, trace_compute_scale=5)
    assert cfg.collective == "trace" and cfg.trace == HYBRID
    cfg.count_for(4)
    with pytest.raises(ValueError, match="does not divide 3 ranks"):
        cfg.count_for(3)
    with pytest.raises(ValueError, match="give either collective .all_reduce. or trace"):
        JobConfig(trace="diamond", collective="all_reduce")
    with pytest.raises(ValueError, match="bytes: not used by a trace job"):
        JobConfig(trace="diamond", bytes=1024)
    with pytest.raises(ValueError, match="trace_bytes_scale: only for a trace job"):
        JobConfig(trace_bytes_scale=0.1)
    with pytest.raises(ValueError, match="built-in: Resnet50_DataParallel.txt, diamond, "
                                         "transformer_hybrid.txt"):
        JobConfig(trace="resnet")


def test_a_scenario_trace_path_is_relative_to_its_folder(tmp_path):
    (tmp_path / "mine.txt").write_text(open(HYBRID).read())
    cfg = JobConfig.model_validate({"trace": "mine.txt"}, context={"base": tmp_path})
    assert cfg.trace == str(tmp_path / "mine.txt")
    assert JobConfig.model_validate({"trace": "diamond"}, context={"base": tmp_path}).trace \
        == traces.resolve("diamond")


def test_bytes_scale_keeps_the_modelled_ratio():
    # 400 Gbit/s modelled, 100 Mbit/s lab link, compute 100 times slower: 100 * 1e8 / 4e11
    assert traces.scale_for(100, 100e6, 400e9) == pytest.approx(0.025)
    assert astra.run_bytes("all_reduce", 37632, 0.025, 8) == 940  # 235 float32 elements
    assert astra.run_bytes("all_gather", 10, 1.0, 8) == 32  # one element per rank at least


def test_a_trace_job_computes_on_its_accelerator_per_operation():
    assert JobConfig(trace="diamond").compute() == {"kind": "accelerator",
                                                    "s_per_iteration": None, "units": 0}
