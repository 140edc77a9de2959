"""``nslab exec LAB VM -- CMD``: run a command inside a VM of a running lab, as the lab would
(its namespace, its physical host's cgroup, ``NSLAB_CLOCK``)."""
from __future__ import annotations

import json
import os

from pyroute2 import netns

from lab.capabilities import require_root
from lab.errors import LabError
from lab.names import state_dir


def add_parser(sub) -> None:
    p = sub.add_parser("exec", help="run a command in a VM of a running lab",
                       description="Run CMD in VM of the running lab LAB: in its network "
                                   "namespace and cgroup, with NSLAB_CLOCK set.")
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
    for procs in vm["cgroup_procs"]:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    netns.setns(vm["netns"])
    os.execvpe(args.cmd[0], args.cmd, {**os.environ, "NSLAB_CLOCK": vm["clock"]})
    return 127  # not reached
