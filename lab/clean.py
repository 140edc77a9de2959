"""Remove the leftovers of crashed labs, found by name prefix only.

For lab NAME: first its namespaces and their processes on each remote server it was split
across (``lab.servers``); then here, processes inside its namespaces (``nslab-NAME-*``) or its
cgroups (``nslab-NAME``) are killed by PID (they are the lab's by construction), then the
namespace names, the cgroups and the state directory are removed. Nothing is matched by
process name.
"""
from __future__ import annotations

import os
import shutil
import signal

from lab.cgroups import Cgroups
from lab.lab import lab_netns
from lab.names import PREFIX, STATE_ROOT, state_dir
from lab.netlink import remove_netns
from lab.servers import clean_remote


def labs_present() -> list[str]:
    """Names of labs with a namespace, a state directory or a cgroup on this machine."""
    names = set()
    try:
        names |= {n.split("-")[1] for n in os.listdir("/run/netns")
                  if n.startswith(PREFIX + "-") and n.count("-") >= 2}
    except FileNotFoundError:
        pass
    if os.path.isdir(STATE_ROOT):
        names |= set(os.listdir(STATE_ROOT))
    for root in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup"):
        if os.path.isdir(root):
            names |= {d[len(PREFIX) + 1:] for d in os.listdir(root)
                      if d.startswith(PREFIX + "-") and os.path.isdir(os.path.join(root, d))}
    names.discard("probe")
    return sorted(n for n in names if n)


def stale_probes() -> list[str]:
    """Capability-probe namespaces (``nslab-probe-<pid>``, ``lab.capabilities``) whose process
    is gone: a probe killed before it removed its namespace."""
    try:
        names = os.listdir("/run/netns")
    except FileNotFoundError:
        return []
    pid = f"{PREFIX}-probe-"
    return sorted(n for n in names if n.startswith(pid) and n[len(pid):].isdigit()
                  and not os.path.exists(f"/proc/{n[len(pid):]}"))


def _netns_inode(name: str) -> int:
    return os.stat(os.path.join("/run/netns", name)).st_ino


def pids_in_netns(inodes: set[int]) -> list[int]:
    """PIDs whose network namespace is one of ``inodes``."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}/ns/net").st_ino in inodes:
                    out.append(int(d))
            except OSError:
                continue
    return out


def clean(lab: str, dry_run: bool = False) -> list[str]:
    """Remove lab ``lab``'s leftovers, on its remote servers too; returns what was (or, dry,
    would be) removed.

    Raises:
        LabError: a remote server could not be reached or cleaned (nothing here is removed,
            so its record stays for the next try).
    """
    done = clean_remote(lab, dry_run)
    names = lab_netns(lab)
    inodes = {_netns_inode(n) for n in names}
    for pid in pids_in_netns(inodes) if inodes else []:
        if pid != os.getpid():
            done.append(f"process {pid}")
            if not dry_run:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    for n in names:
        done.append(f"netns {n}")
        if not dry_run:
            remove_netns(n)
    cg = Cgroups(lab)
    for path in cg.exists():
        done.append(f"cgroup {path}")
    if cg.exists() and not dry_run:
        cg.destroy()
    if os.path.isdir(state_dir(lab)):
        done.append(f"state {state_dir(lab)}")
        if not dry_run:
            shutil.rmtree(state_dir(lab))
    return done

