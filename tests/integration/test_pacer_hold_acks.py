"""A refuse hold on traffic that flows both ways (a collective's AllToAll): the data segments a
held VM refuses carry its acknowledgements of the peer's data, which its TCP counts as sent
(``__tcp_transmit_skb`` calls ``tcp_event_ack_sent`` before the packet reaches the qdisc). The
real programs (agents/native/pacer.bpf.c) on both ends of a veth pair between two private
network namespaces, each held toward the other; real TCP both ways; no lab."""
import json
import subprocess
import sys

SIDE = r"""
import ctypes, json, os, socket, subprocess, sys, tempfile, threading, time
from agents.bpf import Cfg, Datapath, Dest
from agents.bpfpacer import kernel_monotonic_ns

MS = 1_000_000
N = 256 * 1024
DATA = bytes(range(256)) * (N // 256)

def tcp_timeouts():
    lines = open("/proc/self/net/netstat").read().splitlines()
    for a, b in zip(lines[::2], lines[1::2]):
        if a.startswith("TcpExt:"):
            return int(dict(zip(a.split()[1:], b.split()[1:]))["TCPTimeouts"])

def held(ifname, peer_ip):
    d = Datapath(ifname, tempfile.mkdtemp(prefix="nslab-bpf-"))
    d.set_peer(peer_ip, 0, True)
    # held toward the peer for a minute (no clock: nothing stamped, no echo, no other hold)
    d.set_cfg(Cfg(synced=0, pace=1, max_hold_ns=60_000 * MS, max_cont_ns=60_000 * MS,
                  max_transit_ns=400 * MS))
    x = Dest()
    x.hold_until = kernel_monotonic_ns() + 60_000 * MS
    d.update("dests", ctypes.c_uint32(0), x)
    return d

def exchange(s):
    # both ways at once over one connection, as an AllToAll does
    got = bytearray()
    def recv():
        while len(got) < N:
            got.extend(s.recv(65536))
    r = threading.Thread(target=recv)
    r.start()
    s.sendall(DATA)
    r.join()
    return bytes(got) == DATA

def report(d, t0, rto0, intact):
    y = d.dest(0)
    out = {"s": time.monotonic() - t0, "timeouts": tcp_timeouts() - rto0, "intact": intact,
           "refused": y.refused, "acks": y.acks}
    d.close()
    return out

if sys.argv[1] == "peer":
    assert sys.stdin.readline().strip() == "up"
    d = held("p0", "10.9.0.1")
    srv = socket.create_server(("10.9.0.2", 5201))
    print("listening", flush=True)
    c, _ = srv.accept()
    t0, rto0 = time.monotonic(), tcp_timeouts()
    print(json.dumps(report(d, t0, rto0, exchange(c))), flush=True)
    sys.exit()

peer = subprocess.Popen(["unshare", "--net", "--mount", sys.executable, "-c", sys.argv[2],
                         "peer"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
def ip(*a, ns=False):
    pre = ["nsenter", f"--net=/proc/{peer.pid}/ns/net"] if ns else []
    subprocess.run(pre + ["ip", *a], check=True)
time.sleep(0.2)
ip("link", "add", "h0", "type", "veth", "peer", "name", "p0", "netns", str(peer.pid))
ip("addr", "add", "10.9.0.1/24", "dev", "h0")
for dev, addr, ns in (("h0", "10.9.0.1/24", False), ("p0", "10.9.0.2/24", True)):
    if ns:
        ip("addr", "add", addr, "dev", dev, ns=True)
    # a VM's vNIC: one packet per segment (GSO off), a 20 Mbit/s line with a deep queue
    ip("link", "set", "dev", dev, "gso_max_segs", "1", ns=ns)
    ip("link", "set", dev, "up", ns=ns)
    pre = ["nsenter", f"--net=/proc/{peer.pid}/ns/net"] if ns else []
    for line in (f"qdisc add dev {dev} root handle 1: htb default 1",
                 f"class add dev {dev} parent 1: classid 1:1 htb rate 20mbit",
                 f"qdisc add dev {dev} parent 1:1 pfifo limit 1000"):
        subprocess.run(pre + ["tc", *line.split()], check=True)
peer.stdin.write("up\n")
peer.stdin.flush()
d = held("h0", "10.9.0.2")
assert peer.stdout.readline().strip() == "listening"
s = socket.create_connection(("10.9.0.2", 5201))
t0, rto0 = time.monotonic(), tcp_timeouts()
mine = report(d, t0, rto0, exchange(s))
theirs = json.loads(peer.stdout.readline())
peer.wait(timeout=10)
print(json.dumps({"here": mine, "peer": theirs}))
"""


def test_refused_segments_hand_their_acknowledgements_on():
    """Two VMs, each held toward the other, exchange 256 KB both ways over one connection.
    Their refused segments carry acknowledgements (and windows) of the other's data that TCP
    counts as sent: the datapath sends each new one on as a pure ACK (the segment's headers),
    so neither end waits for a retransmission timeout (TcpExt TCPTimeouts in each namespace
    stays 0, where the two ends otherwise wait on each other's acknowledgement until one
    times out); the holds still refuse segments; every byte arrives intact both ways."""
    out = subprocess.run(["unshare", "--net", "--mount", sys.executable, "-c", SIDE, "here",
                          SIDE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    for end in ("here", "peer"):
        assert r[end]["intact"], r
        assert r[end]["timeouts"] == 0, r
    assert r["here"]["refused"] + r["peer"]["refused"] > 0, r
    assert r["here"]["acks"] + r["peer"]["acks"] > 0, r
