"""The TUI drives a real small lab (root): start the scenario, take a link down from the keys,
see it in the fabric view, the kernel and the log, quit, and find nothing left."""
import asyncio
import subprocess
import time

import pytest

pytest.importorskip("textual")

from lab.lab import lab_netns  # noqa: E402
from tui.app import make_app  # noqa: E402
from tui.live import LiveBackend  # noqa: E402
from tui.widgets import EventLog, FabricView  # noqa: E402

pytestmark = pytest.mark.integration

SCENARIO = """
name: it_tui
seed: 3
duration_s: 30
topology: {spines: 2, leaves: 2, vms_per_leaf: 1, host_bw: 100, fabric_bw: 100}
placement: {vms_per_host: 1}
hosts: {cpu_cores: 0.5}
faults:
  - {at_s: 20, kind: cpu_hog, vm: vm1}
load:
  - {src: vm1, dst: vm2, at_s: 0.2, duration_s: 3}
"""


def netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                          check=True).stdout


def test_tui_takes_a_link_down_and_quits_clean(tmp_path):
    path = tmp_path / "it_tui.yaml"
    path.write_text(SCENARIO)
    backend = LiveBackend(str(path))
    app = make_app(backend, poll_s=0.5)

    async def drive():
        async with app.run_test(size=(100, 30)) as pilot:
            for _ in range(100):  # bring-up runs in a worker; the UI keeps answering
                await pilot.pause(0.1)
                if app.snap is not None and app.snap.links:
                    break
            assert app.snap.state == "running" and netns_list().count("nslab-it_tui-") == 6
            app.select_link("leaf1", "spine1")
            await pilot.press("d")
            for _ in range(50):
                await pilot.pause(0.1)
                lk = app.snap.link("leaf1", "spine1")
                if lk is not None and not lk.up:
                    break
            assert not app.snap.link("leaf1", "spine1").up
            fabric = app.query_one(FabricView)
            assert "DOWN" in fabric.render().plain and "X" in fabric.render().plain
            assert any("tui      link_down leaf1-spine1" in e
                       for e in app.query_one(EventLog).entries)
            assert any(e.kind == "link_down" and e.target == "leaf1-spine1"
                       and e.source == "tui" for e in backend.lab.timeline)  # in the truth
            intf = backend.lab.faults.ends("leaf1", "spine1")[0]
            assert "state DOWN" in intf.node.cmd(f"ip link show dev {intf.name}")
            await pilot.press("q")
            for _ in range(100):
                await pilot.pause(0.1)
                if backend.state == "stopped":
                    break
    asyncio.run(drive())
    assert backend.state == "stopped"
    assert lab_netns("it_tui") == []
    assert "nslab-it_tui-" not in netns_list()


JOBS_SCENARIO = """
name: it_tuijobs
seed: 5
duration_s: 2
topology: {spines: 1, leaves: 2, vms_per_leaf: 1, host_bw: 100, fabric_bw: 100}
placement: {vms_per_host: 1}
faults:
  - {at_s: 0.5, kind: loss, link: [vm1, leaf1], percent: 1}
jobs:
  - {name: ar, collective: all_reduce, ranks: 2, bytes: 100000, iterations: 3}
  - {name: train, collective: ddp, ranks: 2, iterations: 2}
"""


def test_tui_runs_ddp_and_allreduce_jobs_and_one_timeline(tmp_path):
    """The TUI runs what ``nslab run`` runs (the same Session): a DDP and an AllReduce job to
    completion; a fault from the TUI and one from the scenario land in one typed timeline."""
    pytest.importorskip("torch")
    from contracts.events import CpuHog, Event
    path = tmp_path / "it_tuijobs.yaml"
    path.write_text(JOBS_SCENARIO)
    backend = LiveBackend(str(path))
    try:
        backend.start()
        backend.inject(CpuHog(vm="vm2", enable=False))
        for _ in range(900):
            if backend.state == "done":
                break
            time.sleep(0.2)
        snap = backend.snapshot()
    finally:
        backend.stop()
    assert backend.state == "stopped"
    jobs = {j.name: j for j in snap.jobs}
    assert jobs["ar"].verified and jobs["ar"].completion_s > 0, jobs["ar"]
    assert jobs["train"].verified and jobs["train"].completion_s > 0, jobs["train"]
    timeline = backend.lab.timeline
    assert all(isinstance(e, Event) for e in timeline)
    sources = {(e.kind, e.source) for e in timeline}
    assert ("cpu_hog", "tui") in sources and ("loss", "timeline") in sources
    assert lab_netns("it_tuijobs") == []
