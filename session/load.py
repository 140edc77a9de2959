"""Background load between VMs with iperf3 (iperf3(1)): a scenario element.

Each flow runs ``iperf3 -s -1`` in the destination VM and ``iperf3 -c ... -J`` in the source
VM for ``duration_s``; the results keep what iperf3 measured (receiver goodput in Mbit/s,
retransmits for TCP, loss for UDP).
"""
from __future__ import annotations

import json
import subprocess
import threading
import time

from pydantic import BaseModel, ConfigDict, Field

BASE_PORT = 5201
"""iperf3's port of the first flow; flow i without a ``port`` uses BASE_PORT + i."""


class Flow(BaseModel):
    """One iperf3 flow from VM ``src`` to VM ``dst`` (also a scenario's ``load:`` entry)."""

    model_config = ConfigDict(extra="forbid")

    src: str = Field(description="sending VM", examples=["vm1"])
    dst: str = Field(description="receiving VM (iperf3 -s)", examples=["vm5"])
    at_s: float = Field(0.0, ge=0, description="start, s after bring-up")
    duration_s: float = Field(5.0, gt=0, description="s")
    bw: float | None = Field(None, gt=0, description="Mbit/s (TCP: a cap; UDP: the rate, "
                                                     "default 100)")
    udp: bool = False
    parallel: int = Field(1, gt=0, le=128, description="parallel streams (-P)")
    port: int | None = Field(None, gt=0, lt=65536, description="iperf3 port (default: "
                             f"{BASE_PORT} + the flow's index; concurrent flows need their own)")


def client_argv(flow: Flow, dst_ip: str, port: int) -> list[str]:
    """The iperf3 client command line of ``flow``."""
    argv = ["iperf3", "-c", dst_ip, "-p", str(port), "-t", str(flow.duration_s), "-J",
            "-P", str(flow.parallel)]
    if flow.udp:
        argv += ["-u", "-b", f"{flow.bw or 100}M"]
    elif flow.bw:
        argv += ["-b", f"{flow.bw}M"]
    return argv


def summarize(flow: Flow, doc: dict) -> dict:
    """Results entry of one flow from iperf3's JSON."""
    out = {"src": flow.src, "dst": flow.dst, "at_s": flow.at_s, "duration_s": flow.duration_s,
           "protocol": "udp" if flow.udp else "tcp", "requested_mbit": flow.bw}
    if "error" in doc:
        return {**out, "error": doc["error"]}
    end = doc["end"]
    if flow.udp:
        s = end["sum"]
        return {**out, "mbit": round(s["bits_per_second"] * (1 - s["lost_percent"] / 100) / 1e6,
                                     3), "lost_percent": round(s["lost_percent"], 3)}
    return {**out, "mbit": round(end["sum_received"]["bits_per_second"] / 1e6, 3),
            "retransmits": end["sum_sent"].get("retransmits", 0)}


class LoadRunner:
    """Starts each flow at its time (in background threads) and collects the results."""

    def __init__(self, lab, flows: list[Flow]):
        self.lab, self.flows = lab, flows
        self.results: list[dict] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        for i, flow in enumerate(self.flows):
            t = threading.Thread(target=self._run, args=(flow, flow.port or BASE_PORT + i),
                                 daemon=True,
                                 name=f"nslab-iperf3-{flow.src}-{flow.dst}")
            self._threads.append(t)
            t.start()

    def _run(self, flow: Flow, port: int) -> None:
        wait = flow.at_s - self.lab.now_s()
        if wait > 0:
            time.sleep(wait)
        src, dst = self.lab[flow.src], self.lab[flow.dst]
        self.lab.stamp("load", f"{flow.src}->{flow.dst}", duration_s=flow.duration_s,
                       mbit=flow.bw, udp=flow.udp)
        server = dst.popen(["iperf3", "-s", "-1", "-p", str(port)])
        try:
            doc = {"error": "iperf3 server did not start"}
            for _ in range(20):  # until the server listens
                client = src.popen(client_argv(flow, dst.IP(), port))
                try:
                    out, _ = client.communicate(timeout=flow.duration_s + 15)
                except subprocess.TimeoutExpired:
                    client.kill()
                    out, _ = client.communicate()
                doc = json.loads(out) if out.strip() else {"error": "iperf3 printed nothing"}
                if "unable to connect" not in str(doc.get("error", "")):
                    break
                time.sleep(0.1)
        finally:
            server.kill()
            server.wait()
        entry = summarize(flow, doc)
        with self._lock:
            self.results.append(entry)
        self.lab.stamp("load_done", f"{flow.src}->{flow.dst}", mbit=entry.get("mbit"))

    def join(self, timeout_s: float) -> list[dict]:
        """Wait for the flows (at most ``timeout_s`` in all); results in start order."""
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        order = {(f.src, f.dst, f.at_s): i for i, f in enumerate(self.flows)}
        return sorted(self.results, key=lambda r: order.get((r["src"], r["dst"], r["at_s"]), 0))
