"""``nslab exec LAB VM -- CMD``: run a command inside a VM of a running lab, as the lab would
(its namespace, its physical host's cgroup, the VM clock: ``vmclock`` preloaded on
``NSLAB_CLOCK``, the machine's capabilities dropped)."""
from __future__ import annotations

import json
import os
import shutil
import sys

from pyroute2 import netns

from lab import vmclock
from lab.capabilities import require_root
from lab.errors import LabError
from lab.names import state_dir


def add_parser(sub) -> None:
    p = sub.add_parser("exec", help="run a command in a VM of a running lab",
                       description="Run CMD in VM of the running lab LAB: in its network "
                                   "namespace and cgroup, on the VM clock (the vmclock "
                                   "preload and NSLAB_CLOCK), without the capabilities that "
                                   "reach the machine (CAP_SYS_TIME among them). A statically "
                                   "linked or Go program bypasses the preload and sees the "
                                   "machine's true time: a warning says so.")
    p.add_argument("lab")
    p.add_argument("vm")
    p.add_argument("cmd", nargs="+", help="the command (put it after --)")
    p.set_defaults(func=main)


def main(args) -> int:
    require_root()
    path = os.path.join(state_dir(args.lab), "vms.json")
    try:
        with open(path) as f:
            vms = json.load(f)
    except FileNotFoundError:
        raise LabError(f"no running lab {args.lab!r} (no {path})") from None
    if args.vm not in vms:
        raise LabError(f"lab {args.lab} has no VM {args.vm!r}; VMs: {', '.join(sorted(vms))}")
    vm = vms[args.vm]
    if vm.get("remote"):
        raise LabError(f"{args.vm} runs on server {vm['server']}: nslab exec reaches VMs on "
                       "this machine only")
    for procs in vm["cgroup_procs"]:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    env = vmclock.preload_env({**os.environ, "NSLAB_CLOCK": vm["clock"]})
    reason = vmclock.bypass_reason(shutil.which(args.cmd[0]) or args.cmd[0])
    if reason:
        print(f"nslab exec: {args.cmd[0]} is {reason}: it sees the machine's true time, "
              "not the VM clock", file=sys.stderr)
    netns.setns(vm["netns"])
    vmclock.drop_capabilities()
    os.execvpe(args.cmd[0], args.cmd, env)
    return 127  # not reached
