"""The collective worker (workloads.worker) and job runner (workloads.job) on
loopback without root: real worker processes, real TCP, real signals."""
from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

from agents.clock import Clock, ClockSpec, Oscillator, Segment
from workloads import worker as wk
from workloads.config import JobConfig, WorkerConfig
from workloads.job import Job, local_spawn, loopback_addresses, run_job
from workloads.schedule import Schedule

S = 1_000_000_000


def run_ranks_in_threads(world, name, clock=None, **params):
    """``run_worker`` for every rank of one job, each in its own thread."""
    peers = loopback_addresses(world)
    docs = [None] * world

    def go(r):
        cfg = WorkerConfig(name=name, rank=r, peers=peers, job=JobConfig(**params))
        docs[r] = wk.run_worker(cfg, clock=clock)

    threads = [threading.Thread(target=go, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(d is not None for d in docs), "a worker hung"
    return docs


def test_worker_times_iterations_with_the_vm_clock(tmp_path):
    now = time.time_ns()
    path = tmp_path / "clock.json"
    ClockSpec("vm1", [Segment(now, 5e9, "h1", Oscillator(now, 100.0))]).write(str(path))
    docs = run_ranks_in_threads(3, "t1", clock=Clock(str(path)), collective="reduce_scatter",
                                count=333, dtype="float64", iterations=4, warmup=1,
                                compute_units=3, conns_per_peer=2)
    for r, d in enumerate(docs):
        assert d["error"] is None and d["verified"] is True, d["error"]
        assert d["schema"] == "nslab.worker/1" and d["rank"] == r and d["world"] == 3
        assert d["clock"] == "emulated" and d["bytes"] == 3 * 333 * 8
        assert len(d["iteration_s"]) == len(d["comm_s"]) == len(d["compute_s"]) == 4
        assert all(c > 0 for c in d["compute_s"]) and all(c > 0 for c in d["comm_s"])
        assert d["iteration_s"] == pytest.approx(np.add(d["compute_s"], d["comm_s"]))
        # VM clock = true time + 5 s offset (+ 100 ppm): the stamps are VM time, not host time
        assert abs(d["start_ns"] - (now + 5 * S)) < 20 * S
        assert 0 < d["elapsed_s"] < 20 and d["end_ns"] > d["start_ns"]
        assert len(d["flows"]) == 2 * 2
    json.dumps(docs)  # the report is plain JSON


def test_slots_follow_the_offset_and_drift_of_each_rank():
    sc = Schedule(start_ns=10 * S, period_s=2.0, shift_s=1.0, offsets_ns=[0, -5_000],
                  drifts_ppm=[0.0, 100.0])
    assert sc.slot_ns(0, 0) == 11 * S and sc.slot_ns(2, 0) == 15 * S
    # rank 1: 5 us behind the reference at start_ns, 100 ppm fast: +500 us after 5 s
    assert sc.slot_ns(2, 1) == 15 * S - 5_000 + 500_000
    assert Schedule(start_ns=0, period_s=1.0).slot_ns(3, 7) == 3 * S  # raw VM clocks


def test_first_slot_is_the_first_one_not_missed():
    sc = Schedule(start_ns=10 * S, period_s=2.0, shift_s=1.0, offsets_ns=[0, 0],
                  drifts_ppm=[0.0, 1000.0])
    assert [sc.first_slot(t, 0) for t in (0, 11 * S, 11 * S + 1, 20 * S, 21 * S)] == [
        0, 0, 1, 5, 5]
    # rank 1 runs 1000 ppm fast: slot 5 is at 21.01 s on its clock, slot 4 at 19.008 s
    assert sc.first_slot(19 * S + 9_000_000, 1) == 5 and sc.first_slot(19 * S, 1) == 4


def test_next_slot_lets_a_slot_pass_when_later_than_late_s():
    # slots at 11, 13, 15, ... s; a rank up to 0.5 s late starts at once, later it waits
    sc = Schedule(start_ns=10 * S, period_s=2.0, shift_s=1.0, late_s=0.5)
    assert sc.next_slot(10 * S, 0, None) == 0  # the first slot it can catch
    assert sc.next_slot(11 * S + 400_000_000, 0, None) == 0  # 0.4 s late: at once
    assert sc.next_slot(12 * S, 0, 0) == 1  # early for slot 1: waits for it
    assert sc.next_slot(13 * S + 500_000_000, 0, 0) == 1  # 0.5 s late: at once
    assert sc.next_slot(13 * S + 600_000_000, 0, 0) == 2  # later: slot 1 passes
    assert sc.next_slot(17 * S + 600_000_000, 0, 0) == 4  # slots 1 to 3 pass
    # without late_s, the slot after the last one however late
    raw = sc.model_copy(update={"late_s": None})
    assert raw.next_slot(17 * S + 600_000_000, 0, 0) == 1
    assert raw.next_slot(11 * S + 1, 0, None) == 1  # but never a first slot already begun


def test_scheduled_iterations_start_on_their_slots_of_the_vm_clock(tmp_path):
    # the VM clock is 3 s ahead of the reference (system) clock: with that offset the slots
    # hold in reference time; every iteration (warmup 1) starts on its own slot, not earlier
    now = time.time_ns()
    path = tmp_path / "clock.json"
    ClockSpec("vm1", [Segment(now, 3e9, "h1", Oscillator(now, 0.0))]).write(str(path))
    start = now + S // 2
    schedule = {"start_ns": start, "period_s": 0.15, "shift_s": 0.05, "offsets_ns": [3 * S] * 2}
    docs = run_ranks_in_threads(2, "slots", clock=Clock(str(path)), count=64, iterations=4,
                                warmup=1, schedule=schedule)
    for d in docs:
        assert d["error"] is None and d["verified"], d["error"]
        assert len(d["wait_s"]) == 4 and d["iteration_s"] == pytest.approx(
            np.add(np.add(d["wait_s"], d["compute_s"]), d["comm_s"]))
        for i, t1 in enumerate(d["comm_start_ns"]):
            k = d["first_slot"] + i + 1  # a slow start skips the slots it missed
            slot = start + 3 * S + round((0.05 + k * 0.15) * S)  # VM clock
            late = (t1 - d["compute_s"][i] * S - slot) / S
            assert 0 <= late < 0.05, (i, late)
        assert min(d["wait_s"]) > 0.05  # a tiny job waits out most of every slot
    with pytest.raises(ValueError, match="offsets_ns: 1 values for 2 ranks"):
        WorkerConfig(name="x", rank=0, peers=loopback_addresses(2),
                     job=JobConfig(schedule={**schedule, "offsets_ns": [0]}))


def test_worker_reports_a_wrong_result(monkeypatch):
    real = wk.coll.run

    def corrupting(collective, comm, sendbuf, recvbuf=None, **kw):
        out = real(collective, comm, sendbuf, recvbuf, **kw)
        if comm.rank == 1:
            out[2] += 1
        return out

    monkeypatch.setattr(wk.coll, "run", corrupting)
    docs = run_ranks_in_threads(2, "t2", collective="all_gather", count=5, iterations=2,
                                warmup=0)
    assert docs[0]["verified"] is True
    bad = docs[1]
    assert bad["verified"] is False and bad["error_kind"] == "verify"
    assert bad["error"].startswith("rank 1: verification failed at iteration 0: 1 of 10")
    assert wk.exit_status(bad) == wk.EXIT_WRONG and wk.exit_status(docs[0]) == wk.EXIT_OK


def _cli(capsys, *argv):
    rc = wk.main([*argv, "--quiet"])
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_worker_cli_rejects_bad_configurations_with_a_json_error(capsys, tmp_path):
    peers = ["127.0.0.1:1", "127.0.0.1:2"]
    bad_rank = {"name": "j", "rank": 2, "peers": peers, "job": {}}
    rc, doc = _cli(capsys, "--config", json.dumps(bad_rank))
    assert rc == wk.EXIT_USAGE and doc["error_kind"] == "config" and doc["rank"] == 2
    assert doc["error"] == "rank 2: bad configuration: rank: 2 is outside 0..1 (2 peer addresses)"
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"name": "j", "rank": 0, "peers": peers,
                                "job": {"collective": "all_gather", "bytes": 7}}))
    rc, doc = _cli(capsys, "--config", f"@{path}")
    assert rc == wk.EXIT_USAGE and "bytes: 7 is too small" in doc["error"]
    assert "allowed >= 8" in doc["error"] and doc["job"] == "j"
    rc, doc = _cli(capsys, "--config", "{not json")
    assert rc == wk.EXIT_USAGE and doc["rank"] is None and "Invalid JSON" in doc["error"]
    rc, doc = _cli(capsys, "--config", f"@{tmp_path / 'missing.json'}")
    assert rc == wk.EXIT_USAGE and "cannot read the configuration" in doc["error"]
    ddp = {"name": "j", "rank": 0, "peers": peers, "job": {"collective": "ddp"}}
    rc, doc = _cli(capsys, "--config", json.dumps(ddp))
    assert rc == wk.EXIT_USAGE and "runs with python -m workloads.ddp" in doc["error"]


