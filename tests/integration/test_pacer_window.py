"""The kernel datapath's receive-window clamp and its base-relative threshold, on crafted
segments: the real programs (agents/native/pacer.bpf.c) run by the kernel (BPF_PROG_TEST_RUN)
with their maps set to known states, in a private network and mount namespace (its loopback
interface, a bpffs of its own), so that each window and hold has a known right answer."""
import json
import subprocess
import sys

RUN = r"""
import ctypes, json, os, socket, struct, tempfile
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from agents.bpf import Act, Cfg, Datapath, Dest, Flow, FlowKey
from agents.bpfpacer import kernel_monotonic_ns

ME, PEER, LPORT, PPORT = "10.0.0.1", "10.0.0.2", 5201, 40000
MS = 1_000_000
d = Datapath("lo", tempfile.mkdtemp(prefix="nslab-bpf-"))
d.set_peer(PEER, 0, True)
k = kernel_monotonic_ns()
ACTIVE_NS = k // 3            # epochs of a third of the uptime: this test runs in epoch 3
e = k // ACTIVE_NS

def cfg(**kw):
    base = dict(k0=k, ref0=k, ppb=0, synced=1, pace=1, threshold_ns=500_000,
                max_hold_ns=20 * MS, max_cont_ns=200 * MS, max_transit_ns=400 * MS,
                ps_per_byte=8000, burst_ns=0, window=1, active_ns=ACTIVE_NS, full_bytes=1448,
                min_window=1448, queue_bytes=62_500)
    d.set_cfg(Cfg(**(base | kw)))

def ip32(a):
    return struct.unpack("=I", socket.inet_aton(a))[0]

key = FlowKey(ip32(PEER), LPORT, PPORT)

def out_window(flags, window, options=(), ack=0):
    pkt = Ether() / IP(src=ME, dst=PEER, id=1) / TCP(sport=LPORT, dport=PPORT, flags=flags,
                                                   window=window, ack=ack,
                                                   options=list(options))
    rc, raw = d.test_run("egress", bytes(pkt))
    got = Ether(raw)
    sent = got[TCP].chksum
    del got[TCP].chksum
    return {"rc": rc, "window": got[TCP].window,
            "csum_ok": Ether(bytes(got))[TCP].chksum == sent}

def dest(**kw):
    x = Dest()
    for f, v in kw.items():
        setattr(x, f, v)
    d.update("dests", ctypes.c_uint32(0), x)

res = {}
cfg()
# the handshake: our SYN-ACK announces window scale 7; the window starts at two segments
res["synack"] = out_window("SA", 65160, [("MSS", 1460), ("SAckOK", b""), ("Timestamp", (1, 2)),
                                         ("NOP", None), ("WScale", 7)])
f = d.lookup("flows", key, Flow())
res["ws_ours"] = f.ws_ours
# 4 active flows, the data's base OWD 1 ms (no socket here: the ACKs' taken as 1 ms too)
d.update("flows", key, Flow(epoch=e, ws_ours=7, peer_ws=1))
d.update("act", ctypes.c_uint32(0), Act(epoch=e, cur=4, prev=2))
dest(rx_min=MS, rx_owd=MS)
res["share"] = out_window("A", 5000)
dest(rx_min=MS, rx_owd=3 * MS)                      # 2 ms of queueing > T = 0.5 ms
# the right edge stays: 100 units of data later the window is 500 units, not 148
res["no_shrink"] = out_window("A", 5000, ack=100 * 128)
d.update("flows", key, Flow(epoch=e, ws_ours=7, peer_ws=1))  # a new edge
res["queued"] = out_window("A", 5000)
d.update("flows", key, Flow(epoch=e, ws_ours=7, peer_ws=1))
d.update("act", ctypes.c_uint32(0), Act(epoch=e, cur=400, prev=0))
res["floor"] = out_window("A", 500)
res["smaller_kept"] = out_window("A", 2)            # never widened
dest()                                              # no OWD yet, no socket: no base
res["no_base"] = out_window("A", 500)
dest(rx_min=MS, rx_owd=MS)
d.update("flows", key, Flow(epoch=e - 2, ws_ours=7, peer_ws=1))
res["idle_flow"] = out_window("A", 500)             # not active: left alone
cfg(window=0)
d.update("flows", key, Flow(epoch=e, ws_ours=7, peer_ws=1))
res["off"] = out_window("A", 500)

# the sender: echoes of full-size segments set the base; T counts from it
def echo(owd_ns, full):
    units = owd_ns >> 13
    now = kernel_monotonic_ns()                     # its stamp: sent now (transit ~0)
    pkt = Ether() / IP(src=PEER, dst=ME, id=(now >> 13) & 0xffff) / TCP(
        sport=PPORT, dport=LPORT, flags="A", urgptr=units | (0x8000 if full else 0))
    d.test_run("ingress", bytes(pkt))
    return d.dest(0)

for from_base in (1, 0):
    cfg(window=0, from_base=from_base)
    dest()
    x = echo(4 * MS, True)                          # the base: 4 ms
    y = echo(4 * MS + 1_500_000, False)             # 1.5 ms above it
    res[f"from_base_{from_base}"] = {"fb_min": x.fb_min, "first_ns": x.held_ns,
                                     "holds": y.holds}
    if from_base:
        res["from_base_1"]["second_ns"] = y.held_ns
d.close()
print(json.dumps(res))
"""


