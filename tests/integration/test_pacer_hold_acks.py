"""The kernel datapath's ACKs on real TCP: the real programs (agents/native/pacer.bpf.c) on the
ends of a veth pair between two private network namespaces (20 Mbit/s HTB lines, GSO off as on
a lab VM's vNIC), no lab.

* A refuse hold on traffic that flows both ways (a collective's AllToAll): the data segments a
  held VM refuses carry its acknowledgements of the peer's data, which its TCP counts as sent
  (``__tcp_transmit_skb`` calls ``tcp_event_ack_sent`` before the packet reaches the qdisc).
* ACK pacing: a receiver's pure ACKs in an HTB class that counts each as a full segment
  (``agents.bpfpacer.pace_acks``) set its sender's rate."""
import json
import subprocess
import sys

SIDE = r"""
import ctypes, json, os, socket, subprocess, sys, tempfile, threading, time
from agents.bpf import Cfg, Datapath, Dest
from agents.bpfpacer import kernel_monotonic_ns, pace_acks
from agents.tcpsense import netstat

MODE = sys.argv[1]
ACK_SHARE = 0.25                                     # of the 20 Mbit/s line, in ACK pacing
MS = 1_000_000
N = 256 * 1024
DATA = bytes(range(256)) * (N // 256)

def tcp_timeouts():
    return netstat().timeouts

def held(ifname, peer_ip):
    d = Datapath(ifname, tempfile.mkdtemp(prefix="nslab-bpf-"))
    d.set_peer(peer_ip, 0, True)
    if MODE == "ack":                                # the receiver (the peer) paces its ACKs
        if ifname == "p0":  # every segment acknowledged at once, as the pacer's routes do
            subprocess.run(["ip", "route", "change", "10.9.0.0/24", "dev", "p0", "proto",
                            "kernel", "scope", "link", "src", "10.9.0.2", "quickack", "1"],
                           check=True)
            d.set_cfg(Cfg(ack_class=pace_acks("p0", ACK_SHARE * 20e6, 1514)))
        return d
    # held toward the peer for a minute (no clock: nothing stamped, no echo, no other hold)
    d.set_cfg(Cfg(synced=0, pace=1, max_hold_ns=60_000 * MS, max_cont_ns=60_000 * MS,
                  max_transit_ns=400 * MS))
    x = Dest()
    x.hold_until = kernel_monotonic_ns() + 60_000 * MS
    d.update("dests", ctypes.c_uint32(0), x)
    return d

def exchange(s):
    # hold: both ways at once over one connection, as an AllToAll does; ack: here to the peer
    got = bytearray()
    if MODE == "ack":
        if s.getsockname()[0] == "10.9.0.1":
            s.sendall(DATA)
            return True
        while len(got) < N:
            got.extend(s.recv(65536))
        return bytes(got) == DATA
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

if sys.argv[2] == "peer":
    assert sys.stdin.readline().strip() == "up"
    d = held("p0", "10.9.0.1")
    srv = socket.socket()
    if MODE == "ack":  # a small receive window: each ACK lets as much go as it acknowledges
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
    srv.bind(("10.9.0.2", 5201))
    srv.listen()
    print("listening", flush=True)
    c, _ = srv.accept()
    t0, rto0 = time.monotonic(), tcp_timeouts()
    print(json.dumps(report(d, t0, rto0, exchange(c))), flush=True)
    sys.exit()

peer = subprocess.Popen(["unshare", "--net", "--mount", sys.executable, "-c", sys.argv[3],
                         MODE, "peer"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        text=True)
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


def _run(mode: str) -> dict:
    out = subprocess.run(["unshare", "--net", "--mount", sys.executable, "-c", SIDE, mode,
                          "here", SIDE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_refused_segments_hand_their_acknowledgements_on():
    """Two VMs, each held toward the other, exchange 256 KB both ways over one connection.
    Their refused segments carry acknowledgements (and windows) of the other's data that TCP
    counts as sent: the datapath sends each new one on as a pure ACK (the segment's headers),
    so neither end waits for a retransmission timeout (TcpExt TCPTimeouts in each namespace
    stays 0, where the two ends otherwise wait on each other's acknowledgement until one
    times out); the holds still refuse segments; every byte arrives intact both ways."""
    r = _run("hold")
    for end in ("here", "peer"):
        assert r[end]["intact"], r
        assert r[end]["timeouts"] == 0, r
    assert r["here"]["refused"] + r["peer"]["refused"] > 0, r
    assert r["here"]["acks"] + r["peer"]["acks"] > 0, r


def test_paced_acks_set_the_senders_rate():
    """The peer receives 256 KB and sends its pure ACKs through an HTB class at a quarter of
    the 20 Mbit/s line that counts each ACK as a full segment's frame (1514 B): every ACK
    releases one 1448-byte segment, so the data arrives at 5 Mbit/s x 1448 / 1514, about
    598 kB/s: the 256 KB beyond the initial window (10 segments) take about 0.41 s, where the
    line alone takes 0.11 s. Measured at the receiver, within [0.8, 1.6] x that."""
    r = _run("ack")
    assert r["peer"]["intact"], r
    expect = (256 * 1024 - 10 * 1448) / (0.25 * 20e6 / 8 / 1514 * 1448)
    assert 0.8 * expect <= r["peer"]["s"] <= 1.6 * expect, (r, expect)
