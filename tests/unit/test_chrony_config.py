"""session.chrony: chronyd's configuration per VM and the scoring of achieved offsets against
known truth."""
from session.chrony import ChronySpec, config, score

S = 1_000_000_000


def test_server_and_client_configuration():
    server = config("/run/x/vm1", None, -2)
    assert "local stratum 1" in server and "allow all" in server and "server " not in server
    client = config("/run/x/vm2", "10.1.1.2", -2)
    assert "server 10.1.1.2 iburst minpoll -2 maxpoll -2" in client
    for conf in (server, client):  # everything of chronyd in the VM's state directory
        assert "cmdport 0" in conf and "pidfile /run/x/vm" in conf
        assert "bindcmdaddress /run/x/vm" in conf


def test_score_leaves_out_the_warmup_and_finds_convergence():
    spec = ChronySpec(enabled=True, warmup_s=2, converged_us=100)
    # vm2 converges from 5 ms to 50 us at 1.5 s; vm3 sits at -20 us throughout
    samples = [(int(k * 0.5 * S), {"vm2": (5e6 if k < 3 else 50e3, 3.0 if k < 3 else 0.1),
                                   "vm3": (-20e3, -0.2)}) for k in range(10)]
    out = score(samples, 0, spec, "vm1")
    assert out["offset_error_us"] == {"p50": 35.0, "p99": 50.0, "max": 50.0, "n": 12}
    assert out["drift_error_ppm"]["max"] == 0.2
    assert out["by_vm"]["vm2"]["p99"] == 50.0 and out["by_vm"]["vm3"]["p99"] == 20.0
    assert out["by_vm"]["vm2"]["n"] == out["by_vm"]["vm3"]["n"] == 6
    assert out["converged_s"] == 1.5 and out["server"] == "vm1"
    assert score(samples[:3], 0, spec, "vm1")["converged_s"] is None
