"""Collective algorithms and the TCP mesh (workloads), on loopback without root.

Every rank runs in its own thread with its own ``Mesh`` (real TCP sockets on 127.0.0.1).
Results are checked against references computed here from first principles (not with the
library's own ``expected``), on integer-valued data so every reduction order is exact.
"""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from workloads import collectives as coll
from workloads.errors import JobTimeoutError, PeerLostError, PeerUnreachableError
from workloads.transport import Mesh, PathHints, split_bytes

SIZES = (1, 2, 7, 1001, 30011)  # 1 and 2 are below most world sizes; none divides evenly
REDUCE_CASES = (("float32", "sum"), ("int32", "max"), ("int8", "prod"), ("float64", "avg"),
                ("uint8", "min"), ("float16", "sum"))
MOVE_DTYPES = ("float32", "int8", "float64")


def run_ranks(world, fn, conns=1, hints=None, deadline_s=20.0, job_ids=None,
              connect_timeout=10.0, cc=None, balancer=None):
    """Run ``fn(mesh)`` on ``world`` connected meshes, one thread each.

    Returns ``(results, errors, meshes)`` indexed by rank.
    """
    deadline = time.monotonic() + deadline_s
    meshes = [Mesh(r, [("127.0.0.1", 0)] * world, conns_per_peer=conns, hints=hints,
                   job_id=job_ids[r] if job_ids else "t", deadline=deadline,
                   connect_timeout=connect_timeout, cc=cc,
                   balancer=balancer(r) if balancer else None) for r in range(world)]
    addrs = [m.listen() for m in meshes]
    results: list = [None] * world
    errors: list = [None] * world

    def go(r):
        try:
            meshes[r].connect(addrs)
            results[r] = fn(meshes[r])
            meshes[r].close()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors[r] = e
            meshes[r].close(graceful=False)

    threads = [threading.Thread(target=go, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s + 5)
    assert not any(t.is_alive() for t in threads), "a rank hung past the deadline"
    return results, errors, meshes


def test_input(rank, n, dtype, op):
    """Rank ``rank``'s data, independent of the library: small integers, exact in any type."""
    i = np.arange(n)
    if op == "prod":
        vals = np.array([1, 2, 1, 2] if np.dtype(dtype).kind == "u" else [1, 2, -1, -2])
        return vals[(i + rank) % 4].astype(dtype)
    lo = 0 if np.dtype(dtype).kind == "u" else -11
    return ((i * 7 + rank * 13) % 23 + lo).astype(dtype)


test_input.__test__ = False  # a helper, not a test


def reference(collective, world, rank, count, dtype, op, root):
    """What rank ``rank`` must receive, from the NCCL definitions (None: undefined)."""
    send_n = count * (world if collective in ("reduce_scatter", "scatter", "all_to_all") else 1)
    ins = [test_input(r, send_n, dtype, op) for r in range(world)]
    fold = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum,
            "min": np.minimum}[op]

    def reduced(arrays):
        acc = arrays[0].copy()
        for a in arrays[1:]:
            acc = fold(acc, a).astype(dtype)
        if op == "avg":
            acc = (acc / world).astype(dtype)
        return acc

    def block(a, i):
        return a[i * count:(i + 1) * count]

    if collective == "all_reduce":
        return reduced(ins)
    if collective == "reduce":
        return reduced(ins) if rank == root else None
    if collective == "reduce_scatter":
        return reduced([block(a, rank) for a in ins])
    if collective == "broadcast":
        return ins[root]
    if collective == "all_gather":
        return np.concatenate(ins)
    if collective == "gather":
        return np.concatenate(ins) if rank == root else None
    if collective == "scatter":
        return block(ins[root], rank)
    if collective == "all_to_all":
        return np.concatenate([block(ins[i], rank) for i in range(world)])
    raise AssertionError(collective)


def cases(collective):
    if collective in coll.REDUCING:
        return REDUCE_CASES
    return tuple((d, "sum") for d in MOVE_DTYPES)


def run_case(world, collective, count, dtype, op, root, conns=1, algo="ring", balancer=None):
    send_n = count * (world if collective in ("reduce_scatter", "scatter", "all_to_all") else 1)

    def fn(mesh):
        return coll.run(collective, mesh, test_input(mesh.rank, send_n, dtype, op), None,
                        op=op, root=root, algo=algo)

    results, errors, _ = run_ranks(world, fn, conns=conns, balancer=balancer)
    assert errors == [None] * world
    for r in range(world):
        want = reference(collective, world, r, count, dtype, op, root)
        if want is None:
            continue
        got = results[r]
        assert got.dtype == np.dtype(dtype) and got.shape == want.shape, (r, got.shape)
        assert np.array_equal(got, want), (
            f"{collective} world={world} count={count} {dtype}/{op} root={root} rank {r}: "
            f"{np.flatnonzero(got != want)[:5]} differ")


