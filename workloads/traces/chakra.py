"""Chakra execution traces (MLCommons): read and write ``.et`` files, and turn one rank's nodes
into its operation graph.

File layout (Chakra's ``protolib``): a stream of protobuf messages, each preceded by its length
as a varint; the first is a ``GlobalMetadata``, every other one a ``Node``
(``chakra_et.proto``: the field numbers of Chakra's ``et_def.proto``). One file per rank,
named ``PREFIX.RANK.et`` as Chakra's converters write them; a job's ``trace`` is the PREFIX
(or the rank-0 file's path).

Nodes replayed (``to_ops``):

* ``COMP_NODE``: accelerator time, ``duration_micros`` us times ``compute_scale``;
* ``COMM_COLL_NODE``: attribute ``comm_type`` (``CollectiveCommType``: ALL_REDUCE, REDUCE,
  ALL_GATHER, GATHER, SCATTER, BROADCAST, ALL_TO_ALL, REDUCE_SCATTER, REDUCE_SCATTER_BLOCK as
  reduce_scatter, BARRIER as a one-element all_reduce) and ``comm_size`` (bytes, times
  ``bytes_scale``) among all ranks (rooted ones rooted at rank 0); a ``pg_name`` other than
  "" or "0" (a process group) is an error;
* ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: ``comm_size`` bytes to ``comm_dst`` / from
  ``comm_src``, matched in order per peer (``comm_tag`` is not needed for that);
* ``METADATA_NODE``: no work (it only joins dependencies).

Other node types (memory, storage, batch, checkpoint) are errors that name them.
``data_deps`` and ``ctrl_deps`` are both dependencies. Source: mlcommons/chakra,
schema/protobuf/et_def.proto and the attribute names ASTRA-sim's ``ETFeederNode`` reads.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from workloads.traces import chakra_et_pb2 as pb
from workloads.traces.astra import run_bytes
from workloads.traces.graph import Op

COLLECTIVES = {pb.ALL_REDUCE: "all_reduce", pb.REDUCE: "reduce", pb.ALL_GATHER: "all_gather",
               pb.GATHER: "gather", pb.SCATTER: "scatter", pb.BROADCAST: "broadcast",
               pb.ALL_TO_ALL: "all_to_all", pb.REDUCE_SCATTER: "reduce_scatter",
               pb.REDUCE_SCATTER_BLOCK: "reduce_scatter", pb.BARRIER: "all_reduce"}
WORLD_GROUPS = ("", "0")
Node = pb.Node
GlobalMetadata = pb.GlobalMetadata
Attr = pb.AttributeProto


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def write(path: str | os.PathLike, nodes: Iterable[Node],
          metadata: GlobalMetadata | None = None) -> None:
    """Write a ``.et`` file: ``metadata`` (default: version "0.0.4") then ``nodes``."""
    with open(path, "wb") as f:
        for msg in (metadata or GlobalMetadata(version="0.0.4"), *nodes):
            data = msg.SerializeToString()
            f.write(_varint(len(data)) + data)


def read(path: str | os.PathLike) -> tuple[GlobalMetadata, list[Node]]:
    """The metadata and the nodes of a ``.et`` file.

    Raises:
        OSError: the file cannot be read.
        ValueError: a truncated message or one that does not parse (naming its offset).
    """
    data = Path(path).read_bytes()
    pos, msgs = 0, []
    while pos < len(data):
        size = shift = 0
        start = pos
        while True:
            if pos >= len(data) or shift > 63:
                raise ValueError(f"{path}: bad length prefix at byte {start}")
            b = data[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if pos + size > len(data):
            raise ValueError(f"{path}: message at byte {start} is truncated")
        msg = GlobalMetadata() if not msgs else Node()
        try:
            msg.ParseFromString(data[pos:pos + size])
        except Exception as e:  # protobuf's DecodeError
            raise ValueError(f"{path}: message at byte {start} does not parse: {e}") from None
        msgs.append(msg)
        pos += size
    if not msgs:
        raise ValueError(f"{path}: empty trace (no global metadata)")
    return msgs[0], msgs[1:]


def attrs(node: Node) -> dict[str, object]:
    """A node's attributes by name (the value of the oneof each holds)."""
    out: dict[str, object] = {}
    for a in node.attr:
        which = a.WhichOneof("value")
        out[a.name] = getattr(a, which) if which else None
    return out


