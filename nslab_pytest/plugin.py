"""The pytest plugin of nslab (entry point ``pytest11``: ``nslab``; docs/pytest-plugin.md).

* ``nslab_lab(topo_or_scenario, **options)``: a factory fixture; each call builds and starts a
  lab (``lab.Lab``) from a Mininet ``Topo`` or a scenario (YAML file or built-in name) and
  returns it running; after the test every lab it built is torn down, also when the test
  failed or was interrupted (Ctrl-C), and the teardown is checked (``Lab.leftovers``: a
  leftover fails the test). Options: ``nslab_pytest.labrun.LabRun``.
* ``@pytest.mark.nslab(needs=[...])``: skip, with the reason, when not root or when this
  machine lacks a named capability (``nslab_pytest.needs``).
* A test that fails keeps each of its labs' directory (the processes' logs, the agents' logs,
  ``truth.json``, the pcaps; a scenario's ``results.json`` and ``report.html``) in
  ``--nslab-artifacts DIR`` (default ``nslab-artifacts`` in the rootdir) under the test's id;
  the failure report and the summary name it (and JUnit XML, as the property
  ``nslab_artifacts``).
* ``--nslab-pcap``: every lab captures its VMs unless the test passes ``pcap``.
* Lab names are unique per process and run (``nslab_pytest.names``), so pytest-xdist workers
  never clash.
"""
from __future__ import annotations

import os
import re
import shutil

import pytest

_CALL = pytest.StashKey()  # the test's call-phase report
_KEEP = pytest.StashKey()  # where a failing test's labs are kept


def pytest_addoption(parser) -> None:
    group = parser.getgroup("nslab")
    group.addoption("--nslab-artifacts", metavar="DIR", default=None,
                    help="where a failing test keeps its nslab labs' logs, truth and captures "
                         "(default: nslab-artifacts in the rootdir)")
    group.addoption("--nslab-pcap", action="store_true",
                    help="capture every VM of every lab whose test did not choose (the "
                         "fixture's pcap=True), kept when the test fails")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "nslab(needs=[...]): the test builds nslab labs; skip it with the reason "
                   "when not root or when this machine lacks a named capability (nslab doctor)")


def keep_dir(item) -> str:
    """Where ``item``'s labs are kept if it fails: ``<artifacts>/<test id, sanitized>``."""
    root = item.config.getoption("nslab_artifacts") or os.path.join(item.config.rootpath,
                                                                     "nslab-artifacts")
    return os.path.join(os.path.abspath(root),
                        re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid).strip("_")[-150:])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    marks = list(item.iter_markers("nslab"))
    if not marks:
        return
    needs = [n for m in marks for n in m.kwargs.get("needs", ())]
    from lab.capabilities import probe
    from nslab_pytest.needs import skip_reason
    reason = skip_reason(needs, os.geteuid() == 0, probe)
    if reason:
        pytest.skip(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.when == "call":
        item.stash[_CALL] = rep
        if rep.failed and _KEEP in item.stash:
            rep.sections.append(("nslab", "logs, truth and captures of the test's labs are "
                                          f"kept in {item.stash[_KEEP]}"))
            rep.user_properties.append(("nslab_artifacts", item.stash[_KEEP]))
    return rep


def pytest_terminal_summary(terminalreporter) -> None:
    kept = sorted({value for cat in ("failed", "error")
                   for rep in terminalreporter.stats.get(cat, [])
                   for key, value in getattr(rep, "user_properties", ())
                   if key == "nslab_artifacts"})
    if kept:
        terminalreporter.write_sep("-", "nslab: failing tests' labs kept")
        for path in kept:
            terminalreporter.write_line(path)


@pytest.fixture
def nslab_lab(request, tmp_path):
    """``nslab_lab(topo_or_scenario, **options) -> lab.Lab``, running; torn down after the
    test (see the module doc). Options: ``name``, ``pcap`` (True or VMs and links ``a-b``),
    ``pcap_filter``, ``agents`` (Topo labs), and ``Lab``'s (seed, clocks, cpu_cores,
    host_cpu, fabric) or ``Session``'s (run_jobs) arguments.

    Raises (from a call): NotRootError, CapabilityError, LabError, ScenarioError, TypeError.
    """
    from nslab_pytest.labrun import LabRun
    runs = []

    def make(source, **options):
        request.node.stash[_KEEP] = keep_dir(request.node)
        if request.config.getoption("nslab_pcap"):
            options.setdefault("pcap", True)
        run = LabRun(source, str(tmp_path / "nslab"), **options)
        lab = run.start()  # a failed start has torn down what it built
        runs.append(run)
        return lab

    yield make
    rep = request.node.stash.get(_CALL, None)
    keep = request.node.stash.get(_KEEP, None) if rep is None or rep.failed else None
    if keep:
        shutil.rmtree(keep, ignore_errors=True)
    leftovers = {}
    for run in reversed(runs):
        left = run.stop(os.path.join(keep, run.name) if keep else None)
        if left:
            leftovers[run.name] = left
    if leftovers:
        pytest.fail(f"nslab: teardown left {leftovers}", pytrace=False)