def test_worker_cli_prints_the_schema_of_its_configuration(capsys):
    assert wk.main(["--schema"]) == wk.EXIT_OK
    schema = json.loads(capsys.readouterr().out)
    assert schema["required"] == ["name", "rank", "peers", "job"]
    assert "timeout_s" in schema["$defs"]["JobConfig"]["properties"]
    with pytest.raises(SystemExit):
        wk.main([])  # --config or --schema is required


def test_job_configuration_is_checked_against_the_world_before_anything_starts():
    addrs = loopback_addresses(2)
    with pytest.raises(ValueError, match="bytes: 4 is too small for all_to_all"):
        Job("x", JobConfig(collective="alltoall", bytes=4), addrs)
    with pytest.raises(ValueError, match=r"root: 2 is outside 0\.\.1"):
        Job("x", JobConfig(collective="broadcast", root=2), addrs)
    with pytest.raises(ValueError, match="peers: address 'nohost' is not host:port"):
        Job("x", JobConfig(), ["nohost"])


def test_the_ranks_receive_only_the_job_configuration_fields():
    class Spec(JobConfig):  # as the scenario layer's JobSpec
        ranks: int = 2

    job = Job("sub", Spec(collective="gather", count=3, ranks=2), loopback_addresses(2))
    with job:
        argv = job.worker_argv(1)
    assert argv[1:3] == ["-m", "workloads.worker"] and argv[3] == "--config"
    cfg = WorkerConfig.model_validate_json(argv[4])
    assert cfg.rank == 1 and cfg.name == "sub" and cfg.job == JobConfig(collective="gather",
                                                                        count=3)
    assert "ranks" not in json.loads(argv[4])["job"]


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_run_job_of_local_processes():
    addrs = loopback_addresses(3)
    spawned = []

    def spawn(rank, argv, **kw):
        spawned.append((rank, sorted(kw)))
        return local_spawn(rank, argv, **kw)

    config = JobConfig(collective="AllReduce", bytes=100_003, dtype="float", iterations=3,
                       warmup=1, compute_units=2, conns_per_peer=2, dscp=[10], timeout_s=30)
    s = run_job("ok", config, addrs, spawn=spawn, placement=["vmA", "vmB", "vmC"])
    assert spawned == [(r, ["env", "stderr", "stdin", "stdout"]) for r in range(3)]
    assert s["error"] is None and s["verified"] is True and s["failed_ranks"] == []
    assert s["schema"] == "nslab.job/1" and s["collective"] == "all_reduce"
    assert s["placement"] == {"0": "vmA", "1": "vmB", "2": "vmC"}
    assert s["count"] == 25_000 and s["bytes"] == 100_000
    assert set(s["iteration_s"]) == {"p50", "p90", "p99", "max", "mean"}
    assert 0 < s["iteration_s"]["p50"] <= s["iteration_s"]["p99"] <= s["iteration_s"]["max"]
    assert s["completion_s"] >= s["iteration_s"]["max"]
    # per iteration, its slowest rank: the percentiles are those of this series
    per_rank = [w["iteration_s"] for w in s["workers"]]
    assert s["iteration_times_s"] == [max(r[i] for r in per_rank) for i in range(3)]
    assert max(s["iteration_times_s"]) == s["iteration_s"]["max"]
    assert s["comm_times_s"] == [max(w["comm_s"][i] for w in s["workers"]) for i in range(3)]
    assert s["busbw_bit_s"] == pytest.approx(s["algbw_bit_s"] * 4 / 3)
    assert all(row["exit_code"] == 0 for row in s["ranks"])
    flows = s["workers"][1]["flows"]
    assert len(flows) == 4 and {f["dscp"] for f in flows} == {10}
    assert all(_gone(row["pid"]) for row in s["ranks"])


