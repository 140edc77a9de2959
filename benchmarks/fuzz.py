"""Fuzz: the agents and their coordinator take malformed probes and junk API calls without
dying or losing a window. No root: everything runs on loopback.

    .venv/bin/python benchmarks/fuzz.py [--probes 100000] [--api 2000] [--rate 4000]

Three agents (``python -m agents agent``, on 127.0.0.1-3, HMAC keys on) and a coordinator run as
in a lab. Once their windows come, ``--probes`` datagrams are sent to vm1's probe port from an
address no agent has, at ``--rate`` a second: a quarter random bytes (0-200 bytes), half
scapy-fuzzed probe layers (``fuzz(NslabProbe)``), a quarter well-formed probes with no key, a
wrong key, a peer's address forged. At the same time ``--api`` junk calls go to the
coordinator: HTTP requests with random paths, methods, malformed request lines and random
bytes to its API port, and junk lines (not JSON, JSON of no message type, a 1 MB line, random
bytes) on connections to its report port.

Then: every process still runs; the coordinator produced a window every ``window_s`` through
the fuzz, each with every VM's estimate ("windows lost" counts those it did not); vm1 counted
the datagrams as rejects (the rest the kernel dropped from a full socket buffer: "dropped
before the agent"); vm1 still received its peers' probes. Prints and records
(``benchmarks/results/fuzz.json``).
"""
from __future__ import annotations

import argparse
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from record import record
from scapy.packet import fuzz

from agents.probe import NslabProbe, Probe, encode, node_id
from contracts.messages import CoordinatorState

REPO = Path(__file__).resolve().parent.parent
IPS = {"vm1": "127.0.0.1", "vm2": "127.0.0.2", "vm3": "127.0.0.3"}
KEY = "f022" * 8
WINDOW_S = 2.0


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mesh:
    def __init__(self, tmp: Path):
        self.tmp, self.udp = tmp, free_port(socket.SOCK_DGRAM)
        self.coord, self.http = free_port(), free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        self.spawn("coordinator", ["coordinator", "--bind", "127.0.0.1", "--port",
                                   str(self.coord), "--http-port", str(self.http), "--window",
                                   str(WINDOW_S)])
        for vm, ip in IPS.items():
            peers = ",".join(f"{p}={a}" for p, a in IPS.items() if p != vm)
            self.spawn(vm, ["agent", "--name", vm, "--bind", ip, "--peers", peers,
                            "--coordinator", f"127.0.0.1:{self.coord}", "--port",
                            str(self.udp), "--key", KEY, "--window", str(WINDOW_S)])

    def spawn(self, key: str, args: list[str]) -> None:
        with open(self.tmp / f"{key}.log", "w") as log:
            self.procs[key] = subprocess.Popen([sys.executable, "-m", "agents", *args],
                                               cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    def state(self) -> CoordinatorState | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/api/v1/state",
                                        timeout=2) as r:
                return CoordinatorState.model_validate_json(r.read())
        except OSError:
            return None

    def dead(self) -> list[str]:
        return [k for k, p in self.procs.items() if p.poll() is not None]

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def datagrams(n: int, rng: random.Random):
    """The fuzz: random bytes, fuzzed probe layers, well-formed probes with bad keys."""
    tmpl = fuzz(NslabProbe(src=node_id("vm2"), dst=node_id("vm1")))
    key = bytes.fromhex(KEY)
    for i in range(n):
        kind = i % 4
        if kind == 0:
            yield "random", rng.randbytes(rng.randrange(0, 201))
        elif kind in (1, 2):
            yield "fuzzed", bytes(tmpl)
        else:
            p = Probe(node_id("vm2"), node_id("vm1"), rng.getrandbits(62), rng.getrandbits(32),
                      rng.randrange(2), 0)
            yield "bad key", encode(p, rng.choice([None, bytes(16), key[::-1]]))


