"""The servers of a split lab (``topo.split``), reached as Mininet Cluster Edition reaches them.

Mechanism (from ``mininet.examples.cluster.RemoteMixin``): one shared SSH control connection per
server (OpenSSH ``ControlMaster=auto``, ``ControlPersist``, a ``ControlPath`` per server under
the lab's state directory), ``BatchMode=yes`` (key authentication, never a password prompt),
root on the server; every command goes over that connection as an argument vector quoted for
the remote shell. The first server is the one nslab runs on: its commands run here, without
SSH. Unlike Mininet's ``RemoteMixin`` there is no shell per node on the server parsed through a
prompt and no ``sudo -E -u`` hop: nslab runs as root and starts one process per batch.

Every namespace made on a server is recorded (``state_dir/servers.json``: the servers, the SSH
options and the namespaces per server), so teardown removes exactly those and ``nslab clean``
finds a crashed lab's servers; on each server the lab's namespaces are found by prefix
(``nslab-<lab>-``), the processes in them killed by PID (``ip netns pids``), then the
namespaces deleted (their tunnels go with them).
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import asdict

from lab.errors import LabError
from lab.names import netns_name, state_dir
from topo.split import Server

CONTROL_PERSIST_S = 30
# kill every process in each namespace named in "$@" (by PID), then delete the namespace
_REMOVE = ('for n in "$@"; do for p in $(ip netns pids "$n"); do kill -9 "$p"; done; '
           'ip netns del "$n"; done')


class ServerShell:
    """Runs commands on one server: here for the local one, over its SSH control connection
    for the others.

    Args:
        server: the server (``ssh`` "" for the local one).
        control_dir: where the control socket lives (the lab's state directory).
        ssh_options: extra ``ssh`` arguments (``-i KEY``, ``-o UserKnownHostsFile=...``).
    """

    def __init__(self, server: Server, control_dir: str, ssh_options: Sequence[str] = ()):
        self.server = server
        self.control = os.path.join(control_dir, f"ssh-{server.name}")
        self.ssh = ["ssh", "-q", "-o", "BatchMode=yes", "-o", "ControlMaster=auto",
                    "-o", f"ControlPersist={CONTROL_PERSIST_S}", "-o",
                    f"ControlPath={self.control}", *ssh_options]

    @property
    def local(self) -> bool:
        """True for the server nslab runs on."""
        return not self.server.ssh

    def argv(self, args: Sequence[str]) -> list[str]:
        """``args`` as run on this server (wrapped in ``ssh`` for a remote one)."""
        return list(args) if self.local else [*self.ssh, self.server.ssh, "--",
                                               shlex.join(args)]

    def run(self, args: Sequence[str], input: str | None = None, timeout: float = 30.0) -> str:
        """Run ``args`` on the server; its stdout.

        Raises:
            LabError: it failed or timed out (server, command and stderr in the message).
        """
        try:
            r = subprocess.run(self.argv(args), input=input, capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise LabError(f"server {self.server.name}: {shlex.join(args)} timed out after "
                           f"{timeout:g} s; is it reachable (ssh {self.server.ssh})?") from e
        if r.returncode != 0:
            raise LabError(f"server {self.server.name}: {shlex.join(args)} failed "
                           f"(exit {r.returncode}): {r.stderr.strip()}")
        return r.stdout

    def popen(self, args: Sequence[str]) -> subprocess.Popen:
        """A long-running ``args`` on the server, stdin and stdout piped (text, line
        buffered); the caller ends it."""
        return subprocess.Popen(self.argv(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, bufsize=1)

    def remove_netns(self, names: Sequence[str]) -> None:
        """Kill the processes in namespaces ``names`` by PID and delete them (gone: fine)."""
        if names:
            self.run(["sh", "-c", _REMOVE, "sh", *names])

    def close(self) -> None:
        """End the control connection (none open: nothing to do)."""
        if not self.local and os.path.exists(self.control):
            subprocess.run([*self.ssh, "-O", "exit", self.server.ssh], capture_output=True)


class Servers:
    """The servers of lab ``lab`` and the namespaces made on them; ``servers[name]`` is a
    ``ServerShell``.

    Args:
        lab: the lab's name (its prefix names every namespace).
        servers: ``topo.split.Server`` list, the first the local one.
        ssh_options: extra ``ssh`` arguments for every remote server.
    """

    def __init__(self, lab: str, servers: Sequence[Server], ssh_options: Sequence[str] = ()):
        self.lab = lab
        self.ssh_options = list(ssh_options)
        self.dir = state_dir(lab)
        self.shells = {s.name: ServerShell(s, self.dir, ssh_options) for s in servers}
        self.netns: dict[str, list[str]] = {s.name: [] for s in servers}

    def __getitem__(self, name: str) -> ServerShell:
        return self.shells[name]

    def check(self) -> None:
        """Reach every server once (Mininet Cluster Edition's pre-flight); this opens the
        control connections.

        Raises:
            LabError: a server that does not answer, with what ssh said.
        """
        os.makedirs(self.dir, exist_ok=True)
        self._record()
        for shell in self.shells.values():
            shell.run(["true"], timeout=15)

    def add_netns(self, server: str, node: str) -> str:
        """Make node ``node``'s namespace on ``server`` (recorded first); its name.

        Raises:
            LabError: ``ip netns add`` failed there (e.g. it exists: a lab left behind).
        """
        name = netns_name(self.lab, node)
        self.netns[server].append(name)
        self._record()
        self.shells[server].run(["ip", "netns", "add", name])
        return name

    def teardown(self) -> None:
        """Remove the namespaces made on every server (processes first), close the control
        connections, then the record (and the state directory if nothing else is in it).

        Raises:
            LabError: a server could not be cleaned (the record stays for ``nslab clean``).
        """
        for name, shell in self.shells.items():
            shell.remove_netns(self.netns[name])
            self.netns[name] = []
            self._record()
        self.close()
        os.remove(os.path.join(self.dir, "servers.json"))
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)

    def close(self) -> None:
        """Close every control connection."""
        for shell in self.shells.values():
            shell.close()

    def _record(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        doc = {"servers": [asdict(s.server) for s in self.shells.values()],
               "ssh_options": self.ssh_options, "netns": self.netns}
        with open(os.path.join(self.dir, "servers.json"), "w") as f:
            json.dump(doc, f)


def clean_remote(lab: str, dry_run: bool = False) -> list[str]:
    """On each remote server recorded for ``lab`` (its ``servers.json``), remove the lab's
    namespaces found by prefix (processes by PID first); what was (dry: would be) removed.
    Nothing recorded: nothing to do.

    Raises:
        LabError: a server could not be reached or cleaned (the others are cleaned first).
    """
    path = os.path.join(state_dir(lab), "servers.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        doc = json.load(f)
    servers = Servers(lab, [Server(**s) for s in doc["servers"]], doc["ssh_options"])
    prefix = netns_name(lab, "")
    done, failed = [], []
    for shell in servers.shells.values():
        if shell.local:
            continue
        try:
            names = [line.split()[0] for line in shell.run(["ip", "netns", "list"]).splitlines()
                     if line.startswith(prefix)]
            done += [f"netns {n} on {shell.server.name}" for n in names]
            if not dry_run:
                shell.remove_netns(names)
        except LabError as e:
            failed.append(str(e))
        shell.close()
    if failed:
        raise LabError("nslab clean: " + "; ".join(failed))
    return done
