"""Test helper run inside a VM (`<venv python> vmclock_probe.py CMD`): what a program of the
VM sees of its clock, beside the machine's true time read by raw syscalls (which no preload sees).
Prints one JSON value.

    read              [true_before_ns, time.time_ns(), true_after_ns, formula_ns(true_before)]
    recv PORT         kernel receive stamps of 5 UDP datagrams on PORT (SO_TIMESTAMPNS cmsg) and
                      5 on PORT+1 (SIOCGSTAMPNS), each as time.time_ns() right after the
                      receive minus the stamp (ns); then "self": 20 datagrams sent to itself
                      over loopback, each [before_ns, cmsg stamp_ns, SIOCGSTAMPNS stamp_ns,
                      after_ns] with before/after read around the send and the receive (no
                      scheduler wake-up in between)
    send HOST PORT    sends 5 datagrams to PORT+1, then 5 to PORT with software TX
                      timestamping, 20 ms apart: [before_ns, error-queue stamp_ns, after_ns]
                      of the last one
    adjtimex PPM      sets the frequency through libc adjtimex (the preload): the state read back
    probe_cap         a raw adjtimex syscall that only asks for CAP_SYS_TIME (tick=1 is invalid:
                      EINVAL with the capability, EPERM without; it never changes anything)
"""
import ctypes
import fcntl
import json
import os
import socket
import struct
import sys
import time

from agents.clock import Clock

libc = ctypes.CDLL(None, use_errno=True)
SYS_CLOCK_GETTIME, SYS_ADJTIMEX = 228, 159  # x86_64
ADJ_FREQUENCY, ADJ_TICK = 0x0002, 0x4000
SO_TIMESTAMPNS, SO_TIMESTAMPING, SIOCGSTAMPNS = 35, 37, 0x8907
TX_SOFTWARE = (1 << 1) | (1 << 4) | (1 << 11)  # TX_SOFTWARE, SOFTWARE, OPT_TSONLY


class Timex(ctypes.Structure):
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long),
                ("status", ctypes.c_int), ("constant", ctypes.c_long),
                ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long),
                ("tick", ctypes.c_long), ("rest", ctypes.c_int * 32)]


def true_ns() -> int:
    ts = (ctypes.c_long * 2)()
    libc.syscall(SYS_CLOCK_GETTIME, 0, ts)
    return ts[0] * 1_000_000_000 + ts[1]


def ns(data: bytes) -> int:
    sec, nsec = struct.unpack_from("@ll", data)
    return sec * 1_000_000_000 + nsec


def main(cmd: str, *args: str):
    if cmd == "read":
        a = true_ns()
        v = time.time_ns()
        b = true_ns()
        return [a, v, b, Clock(os.environ["NSLAB_CLOCK"]).to_vm_ns(a)]
    if cmd == "recv":
        s, plain = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2))
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        s.bind(("0.0.0.0", int(args[0])))
        plain.bind(("0.0.0.0", int(args[0]) + 1))
        plain.settimeout(10)
        s.settimeout(10)
        buf = bytearray(16)
        try:  # the first SIOCGSTAMPNS turns the socket's stamps on (sock_gettstamp)
            fcntl.ioctl(plain.fileno(), SIOCGSTAMPNS, buf, True)
        except OSError:
            pass
        out = {"cmsg": [], "ioctl": []}
        for _ in range(5):
            plain.recv(64)
            after = time.time_ns()
            fcntl.ioctl(plain.fileno(), SIOCGSTAMPNS, buf, True)
            out["ioctl"].append(after - ns(buf))
        for _ in range(5):
            _, anc, _, _ = s.recvmsg(64, 256)
            after = time.time_ns()
            out["cmsg"] += [after - ns(d) for lvl, t, d in anc
                            if lvl == socket.SOL_SOCKET and t == SO_TIMESTAMPNS]
        # loopback: one socket with cmsgs, one for SIOCGSTAMPNS
        a, b = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2))
        a.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        try:
            fcntl.ioctl(b.fileno(), SIOCGSTAMPNS, buf, True)
        except OSError:
            pass
        out["self"] = []
        for _ in range(20):
            before = time.time_ns()
            a.sendto(b"x", a.getsockname())
            a.sendto(b"x", b.getsockname())
            _, anc, _, _ = a.recvmsg(64, 256)
            b.recv(64)
            fcntl.ioctl(b.fileno(), SIOCGSTAMPNS, buf, True)
            after = time.time_ns()
            out["self"].append([before, ns(anc[0][2]), ns(buf), after])
        return out
    if cmd == "send":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(5):
            s.sendto(b"x", (args[0], int(args[1]) + 1))
            time.sleep(0.02)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TX_SOFTWARE)
        for _ in range(4):
            s.sendto(b"x", (args[0], int(args[1])))
            time.sleep(0.02)
            s.recvmsg(64, 256, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        before = time.time_ns()
        s.sendto(b"x", (args[0], int(args[1])))
        for _ in range(100):
            try:
                _, anc, _, _ = s.recvmsg(64, 256, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
                break
            except BlockingIOError:
                time.sleep(0.001)
        after = time.time_ns()
        stamp = [ns(d) for lvl, t, d in anc if lvl == socket.SOL_SOCKET and t == SO_TIMESTAMPING]
        return [before, stamp[0], after]
    if cmd == "adjtimex":
        tx = Timex(modes=ADJ_FREQUENCY, freq=int(float(args[0]) * 65536))
        rc = libc.adjtimex(ctypes.byref(tx))
        back = Timex()
        libc.adjtimex(ctypes.byref(back))
        return {"rc": rc, "errno": ctypes.get_errno(), "freq_ppm": back.freq / 65536,
                "tick": back.tick}
    if cmd == "probe_cap":
        tx = Timex(modes=ADJ_TICK, tick=1)
        rc = libc.syscall(SYS_ADJTIMEX, ctypes.byref(tx))
        return {"rc": rc, "errno": ctypes.get_errno()}
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
