"""The TUI drives a real small lab (root): start the scenario, take a link down from the keys,
see it in the fabric view, the kernel and the log, quit, and find nothing left."""
import asyncio
import subprocess

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
            assert any(e["kind"] == "link_down" and e["target"] == "leaf1-spine1"
                       for e in backend.lab.timeline)  # stamped in the truth
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