@pytest.fixture
def small_pipeline(monkeypatch):
    """Small pipeline chunks, so broadcast/reduce run many uneven chunks on small buffers."""
    monkeypatch.setattr(coll, "PIPELINE_CHUNK_BYTES", 4096)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("collective", coll.COLLECTIVES)
def test_collective_matches_reference(collective, world, small_pipeline):
    root = world - 1 if collective in coll.ROOTED else 0
    for count in SIZES:
        for dtype, op in cases(collective):
            run_case(world, collective, count, dtype, op, root)
    if collective in coll.ROOTED:
        run_case(world, collective, 1001, "float32", "sum", 0)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_halving_doubling_all_reduce_matches_reference(world):
    for count in SIZES:
        for dtype, op in REDUCE_CASES:
            run_case(world, "all_reduce", count, dtype, op, 0, algo="halving_doubling")


def test_halving_doubling_needs_a_power_of_two():
    with pytest.raises(ValueError, match="power-of-two"):
        coll.check_algo("halving_doubling", 6)
    with pytest.raises(ValueError, match="unknown all_reduce algorithm"):
        coll.check_algo("tree", 4)


def test_single_rank_is_a_local_copy():
    for c in coll.COLLECTIVES:
        run_case(1, c, 5, "float32", "avg" if c in coll.REDUCING else "sum", 0)


@pytest.mark.parametrize("conns", [2, 3])
def test_several_connections_per_peer_still_verify(conns, small_pipeline):
    for c in coll.COLLECTIVES:
        for count in (1, 2, 5003):  # 1 and 2 elements of int8: fewer bytes than connections
            run_case(3, c, count, "int8" if count < 3 else "float32", "sum", 1, conns=conns)
    flows, errors, _ = run_ranks(3, lambda m: m.flows(), conns=conns)
    assert errors == [None] * 3
    assert all(len(f) == 2 * conns for f in flows)


def test_flows_and_byte_split_across_connections():
    assert split_bytes(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert split_bytes(2, 3) == [(0, 0), (0, 1), (1, 2)]
    flows, errors, _ = run_ranks(3, lambda m: m.flows(), conns=2)
    assert errors == [None] * 3
    assert [(f["peer"], f["conn"]) for f in flows[1]] == [(0, 0), (0, 1), (2, 0), (2, 1)]
    assert [f["initiator"] for f in flows[1]] == [True, True, False, False]


def _free_port_block(n):
    """A base port with ``n`` consecutive free ports (checked now)."""
    for base in range(43000, 60000, 97):
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.fail("no block of free ports")


def test_path_hints_set_source_ports_and_dscp():
    world, conns = 3, 2
    base = _free_port_block(world * world * conns)
    hints = PathHints(src_port_base=base, dscp=(10, 46))

    def fn(mesh):
        out = {}
        for peer in range(world):
            if peer == mesh.rank:
                continue
            for c, s in enumerate(mesh.sockets(peer)):
                out[(peer, c)] = (s.getsockname()[1], s.getpeername()[1],
                                  s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS))
        coll.all_reduce(mesh, np.arange(101, dtype=np.float32))
        return out

    for _ in range(2):  # twice: the same source ports are reusable at once (no TIME_WAIT)
        results, errors, _ = run_ranks(world, fn, conns=conns, hints=hints)
        assert errors == [None] * world
        for r in range(world):
            for (peer, c), (local, remote, tos) in results[r].items():
                hi, lo = max(r, peer), min(r, peer)
                port = base + (hi * world + lo) * conns + c
                assert (local if r > peer else remote) == port
                assert tos == (10, 46)[c] << 2


@pytest.mark.parametrize("cc", ["reno", "cubic"])
def test_congestion_control_is_set_on_every_connection(cc):
    """Both ends of every connection run the job's congestion control (``TCP_CONGESTION``),
    whatever the system's default is."""
    def fn(mesh):
        return {s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0")
                for peer in range(3) if peer != mesh.rank for s in mesh.sockets(peer)}

    results, errors, _ = run_ranks(3, fn, conns=2, cc=cc)
    assert errors == [None] * 3
    assert results == [{cc.encode()}] * 3


def test_path_hint_ports_must_fit():
    with pytest.raises(ValueError, match="65535"):
        Mesh(3, ["127.0.0.1:1"] * 4, conns_per_peer=4, hints=PathHints(src_port_base=65500))
    with pytest.raises(ValueError, match="DSCP"):
        PathHints(dscp=(64,))


def test_peer_that_dies_mid_transfer_is_a_clear_error():
    def fn(mesh):
        if mesh.rank == 1:
            mesh.close(graceful=False)  # rank 1 "dies" before its first transfer
            return None
        return coll.all_reduce(mesh, np.ones(100000, np.float32))

    t = time.monotonic()
    _, errors, _ = run_ranks(3, fn, deadline_s=15)
    assert time.monotonic() - t < 5
    for r in (0, 2):
        assert isinstance(errors[r], (PeerLostError, JobTimeoutError)), errors[r]
    lost = [e for e in errors if isinstance(e, PeerLostError)]
    assert lost and any(e.peers == (1,) and "rank 1" in str(e) for e in lost), lost


