"""Packet captures of a running lab: tcpdump on chosen VMs or links, one pcap per interface.

A target is a VM's name (every interface of the VM: ``vm1`` -> ``vm1.pcap``) or a link
``a-b`` (the interface of node ``a`` facing ``b``, both directions: ``leaf1-spine1.pcap``).
tcpdump runs in the node's namespace as the lab, outside the VM's cgroup and clock (a tap of
the hypervisor, ``lab.nodes.LabNode.tap_popen``): packet times are the CLOCK_REALTIME of the
node's server, not the VM's clock. On a remote server of a split lab tcpdump runs there
(over its SSH control connection, ``lab.servers``) and writes into the lab's directory
there; ``stop`` brings each pcap back into ``directory`` here. Probes of
the agents dissect with ``agents.probe.NslabProbe`` (scapy) and in Wireshark with
``tools/wireshark/nslab_probe.lua``.

    cap = Capture(lab, "/tmp/pcaps", ["vm1", "leaf1-spine1"], bpf="udp port 7701")
    cap.start()
    ...
    cap.stop()       # {"vm1": "/tmp/pcaps/vm1.pcap", ...}; cap.packets: captured per file

Source: tcpdump(8), pcap-filter(7).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from typing import TYPE_CHECKING

from lab.errors import CapabilityError, LabError
from lab.wait import wait_until

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab

READY_S = 5.0
"""How long ``start`` waits for every tcpdump to say it is listening, s."""
STOP_S = 3.0
"""How long ``stop`` waits for a tcpdump to flush and exit after SIGTERM, s."""


def interfaces(lab: Lab, target: str) -> list[tuple[object, str, str]]:
    """``(node, interface, pcap file name)`` of every interface ``target`` names (a cut
    link's end: its tunnel's device, ``lab.tunnel.TunnelEnd``).

    Raises:
        LabError: no VM and no link of that name (the message lists the VMs).
    """
    net = lab.net
    node = net.nameToNode.get(target)
    if node is not None and node in net.hosts:
        intfs = [i for i in node.intfList() if i.name != "lo"]
        return [(node, i.name, f"{target}.pcap" if len(intfs) == 1
                 else f"{target}-{i.name}.pcap") for i in intfs]
    a, _, b = target.partition("-")
    if a in net.nameToNode and b in net.nameToNode:
        for intf in lab.faults.ends(a, b):
            if intf.node.name == a:
                return [(intf.node, intf.name, f"{target}.pcap")]
    raise LabError(f"capture target {target!r}: not a VM nor a link 'a-b' of lab {lab.name} "
                   f"(VMs: {', '.join(h.name for h in net.hosts)})")


class Capture:
    """tcpdump on chosen VMs' and links' interfaces of a running lab (see the module doc).

    Args:
        lab: a started ``Lab``.
        directory: where the pcap files (and one ``.log`` per tcpdump) go; created.
        targets: VM names and links ``a-b``; None: every VM.
        bpf: a capture filter (pcap-filter(7)), e.g. ``"udp port 7701"``; None: everything.
        snaplen: bytes kept per packet (0: tcpdump's default, whole packets).
    """

    def __init__(self, lab: Lab, directory: str, targets: list[str] | None = None,
                 bpf: str | None = None, snaplen: int = 0):
        self.lab, self.dir, self.bpf, self.snaplen = lab, directory, bpf, snaplen
        self.targets = list(targets) if targets is not None else None
        self.files: dict[str, str] = {}
        """pcap file name (without the directory) -> path, once started."""
        self.packets: dict[str, int | None] = {}
        """pcap path -> packets tcpdump captured (after ``stop``; None if it did not say)."""
        self._procs: dict[str, subprocess.Popen] = {}
        self._remote: dict[str, tuple[str, str]] = {}
        """pcap path here -> (server, its path there) of a capture on a remote server."""

    def start(self) -> dict[str, str]:
        """Start one tcpdump per interface and wait until each listens; the pcap paths by
        file name.

        Raises:
            CapabilityError: tcpdump is not installed.
            LabError: an unknown target, or a tcpdump that failed (its message quoted); the
                captures already started are stopped.
        """
        if shutil.which("tcpdump") is None:
            raise CapabilityError("tcpdump is missing: apt-get install tcpdump (make setup does)")
        targets = self.targets if self.targets is not None else [v.name for v in self.lab.vms]
        plan = [i for t in targets for i in interfaces(self.lab, t)]
        os.makedirs(self.dir, exist_ok=True)
        try:
            for node, intf, fname in plan:
                self._spawn(node, intf, os.path.join(self.dir, fname))
                self.files[fname] = os.path.join(self.dir, fname)
            self._wait_ready()
        except BaseException:
            with contextlib.suppress(LabError):  # a pcap never written there: the cause is above
                self.stop()
            raise
        return dict(self.files)

    def _spawn(self, node, intf: str, path: str) -> None:
        written = path
        if node.remote:  # written on its server, brought back by stop
            servers = self.lab.servers
            written = os.path.join(servers.remote_dir(node.on), "capture",
                                   os.path.basename(path))
            node.on.run(["mkdir", "-p", os.path.dirname(written)])
            self._remote[path] = (node.on.server.name, written)
        # -U --immediate-mode: every packet reaches the file at once (a SIGTERM loses none);
        # -Z root: keep root, or Debian's tcpdump writes as user tcpdump and may not own DIR
        cmd = ["tcpdump", "-i", intf, "-n", "-U", "--immediate-mode", "-Z", "root",
               "-s", str(self.snaplen), "-w", written]
        if self.bpf:
            cmd.append(self.bpf)
        with open(path[:-len(".pcap")] + ".log", "w") as log:
            self._procs[path] = node.tap_popen(cmd, stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=log,
                                               start_new_session=True)

    def _log(self, path: str) -> str:
        try:
            with open(path[:-len(".pcap")] + ".log") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def _wait_ready(self) -> None:
        waiting = dict(self._procs)

        def listening() -> bool:
            for path, proc in list(waiting.items()):
                log = self._log(path)
                if "listening on" in log:
                    del waiting[path]
                elif proc.poll() is not None:
                    raise LabError(f"tcpdump for {path} exited: {log.strip() or proc.returncode}")
            return not waiting

        if not wait_until(listening, READY_S, 0.02):
            raise LabError(f"tcpdump did not start within {READY_S} s: {', '.join(waiting)}")

    def stop(self) -> dict[str, str]:
        """SIGTERM every tcpdump (it flushes and exits; SIGKILL after ``STOP_S``), bring the
        pcaps written on remote servers here; the pcap paths by file name. Idempotent.

        Raises:
            LabError: a remote server could not send a pcap back (the others are fetched).
        """
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_S
        for path, proc in self._procs.items():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            m = re.search(r"(\d+) packets? captured", self._log(path))
            self.packets[path] = int(m.group(1)) if m else None
        self._procs.clear()
        failed = []
        for path, (server, there) in self._remote.items():
            try:
                data = self.lab.servers.get(server, there)
            except LabError as e:
                failed.append(str(e))
                continue
            with open(path, "wb") as f:
                f.write(data)
        self._remote.clear()
        if failed:
            raise LabError("captures not brought back: " + "; ".join(failed))
        return dict(self.files)