def _wait_for(path, text, timeout_s=15):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with open(path) as f:
                if text in f.read():
                    return
        except OSError:
            pass
        time.sleep(0.05)
    pytest.fail(f"{text!r} never appeared in {path}")


def test_a_killed_worker_ends_the_job_with_a_clear_error():
    addrs = loopback_addresses(3)
    with Job("kill", JobConfig(count=50_000, iterations=100_000, warmup=0, timeout_s=30),
             addrs) as job:
        job.start()
        _wait_for(job.log_path(1), "connected")
        time.sleep(0.2)
        t = time.monotonic()
        job.kill(1)
        s = job.wait()
        elapsed = time.monotonic() - t
    assert elapsed < 5, "the surviving ranks should notice at once, not at the timeout"
    assert s["verified"] is False and s["completion_s"] is None
    assert s["failed_ranks"] == [0, 1, 2]
    assert s["error"].startswith("rank 1: killed by SIGKILL without a report")
    for r in (0, 2):  # the survivors fail fast; one may see the other's exit first
        row = s["ranks"][r]
        assert row["error_kind"] == "peer_lost" and row["exit_code"] == 1
        assert row["error"].startswith(f"rank {r}: connection") and not row["killed"]
    assert any("to rank 1 " in s["ranks"][r]["error"] for r in (0, 2))
    assert all(_gone(pid) for pid in job.pids.values())


