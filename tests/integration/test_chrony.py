"""The built-in chrony scenario: real chronyd in every VM on its VM clock; the clients
converge on the server's clock, their corrections are VM clock segments in the truth, and
sync.chrony is scored beside the agents' sync."""
from session.scenario import load
from session.session import Session


def test_chrony_clients_converge_on_the_vm_clocks():
    sc, topo = load("chrony")
    sc = sc.model_copy(update={"duration_s": 20.0, "name": "clk_chrony",
                               "chrony": sc.chrony.model_copy(update={"warmup_s": 12.0})})
    doc = Session(sc, topo, "chrony").run()
    chrony = doc["sync"]["chrony"]
    print("sync.chrony", chrony, "agents", doc["sync"]["offset_error_us"],
          "baseline_ntp", doc["sync"]["baseline_ntp"]["offset_error_us"])
    assert chrony["server"] == "vm1" and chrony["offset_error_us"]["n"] > 0
    # initial offsets up to 20 ms apart; after the warm-up every client is within 1 ms
    assert chrony["offset_error_us"]["max"] < 1000, chrony
    assert chrony["converged_s"] is not None
    segments = doc["truth"]["clocks"]["vms"]
    for vm in ("vm2", "vm3", "vm4"):  # chronyd disciplined each client's VM clock
        assert "vm_frequency" in [s["kind"] for s in segments[vm]], segments[vm]
    assert doc["teardown"]["clean"]