def junk_http(port: int, rng: random.Random) -> None:
    req = rng.choice([
        f"GET /{rng.randbytes(8).hex()} HTTP/1.1\r\nHost: x\r\n\r\n",
        f"{rng.choice(['POST', 'PUT', 'DELETE', 'BREW'])} /api/v1/state HTTP/1.1\r\n\r\n",
        "GET /api/v1/state HTTP/9.9\r\n\r\n", "\r\n\r\n",
        "GET / HTTP/1.1\r\n" + "X: " + "y" * 70_000 + "\r\n\r\n",
        "GET /api/v1/../../etc/passwd HTTP/1.0\r\n\r\n"]).encode()
    if rng.random() < 0.2:
        req = rng.randbytes(rng.randrange(1, 400))
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        try:
            s.sendall(req)
            s.shutdown(socket.SHUT_WR)
            s.recv(65536)
        except OSError:
            pass


def junk_report(port: int, rng: random.Random) -> None:
    line = rng.choice([b"not json\n", b'{"type": "nonsense"}\n', b'{"type": "report"}\n',
                       b"[1, 2, 3]\n", b'{"type": "hello", "name": 5}\n',
                       b"{" * 1_000_000 + b"\n", rng.randbytes(300) + b"\n"])
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        try:
            s.sendall(line)
            s.shutdown(socket.SHUT_WR)
            s.recv(4096)
        except OSError:
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probes", type=int, default=100_000)
    ap.add_argument("--api", type=int, default=2_000, help="junk calls to the coordinator")
    ap.add_argument("--rate", type=float, default=4_000, help="fuzzed datagrams per second")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        mesh = Mesh(Path(tmp))
        try:
            deadline = time.monotonic() + 60
            st = None
            while time.monotonic() < deadline:
                st = mesh.state()
                if st and st.windows >= 2 and len(st.history[-1].vms) == len(IPS):
                    break
                assert not mesh.dead(), mesh.dead()
                time.sleep(0.5)
            else:
                sys.exit(f"fuzz: the mesh never produced full windows: {st}")
            before = st
            rejects0 = sum(before.vms["vm1"].rejects.values())
            t0 = time.monotonic()
            sent = {"random": 0, "fuzzed": 0, "bad key": 0}
            api_every = max(1, args.probes // max(args.api, 1))
            calls = 0
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind(("127.0.0.9", 0))
                for i, (kind, data) in enumerate(datagrams(args.probes, rng)):
                    s.sendto(data, (IPS["vm1"], mesh.udp))
                    sent[kind] += 1
                    if i % api_every == 0 and calls < args.api:
                        (junk_http if calls % 2 else junk_report)(
                            mesh.http if calls % 2 else mesh.coord, rng)
                        calls += 1
                    late = t0 + (i + 1) / args.rate - time.monotonic()
                    if late > 0:
                        time.sleep(late)
            spent = time.monotonic() - t0
            time.sleep(2 * WINDOW_S + 1)   # the windows of the fuzz settle
            after = mesh.state()
            dead = mesh.dead()
        finally:
            mesh.close()
    total = sum(sent.values())
    during = [h for h in after.history if before.t_ns < h.t_ns] if after else []
    expected = int(spent / WINDOW_S)
    full = sum(len(h.vms) == len(IPS) for h in during)
    counted = sum(after.vms["vm1"].rejects.values()) - rejects0 if after else 0
    row = {"datagrams": f"{total:,}", "junk API calls": f"{calls:,}",
           "seconds": round(spent, 1), "processes dead": ", ".join(dead) or "none",
           "windows": len(during), "windows lost": max(0, expected - full),
           "rejected by vm1": f"{counted:,}",
           "dropped before the agent": f"{total - counted:,}",
           "vm1 probes from peers": after.vms["vm1"].probes_rx - before.vms["vm1"].probes_rx
           if after else 0}
    print("  ".join(f"{k}: {v}" for k, v in row.items()))
    record("fuzz", "Fuzz: malformed probes and junk API calls against the agents", list(row),
           [row], f"3 agents and a coordinator on loopback, {WINDOW_S:g} s windows; datagrams "
           f"to vm1 at {args.rate:g}/s: {sent['random']:,} random, {sent['fuzzed']:,} "
           f"scapy-fuzzed probes, {sent['bad key']:,} probes with a missing or wrong key; "
           "'windows lost': windows of the fuzz's span without every VM's estimate.")
    if dead or not after:
        sys.exit(1)


if __name__ == "__main__":
    main()
