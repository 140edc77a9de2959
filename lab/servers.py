"""The servers of a split lab (``topo.split``), reached as Mininet Cluster Edition reaches them.

Mechanism (from ``mininet.examples.cluster.RemoteMixin``): one shared SSH control connection per
server (OpenSSH ``ControlMaster=auto``, ``ControlPersist``, a ``ControlPath`` per server under
the lab's state directory), ``BatchMode=yes`` (key authentication, never a password prompt),
root on the server; every command goes over that connection as an argument vector quoted for
the remote shell. The first server is the one nslab runs on: its commands run here, without
SSH. Unlike Mininet's ``RemoteMixin`` there is no shell per node on the server parsed through a
prompt and no ``sudo -E -u`` hop: nslab runs as root and starts one process per batch.

A remote server's commands (``run``) go to one long-lived ``python3`` there, started over the
control connection, that runs each command it is sent (JSON lines: argument vector, input,
timeout; answer: exit status, stdout, stderr): one SSH session per server instead of one per
command, whose start (sshd's session, the login shell's rc files) costs 0.1-0.5 s each.
Long-running processes (``popen``, a node's shell) get their own session.

Every namespace made on a server is recorded (``state_dir/servers.json``: the servers, the SSH
options and the namespaces per server), so teardown removes exactly those and ``nslab clean``
finds a crashed lab's servers; on each server the lab's namespaces are found by prefix
(``nslab-<lab>-``), the processes in them killed by PID (``ip netns pids``), then the
namespaces deleted (their tunnels go with them).
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict

from lab import tc
from lab.errors import LabError
from lab.names import netns_name, state_dir
from lab.netlink import entered
from lab.server_cgroups import RemoteCgroups
from topo.split import Server

CONTROL_PERSIST_S = 30
USER_HZ = 100
"""Clock ticks per second of /proc/PID/stat's times (proc(5); 100 on every Linux ABI)."""
# a remote server's command runner: one JSON request per line in, one answer per line out
_SERVE = """import base64, json, subprocess, sys
for line in sys.stdin:
    req = json.loads(line)
    try:
        r = subprocess.run(req["args"], input=base64.b64decode(req["input"]),
                           capture_output=True, timeout=req["timeout"])
        out = [r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")]
    except subprocess.TimeoutExpired:
        out = [None, "", "timed out"]
    except OSError as e:
        out = [127, "", str(e)]
    print(json.dumps(out), flush=True)
"""
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
        self._runner: subprocess.Popen | None = None
        self._lock = threading.Lock()

    @property
    def local(self) -> bool:
        """True for the server nslab runs on."""
        return not self.server.ssh

    def argv(self, args: Sequence[str], tty: bool = False) -> list[str]:
        """``args`` as run on this server (wrapped in ``ssh`` for a remote one; ``tty``: on a
        terminal there, ``ssh -tt``, as Mininet Cluster Edition runs a node's shell)."""
        if self.local:
            return list(args)
        return [*self.ssh, *(["-tt"] if tty else []), self.server.ssh, "--", shlex.join(args)]

    def run(self, args: Sequence[str], input: str | bytes | None = None,
            timeout: float = 30.0) -> str:
        """Run ``args`` on the server (here directly, on a remote server through its command
        runner); its stdout.

        Raises:
            LabError: it failed or timed out (server, command and stderr in the message).
        """
        data = input.encode() if isinstance(input, str) else input or b""
        if self.local:
            try:
                r = subprocess.run(list(args), input=data, capture_output=True, timeout=timeout)
                rc, out, err = r.returncode, r.stdout.decode(errors="replace"), \
                    r.stderr.decode(errors="replace")
            except subprocess.TimeoutExpired:
                rc, out, err = None, "", ""
        else:
            rc, out, err = self._remote(args, data, timeout)
        if rc is None:
            raise LabError(f"server {self.server.name}: {shlex.join(args)} timed out after "
                           f"{timeout:g} s; is it reachable (ssh {self.server.ssh})?")
        if rc != 0:
            raise LabError(f"server {self.server.name}: {shlex.join(args)} failed "
                           f"(exit {rc}): {err.strip()}")
        return out

    def _remote(self, args: Sequence[str], data: bytes, timeout: float
                ) -> tuple[int | None, str, str]:
        """One command through the server's runner (started at first use)."""
        req = json.dumps({"args": list(args), "input": base64.b64encode(data).decode(),
                          "timeout": timeout}) + "\n"
        with self._lock:
            if self._runner is None or self._runner.poll() is not None:
                self._runner = subprocess.Popen(self.argv(["python3", "-c", _SERVE]),
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE)
            runner = self._runner
            try:
                runner.stdin.write(req.encode())
                runner.stdin.flush()
                ready = select.select([runner.stdout], [], [], timeout + 15)[0]
                line = runner.stdout.readline() if ready else b""
            except OSError:
                line = b""
            if not line:  # no answer: ssh failed, or the server hangs
                runner.kill()
                _, err = runner.communicate()
                self._runner = None
                return (None if not ready else 255), "", err.decode(errors="replace")
        return tuple(json.loads(line))

    def popen(self, args: Sequence[str]) -> subprocess.Popen:
        """A long-running ``args`` on the server, stdin and stdout piped (text, line
        buffered); the caller ends it."""
        return subprocess.Popen(self.argv(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, bufsize=1)

    def batch(self, netns: str, tool: str, lines: Sequence[str]) -> None:
        """Run ``ip``, ``tc`` or ``nft`` lines (``lab.tc.batch_argv``) in namespace ``netns``
        on this server, in one process (none: nothing run).

        Raises:
            LabError: the tool failed (its message included).
        """
        if lines:
            self.run(tc.batch_argv(netns, tool), input="\n".join(lines) + "\n")

    def sysctl(self, netns: str, assignments: Sequence[str]) -> None:
        """Set sysctls (``key=value``) in namespace ``netns``: here by writing ``/proc/sys``
        from inside it, on a remote server with ``sysctl -w`` there.

        Raises:
            LabError: a key is unknown or the write failed.
        """
        if not self.local:
            self.run(["ip", "netns", "exec", netns, "sysctl", "-qw", *assignments])
            return
        with entered(netns):  # /proc/sys/net is the caller's namespace's
            for a in assignments:
                key, value = a.split("=", 1)
                try:
                    with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
                        f.write(value)
                except OSError as e:
                    raise LabError(f"{netns}: sysctl {a} failed: {e}") from e

    def remove_netns(self, names: Sequence[str]) -> None:
        """Kill the processes in namespaces ``names`` by PID and delete them (gone: fine)."""
        if names:
            self.run(["sh", "-c", _REMOVE, "sh", *names])

    def close(self) -> None:
        """End the command runner and the control connection (none open: nothing to
        do)."""
        with self._lock:
            if self._runner is not None:
                self._runner.stdin.close()
                self._runner.wait(timeout=10)
                self._runner = None
        if not self.local and os.path.exists(self.control):
            subprocess.run([*self.ssh, "-O", "exit", self.server.ssh], capture_output=True)


class RemoteProcess(subprocess.Popen):
    """A process started on a remote server through ``ssh`` (``ServerShell.argv``): it writes
    its PID to ``pidfile`` there, then execs, so ``send_signal`` (and ``terminate``,
    ``kill``) reach the process itself over the control connection, not only the local
    ``ssh``; ``wait`` and ``returncode`` are the remote process's (ssh passes its status).

    Args:
        shell: the server's ``ServerShell``.
        pidfile: where the process writes its PID on that server.
        args: the command there; ``kwargs``: ``subprocess.Popen``'s.
    """

    def __init__(self, shell: ServerShell, pidfile: str, args: Sequence[str], **kwargs):
        self.shell, self.pidfile = shell, pidfile
        wrapped = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', pidfile, *args]
        super().__init__(shell.argv(wrapped), **kwargs)

    def remote_pid(self, wait_s: float = 5.0) -> int | None:
        """The process's PID on its server (None: it has ended, or did not write it within
        ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        while self.poll() is None:
            try:
                return int(self.shell.run(["cat", self.pidfile], timeout=10))
            except (LabError, ValueError):  # not written yet
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
        return None

    def usage(self) -> tuple[float, float] | None:
        """``(cpu_s, rss_mb)`` of the process on its server: user + system CPU seconds and
        resident MiB from its ``/proc/PID/stat`` there (proc(5): clock ticks of
        ``USER_HZ``, 100 on Linux; pages of 4 KiB), or None once it has ended."""
        pid = self.remote_pid()
        try:
            fields = self.shell.run(["cat", f"/proc/{pid}/stat"]).rsplit(")", 1)[1].split()
        except (LabError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / USER_HZ, int(fields[21]) * 4096 / 2**20

    def send_signal(self, sig: int) -> None:
        """Signal the remote process (gone, or never started: nothing to do)."""
        pid = self.remote_pid()
        if pid is not None:
            with contextlib.suppress(LabError):  # it exited meanwhile
                self.shell.run(["kill", f"-{int(sig)}", str(pid)], timeout=10)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


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
            if not shell.local:
                shell.run(["mkdir", "-p", os.path.join(self.remote_dir(shell), "pids")])

    def remote_dir(self, shell: ServerShell) -> str:
        """The lab's directory on a remote server (VM clock files, PID files): under the
        lab's state directory, one per server, so that servers sharing a file system (the
        emulated ones) do not overwrite each other's files."""
        return os.path.join(self.dir, f"server-{shell.server.name}")

    def put(self, server: str, path: str, data: bytes) -> None:
        """Write ``data`` to file ``path`` on ``server`` (its directory made).

        Raises:
            LabError: the server refused.
        """
        self.shells[server].run(["sh", "-c", 'mkdir -p "$(dirname "$0")" && cat > "$0"', path],
                                input=data)

    def get(self, server: str, path: str) -> bytes:
        """The content of file ``path`` on ``server`` (base64 over its command runner).

        Raises:
            LabError: the server could not read it.
        """
        return base64.b64decode(self.shells[server].run(["base64", "-w0", path], timeout=120))

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

    def teardown(self) -> list[str]:
        """Remove the namespaces made on every server (processes first) and the lab's
        directory on the remote ones, close the control connections, then the record (and
        the state directory if nothing else is in it).

        Returns:
            What survived on the remote servers (``leftovers``, checked before the control
            connections close); normally [].

        Raises:
            LabError: a server could not be cleaned (the record stays for ``nslab clean``).
        """
        for name, shell in self.shells.items():
            shell.remove_netns(self.netns[name])
            self.netns[name] = []
            self._record()
            if not shell.local:
                shell.run(["rm", "-rf", self.remote_dir(shell)])
        left = self.leftovers()
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.dir, "servers.json"))
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)
        return left

    def leftovers(self) -> list[str]:
        """The lab's namespaces still on each remote server (``netns NAME on SERVER``); a
        server that does not answer is named as such."""
        prefix, out = netns_name(self.lab, ""), []
        for shell in self.shells.values():
            if shell.local:
                continue
            try:
                listed = shell.run(["ip", "netns", "list"]).splitlines()
            except LabError as e:
                out.append(str(e))
                continue
            out += [f"netns {line.split()[0]} on {shell.server.name}" for line in listed
                    if line.startswith(prefix)]
        return out

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
    namespaces found by prefix (processes by PID first), then its cgroups there
    (``lab.server_cgroups``); what was (dry: would be) removed.
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
            cgroups = RemoteCgroups(shell, lab)
            left = cgroups.exists()
            done += [f"cgroup {p} on {shell.server.name}" for p in left]
            if left and not dry_run:
                cgroups.destroy()
        except LabError as e:
            failed.append(str(e))
        shell.close()
    if failed:
        raise LabError("nslab clean: " + "; ".join(failed))
    return done
