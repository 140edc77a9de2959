"""Link accuracy: measured/configured rate over one shaped VM-leaf-VM path at several rates,
with the machine's fidelity during each measurement (where emulation stops being faithful).

    sudo .venv/bin/python benchmarks/link_accuracy.py [--rates 10,100,1000] [--seconds 4]
                                                      [--hogs N]

TCP goodput is reported against the configured rate; its ceiling is 1448/1514 = 0.956 (HTB
counts Ethernet headers). ``queued`` is what the fidelity watchdog read from the VM's emulated
queue (``lab.saturation``): the rate it sent while it held packets, over the configured rate
(p50), and whether it judged the link CPU-limited. ``--hogs N`` runs N busy loops on the
machine during each measurement (started and ended by PID), to see the watchdog's verdict on a
saturated machine.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from mininet.log import setLogLevel
from record import record

from lab import Lab
from lab.fidelity import FidelitySampler
from lab.queues import QueueReader
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
    ap.add_argument("--hogs", type=int, default=0, help="busy loops during each measurement")
    args = ap.parse_args()
    setLogLevel("error")
    print(f"{'rate Mbit/s':>11s} {'TCP Mbit/s':>10s} {'ratio':>6s} {'retr':>5s} "
          f"{'busy p50':>8s} {'core max':>8s} {'softirq max':>11s} {'queued':>6s} "
          f"{'cpu-limited':>11s} {'saturated':>9s}")
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        topo = LeafSpine(spines=1, leaves=1, vms_per_leaf=2, host_bw=rate)
        with Lab(topo, name="bench_link") as lab, FidelitySampler() as fid:
            fid.watch(QueueReader(lab))
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(args.hogs)]
            try:
                doc = iperf3(lab["vm1"], lab["vm2"], args.seconds)
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
        got = doc["end"]["sum_received"]["bits_per_second"] / 1e6
        f = fid.summary()
        q = next((q for q in f["queues"] if q["link"] == "vm1->leaf1"), None)
        print(f"{rate:11.0f} {got:10.1f} {got / rate:6.3f} "
              f"{doc['end']['sum_sent'].get('retransmits', 0):5d} "
              f"{f['cpu_busy']['p50']:8.2f} {f['busiest_core']['max']:8.2f} "
              f"{f['softirq']['max']:11.2f} "
              f"{q['rate_ratio']['p50'] if q else float('nan'):6.3f} "
              f"{(q['cpu_limited'] if q else None)!s:>11s} {f['saturated']!s:>9s}")
        rows.append({"rate Mbit/s": f"{rate:.0f}", "TCP Mbit/s": round(got, 1),
                     "ratio": round(got / rate, 3),
                     "retransmits": doc["end"]["sum_sent"].get("retransmits", 0),
                     "busiest core max": round(f["busiest_core"]["max"], 2),
                     "softirq max": round(f["softirq"]["max"], 2),
                     "saturated": f["saturated"]})
    record("link_accuracy", "Link accuracy: TCP goodput over a shaped link / configured rate",
           list(rows[0]), rows, f"iperf3 TCP for {args.seconds:g} s over vm1 -> leaf1 -> vm2; "
           f"the ceiling is 1448/1514 = 0.956 (HTB counts Ethernet headers); {args.hogs} busy "
           "loops beside.")


if __name__ == "__main__":
    main()
