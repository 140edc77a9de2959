"""VMs: CPU of shared physical hosts, clocks as the hypervisor publishes them, pause, migration."""
import json
import os
import statistics
import sys
import time

from topo import LeafSpine

PLACEMENT = {"vm1": "phys1", "vm2": "phys1", "vm3": "phys2"}


def three_vms(nslab_lab, name, **kw):
    topo = LeafSpine(spines=1, leaves=1, vms_per_leaf=3, vms_per_host=2, placement="explicit",
                     explicit=PLACEMENT)
    return nslab_lab(topo, name=name, **kw)


LOOP = "python3 -c 'import time; w, c = time.perf_counter(), time.process_time(); " \
       "sum(range(8_000_000)); print((time.perf_counter() - w) / (time.process_time() - c))'"


def stretch(vm) -> float:
    """Wall time over CPU time of a busy loop in ``vm``: 1 / the CPU share it got (2 at half a
    core). A ratio, so a run that is slower per instruction (the machine's other load, cache,
    frequency) counts alike in both terms."""
    return float(vm.cmd(LOOP).strip().splitlines()[-1])


def test_noisy_neighbour_slows_a_vm_on_the_same_host_only(nslab_lab):
    lab = three_vms(nslab_lab, "it_cpu", cpu_cores=0.5)
    # three rounds of idle then busy, the median of each: a round lands on a random phase of
    # the CFS quota period (10 ms). Wall-clock times alone failed once in a fresh clone (the
    # other host 0.61 s busy vs 0.44 s idle): the CPU time of the same loop moves with them.
    # Seen with stretches: idle 1.8-2.1 on both hosts, busy 4.0-4.3 same host, 2.0 other.
    runs: dict[str, list[float]] = {"idle_same": [], "idle_other": [], "busy_same": [],
                                    "busy_other": []}
    for _ in range(3):
        runs["idle_same"].append(stretch(lab["vm2"]))
        runs["idle_other"].append(stretch(lab["vm3"]))
        lab.faults.cpu_hog("vm1")
        time.sleep(0.3)
        runs["busy_same"].append(stretch(lab["vm2"]))
        runs["busy_other"].append(stretch(lab["vm3"]))
        lab.faults.cpu_hog("vm1", enable=False)
    mid = {k: statistics.median(v) for k, v in runs.items()}
    assert mid["busy_same"] > 1.5 * mid["idle_same"], runs  # fair share: 2x
    assert mid["busy_other"] < 1.25 * mid["idle_other"], runs
    assert lab.cgroups.cpu_usage_ns("phys1", "vm1") > 0.1e9
    # a hog and a loop on half a core: the host ran out of quota in most of its periods and
    # its tasks waited for it (the kernel's cpu.stat, Cgroups.throttling)
    periods, throttled, waited_ns = lab.cgroups.throttling("phys1")
    assert periods >= throttled > 0.3 * periods, (periods, throttled)
    assert waited_ns > 0.1e9


READ = f"{sys.executable} {os.path.dirname(os.path.abspath(__file__))}/vmclock_probe.py read"


def read_clock(vm):
    """[true ns, the published formula at it, the VM's time.time_ns() (the preload), true ns
    after]: the true times are raw syscalls, which no preload sees."""
    a, v, b, formula = json.loads(vm.cmd(READ).strip().splitlines()[-1])
    return [a, formula, v, b]


def rate_ppm(vm, wait_s=1.0):
    t1, v1, *_ = read_clock(vm)
    time.sleep(wait_s)
    t2, v2, *_ = read_clock(vm)
    return ((v2 - v1) / (t2 - t1) - 1) * 1e6


def test_clock_reads_agree_with_the_published_truth(nslab_lab):
    lab = three_vms(nslab_lab, "it_clock")
    spec = lab.clocks.specs["vm1"]
    for _ in range(2):  # two processes of the same VM
        t, v, now, t_after = read_clock(lab["vm1"])
        assert abs((v - t) - spec.offset_at(t)) <= 1  # ns
        assert spec.to_vm_ns(t) <= now <= spec.to_vm_ns(t_after)
    assert abs(spec.offset_at(t)) > 0  # an offset was injected


def test_same_host_same_frequency_other_host_differs(nslab_lab):
    lab = three_vms(nslab_lab, "it_freq")
    y1, y2, y3 = (rate_ppm(lab[vm]) for vm in ("vm1", "vm2", "vm3"))
    truth = lab.clocks.truth()["oscillators"]
    assert abs(truth["phys1"]["base_ppm"] - truth["phys2"]["base_ppm"]) > 1
    assert abs(y1 - y2) < 0.01, (y1, y2)  # one oscillator (wander included)
    assert abs(y1 - y3) > 0.5, (y1, y3)
    assert abs(y1 - truth["phys1"]["base_ppm"]) < 0.25  # base drift + bounded wander


def test_clock_step_and_migration(nslab_lab):
    lab = three_vms(nslab_lab, "it_step")
    t, v, *_ = read_clock(lab["vm3"])
    before = v - t
    lab.faults.clock_step("vm3", 5.0)
    t, v, *_ = read_clock(lab["vm3"])
    assert abs((v - t) - before - 5e6) < 0.05e6  # 5 ms step (plus < 50 us of drift)
    lab.faults.migrate("vm3", "phys1")
    assert abs(rate_ppm(lab["vm3"]) - rate_ppm(lab["vm1"])) < 0.01
    shell_cgroups = open(f"/proc/{lab['vm3'].pid}/cgroup").read()
    assert "/nslab-it_step/phys1/vm3" in shell_cgroups
    assert [e.kind for e in lab.timeline] == ["clock_step", "migrate"]


def test_pause_freezes_processes_and_silences_the_vm(nslab_lab):
    lab = three_vms(nslab_lab, "it_pause")
    counter = lab["vm2"].popen(["sh", "-c", "i=0; while :; do i=$((i+1)); "
                                            "echo $i > /tmp/nslab_it_pause; "
                                            "sleep 0.05; done"])
    try:
        time.sleep(0.3)
        lab.faults.pause("vm2")
        frozen_at = open("/tmp/nslab_it_pause").read()
        assert "100% packet loss" in lab["vm1"].cmd("ping -c 2 -W 1 10.1.2.2")
        assert open("/tmp/nslab_it_pause").read() == frozen_at
        lab.faults.resume("vm2")
        lab["vm1"].cmd("ping -c 1 -W 3 10.1.2.2")  # the leaf's ARP entry expired meanwhile
        assert " 0% packet loss" in lab["vm1"].cmd("ping -c 2 -W 1 10.1.2.2")
        time.sleep(0.2)
        assert open("/tmp/nslab_it_pause").read() != frozen_at
    finally:
        counter.kill()
        counter.wait()
        os.remove("/tmp/nslab_it_pause")