def test_window_clamp_and_base_relative_threshold_on_known_segments():
    """Receiver side: a SYN-ACK's window becomes two full segments (2896 B) and its
    window scale (7) is noted; with 4 flows active (the larger of this epoch's and the
    previous one's count), a base OWD of 1 ms each way, 1 Gbit/s and a queue of 62500 B
    (0.5 ms of the line), each flow's window is (2 ms of the line + the queue) / 4 = 78125 B,
    53 whole segments of 1448 B: 600 units of 128 B (rounded up); 2 ms of queueing
    (> 0.5 ms) cuts it by 0.5 / 2 to 19531 B, 13 segments (148 units), but never left of the
    right edge already advertised (100 units acknowledged later: 500 units); 400 flows hit the
    floor (12 units); a window already smaller is kept; an idle flow's, one without a base
    RTT (no OWD and no socket to ask) and a clamp that is off change nothing; every rewritten
    segment's TCP checksum is right. Sender side: with T from the base, the echo of a
    full-size segment at 4 ms sets the base and holds nothing, and one 1.5 ms above it holds
    for 1 ms; with T from 0 the first echo holds for 3.5 ms (On-Ramp as published)."""
    out = subprocess.run(["unshare", "--net", "--mount", sys.executable, "-c", RUN],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["synack"] == {"rc": 0, "window": 2896, "csum_ok": True}
    assert r["ws_ours"] == 7
    assert r["share"] == {"rc": 0, "window": 600, "csum_ok": True}
    assert r["queued"] == {"rc": 0, "window": 148, "csum_ok": True}
    assert r["no_shrink"] == {"rc": 0, "window": 500, "csum_ok": True}
    assert r["floor"]["window"] == 12 and r["floor"]["csum_ok"]
    assert r["smaller_kept"]["window"] == 2
    assert r["idle_flow"]["window"] == 500
    assert r["no_base"]["window"] == 500
    assert r["off"]["window"] == 500
    # OWDs travel in stamp units (8.192 us): 4 ms is 488 units, 5.5 ms 671
    base, zero = r["from_base_1"], r["from_base_0"]
    assert base["fb_min"] == zero["fb_min"] == 488 << 13
    assert base == {"fb_min": 488 << 13, "first_ns": 0, "second_ns": (671 << 13) - 500_000
                    - (488 << 13), "holds": 1}
    assert zero["first_ns"] == (488 << 13) - 500_000
