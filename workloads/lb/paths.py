"""Path discovery from a host, the way traceroute does it: UDP probes with a growing TTL,
one series per entropy value; every router where a probe's TTL runs out answers with ICMP
time exceeded (its address is the hop), the destination with port unreachable.

The entropy value is the probe's DSCP (the lab's ``entropy`` fabric mode maps DSCP k to path
slot k; any fabric that steers by DSCP works alike) or its UDP source port (switches that
hash the 5-tuple; the hash includes the protocol, so a UDP probe finds UDP's path, not
TCP's). Errors are read from the socket's error queue (``IP_RECVERR``, ``ip(7)``): no raw
socket, no root.

    python -m workloads.lb.paths 10.2.1.2 --dscp 1 2 3 4     # JSON: {entropy: [hop, ...]}
"""
from __future__ import annotations

import argparse
import json
import select
import socket
import struct

IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
SO_EE_ORIGIN_ICMP = 2
ICMP_TIME_EXCEEDED = 11
ICMP_DEST_UNREACH = 3
PROBE_PORT = 33434
"""Destination port of the probes (traceroute's: nothing listens there)."""


def probe(dst: str, ttl: int, dscp: int = 0, sport: int = 0, timeout_s: float = 1.0
          ) -> tuple[str | None, bool]:
    """Send one UDP probe to ``dst`` with ``ttl``, DSCP ``dscp`` and source port ``sport``
    (0: ephemeral).

    Returns:
        (address that answered, whether it is the destination); (None, False) when nothing
        answered within ``timeout_s`` seconds.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
        s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        s.bind(("", sport))
        s.sendto(b"nslab-path-probe", (dst, PROBE_PORT))
        poller = select.poll()
        poller.register(s, select.POLLERR)
        if not poller.poll(timeout_s * 1000):
            return None, False
        _, ancdata, _, _ = s.recvmsg(64, 512, socket.MSG_ERRQUEUE)
        for level, kind, data in ancdata:
            if level == socket.IPPROTO_IP and kind == IP_RECVERR:
                _, origin, icmp_type, _ = struct.unpack_from("=IBBB", data)
                if origin != SO_EE_ORIGIN_ICMP:
                    continue
                addr = socket.inet_ntoa(data[20:24])  # offender: sockaddr_in after 16 bytes
                return addr, icmp_type == ICMP_DEST_UNREACH
    return None, False


def trace(dst: str, dscp: int = 0, sport: int = 0, max_ttl: int = 8, timeout_s: float = 1.0
          ) -> list[str | None]:
    """The hops towards ``dst`` for one entropy value: the answering address at TTL 1, 2, ...
    up to and including ``dst`` itself (None where nothing answered)."""
    hops: list[str | None] = []
    for ttl in range(1, max_ttl + 1):
        addr, reached = probe(dst, ttl, dscp, sport, timeout_s)
        hops.append(addr)
        if reached:
            break
    return hops


def discover(dst: str, dscps: list[int], max_ttl: int = 8, timeout_s: float = 1.0
             ) -> dict[int, list[str | None]]:
    """Hops towards ``dst`` for every DSCP in ``dscps`` (``trace``). Entropy values whose
    hops differ take different paths; equal hops, the same path."""
    return {d: trace(dst, dscp=d, max_ttl=max_ttl, timeout_s=timeout_s) for d in dscps}


def distinct_paths(hops: dict[int, list[str | None]], at: int = 1) -> list[int]:
    """One entropy value per distinct path: the smallest of those whose hop number ``at``
    (0-based; 1 = the routers one hop past the first, the spines of a leaf-spine) answered
    with the same address. Entropy values with no answer there are left out."""
    first: dict[str, int] = {}
    for e in sorted(hops):
        h = hops[e]
        if len(h) > at and h[at] is not None:
            first.setdefault(h[at], e)
    return sorted(first.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workloads.lb.paths",
                                description="Discover the paths towards a host by TTL-limited "
                                            "UDP probes, one series per DSCP value; prints "
                                            "JSON {dscp: [hop address, ...]}.")
    p.add_argument("dst", help="destination IPv4 address")
    p.add_argument("--dscp", type=int, nargs="+", default=[0], help="entropy values (DSCP)")
    p.add_argument("--max-ttl", type=int, default=8)
    p.add_argument("--timeout", type=float, default=1.0, help="per probe, s")
    args = p.parse_args(argv)
    print(json.dumps(discover(args.dst, args.dscp, args.max_ttl, args.timeout)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
