"""The plugin's pure parts: lab names, the marker's reasons, its entry point."""
import re
from importlib import import_module
from pathlib import Path

import pytest

from lab.capabilities import Capability
from nslab_pytest.names import base36, lab_name, next_lab_name
from nslab_pytest.needs import ROOT_REASON, skip_reason


def test_base36_reads_back_with_int():
    assert [base36(n) for n in (0, 35, 36)] == ["0", "z", "10"]
    assert all(int(base36(n), 36) == n for n in (1, 4194304, 36**7 - 1, 123456789))


def test_lab_names_are_valid_short_and_distinct():
    # the largest Linux PID and a large serial still fit the 16 characters of a lab name
    assert lab_name(36**7 - 1, 4194304, "zz") == "t2hwcgzz_zzzzzzz"
    with pytest.raises(ValueError, match="1-16 characters"):
        lab_name(36**7, 4194304, "zz")
    assert lab_name(1, 100, "ab") != lab_name(1, 101, "ab")  # two xdist workers
    names = [next_lab_name() for _ in range(3)]
    assert len(set(names)) == 3
    prefixes = {n.split("_")[0] for n in names}  # one process: one prefix, serials differ
    assert len(prefixes) == 1 and re.fullmatch(r"t[0-9a-z]{3,7}", prefixes.pop())


CAPS = {"netem": Capability("netem", False, "'tc qdisc add ... netem' fails: no such file",
                            "link delay, jitter and reorder", "modprobe sch_netem"),
        "tcpdump": Capability("tcpdump", True, "/usr/bin/tcpdump", "packet captures")}


def test_marker_skips_without_root_before_probing():
    def never():
        raise AssertionError("probed without root")
    assert skip_reason(["netem"], root=False, probe=never) == ROOT_REASON


def test_marker_names_the_missing_capability_and_what_it_disables():
    assert skip_reason(["tcpdump"], root=True, probe=lambda: CAPS) is None
    assert skip_reason([], root=True, probe=lambda: CAPS) is None
    assert skip_reason(["tcpdump", "netem"], root=True, probe=lambda: CAPS) == (
        "nslab: this machine lacks netem ('tc qdisc add ... netem' fails: no such file), "
        "needed for link delay, jitter and reorder; fix: modprobe sch_netem")
    with pytest.raises(ValueError, match=r"unknown capabilities \['netme'\]; known: netem, "):
        skip_reason(["netme"], root=True, probe=lambda: CAPS)


def test_entry_point_names_the_plugin_module():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    target = re.search(r'\[project\.entry-points\.pytest11\]\nnslab = "([\w.]+)"',
                       pyproject).group(1)
    plugin = import_module(target)
    assert callable(plugin.nslab_lab) and callable(plugin.pytest_runtest_makereport)
