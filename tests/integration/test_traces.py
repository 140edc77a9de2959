"""Trace jobs in a real lab: ASTRA-sim's ResNet-50 data-parallel file on 4 and 8 VMs, a
hybrid-parallel file with its groups, and a Chakra diamond, replayed over real TCP."""
from session import jobs
from topo import LeafSpine
from workloads import traces
from workloads.config import JobConfig
from workloads.traces import astra

COMPUTE_SCALE, BYTES_SCALE = 10.0, 0.002


def test_resnet50_data_parallel_replays_on_4_and_8_vms(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=2, leaves=2, vms_per_leaf=4, host_bw=200), name="it_trace")
    wl = astra.load(traces.resolve("Resnet50_DataParallel.txt"))
    compute_s = wl.total_cycles() * COMPUTE_SCALE / 1e9
    for world in (4, 8):
        cfg = JobConfig(trace="Resnet50_DataParallel.txt", iterations=1, warmup=0,
                        trace_compute_scale=COMPUTE_SCALE, trace_bytes_scale=BYTES_SCALE,
                        timeout_s=120)
        e = jobs.run(lab, f"resnet{world}", cfg, [f"vm{i}" for i in range(1, world + 1)])
        assert e["verified"] and e["error"] is None, e["error"]
        tr = e["trace"]
        assert (tr["format"], tr["parallelism"], tr["layers"]) == ("astra", "DATA", 54)
        ran = {o["layer"]: o for o in tr["ops"] if o["kind"] == "collective"}
        assert len(ran) == 54
        for la in wl.layers:  # every weight-gradient AllReduce with the file's size, scaled
            op = ran[la.name]
            assert (op["collective"], op["phase"], op["group_size"]) == ("all_reduce", "wg", world)
            assert op["bytes"] == astra.run_bytes("all_reduce", la.size["wg"], BYTES_SCALE, world)
            assert op["busbw_bit_s"] > 0
        assert tr["compute_s_per_pass"] == compute_s
        for p in tr["passes"]:
            assert p["iteration_s"] >= compute_s  # the accelerator's time is a floor
            assert p["compute_s"] == compute_s and p["exposed_comm_s"] > 0


def test_hybrid_and_chakra_traces_replay_with_their_groups(nslab_lab):
    lab = nslab_lab(LeafSpine(spines=1, leaves=2, vms_per_leaf=2, host_bw=200),
                    name="it_trace2")
    vms = ["vm1", "vm2", "vm3", "vm4"]
    cfg = JobConfig(trace="transformer_hybrid.txt", iterations=2, warmup=1,
                    trace_compute_scale=COMPUTE_SCALE, trace_bytes_scale=0.1, timeout_s=60)
    e = jobs.run(lab, "hybrid", cfg, vms)
    # every rank checks every collective's result, which depends on who is in its group
    assert e["verified"] and e["error"] is None, e["error"]
    sizes = {(o["layer"], o["phase"]): o["group_size"] for o in e["trace"]["ops"]
             if o["kind"] == "collective"}
    assert sizes[("attention", "fwd")] == sizes[("output", "ig")] == 2  # model-parallel pairs
    assert sizes[("mlp", "wg")] == 2  # data-parallel: ranks r and r + 2
    assert e["trace"]["model_parallel_group"] == 2 and len(e["trace"]["passes"]) == 2
    d = jobs.run(lab, "diamond", JobConfig(trace="diamond", iterations=1, warmup=0,
                                           timeout_s=60), vms)
    assert d["verified"] and d["error"] is None, d["error"]
    assert [o["kind"] for o in d["trace"]["ops"]][3:7] == ["collective", "compute", "send",
                                                           "recv"]