def test_an_unreachable_peer_ends_the_job_within_the_connect_timeout():
    addrs = loopback_addresses(3)
    t = time.monotonic()
    # rank 0's "VM" never runs the worker: `false` swallows the command and exits 1
    s = run_job("unreach", JobConfig(collective="broadcast", count=10, connect_timeout_s=1.5,
                                     timeout_s=20), addrs,
                spawn=lambda r, argv, **kw: local_spawn(r, ["false"] if r == 0 else argv, **kw))
    assert time.monotonic() - t < 8
    assert s["failed_ranks"] == [0, 1, 2]
    assert s["error"].startswith("rank 0: exited with status 1 without a report")
    for r in (1, 2):
        row = s["ranks"][r]
        assert row["error_kind"] == "unreachable" and row["exit_code"] == 1
        assert f"cannot connect to rank 0 at {addrs[0]}" in row["error"]
        assert "refused" in row["error"]


def test_a_stuck_worker_is_stopped_at_the_job_timeout():
    addrs = loopback_addresses(2)
    t = time.monotonic()
    # a compute phase far longer than the timeout: the runner terminates the workers at
    # timeout + grace and they still report why
    s = run_job("stuck", JobConfig(count=10, compute_units=10**8, timeout_s=2.5), addrs,
                kill_grace_s=0.5)
    assert time.monotonic() - t < 2.5 + 0.5 + 2
    assert s["failed_ranks"] == [0, 1] and s["verified"] is False
    for row in s["ranks"]:
        assert row["killed"]
        assert row["error_kind"] == "terminated" or "killed" in row["error"], row


def test_a_stuck_worker_stops_itself_when_nobody_kills_it():
    addrs = loopback_addresses(1)
    t = time.monotonic()
    s = run_job("alone", JobConfig(count=10, compute_units=10**8, timeout_s=1), addrs,
                kill_grace_s=20)
    assert time.monotonic() - t < 1 + wk.WATCHDOG_GRACE_S + 3
    row = s["ranks"][0]
    assert not row["killed"] and row["exit_code"] == 1 and row["error_kind"] == "timeout"
    assert "still running" in row["error"]


def test_gpu_s_is_a_compute_phase_that_sleeps():
    docs = run_ranks_in_threads(2, "gpu", count=16, iterations=3, warmup=0, gpu_s=0.05)
    for d in docs:
        assert d["error"] is None and d["verified"]
        assert min(d["compute_s"]) >= 0.05, d["compute_s"]  # sleeps at least that long
    with pytest.raises(ValueError, match="gpu_s"):
        JobConfig(collective="ddp", gpu_s=0.1)
