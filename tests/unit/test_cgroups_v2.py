"""The cgroup v2 path of ``lab.cgroups`` (this machine has v1 only): the files it writes in a
cgroup2 tree, on a directory whose new cgroups get the interface files the kernel creates
(cgroup.controllers, cgroup.subtree_control, cgroup.procs, cpu.max, cpu.stat,
cgroup.freeze)."""
import os

import pytest

from lab import cgroups
from lab.cgroups import Cgroups
from lab.errors import CapabilityError

KERNEL_FILES = {"cgroup.subtree_control": "", "cgroup.procs": "", "cpu.max": "max 100000",
                "cpu.weight": "100", "cgroup.freeze": "0",
                "cpu.stat": "usage_usec 1500\nnr_periods 40\nnr_throttled 7\n"
                            "throttled_usec 2500\n"}


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A cgroup2 mount whose cpu and cpuset controllers reach the lab's cgroups (as
    systemd's delegation gives them), with the kernel's files in every new cgroup."""
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kw):
        real_mkdir(path, *args, **kw)
        if str(path).startswith(str(tmp_path)):
            parent = os.path.dirname(path)
            with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                enabled = f.read().replace("+", "")
            (tmp_path / path / "cgroup.controllers").write_text(enabled)
            for name, text in KERNEL_FILES.items():
                (tmp_path / path / name).write_text(text)
    (tmp_path / "cgroup.subtree_control").write_text("+cpu +cpuset +memory")
    monkeypatch.setattr(cgroups.os, "mkdir", mkdir)
    return tmp_path


def read(tree, *parts):
    return (tree.joinpath(*parts)).read_text()


def test_host_budget_cpuset_and_reserve_are_v2_files(tree):
    cg = Cgroups("t", mode="v2", root=str(tree))
    cg.create_host("phys1", cpu_cores=0.25, cpuset="0")
    cg.create_host("phys2", cpu_cores=0.05)
    cg.reserve()
    cg.create_vm("phys1", "vm1")
    assert read(tree, "nslab-t", "cgroup.subtree_control") == "+cpu +cpuset"
    assert read(tree, "nslab-t", "phys1", "cgroup.subtree_control") == "+cpu +cpuset"
    assert read(tree, "nslab-t", "phys1", "cpu.max") == "2500 10000"  # quota period, us
    assert read(tree, "nslab-t", "phys2", "cpu.max") == "1000 20000"
    assert read(tree, "nslab-t", "phys1", "cpuset.cpus") == "0"
    assert read(tree, "nslab-t", "cpu.weight") == "10000"  # 100 default processes
    assert read(tree, "nslab-t", "phys1", "vm1", "cgroup.subtree_control") == ""
    assert cg.join_paths("phys1", "vm1") == [str(tree / "nslab-t/phys1/vm1/cgroup.procs")]


def test_freeze_usage_and_throttling_read_and_write_v2_files(tree):
    cg = Cgroups("t", mode="v2", root=str(tree))
    cg.create_host("phys1", cpu_cores=1.0)
    cg.create_vm("phys1", "vm1")
    cg.freeze("phys1", "vm1", True)
    assert read(tree, "nslab-t", "phys1", "vm1", "cgroup.freeze") == "1"
    cg.freeze("phys1", "vm1", False)
    assert read(tree, "nslab-t", "phys1", "vm1", "cgroup.freeze") == "0"
    assert cg.cpu_usage_ns("phys1", "vm1") == 1_500_000
    assert cg.throttling("phys1") == (40, 7, 2_500_000)
    assert cg.exists() == [str(tree / "nslab-t")]


def test_v2_without_a_delegated_cpu_controller_is_a_clear_error(tree):
    (tree / "cgroup.subtree_control").write_text("+memory")
    with pytest.raises(CapabilityError, match="'cpu' is not enabled"):
        Cgroups("t", mode="v2", root=str(tree)).create_host("phys1", cpu_cores=1.0)
