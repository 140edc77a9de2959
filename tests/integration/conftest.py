"""Integration tests: real namespaces, real tc, real TCP. They need root; without it they are
skipped with that reason (unit tests still run)."""
import os

import pytest

from lab import Lab
from lab.lab import lab_netns
from lab.names import state_dir


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="integration tests need root (sudo make test)")
        for item in items:
            if "integration" in str(item.fspath):
                item.add_marker(skip)


def assert_gone(lab: Lab, shell_pids: list[int]) -> None:
    """Nothing of ``lab`` survives: namespaces, cgroups, state, processes."""
    assert lab.leftovers == []
    assert lab_netns(lab.name) == []
    assert not os.path.exists(state_dir(lab.name))
    assert not [p for p in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/freezer", "/sys/fs/cgroup")
                if os.path.isdir(os.path.join(p, f"nslab-{lab.name}"))]
    alive = [p for p in shell_pids if os.path.exists(f"/proc/{p}")
             and open(f"/proc/{p}/stat").read().split()[2] != "Z"]
    assert alive == []


@pytest.fixture
def make_lab():
    """``make_lab(topo, name, **kw)`` starts a Lab; after the test it is stopped and checked
    for leftovers."""
    labs = []

    def make(topo, name, **kw):
        lab = Lab(topo, name=name, **kw)
        labs.append(lab)
        lab.start()
        lab.shell_pids = [n.pid for n in lab.net.hosts + lab.net.switches]
        return lab

    yield make
    for lab in labs:
        lab.stop()
        assert_gone(lab, lab.shell_pids)

