"""The built-in clock_daemons scenario, short and idle: chronyd, ntpsec's ntpd and ptp4l,
unmodified, in VMs on their VM clocks against one reference VM, beside the agents. chronyd
converges in seconds; ptp4l (software timestamps, UDPv4 unicast) locks
after its BMCA, unicast negotiation and the 16 s its software-timestamp servo waits before its
first frequency estimate (0.016 / pi_integral_scale 0.001: ptp4l(8), pi.c); ntpd disciplines
its VM clock through the kernel's adjtime/PLL calls and, without a drift file, stays in its
FREQ state for its stepout (300 s, ntp.conf(5) tinker), longer than this run."""
from session.scenario import load
from session.session import Session


def test_clock_daemons_discipline_their_vm_clocks():
    sc, topo = load("clock_daemons")
    sc = sc.model_copy(update={
        "duration_s": 50.0, "name": "clk_dmx", "load": [],
        "clock_daemons": sc.clock_daemons.model_copy(update={"warmup_s": 42.0})})
    doc = Session(sc, topo, "clock_daemons").run()
    rows = {r["daemon"]: r for r in doc["sync"]["clock_daemons"]["rows"]}
    print({d: (r["offset_error_us"], r["converged_s"], r["synced_log"]) for d, r in rows.items()})
    chrony, ptp, ntp = rows["chrony"], rows["ptp4l"], rows["ntpsec"]
    assert chrony["converged_s"] is not None and chrony["converged_s"] < 20, chrony
    assert chrony["offset_error_us"]["p99"] < 100 and "Selected source" in chrony["synced_log"]
    assert ptp["synced_log"] and "UNCALIBRATED to SLAVE" in ptp["synced_log"], ptp
    assert ptp["converged_s"] is not None and ptp["converged_s"] < 45, ptp
    segments = doc["truth"]["clocks"]["vms"]
    assert "vm_step" in [s["kind"] for s in segments["vm2"]], segments["vm2"]  # chronyd's step
    assert "vm_step" in [s["kind"] for s in segments["vm4"]], segments["vm4"]  # ptp4l's
    assert "vm_slew" in [s["kind"] for s in segments["vm3"]], segments["vm3"]  # ntpd's slew
    assert ntp["offset_error_us"]["n"] > 0
    assert doc["teardown"]["clean"]
