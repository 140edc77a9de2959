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
