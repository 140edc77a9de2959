"""Real traffic between VMs for the integration tests."""
import json
import time


def iperf3(client, server, *args, port=5201, timeout=30):
    """Run iperf3 from VM ``client`` to VM ``server``; returns the parsed JSON."""
    srv = server.popen(["iperf3", "-s", "-1", "-p", str(port)])
    try:
        deadline = time.time() + 5
        while True:
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
