"""The HTML report of a real results document (``data/quickstart_report_results.json``, see
test_report.py) opened in a real headless browser, Debian's chromium (``make setup`` installs
it), with every host name unresolvable so nothing can come from the network: plotly's
JavaScript must run from the file and draw every plot into the page, with the document's
values; the screenshot is kept beside the page (``report.png``) for a person to look at.
"""
import json
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from report import page

DATA = Path(__file__).parent / "data" / "quickstart_report_results.json"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def browser() -> str:
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    pytest.fail("no headless browser found: `make setup` installs Debian's chromium "
                "(apt-get install chromium)")


def png_ink(path: Path) -> float:
    """Fraction of nonzero bytes in a PNG's filtered pixel rows: about 0 for a blank page
    (every row filtered to zeros), far more for a drawn one."""
    data, pos, idat = path.read_bytes(), 8, b""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        if data[pos + 4:pos + 8] == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(idat)
    return sum(1 for b in raw if b) / len(raw)


def test_report_draws_every_plot_in_a_headless_browser(tmp_path):
    doc = json.loads(DATA.read_text())
    html, png = tmp_path / "report.html", tmp_path / "report.png"
    page.write(doc, str(html))
    r = subprocess.run(
        [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--window-size=1280,4200", "--virtual-time-budget=5000", "--dump-dom",
         f"--screenshot={png}", html.as_uri()],
        capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    figures = dict(re.findall(r'<figure id="fig-([a-z_]+)">(.*?)</figure>', r.stdout, re.S))
    assert list(figures) == ["timeline", "clock_error", "owd", "iterations", "links", "cpu"]
    for key, body in figures.items():
        assert 'class="main-svg"' in body, f"plotly drew nothing in {key}"

    # one marker per event of the truth timeline
    assert figures["timeline"].count('class="point"') == len(doc["truth"]["faults"])
    # the OWD heatmap's cells read the document's p50s, row by row, in natural VM order
    vms = [f"vm{k}" for k in range(1, 9)]
    want = [f"{doc['owd_us']['pairs'][f'{a}->{b}']['p50_us']:.1f}"
            for a in vms for b in vms if a != b]
    assert re.findall(r'class="heatmap-label"><text[^>]*data-unformatted="([0-9.]+)"',
                      figures["owd"]) == want
    # the link utilization heatmap is drawn (an image) with a row label per direction
    links = doc["lab"]["fidelity"]["series"]["links"]
    assert 'class="hm"><image' in figures["links"]
    assert all(f">{k.replace('>', '&gt;')}</text>" in figures["links"] for k in links)
    # clock error: the worst-VM lines and each VM's pair in the legend
    legend = set(re.findall(r'class="legendtext"[^>]*>([^<]+)<', figures["clock_error"]))
    assert {"nslab, worst VM", "NTP-style, worst VM", "vm2 nslab", "vm8 NTP-style"} <= legend
    # each job's iterations: as many markers as iterations kept
    assert figures["iterations"].count('class="point"') == sum(
        2 * len(j["iteration_times_s"]) for j in doc["jobs"])

    assert png.stat().st_size > 50_000 and png_ink(png) > 0.01  # a page with one word: 0.0003