def test_stalled_peer_hits_the_deadline_not_a_hang():
    def fn(mesh):
        if mesh.rank == 1:
            time.sleep(1.5)  # alive but silent
            return None
        return coll.all_reduce(mesh, np.ones(10, np.float32))

    t = time.monotonic()
    _, errors, _ = run_ranks(2, fn, deadline_s=0.7)
    elapsed = time.monotonic() - t
    assert isinstance(errors[0], JobTimeoutError)
    assert errors[0].peers == (1,) and "job timeout" in str(errors[0])
    assert elapsed < 3


def test_unreachable_peer_fails_within_connect_timeout():
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    m = Mesh(1, [f"127.0.0.1:{dead}", "127.0.0.1:0"], connect_timeout=1.0)
    t = time.monotonic()
    with pytest.raises(PeerUnreachableError) as ei:
        m.connect()
    assert time.monotonic() - t < 2.5
    assert ei.value.peers == (0,)
    assert f"rank 0 at 127.0.0.1:{dead}" in str(ei.value) and "refused" in str(ei.value)

    m = Mesh(0, ["127.0.0.1:0", f"127.0.0.1:{dead}"], connect_timeout=1.0)
    with pytest.raises(PeerUnreachableError, match="rank 1 .* did not connect"):
        m.connect()


def test_ranks_of_another_job_are_refused():
    _, errors, _ = run_ranks(2, lambda m: None, job_ids=["a", "b"], connect_timeout=1.0,
                             deadline_s=5)
    assert isinstance(errors[0], PeerUnreachableError) and "another job" in str(errors[0])
    assert isinstance(errors[1], PeerUnreachableError)


def test_a_broken_algorithm_is_caught(monkeypatch):
    """The checks above can fail: a ring that skips its all-gather gives wrong sums."""
    monkeypatch.setattr(coll, "_ring_all_gather", lambda *a, **k: None)
    with pytest.raises(AssertionError, match="differ"):
        run_case(3, "all_reduce", 1001, "float32", "sum", 0)


def test_library_reference_agrees_with_first_principles():
    for c in coll.COLLECTIVES:
        for world in (1, 3):
            for dtype, op in cases(c):
                count = 5
                for r in range(world):
                    exp = coll.expected(c, r, world, count, dtype, op, root=world - 1, seed=3)
                    send_n = coll.buffer_counts(c, world, count)[0]
                    ins = [coll.make_input(c, i, world, count, dtype, op, 3)
                           for i in range(world)]
                    assert all(a.shape == (send_n,) and a.dtype == np.dtype(dtype)
                               for a in ins)
                    if c == "broadcast":
                        assert np.array_equal(exp, ins[world - 1])
                    elif c in ("reduce", "gather") and r != world - 1:
                        assert exp is None
                    elif c == "all_reduce" and op == "sum":
                        assert np.array_equal(exp, sum(ins[1:], ins[0]).astype(dtype))
                    elif c == "all_to_all":
                        assert np.array_equal(exp, np.concatenate(
                            [a[r * count:(r + 1) * count] for a in ins]))
    assert not np.array_equal(coll.make_input("all_reduce", 0, 2, 50, "float32"),
                              coll.make_input("all_reduce", 1, 2, 50, "float32"))


def test_sizes_and_bus_bandwidth_factors_follow_nccl_tests():
    # nccl-tests doc/PERFORMANCE.md and src/{all_gather,alltoall,gather}.cu
    assert coll.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    for c in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        assert coll.bus_factor(c, 4) == pytest.approx(0.75)
    assert coll.bus_factor("broadcast", 4) == coll.bus_factor("reduce", 4) == 1.0
    assert coll.count_from_bytes("all_reduce", 3, 1_000_003, 4) == 250_000
    assert coll.count_from_bytes("all_gather", 3, 1_000_003, 4) == 83_333
    assert coll.size_bytes("all_gather", 3, 83_333, 4) == 999_996
    assert coll.size_bytes("reduce_scatter", 3, 10, 8) == 240
    assert coll.buffer_counts("all_to_all", 4, 3) == (12, 12)
    assert coll.collective_name("AllReduce") == coll.collective_name("all_reduce_perf") \
        == "all_reduce"
    assert coll.collective_name("alltoall") == "all_to_all"
    with pytest.raises(ValueError, match="unknown collective"):
        coll.collective_name("allreduce2")
    with pytest.raises(ValueError, match="bfloat16"):
        coll.dtype_of("bfloat16")
    with pytest.raises(ValueError, match="floating"):
        coll.check_op("avg", np.dtype("int32"))


def test_buffer_shapes_are_checked():
    _, errors, _ = run_ranks(2, lambda m: coll.all_gather(
        m, np.zeros(3, np.float32), np.zeros(5, np.float32)))
    assert all(isinstance(e, ValueError) and "6 elements" in str(e) for e in errors)
