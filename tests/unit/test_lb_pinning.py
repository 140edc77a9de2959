"""The balancer daemon's path choice per connection (workloads.lb.pinning) on synthetic
socket samples with known bytes, and its nftables lines (workloads.lb.daemon)."""
import socket
import time

import pytest

from contracts.results.jobs import BalancerDaemon
from workloads.lb.daemon import Daemon, pin_lines, table_lines
from workloads.lb.pinning import Pinner, Sample
from workloads.lb.sockdiag import SockDiag

LEAF, PATHS = ("10.0.0.9",), (1, 2)


def sample(key, acked, idle=True, leaf=LEAF, paths=PATHS):
    return Sample(key, leaf, paths, acked, idle)


def test_new_connections_go_round_robin_per_leaf_from_the_offset():
    p = Pinner(offset=1)
    changed, gone = p.update([sample("a", 0), sample("b", 0), sample("c", 0),
                              sample("x", 0, leaf=("10.0.0.8",)), sample("own", 0, leaf=None)])
    assert changed == {"a": 2, "b": 1, "c": 2, "x": 2} and gone == []
    assert "own" not in p.pins  # the own leaf: direct, never pinned


def test_connections_that_take_turns_alternate_paths_and_even_the_bytes():
    # gloo's contexts: one connection per collective, in turn, bursts of unequal size
    p = Pinner()
    p.update([sample("ctx0", 0), sample("ctx1", 0)])
    acked = {"ctx0": 0, "ctx1": 0}
    for i, burst in enumerate([300, 1000, 1000, 1000, 1000, 1000, 1000, 1000]):
        c = f"ctx{i % 2}"
        acked[c] += burst // 2
        other = f"ctx{1 - i % 2}"
        p.update([sample(c, acked[c], idle=False), sample(other, acked[other])])
        acked[c] += burst - burst // 2
        p.update([sample(k, v) for k, v in acked.items()])
    load = p.load[LEAF]
    assert sum(load.values()) == 7300
    assert abs(load[1] - load[2]) <= 1000  # within one burst, whatever the order of sizes
    assert p.moves > 0


def test_a_busy_connection_is_never_moved():
    p = Pinner()
    p.update([sample("a", 0, idle=False), sample("b", 0)])
    p.update([sample("a", 5000, idle=False), sample("b", 0)])
    changed, _ = p.update([sample("a", 9000, idle=False), sample("b", 0)])
    assert p.pins["a"] == 1 and "a" not in changed
    assert p.load[LEAF] == {1: 9000, 2: 0}


def test_idle_connections_all_go_to_the_least_loaded_path():
    p = Pinner()
    p.update([sample(k, 0) for k in "abcd"])  # a:1 b:2 c:1 d:2
    changed, _ = p.update([sample("a", 400), sample("b", 100), sample("c", 300),
                           sample("d", 200, idle=False)])
    assert p.load[LEAF] == {1: 700, 2: 300}
    assert changed == {"a": 2, "c": 2} and p.pins == {"a": 2, "b": 2, "c": 2, "d": 2}
    assert p.moves == 2


def test_gone_connections_are_forgotten_but_their_bytes_stay_counted():
    p = Pinner()
    p.update([sample("a", 0)])
    p.update([sample("a", 700)])
    changed, gone = p.update([])
    assert gone == ["a"] and p.pins == {} and p.load[LEAF] == {1: 700}


def test_a_path_that_disappears_moves_its_idle_connections():
    p = Pinner()
    p.update([sample("a", 0)])
    changed, _ = p.update([sample("a", 10, paths=(2,))])
    assert changed == {"a": 2}


def test_no_path_is_an_error():
    with pytest.raises(ValueError, match="no path"):
        Pinner().update([sample("a", 0, paths=())])


def test_nft_lines_replace_a_pin_and_remove_a_gone_one():
    in_map = {("10.0.0.2", 40000, 7800), ("10.0.0.3", 40001, 7800)}
    lines = pin_lines({("10.0.0.2", 40000, 7800): 2, ("10.0.0.4", 40002, 7800): 1},
                      [("10.0.0.3", 40001, 7800)], in_map)
    assert lines == [
        "delete element ip nslab_balancer pins { 10.0.0.3 . 40001 . 7800 }",
        "delete element ip nslab_balancer pins { 10.0.0.2 . 40000 . 7800 }",
        "add element ip nslab_balancer pins { 10.0.0.2 . 40000 . 7800 : goto dscp2 }",
        "add element ip nslab_balancer pins { 10.0.0.4 . 40002 . 7800 : goto dscp1 }"]
    assert in_map == {("10.0.0.2", 40000, 7800), ("10.0.0.4", 40002, 7800)}
    assert "add rule ip nslab_balancer dscp2 ip dscp set 2" in table_lines(2)


def test_the_daemons_report_fits_the_results_contract():
    d = Daemon(paths=2, offset=0, probe_timeout_s=0.1)
    d.routes["10.2.1.2"] = (("10.254.0.4",), (1, 2))
    d.pinner.update([Sample(("10.2.1.2", 40000, 7800), ("10.254.0.4",), (1, 2), 0, True)])
    report = BalancerDaemon.model_validate(d.stats())
    assert report.connections == 1 and report.destinations["10.2.1.2"].dscp == [1, 2]


def test_slack_keeps_a_connection_whose_path_is_nearly_the_least_loaded():
    p = Pinner(slack_bytes=1000)
    p.update([sample("a", 0), sample("b", 0)])  # a:1 b:2
    p.update([sample("a", 900), sample("b", 0, idle=False)])
    assert p.pins == {"a": 1, "b": 2}  # 900 - 0 is within the slack
    changed, _ = p.update([sample("a", 1900), sample("b", 0, idle=False)])
    assert changed == {"a": 2}


def test_sock_diag_reads_a_real_connection_on_loopback():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    diag = SockDiag()
    with srv, socket.create_connection(srv.getsockname()) as c:
        sport, dport = c.getsockname()[1], srv.getsockname()[1]
        peer, _ = srv.accept()
        with peer:
            c.sendall(b"x" * 4000)
            assert len(peer.recv(4000, socket.MSG_WAITALL)) == 4000
            deadline = time.monotonic() + 2  # the receiver's ACK may be delayed (40 ms)
            while True:
                mine = [x for x in diag.established() if x.sport == sport]
                if mine and mine[0].idle or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
    diag.close()
    (conn,) = mine
    assert (conn.dst, conn.sport, conn.dport, conn.idle) == ("127.0.0.1", sport, dport, True)
    assert conn.acked == 4001  # the SYN counts one
    assert conn.segs_out >= 2 and conn.wire_bytes == 4001 + 66 * conn.segs_out


def test_leaf_addresses_that_overlap_are_one_leaf():
    d = Daemon(paths=2, offset=0, probe_timeout_s=0.1)
    # a leaf answers from the address of the link a probe came in on; one answer was lost
    assert [d.leaf_number(r) for r in (("10.254.0.4", "10.254.0.6"), ("10.254.0.6",),
                                       ("10.254.0.0",), ("10.254.0.4",), ())] == [0, 0, 1, 0, 2]
