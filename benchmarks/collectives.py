"""Collective bus bandwidth against the link rate, as nccl-tests reports it (algbw = size /
time, busbw = algbw * bus factor), for every collective and a few sizes, on a real lab.

    sudo .venv/bin/python benchmarks/collectives.py [--ranks 4] [--bw 100] [--sizes 65536,...]

Ranks sit under different leaves of a 2-spine fabric whose VM links run at --bw Mbit/s, so a
ring's busbw can at best approach the link rate (ratio 1.0, minus ~4.4 % of headers).
"time ms" is the mean over iterations of the slowest rank; algbw/busbw average over ranks as
nccl-tests does by default (-a 1). Over TCP a sender finishes once its data sits in socket
buffers, so rooted collectives (gather, scatter) show rank-averaged bandwidths above the link
rate: read their "time ms" instead.
"""
from __future__ import annotations

import argparse

from mininet.log import setLogLevel
from record import record

from lab import Lab
from session import jobs
from topo import LeafSpine
from workloads.config import JobConfig

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather",
               "scatter", "all_to_all")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--bw", type=float, default=100.0, help="VM link rate, Mbit/s")
    ap.add_argument("--sizes", default="65536,1048576,8388608", help="bytes, comma separated")
    ap.add_argument("--iterations", type=int, default=5)
    args = ap.parse_args()
    setLogLevel("error")
    topo = LeafSpine(spines=2, leaves=args.ranks, vms_per_leaf=1, host_bw=args.bw,
                     fabric_bw=args.bw * 2)
    print(f"{'collective':15s} {'bytes':>9s} {'time ms':>9s} {'algbw Mb/s':>10s} "
          f"{'busbw Mb/s':>10s} {'busbw/link':>10s} verified")
    rows = []
    with Lab(topo, name="bench_coll") as lab:
        vms = jobs.naive([v.name for v in lab.vms], args.ranks)
        for collective in COLLECTIVES:
            for size in (int(s) for s in args.sizes.split(",")):
                cfg = JobConfig(collective=collective, bytes=size,
                                iterations=args.iterations, warmup=1, timeout_s=120)
                e = jobs.run(lab, f"{collective}{size}", cfg, vms)
                if e["error"]:
                    print(f"{collective:15s} {size:9d} error: {e['error']}")
                    rows.append({"collective": collective, "bytes": size,
                                 "verified": f"error: {e['error']}"})
                    continue
                alg, bus = e["algbw_bit_s"] / 1e6, e["busbw_bit_s"] / 1e6
                print(f"{collective:15s} {size:9d} {e['comm_s']['mean'] * 1e3:9.2f} "
                      f"{alg:10.1f} {bus:10.1f} {bus / args.bw:10.3f} {e['verified']}")
                rows.append({"collective": collective, "bytes": size,
                             "time ms": round(e["comm_s"]["mean"] * 1e3, 2),
                             "algbw Mbit/s": round(alg, 1), "busbw Mbit/s": round(bus, 1),
                             "busbw / link": round(bus / args.bw, 3),
                             "verified": e["verified"]})
    record("collectives", "Collectives: bus bandwidth against the link rate (nccl-tests' "
           "definitions)", ["collective", "bytes", "time ms", "algbw Mbit/s", "busbw Mbit/s",
                            "busbw / link", "verified"], rows,
           f"{args.ranks} ranks under different leaves, VM links {args.bw:g} Mbit/s, "
           f"{args.iterations} iterations after 1 warm-up; time: the mean of the slowest rank. "
           "Rooted collectives over TCP show rank-averaged bandwidths above the link rate "
           "(a sender is done once its data is in socket buffers): read their time.")


if __name__ == "__main__":
    main()
