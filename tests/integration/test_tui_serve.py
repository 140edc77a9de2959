"""``nslab tui --serve`` in a real browser: Debian's Chromium, headless, driven over the
DevTools protocol, opens the served replay, the app starts in it (textual-serve's page marks
its first bytes and does not close), and a screenshot of the page shows it. No root needed:
a replay serves a class whose students have none."""
from __future__ import annotations

import asyncio
import base64
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

pytest.importorskip("textual_serve")
aiohttp = pytest.importorskip("aiohttp")

from tui.recorded import DEFAULT_RECORDING  # noqa: E402

pytestmark = pytest.mark.integration
CHROMIUM = shutil.which("chromium")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return urllib.request.urlopen(url, timeout=1).read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def browse(devtools: int, url: str, settle_s: float) -> tuple[list[str], bytes]:
    """Open ``url`` in the headless browser, wait ``settle_s``; (the page body's classes, a
    PNG screenshot)."""
    tabs = json.loads(wait_http(f"http://127.0.0.1:{devtools}/json"))
    ws_url = next(t for t in tabs if t["type"] == "page")["webSocketDebuggerUrl"]
    async with aiohttp.ClientSession() as s, s.ws_connect(ws_url, max_msg_size=0) as ws:
        ids = iter(range(1, 100))

        async def call(method: str, **params):
            n = next(ids)
            await ws.send_json({"id": n, "method": method, "params": params})
            async for msg in ws:
                doc = json.loads(msg.data)
                if doc.get("id") == n:
                    return doc["result"]
        await call("Page.navigate", url=url)
        await asyncio.sleep(settle_s)
        classes = await call("Runtime.evaluate", expression="document.body.className")
        shot = await call("Page.captureScreenshot", format="png")
    return classes["result"]["value"].split(), base64.b64decode(shot["data"])


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make setup installs it)")
def test_serve_runs_the_app_in_a_headless_browser(tmp_path):
    port, devtools = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "cli.main", "tui", "--replay",
                               str(DEFAULT_RECORDING), "--frame", "-1", "--serve", str(port),
                               "--host", "127.0.0.1"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    browser = None
    try:
        assert b"textual.js" in wait_http(f"http://127.0.0.1:{port}/")
        browser = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                                    f"--user-data-dir={tmp_path / 'chromium'}",
                                    f"--remote-debugging-port={devtools}",
                                    "--window-size=1280,800", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        classes, png = asyncio.run(browse(devtools, f"http://127.0.0.1:{port}/", 10.0))
        apps = [p for p in psutil.Process(server.pid).children(recursive=True)
                if "tui" in p.cmdline() and "--replay" in p.cmdline()]
        assert apps, "textual-serve started no app for the browser"
        assert "-first-byte" in classes and "-closed" not in classes, classes
        (tmp_path / "served.png").write_bytes(png)
        assert png.startswith(b"\x89PNG") and len(png) > 40_000  # the splash page is ~11 kB
    finally:
        if browser is not None:
            browser.terminate()
            browser.wait(10)
        kids = psutil.Process(server.pid).children(recursive=True)
        server.send_signal(signal.SIGINT)
        out = server.communicate(timeout=20)[0]
        alive = psutil.wait_procs(kids, timeout=10)[1]
        for p in alive:
            p.kill()
    assert "serving on http://127.0.0.1" in out
    assert not alive, "apps left running after the server stopped"
