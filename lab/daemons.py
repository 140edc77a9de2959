"""Run the agents in a lab: one agent per VM, the coordinator in one VM, as on a real cluster
(``python -m agents ...``, unmodified; they see only their VM's clock and network).

The lab reads the coordinator's API (``agents/API.md``) from inside the coordinator VM's
namespace: a socket is opened in that namespace, so nothing routes lab traffic out.
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyroute2 import netns

from lab.errors import LabError
from lab.names import state_dir

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab

AGENT_PORT, COORD_PORT, HTTP_PORT = 7701, 7700, 7780


@dataclass
class AgentConfig:
    """How the agents run: probe pairs per second per peer, window (s), peers per agent, an
    optional shared HMAC key (hex), and the VM that hosts the coordinator (None: the first)."""

    rate: float = 20.0
    window_s: float = 2.0
    max_peers: int = 16
    key: str | None = None
    coordinator_vm: str | None = None


def ns_http_get(ns: str, host: str, port: int, path: str, timeout: float = 3.0) -> dict:
    """GET ``path`` from ``host:port`` inside network namespace ``ns``; the JSON body.

    Raises:
        OSError: connection failed; ValueError: not JSON.
    """
    netns.pushns(ns)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    finally:
        netns.popns()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.sock = sock
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise OSError(f"{path}: HTTP {resp.status}")
    return json.loads(body)


class AgentMesh:
    """The agent daemons of a running lab (``start``, ``state``, ``stop``)."""

    def __init__(self, lab: Lab, cfg: AgentConfig):
        self.lab, self.cfg = lab, cfg
        self.procs: dict[str, subprocess.Popen] = {}
        self.coordinator = None
        self.started_ns = 0
        self.logdir = os.path.join(state_dir(lab.name), "logs")

    def _spawn(self, vm, key: str, args: list[str]) -> None:
        os.makedirs(self.logdir, exist_ok=True)
        log = open(os.path.join(self.logdir, f"{key}.log"), "w")
        self.procs[key] = vm.popen([sys.executable, "-m", "agents", *args], stdout=log,
                                   stderr=subprocess.STDOUT)
        log.close()

    def start(self) -> None:
        """Start the coordinator, then one agent per VM (all peers listed; each agent picks
        ``max_peers`` of them)."""
        vms = self.lab.vms
        name = self.cfg.coordinator_vm or vms[0].name
        self.coordinator = self.lab[name]
        cip = self.coordinator.IP()
        self._spawn(self.coordinator, "coordinator",
                    ["coordinator", "--bind", cip, "--port", str(COORD_PORT),
                     "--http-port", str(HTTP_PORT), "--window", str(self.cfg.window_s)])
        self.wait_api(10.0)
        key = ["--key", self.cfg.key] if self.cfg.key else []
        for vm in vms:
            peers = ",".join(f"{p.name}={p.IP()}" for p in vms if p is not vm)
            self._spawn(vm, f"agent-{vm.name}",
                        ["agent", "--name", vm.name, "--bind", vm.IP(), "--peers", peers,
                         "--coordinator", f"{cip}:{COORD_PORT}", "--port", str(AGENT_PORT),
                         "--rate", str(self.cfg.rate), "--window", str(self.cfg.window_s),
                         "--max-peers", str(self.cfg.max_peers), *key])
        self.started_ns = time.time_ns()

    def wait_api(self, timeout_s: float) -> None:
        """Wait until the coordinator answers.

        Raises:
            LabError: it did not within ``timeout_s`` (its log is named).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ns_http_get(self.coordinator.netns, self.coordinator.IP(), HTTP_PORT,
                            "/api/v1/health", timeout=1.0)
                return
            except (OSError, ValueError):
                if time.monotonic() > deadline or self.procs["coordinator"].poll() is not None:
                    raise LabError("the coordinator did not come up; see "
                                   f"{os.path.join(self.logdir, 'coordinator.log')}") from None
                time.sleep(0.2)

    def state(self) -> dict | None:
        """The coordinator's ``/api/v1/state`` document, or None if it does not answer."""
        try:
            return ns_http_get(self.coordinator.netns, self.coordinator.IP(), HTTP_PORT,
                               "/api/v1/state")
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """SIGTERM every daemon, then SIGKILL what is left after 2 s."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 2.0
        for p in self.procs.values():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
