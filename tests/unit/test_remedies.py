"""What brings a missing piece (lab.remedies): the advice follows what the machine shows."""
import os

from lab import remedies

RELEASE = os.uname().release


def test_kernel_without_modules_directory_needs_another_kernel(tmp_path):
    fix = remedies.kernel_module("sch_netem", "CONFIG_NET_SCH_NETEM", modules=tmp_path)
    assert fix.startswith(f"this kernel ({RELEASE}) has no {tmp_path / RELEASE} and loads no "
                          "modules: boot a kernel built with CONFIG_NET_SCH_NETEM=y or =m")
    assert "modprobe sch_netem" in fix and "linux-modules-extra-$(uname -r)" in fix


def test_installed_module_is_loaded_with_modprobe(tmp_path):
    (tmp_path / RELEASE).mkdir()
    (tmp_path / RELEASE / "modules.dep").write_text(
        "kernel/net/sched/sch_htb.ko.zst:\nkernel/net/sched/sch_netem.ko.zst:\n")
    fix = remedies.kernel_module("sch_netem", "CONFIG_NET_SCH_NETEM", modules=tmp_path)
    assert fix == f"modprobe sch_netem (it is installed in {tmp_path / RELEASE})"


def test_module_not_installed_comes_with_the_extra_modules(tmp_path):
    (tmp_path / RELEASE).mkdir()
    (tmp_path / RELEASE / "modules.dep").write_text("kernel/net/sched/sch_htb.ko.zst:\n")
    (tmp_path / RELEASE / "modules.builtin").write_text("kernel/net/sched/sch_fq_codel.ko\n")
    fix = remedies.kernel_module("sch_red", "CONFIG_NET_SCH_RED", modules=tmp_path)
    assert fix.startswith("modprobe sch_red after installing it: apt-get install "
                          "linux-modules-extra-$(uname -r)")
    builtin = remedies.kernel_module("sch_fq_codel", "CONFIG_NET_SCH_FQ_CODEL",
                                     modules=tmp_path)
    assert builtin.startswith("modprobe sch_fq_codel (it is installed")


def test_cgroup_advice_follows_the_hierarchy():
    assert remedies.cgroup_controller("cpuset", "v2").startswith(
        "echo +cpuset > /sys/fs/cgroup/cgroup.subtree_control")
    v1 = remedies.cgroup_controller("freezer", "v1")
    assert "mount -t cgroup -o freezer none /sys/fs/cgroup/freezer" in v1
    none = remedies.cgroup_controller("cpu", None)
    assert "mount -t cgroup2 none /sys/fs/cgroup" in none and "-o cpu " in none

