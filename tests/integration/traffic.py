"""Real traffic between VMs for the integration tests."""
import json
import time


def iperf3(client, server, *args, port=5201, retry_s=5):
    """Run iperf3 from VM ``client`` to VM ``server``; returns the parsed JSON.

    A failed run is tried again for ``retry_s`` seconds, each time against a running server
    (``-s -1`` serves one test: after a test that failed midway, e.g. when the control
    connection crosses a lossy link, a new one is started)."""
    srv = None
    deadline = time.time() + retry_s
    try:
        while True:
            if srv is None or srv.poll() is not None:
                if srv is not None:
                    srv.wait()
                srv = server.popen(["iperf3", "-s", "-1", "-p", str(port)])
            out = client.cmd(f"iperf3 -c {server.IP()} -p {port} -J " + " ".join(args))
            doc = json.loads(out[out.index("{"):])
            if "error" not in doc or time.time() > deadline:
                break
            time.sleep(0.2)
        assert "error" not in doc, doc.get("error")
        return doc
    finally:
        srv.kill()
        srv.wait()


RECEIVER = ("python3 -c 'import socket; s = socket.socket(socket.AF_INET, "
            "socket.SOCK_DGRAM); s.bind((\"\", {port})); print(\"ready\", flush=True); "
            "s.settimeout(10.0); n = 0\ntry:\n    while True:\n        s.recv(2048); n += 1; "
            "s.settimeout(3.0)\nexcept socket.timeout:\n    print(n)'")
SENDER = ("python3 -c 'import socket, time; s = socket.socket(socket.AF_INET, "
          "socket.SOCK_DGRAM)\nfor i in range({n}):\n    s.sendto(b\"x\" * 200, "
          "(\"{ip}\", {port}))\n    time.sleep(0.0005) if i % 10 == 0 else None'")


def udp_delivered(client, server, n: int, port: int = 9999) -> int:
    """Send ``n`` UDP datagrams (200 bytes, paced at ~20 000/s) from VM ``client`` to VM
    ``server``; returns how many arrived (the receiver waits 10 s for the first, then stops
    3 s after the last). No control connection crosses the path, so a lossy link only thins
    the datagrams (iperf3's TCP control channel can fail there)."""
    rx = server.popen(["sh", "-c", RECEIVER.format(port=port)], text=True)
    try:
        assert rx.stdout.readline().strip() == "ready"
        client.cmd(SENDER.format(n=n, ip=server.IP(), port=port))
        out, _ = rx.communicate(timeout=30)
        return int(out.split()[-1])
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()


def iperf3_together(pairs, *args, port=5301):
    """Run one iperf3 client per (client, server) VM pair at the same time, each to its own
    server port; returns their parsed JSON documents in ``pairs``' order."""
    servers = [srv.popen(["iperf3", "-s", "-1", "-p", str(port + i)])
               for i, (_, srv) in enumerate(pairs)]
    try:
        time.sleep(0.3)  # the servers listen
        clients = [cli.popen(["iperf3", "-c", srv.IP(), "-p", str(port + i), "-J", *args],
                             text=True) for i, (cli, srv) in enumerate(pairs)]
        docs = [json.loads(c.communicate(timeout=60)[0]) for c in clients]
        for doc in docs:
            assert "error" not in doc, doc.get("error")
        return docs
    finally:
        for srv in servers:
            srv.kill()
            srv.wait()
