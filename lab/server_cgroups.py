"""The physical hosts' cgroups of a lab split across servers (``topo.split``): each host's on
the server that runs its VMs.

A remote server's cgroups are ``lab.cgroups.Cgroups`` run there: ``python -m
lab.server_cgroups LAB TOP CALLS`` (nslab's interpreter, at the same path on every server)
through the server's ``ServerShell``, several calls in one process. Their top cgroup is
``nslab-<lab>-<server>``: the lab's prefix and the server's name, so servers that share one
kernel (the emulated ones) never share a cgroup. ``ServerCgroups`` has ``Cgroups``'s methods
and sends each to the cgroups of the host it names.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from lab.cgroups import Cgroups
from lab.errors import LabError
from lab.names import lab_prefix

if TYPE_CHECKING:  # pragma: no cover
    from lab.servers import ServerShell

CALLS = ("create_host", "reserve", "create_vm", "join_paths", "attach", "pids",
         "cpu_usage_ns", "throttling", "freeze", "move_vm", "kill_all", "destroy", "exists")
"""The ``Cgroups`` methods a remote server runs."""


class RemoteCgroups:
    """``Cgroups`` of lab ``lab`` on the server of ``shell``: each method runs there
    (``join_paths``, asked at every process start in a VM, once per VM).

    Raises (from a call):
        LabError: the server refused (its message, e.g. a missing cpu controller).
    """

    def __init__(self, shell: ServerShell, lab: str):
        self.shell, self.lab = shell, lab
        self.top = f"{lab_prefix(lab)}-{shell.server.name}"
        self._joins: dict[tuple[str, str], list[str]] = {}

    def call(self, calls: Sequence[tuple[str, Sequence]]) -> list:
        """Run ``(method, args)`` calls in order in one process there; their results."""
        out = self.shell.run([sys.executable, "-m", "lab.server_cgroups", self.lab, self.top,
                              json.dumps([[m, list(a)] for m, a in calls])], timeout=60)
        return json.loads(out)

    def join_paths(self, phys: str, vm: str) -> list[str]:
        key = (phys, vm)
        if key not in self._joins:
            self._joins[key] = self.call([("join_paths", key)])[0]
        return self._joins[key]

    def __getattr__(self, name: str):
        if name not in CALLS:
            raise AttributeError(name)
        return lambda *args: self.call([(name, args)])[0]


class ServerCgroups:
    """``Cgroups``'s interface over the servers of a split lab: a method naming a physical
    host goes to the cgroups of that host's server (``host_server``: host -> server name;
    ``remote``: server name -> ``RemoteCgroups``; any other server: ``local``); ``reserve``,
    ``kill_all`` and ``destroy`` go to every server. ``exists`` lists what survived here and
    what ``destroy`` found surviving on each remote server.
    """

    def __init__(self, local: Cgroups, remote: Mapping[str, RemoteCgroups],
                 host_server: Mapping[str, str]):
        self.local, self.remote, self.host_server = local, dict(remote), dict(host_server)
        self.mode = local.mode
        self._left: list[str] = []

    def _of(self, phys: str):
        return self.remote.get(self.host_server.get(phys, ""), self.local)

    def build(self, hosts: Mapping[str, tuple[float | None, str | None]],
              vms: Mapping[str, str], reserve: bool) -> None:
        """Create every host's cgroup with its budget (``hosts``: host -> ``(cpu_cores,
        cpuset)``), ``reserve`` each server's lab cgroup (``Cgroups.reserve``), then every
        VM's (``vms``: VM -> host): one process per remote server.

        Raises:
            LabError, CapabilityError: a server refused (e.g. no cpu controller there).
        """
        calls: dict[int, tuple[object, list]] = {}

        def add(cg, method: str, *args) -> None:
            calls.setdefault(id(cg), (cg, []))[1].append((method, args))
        for phys, (cores, cpuset) in hosts.items():
            add(self._of(phys), "create_host", phys, cores, cpuset)
        if reserve:
            for cg in {id(self._of(h)): self._of(h) for h in hosts}.values():
                add(cg, "reserve")
        for vm, phys in vms.items():
            add(self._of(phys), "create_vm", phys, vm)
        for cg, todo in calls.values():
            if cg is self.local:
                for method, args in todo:
                    getattr(cg, method)(*args)
            else:
                cg.call(todo)

    def create_host(self, phys: str, cpu_cores: float | None = None,
                    cpuset: str | None = None) -> None:
        self._of(phys).create_host(phys, cpu_cores, cpuset)

    def create_vm(self, phys: str, vm: str) -> None:
        self._of(phys).create_vm(phys, vm)

    def join_paths(self, phys: str, vm: str) -> list[str]:
        return self._of(phys).join_paths(phys, vm)

    def attach(self, phys: str, vm: str, pid: int) -> None:
        self._of(phys).attach(phys, vm, pid)

    def pids(self, phys: str, vm: str) -> list[int]:
        return self._of(phys).pids(phys, vm)

    def cpu_usage_ns(self, phys: str, vm: str | None = None) -> int:
        return self._of(phys).cpu_usage_ns(phys, vm)

    def throttling(self, phys: str) -> tuple[int, int, int]:
        return tuple(self._of(phys).throttling(phys))

    def freeze(self, phys: str, vm: str, frozen: bool) -> None:
        self._of(phys).freeze(phys, vm, frozen)

    def move_vm(self, vm: str, old_phys: str, new_phys: str) -> None:
        """Raises: LabError: the two hosts are on different servers (a VM cannot migrate
        between servers: its namespace stays on its own)."""
        if self._of(old_phys) is not self._of(new_phys):
            raise LabError(f"{vm} cannot migrate from {old_phys} to {new_phys}: they are on "
                           "different servers")
        self._of(old_phys).move_vm(vm, old_phys, new_phys)

    def reserve(self) -> None:
        for cg in (self.local, *self.remote.values()):
            cg.reserve()

    def kill_all(self) -> None:
        for cg in (*self.remote.values(), self.local):
            cg.kill_all()

    def destroy(self) -> None:
        """Every server's, the remote ones first (what survives there is kept for
        ``exists``); a server that fails does not stop the others.

        Raises:
            LabError: a server failed (after the others were destroyed).
        """
        failed = []
        for name, cg in self.remote.items():
            try:
                cg.destroy()
                self._left += [f"{p} on {name}" for p in cg.exists()]
            except LabError as e:
                failed.append(str(e))
                self._left.append(f"cgroups on {name}")
        self.local.destroy()
        if failed:
            raise LabError("; ".join(failed))

    def exists(self) -> list[str]:
        return self.local.exists() + self._left


def main(argv: Sequence[str]) -> None:
    """``python -m lab.server_cgroups LAB TOP CALLS``: run ``CALLS`` (JSON ``[[method,
    args], ...]``, methods of ``CALLS``) on ``Cgroups(LAB, top=TOP)`` here; their results
    as a JSON list on stdout.

    Raises:
        LabError: a method not in ``CALLS``.
    """
    lab, top, calls = argv[0], argv[1], json.loads(argv[2])
    cg = Cgroups(lab, top=top)
    out = []
    for method, args in calls:
        if method not in CALLS:
            raise LabError(f"cgroups: no method {method!r}")
        out.append(getattr(cg, method)(*args))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
