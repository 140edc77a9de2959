"""A small Chakra trace built with the schema (``workloads.traces.chakra``): the built-in
``diamond`` trace (``workloads/traces/data/diamond.RANK.et``, written by ``python
tests/traces_synthetic.py``) and what the unit tests build from it.

Per rank r of ``world``: node 1 ``embed`` (compute 2 ms) feeds ``left`` (3 ms) and ``right``
(1 ms); ``left`` feeds an AllReduce of 64 KiB (node 4); ``join`` (1 ms) waits for ``right``
(data) and the AllReduce (control): a diamond. Then a ring: a send of 16 KiB to rank r+1 and
a receive from rank r-1, both after ``join``, and ``tail`` (0.5 ms) after both. ``world`` 1
has no ring.
"""
import sys
from pathlib import Path

from workloads.traces import chakra
from workloads.traces import chakra_et_pb2 as pb

DIAMOND_RANKS = 4


def node(i: int, name: str, kind: int, data=(), ctrl=(), us: int = 0, **attrs) -> chakra.Node:
    """A ``Node`` with int attributes (``comm_type``/``comm_size``: int64, ``comm_src``/
    ``comm_dst``: int32, as Chakra writes them) or string ones."""
    n = chakra.Node(id=i, name=name, type=kind, data_deps=list(data), ctrl_deps=list(ctrl),
                    duration_micros=us)
    for key, v in attrs.items():
        if isinstance(v, str):
            n.attr.append(chakra.Attr(name=key, string_val=v))
        elif key in ("comm_src", "comm_dst"):
            n.attr.append(chakra.Attr(name=key, int32_val=v))
        else:
            n.attr.append(chakra.Attr(name=key, int64_val=v))
    return n


def diamond_nodes(rank: int, world: int) -> list[chakra.Node]:
    """Rank ``rank``'s nodes (see the module docstring)."""
    nodes = [node(1, "embed", pb.COMP_NODE, us=2000),
             node(2, "left", pb.COMP_NODE, data=[1], us=3000),
             node(3, "right", pb.COMP_NODE, data=[1], us=1000),
             node(4, "grad all_reduce", pb.COMM_COLL_NODE, data=[2], comm_type=pb.ALL_REDUCE,
                  comm_size=65536),
             node(5, "join", pb.COMP_NODE, data=[3], ctrl=[4], us=1000)]
    if world > 1:
        nodes += [node(6, "send next", pb.COMM_SEND_NODE, data=[5], comm_size=16384,
                       comm_dst=(rank + 1) % world),
                  node(7, "recv prev", pb.COMM_RECV_NODE, data=[5], comm_size=16384,
                       comm_src=(rank - 1) % world),
                  node(8, "tail", pb.COMP_NODE, data=[6, 7], us=500)]
    return nodes


def write_diamond(prefix: str | Path, world: int = DIAMOND_RANKS) -> None:
    """Write ``PREFIX.RANK.et`` for every rank."""
    for r in range(world):
        chakra.write(f"{prefix}.{r}.et", diamond_nodes(r, world))


if __name__ == "__main__":
    write_diamond(sys.argv[1] if len(sys.argv) > 1 else
                  Path(__file__).parents[1] / "workloads" / "traces" / "data" / "diamond")