def rank_files(prefix: str | os.PathLike) -> list[Path]:
    """``PREFIX.0.et``, ``PREFIX.1.et``, ... as long as they exist (``prefix`` may also be
    the rank-0 file's path)."""
    p = str(prefix)
    if p.endswith(".0.et"):
        p = p[:-len(".0.et")]
    files = []
    while Path(f"{p}.{len(files)}.et").is_file():
        files.append(Path(f"{p}.{len(files)}.et"))
    return files


def _type_name(t: int) -> str:
    try:
        return pb.NodeType.Name(t)
    except ValueError:
        return f"node type {t}"


def _comm(node: Node, a: dict, world: int, bytes_scale: float) -> dict:
    size = a.get("comm_size")
    if not isinstance(size, int) or size < 0:
        raise ValueError(f"node {node.id} ({node.name}): comm_size {size!r} is not a byte count")
    if node.type == pb.COMM_COLL_NODE:
        ctype = a.get("comm_type")
        if ctype not in COLLECTIVES:
            raise ValueError(f"node {node.id} ({node.name}): comm_type {ctype!r} is not one of "
                             f"{', '.join(pb.CollectiveCommType.keys())}")
        group = a.get("pg_name", "")
        if group not in WORLD_GROUPS:
            raise ValueError(f"node {node.id} ({node.name}): process group {group!r}: only the "
                             "world group (pg_name '' or '0') is replayed")
        kind = COLLECTIVES[ctype]
        nbytes = 1 if ctype == pb.BARRIER else size
        return {"kind": "collective", "collective": kind, "group": tuple(range(world)),
                "bytes": run_bytes(kind, nbytes, 1.0 if ctype == pb.BARRIER else bytes_scale,
                                   world)}
    key = "comm_dst" if node.type == pb.COMM_SEND_NODE else "comm_src"
    peer = a.get(key)
    if not isinstance(peer, int):
        raise ValueError(f"node {node.id} ({node.name}): {key} missing")
    nbytes = max(1, round(size * bytes_scale))
    return {"kind": "send" if node.type == pb.COMM_SEND_NODE else "recv", "peer": peer,
            "bytes": nbytes}


def to_ops(nodes: Sequence[Node], world: int, passes: int = 1,
           compute_scale: float = 1.0, bytes_scale: float = 1.0) -> list[Op]:
    """A rank's graph in a world of ``world`` ranks: its ``nodes`` replayed ``passes`` times,
    pass k's first nodes (those without dependencies) after every last node (those nothing
    depends on) of pass k-1; op ids are ``k * (max id + 1) + node id``.

    Raises:
        ValueError: an unsupported node type or attribute (naming the node).
    """
    base, last = [], []
    children = {d for n in nodes for d in (*n.data_deps, *n.ctrl_deps)}
    for n in nodes:
        a = attrs(n)
        kw: dict = {"name": n.name or f"node {n.id}"}
        if n.type == pb.COMP_NODE:
            kw |= {"kind": "compute", "duration_ns": round(n.duration_micros * 1000 *
                                                           compute_scale)}
        elif n.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            kw |= _comm(n, a, world, bytes_scale)
        elif n.type == pb.METADATA_NODE:
            kw |= {"kind": "delay"}
        else:
            raise ValueError(f"node {n.id} ({n.name}): {_type_name(n.type)} is not replayed "
                             "(only COMP, COMM_COLL, COMM_SEND, COMM_RECV and METADATA nodes)")
        base.append((n.id, tuple(dict.fromkeys((*n.data_deps, *n.ctrl_deps))), kw))
        if n.id not in children:
            last.append(n.id)
    stride = max((i for i, _, _ in base), default=-1) + 1
    ops = []
    for k in range(passes):
        for i, deps, kw in base:
            prev = tuple(j + (k - 1) * stride for j in last) if k and not deps else ()
            ops.append(Op(id=k * stride + i, deps=tuple(d + k * stride for d in deps) + prev,
                          iteration=k, **kw))
    return ops

