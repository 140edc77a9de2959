"""Link accuracy: measured/configured rate over one shaped VM-leaf-VM path at several rates,
with the machine's fidelity during each measurement (where emulation stops being faithful).

    sudo .venv/bin/python benchmarks/link_accuracy.py [--rates 10,100,1000] [--seconds 4]

TCP goodput is reported against the configured rate; its ceiling is 1448/1514 = 0.956 (HTB
counts Ethernet headers).
"""
from __future__ import annotations

import argparse
import json

from mininet.log import setLogLevel

from lab import Lab
from lab.fidelity import FidelitySampler
from topo import LeafSpine


def iperf3(client, server, seconds: float, udp_mbit: float | None = None) -> dict:
    srv = server.popen(["iperf3", "-s", "-1"])
    try:
        args = f"-t {seconds} -O 1" + (f" -u -b {udp_mbit}M" if udp_mbit else "")
        out = client.cmd(f"sleep 0.3; iperf3 -c {server.IP()} -J {args}")
        return json.loads(out[out.index("{"):])
    finally:
        srv.kill()
        srv.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="10,100,1000", help="Mbit/s, comma separated")
    ap.add_argument("--seconds", type=float, default=4)
    args = ap.parse_args()
    setLogLevel("error")
    print(f"{'rate Mbit/s':>11s} {'TCP Mbit/s':>10s} {'ratio':>6s} {'retr':>5s} "
          f"{'busy p50':>8s} {'core max':>8s} {'softirq max':>11s} {'saturated':>9s}")
    for rate in (float(r) for r in args.rates.split(",")):
        topo = LeafSpine(spines=1, leaves=1, vms_per_leaf=2, host_bw=rate)
        with Lab(topo, name="bench_link") as lab, FidelitySampler() as fid:
            doc = iperf3(lab["vm1"], lab["vm2"], args.seconds)
        got = doc["end"]["sum_received"]["bits_per_second"] / 1e6
        f = fid.summary()
        print(f"{rate:11.0f} {got:10.1f} {got / rate:6.3f} "
              f"{doc['end']['sum_sent'].get('retransmits', 0):5d} "
              f"{f['cpu_busy']['p50']:8.2f} {f['busiest_core']['max']:8.2f} "
              f"{f['softirq']['max']:11.2f} {f['saturated']!s:>9s}")


if __name__ == "__main__":
    main()
