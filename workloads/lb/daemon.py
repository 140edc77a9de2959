"""The balancer daemon of one VM: ``python -m workloads.lb.daemon --paths K``.

It chooses the path of every TCP connection the VM's programs open (PyTorch's gloo, iperf3:
programs nslab did not write) from outside them, seeing only the VM: its sockets
(``sock_diag``, ``man 7 sock_diag``: destination, ports, bytes acknowledged, segments sent,
write queue; ``workloads.lb.sockdiag``), its own traceroute-style probes, and its own
nftables. On a fabric that steers by entropy value (the lab's ``entropy`` mode: DSCP k takes
path slot k, ``lab.fabric``):

* every destination is probed once (``workloads.lb.paths``, DSCP 1..K, TTL up to 4; those
  given with ``--peers`` before it says ready, the others when their first connection shows):
  its leaf (the last routers before it; none when it is in the VM's own leaf) and one DSCP
  per distinct spine (``workloads.lb.balancer.routes_from_hops``);
* every ``poll`` the connections go through ``workloads.lb.pinning.Pinner`` (Ethereal's
  round-robin per destination leaf at arrival, then idle connections re-placed on the least
  loaded path);
* a pin is an element of an nftables verdict map in table ``ip nslab_balancer`` (hook output,
  priority mangle): ``ip daddr . tcp sport . tcp dport vmap @pins`` jumps to a chain that
  sets the DSCP. Connections without a pin keep the program's DSCP (0: the fabric hashes).

It writes ``ready`` on stdout once the table is in place and ``--peers`` probed; on SIGTERM
or SIGINT it removes the table, writes one JSON line (``stats``) and exits 0. Exit 1: nft
refused the table.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading

from workloads.lb.balancer import FRAME_BYTES, routes_from_hops
from workloads.lb.paths import discover
from workloads.lb.pinning import Pinner, Sample
from workloads.lb.sockdiag import SockDiag

TABLE = "nslab_balancer"


def table_lines(paths: int) -> list[str]:
    """``nft -f`` lines that (re)create the table: the map, one chain per DSCP 1..``paths``
    and the output hook."""
    lines = [f"add table ip {TABLE}", f"delete table ip {TABLE}", f"add table ip {TABLE}",
             f"add map ip {TABLE} pins {{ typeof ip daddr . tcp sport . tcp dport : verdict ; }}"]
    for d in range(1, paths + 1):
        lines += [f"add chain ip {TABLE} dscp{d}", f"add rule ip {TABLE} dscp{d} ip dscp set {d}"]
    lines += [f"add chain ip {TABLE} out {{ type filter hook output priority mangle ; "
              "policy accept ; }",
              f"add rule ip {TABLE} out ip daddr . tcp sport . tcp dport vmap @pins"]
    return lines


def pin_lines(changed: dict, gone: list, in_map: set) -> list[str]:
    """``nft -f`` lines for one poll's changes (keys (daddr, sport, dport)); ``in_map`` (the
    keys in the map now) is updated."""
    def elem(k):
        return f"{k[0]} . {k[1]} . {k[2]}"
    lines = []
    for k in [*gone, *changed]:
        if k in in_map:
            lines.append(f"delete element ip {TABLE} pins {{ {elem(k)} }}")
            in_map.discard(k)
    for k, dscp in changed.items():
        lines.append(f"add element ip {TABLE} pins {{ {elem(k)} : goto dscp{dscp} }}")
        in_map.add(k)
    return lines


def nft(lines: list[str]) -> None:
    """Apply ``lines`` in one ``nft -f -`` transaction.

    Raises:
        RuntimeError: nft refused them (its message).
    """
    r = subprocess.run(["nft", "-f", "-"], input="\n".join(lines) + "\n", text=True,
                       capture_output=True)
    if r.returncode:
        raise RuntimeError(f"nft: {r.stderr.strip()}")


class Daemon:
    """The loop (module docstring). ``paths``: entropy values 1..paths to probe;
    ``probe_timeout_s``: per probe; ``offset``, ``slack_bytes``: the ``Pinner``'s."""

    def __init__(self, paths: int, offset: int, probe_timeout_s: float,
                 slack_bytes: int = 0):
        self.paths, self.probe_timeout_s = paths, probe_timeout_s
        self.pinner = Pinner(offset, slack_bytes)
        self.routes: dict[str, tuple] = {}  # destination -> (leaf, DSCPs)
        self.in_map: set = set()
        self.leaves: list[set[str]] = []
        self.polls = 0

    def route(self, dst: str) -> tuple:
        """(leaf number or None in the own leaf, DSCPs of distinct spines) towards ``dst``,
        probed once."""
        if dst not in self.routes:
            hops = discover(dst, list(range(1, self.paths + 1)), max_ttl=4,
                            timeout_s=self.probe_timeout_s)
            r = routes_from_hops({0: hops}, self.paths)
            self.routes[dst] = (r.leaf[0], tuple(c + 1 for c in r.paths[0]))
        leaf, dscp = self.routes[dst]
        return (None if leaf is None else self.leaf_number(leaf)), dscp

    def leaf_number(self, routers: tuple[str, ...]) -> int:
        """The number of the leaf whose answering addresses ``routers`` are: the first known
        leaf that shares one of them (a leaf answers from the address of the link a probe
        came in on, and a probe its ICMP rate limit drops leaves that address out), else a
        new one. Addresses that answered nothing share one number."""
        for i, known in enumerate(self.leaves):
            if known & set(routers) or known == set(routers):
                known.update(routers)
                return i
        self.leaves.append(set(routers))
        return len(self.leaves) - 1

    def poll(self, diag: SockDiag) -> None:
        """One round: sample, choose, write the changes."""
        samples = [Sample((c.dst, c.sport, c.dport), *self.route(c.dst), c.wire_bytes, c.idle)
                   for c in diag.established() if not c.dst.startswith("127.")]
        changed, gone = self.pinner.update(samples)
        lines = pin_lines(changed, gone, self.in_map)
        if lines:
            nft(lines)
        self.polls += 1

    def stats(self) -> dict:
        """``schema`` nslab.balancer/1, ``polls``, ``destinations`` (address -> {leaf: the
        routers before it or null in the own leaf, dscp: one per spine}) and the pinner's
        ``connections``, ``moves``, ``bytes_by_path``."""
        return {"schema": "nslab.balancer/1", "polls": self.polls,
                "destinations": {d: {"leaf": list(leaf) if leaf is not None else None,
                                     "dscp": list(dscp)}
                                 for d, (leaf, dscp) in self.routes.items()},
                **self.pinner.stats()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workloads.lb.daemon",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Choose the path (DSCP) of every TCP connection of this VM: Ethereal's "
                    "round-robin per destination leaf for new connections, idle connections "
                    "re-placed on the least loaded path (workloads.lb.pinning); nftables "
                    "table ip nslab_balancer. Needs a fabric that steers by DSCP. Prints "
                    "'ready', then on SIGTERM one JSON line (nslab.balancer/1).")
    p.add_argument("--paths", type=int, required=True,
                   help="entropy values to probe: DSCP 1..PATHS (at least the spines)")
    p.add_argument("--offset", type=int, default=0,
                   help="where every leaf's round-robin starts (give VMs of one leaf "
                        "different ones)")
    p.add_argument("--peers", default="",
                   help="addresses to probe before 'ready' (comma-separated): their "
                        "connections are pinned from their first poll")
    p.add_argument("--poll-ms", type=float, default=10.0, help="sampling period, ms")
    p.add_argument("--probe-timeout", type=float, default=0.3, help="per probe, s")
    p.add_argument("--slack", type=int, default=FRAME_BYTES,
                   help="bytes by which an idle connection's path may exceed the least "
                        "loaded one before it moves (fewer nftables updates)")
    args = p.parse_args(argv)
    if not 1 <= args.paths <= 63:
        p.error(f"--paths: {args.paths} is outside 1..63")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        nft(table_lines(args.paths))
    except RuntimeError as e:
        print(f"balancer: {e}", file=sys.stderr)
        return 1
    daemon = Daemon(args.paths, args.offset, args.probe_timeout, args.slack)
    for peer in filter(None, args.peers.split(",")):
        daemon.route(peer)
    print("ready", flush=True)
    diag = SockDiag()
    try:
        while not stop.wait(args.poll_ms / 1000):
            daemon.poll(diag)
    finally:
        diag.close()
        nft([f"add table ip {TABLE}", f"delete table ip {TABLE}"])
        print(json.dumps(daemon.stats()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
