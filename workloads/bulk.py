"""A bulk TCP transfer that ends when the receiver has every byte.

``iperf3 -n N`` ends when the client has *written* N bytes to its socket; the server then
stops reading and closes, so what was still in the socket buffers (hundreds of kB) never
crosses the fabric. A load-balancing step must end when its data has arrived, so the sender
here shuts down its side after N bytes and waits for the receiver's close, which the
receiver sends only after reading to EOF.

    python -m workloads.bulk recv 5301                    # one connection; JSON when done
    python -m workloads.bulk send 10.2.1.2 5301 300000 --dscp 2 --cc cubic
    python -m workloads.bulk recv 5301 --ready            # says "ready" once listening
    python -m workloads.bulk send 10.2.1.2 5301 300000 --ready   # says "ready", waits for a line

With ``--ready`` the receiver prints ``ready`` once it listens, and the sender prints ``ready``
and waits for a line on its standard input before it connects: an incast starts every sender at
once (``session.incast``), not as each one's Python happens to start (seconds apart on a loaded
machine); the connection (its SYN) comes with the go, as an application's would.

Both print one JSON object: ``bytes``, ``seconds`` (connect to the receiver's close, on the
sender; first byte to EOF, on the receiver) and, on the sender, ``retransmits``
(``tcpi_total_retrans`` of ``TCP_INFO``, tcp(7)).
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Callable

from workloads.lb import tcpinfo

CHUNK = 64 * 1024


def receive(port: int, timeout_s: float = 60.0, listening: Callable[[], object] | None = None
            ) -> dict:
    """Serve one connection on ``port``: read to EOF, then close; ``listening`` is called once
    the port is open.

    Returns:
        {"bytes": received, "seconds": first byte to EOF}.
    Raises:
        TimeoutError: no connection or no data for ``timeout_s`` seconds.
    """
    with socket.create_server(("", port)) as srv:
        srv.settimeout(timeout_s)
        if listening is not None:
            listening()
        conn, _ = srv.accept()
    with conn:
        conn.settimeout(timeout_s)
        n, t0 = 0, None
        while data := conn.recv(CHUNK):
            t0 = t0 or time.perf_counter()
            n += len(data)
        return {"bytes": n, "seconds": time.perf_counter() - t0 if t0 else 0.0}


def send(host: str, port: int, nbytes: int, dscp: int = 0, timeout_s: float = 60.0,
         cc: str | None = None, go: Callable[[], object] | None = None) -> dict:
    """Send ``nbytes`` to a ``receive`` on ``host:port`` with DSCP ``dscp`` (the entropy value
    of the lab's ``entropy`` fabric) and congestion control ``cc`` (``TCP_CONGESTION``; None:
    the system's); return once the receiver has read them all and closed. ``go``, when
    given, is called first and the connection waits for its return (a start barrier).

    Returns:
        {"bytes": nbytes, "seconds": connect to the receiver's close, "retransmits": TCP
        segments retransmitted}.
    A refused connection is tried again until ``timeout_s`` (the receiver may still be
    starting).

    Raises:
        OSError: the connection failed; ConnectionError: the receiver closed early.
    """
    if go is not None:
        go()
    t0 = time.perf_counter()
    with _connect(host, port, timeout_s, cc) as s:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
        block = bytes(CHUNK)
        left = nbytes
        while left:
            left -= s.send(memoryview(block)[:min(left, CHUNK)])
        s.shutdown(socket.SHUT_WR)
        if s.recv(1):
            raise ConnectionError("the receiver sent data instead of closing")
        retrans = tcpinfo.read(s).total_retrans
    return {"bytes": nbytes, "seconds": time.perf_counter() - t0, "retransmits": retrans}


def _say_ready() -> None:
    print("ready", flush=True)


def _ready() -> None:
    _say_ready()
    sys.stdin.readline()


def _connect(host: str, port: int, timeout_s: float, cc: str | None) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        try:
            if cc is not None:  # before connect: the handshake already runs it
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
            s.connect((host, port))
            return s
        except ConnectionRefusedError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        except OSError:
            s.close()
            raise


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m workloads.bulk",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rx = sub.add_parser("recv", help="serve one transfer; print JSON when it is complete")
    rx.add_argument("port", type=int)
    tx = sub.add_parser("send", help="send NBYTES; print JSON once the receiver has them")
    tx.add_argument("host")
    tx.add_argument("port", type=int)
    tx.add_argument("nbytes", type=int)
    tx.add_argument("--dscp", type=int, default=0, help="DSCP (0-63): the entropy value")
    tx.add_argument("--cc", help="TCP congestion control, e.g. cubic or bbr (default: the "
                    "system's)")
    tx.add_argument("--ready", action="store_true", help="print 'ready' and wait for a line "
                    "on standard input before connecting")
    rx.add_argument("--ready", action="store_true", help="print 'ready' once listening")
    for p in (rx, tx):
        p.add_argument("--timeout", type=float, default=60.0, help="seconds without progress")
    args = ap.parse_args(argv)
    if args.cmd == "recv":
        out = receive(args.port, args.timeout, _say_ready if args.ready else None)
    else:
        out = send(args.host, args.port, args.nbytes, args.dscp, args.timeout, args.cc,
                   _ready if args.ready else None)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
