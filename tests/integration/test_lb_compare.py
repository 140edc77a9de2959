"""The load-balancer comparison in a real lab, short: an AllToAll across two leaves under
ECMP, spraying, REPS and Ethereal, symmetric and with a leaf-spine link taken down mid-job
(once its leaf moved a fifth of the symmetric run's bytes). Every mode survives the failure
(the job finishes verified, nothing hangs), the failed link carries bytes until the fault and
none after, the other uplinks carry the rest of the job, and the results carry the contract's
fields.

The uplinks run at 1:4 (the AllToAll's bytes take ~0.7 s) and the runner reads the leaf's
counters from /proc every 10 ms (polls 0.02 s apart, 0.06 s with two CPU hogs besides). Before,
each poll was a netlink dump on the lab thread (up to 0.96 s apart on a loaded machine) and at
1:1 the bytes moved in ~0.2 s: the link went down after >= 98.8 % of them in 15 of 16 runs at
load 5-8, and the test failed on the failed link's bytes in 1 of 4."""
import pytest
from scenario_run import run_text

SCENARIO = """
name: lb_short
seed: 2
duration_s: 1
topology: {spines: 4, leaves: 2, vms_per_leaf: 2, host_bw: 100, fabric_bw: 100,
           host_queue: 100, fabric_queue: 100}
lb:
  collectives: [all_to_all]
  cases: [symmetric, link_down]
  oversubscription: [4]
  bytes: 2000000
  iterations: 1
  down_at: 0.2
  timeout_s: 30
"""
MODES = ["ecmp", "spray", "reps", "ethereal"]
FAILED = "leaf1-spine1"


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    return run_text(tmp_path_factory.mktemp("lb"), SCENARIO)


def test_every_mode_survives_a_link_failure_mid_job(doc):
    runs = {(r.mode, r.case): r for r in doc.lb.runs}
    assert sorted(runs) == sorted((m, c) for m in MODES for c in ("symmetric", "link_down"))
    leaf1 = sorted(k for k in runs[("ecmp", "symmetric")].link_bytes if k.startswith("leaf1-"))
    for mode in MODES:
        sym, down = runs[(mode, "symmetric")], runs[(mode, "link_down")]
        for r in (sym, down):
            assert r.finished and r.error is None and r.completion_s > 0, r
            assert r.retransmits is not None and r.reordering is not None, r
        assert down.fault_at_s is not None, down
        at, sym_total = down.link_bytes_at_fault, sum(sym.link_bytes[k] for k in leaf1)
        # the runner took the link down once leaf1's uplinks had moved down_at of their
        # symmetric bytes; the link had carried bytes until then and carried none after
        assert sum(at[k] for k in leaf1) >= 0.2 * sym_total, (mode, at, sym.link_bytes)
        assert 0 < at[FAILED] == down.link_bytes[FAILED], (mode, at, down.link_bytes)
        # mid-job: the other uplinks carried part of the job after the fault and the reroute
        # (at_fault is read after both, and the job goes on meanwhile). Seen: 0.57-0.68 of
        # the symmetric bytes at load 5, 0.046-0.41 with two CPU hogs besides (a slow
        # reroute); a fault after the job's last byte left 0-0.85 % (the old poll, 16 runs)
        after = sum(down.link_bytes[k] - at[k] for k in leaf1 if k != FAILED)
        assert after > 0.02 * sym_total, (mode, after, at, down.link_bytes, sym.link_bytes)
        assert sym.imbalance >= 1.0 and down.imbalance >= 1.0
    kinds = [(e.kind, e.target) for e in doc.truth.faults if e.kind in ("link_down", "link_up")]
    assert kinds == [("link_down", "leaf1-spine1"), ("link_up", "leaf1-spine1")] * 4
    # the hosts' balancers ran on the paths they discovered: 4 spines to the other leaf
    assert runs[("ethereal", "symmetric")].balancer_events.keys() >= {"failed_marks", "moves"}
    assert runs[("reps", "symmetric")].balancer_events["clean_acks"] + \
        runs[("reps", "symmetric")].balancer_events["marked_acks"] > 0


def test_ratios_compare_every_mode_with_ecmp(doc):
    (ratio_sym, ratio_down) = sorted(doc.lb.ratios, key=lambda r: r.case == "link_down")
    for ratio in (ratio_sym, ratio_down):
        assert set(ratio.to_ecmp) == set(MODES) and ratio.to_ecmp["ecmp"] == 1.0
        runs = {r.mode: r for r in doc.lb.runs if r.case == ratio.case}
        assert ratio.to_ecmp["ethereal"] == round(runs["ethereal"].completion_s
                                                  / runs["ecmp"].completion_s, 3)
