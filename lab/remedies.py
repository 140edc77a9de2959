"""What brings a missing piece of the machine: the command or package for each capability that
``nslab doctor`` finds missing.

Kernel features come as modules: ``modprobe`` loads one that is installed; a module that is not
installed comes with the kernel's extra modules (Ubuntu: ``linux-modules-extra-<release>``;
Debian's kernel packages build them all as modules); a kernel without a modules directory
(``/lib/modules/<release>``, as in many microVMs and containers) loads none and needs a kernel
built with the option. Tools come from Debian packages (``apt-get install``).
"""
from __future__ import annotations

import os
from pathlib import Path

MODULES = Path("/lib/modules")


def kernel_module(module: str, config: str, modules: Path = MODULES) -> str:
    """How to get kernel module ``module`` (Kconfig option ``config``) on this kernel.

    Returns:
        ``modprobe MODULE`` and the package that has the module, led by what this machine
        shows: the module installed, not installed, or no modules directory at all.
    """
    release = os.uname().release
    here = modules / release
    extra = ("apt-get install linux-modules-extra-$(uname -r) (Ubuntu's extra modules); "
             "Debian's kernel (linux-image-$(dpkg --print-architecture)) has it as a module")
    if not here.is_dir():
        return (f"this kernel ({release}) has no {here} and loads no modules: boot a kernel "
                f"built with {config}=y or =m. On a distribution kernel: modprobe {module}, "
                f"and if there is no such module: {extra}")
    if _installed(here, module):
        return f"modprobe {module} (it is installed in {here})"
    return f"modprobe {module} after installing it: {extra}"


def _installed(here: Path, module: str) -> bool:
    names = {module, module.replace("_", "-")}
    for index in ("modules.dep", "modules.builtin"):
        try:
            lines = (here / index).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            base = os.path.basename(line.split(":", 1)[0])
            if base.split(".ko", 1)[0] in names:
                return True
    return False


def package(pkg: str, options: str = "") -> str:
    """``apt-get install [OPTIONS] PKG`` (Debian, Ubuntu)."""
    return f"apt-get install {options + ' ' if options else ''}{pkg}"


def cgroup_controller(controller: str, mode: str | None) -> str:
    """How to make cgroup ``controller`` available under hierarchy ``mode`` (``"v1"``,
    ``"v2"`` or None: no hierarchy with the cpu controller)."""
    if mode == "v2":
        return (f"echo +{controller} > /sys/fs/cgroup/cgroup.subtree_control (cgroup v2: "
                "enable the controller for the children of the root)")
    v2 = "mount -t cgroup2 none /sys/fs/cgroup"
    v1 = f"mount -t cgroup -o {controller} none /sys/fs/cgroup/{controller}"
    if mode is None:
        return f"mount a cgroup hierarchy: cgroup v2 `{v2}`, or cgroup v1 `{v1}`"
    return f"mount the v1 controller: mkdir -p /sys/fs/cgroup/{controller} && {v1}"
