"""Real chronyd (Debian's chrony) in every VM of a lab, scored against the truth: the baseline a
user would run instead of nslab's agent.

One VM serves NTP from its own clock (``local stratum 1``); every other VM is its client
(``server ... iburst``, kernel software timestamps: chrony's default on Linux). Each chronyd
runs on its VM clock through the ``vmclock`` preload, so its corrections (adjtimex frequency,
ADJ_SETOFFSET steps) discipline that VM clock, never the machine's. Its configuration, pid file
and command socket live under the lab's state directory. What chrony achieved is read from the
truth: every client's clock minus the server's (offset, us) and their frequency difference
(ppm), sampled from the published clocks while it runs (chrony's documentation:
https://chrony-project.org/doc/4.3/chrony.conf.html).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from agents.native import cache_dir
from lab.capabilities import Capability
from lab.errors import LabError
from lab.names import state_dir
from lab.wait import wait_until
from session.scoring import _stats

# a checkout's older place for Debian's unpacked chrony (`make setup` before the cache)
REPO_CHRONYD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "build", "chrony", "usr", "sbin", "chronyd")


def unpacked_dir() -> str:
    """Where Debian's chrony package is unpacked when chronyd is not installed (``make setup``
    does it): ``<nslab's cache>/chrony`` (``agents.native.cache_dir``). Unpacked, not
    installed: no service starts, nothing steers the machine's clock."""
    return os.path.join(cache_dir(), "chrony")


def unpack_command() -> str:
    """The shell command that unpacks Debian's chrony into ``unpacked_dir()``."""
    d = unpacked_dir()
    return (f"mkdir -p {d} && cd {d} && apt-get download chrony && dpkg-deb -x chrony_*.deb . "
            "&& rm chrony_*.deb")


class ChronySpec(BaseModel):
    """The scenario's ``chrony:`` section."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="run chronyd in every VM")
    server: str | None = Field(None, description="the VM that serves NTP from its own clock "
                                                 "(default: the first VM)")
    poll: int = Field(-2, ge=-6, le=10, description="clients' minpoll = maxpoll, log2 s")
    warmup_s: float = Field(10.0, ge=0, description="s after chronyd started left out of the "
                                                    "error statistics (convergence)")
    converged_us: float = Field(100.0, gt=0, description="the offset bound that defines "
                                                         "convergence, us")


def candidates() -> list[tuple[str, str]]:
    """``(path, where)`` of the places chronyd is looked for, in order: PATH (also
    ``/usr/sbin``, which a user's PATH may lack), the unpacked package in nslab's cache, a
    checkout's ``build/chrony``."""
    found = shutil.which("chronyd", path=os.pathsep.join([os.environ.get("PATH", ""),
                                                           "/usr/sbin", "/sbin"]))
    return [(found or "chronyd", "PATH"),
            (os.path.join(unpacked_dir(), "usr", "sbin", "chronyd"), "nslab's cache"),
            (REPO_CHRONYD, "the checkout's build/chrony")]


def find() -> tuple[str, str] | None:
    """``(path, where it came from)`` of chronyd, or None."""
    for path, where in candidates():
        if os.path.isabs(path) and os.access(path, os.X_OK):
            return path, where
    return None


def chronyd() -> str:
    """Path of chronyd.

    Raises:
        LabError: no chronyd; the message gives the command that unpacks Debian's.
    """
    found = find()
    if found is None:
        raise LabError(f"chronyd not found (in PATH nor in {unpacked_dir()}): "
                       f"{unpack_command()} (`make setup` does)")
    return found[0]


def capability() -> Capability:
    """chronyd, as ``nslab doctor`` reports it (the ``chrony:`` section needs it)."""
    found = find()
    if found:
        return Capability("chronyd", True, f"{found[0]} (from {found[1]})", "the chrony scenario")
    return Capability("chronyd", False, f"not in PATH nor at {candidates()[1][0]}",
                      "the chrony scenario", f"{unpack_command()} (`make setup` does; installing "
                      "the chrony package would start a service that steers this machine's "
                      "clock)")


def config(directory: str, server_ip: str | None, poll: int) -> str:
    """chrony.conf of one VM: a client of ``server_ip``, or the server when None."""
    lines = [f"pidfile {directory}/chronyd.pid", f"bindcmdaddress {directory}/chronyd.sock",
             "cmdport 0"]
    if server_ip is None:
        lines += ["local stratum 1", "allow all"]
    else:
        lines += [f"server {server_ip} iburst minpoll {poll} maxpoll {poll}",
                  "makestep 0.1 3"]
    return "\n".join(lines) + "\n"


READY_S = 10.0
"""How long chronyd may take to write its pidfile, s."""


class ChronyMesh:
    """chronyd in every VM of ``lab``; ``samples`` of the truth while they run."""

    def __init__(self, lab, spec: ChronySpec, sample_s: float = 0.5):
        self.lab, self.spec, self.sample_s = lab, spec, sample_s
        self.names = sorted((vm.name for vm in lab.vms), key=lambda v: (len(v), v))
        self.server = spec.server or self.names[0]
        self.procs: dict[str, subprocess.Popen] = {}
        self.samples: list[tuple[int, dict[str, tuple[float, float]]]] = []
        self.start_ns: int | None = None
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start chronyd in every VM (server first) and the truth sampler.

        Raises:
            LabError: no chronyd, or one exited at once (its log says why).
        """
        exe = chronyd()
        server_ip = self.lab[self.server].IP()
        for vm in [self.server] + [v for v in self.names if v != self.server]:
            d = os.path.join(state_dir(self.lab.name), "chrony", vm)
            os.makedirs(d, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):  # a crashed lab's: not ready
                os.remove(os.path.join(d, "chronyd.pid"))
            conf = os.path.join(d, "chrony.conf")
            with open(conf, "w") as f:
                f.write(config(d, None if vm == self.server else server_ip, self.spec.poll))
            log = open(os.path.join(d, "chronyd.log"), "w")
            self.procs[vm] = self.lab[vm].popen([exe, "-d", "-u", "root", "-f", conf],
                                                stdout=log, stderr=subprocess.STDOUT)
            log.close()
        for vm in self.procs:
            if not wait_until(lambda vm=vm: self._ready(vm), READY_S):
                raise LabError(f"chronyd in {vm} wrote no pidfile within {READY_S} s")
        self.start_ns = time.time_ns()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="nslab-chrony")
        self._thread.start()

    def _ready(self, vm: str) -> bool:
        """chronyd in ``vm`` has written its pidfile (it does once initialised).

        Raises:
            LabError: it exited (its log's end is quoted).
        """
        d = os.path.join(state_dir(self.lab.name), "chrony", vm)
        p = self.procs[vm]
        if p.poll() is not None:
            with open(os.path.join(d, "chronyd.log")) as f:
                raise LabError(f"chronyd in {vm} exited ({p.returncode}): {f.read()[-500:]}")
        return os.path.exists(os.path.join(d, "chronyd.pid"))

    def _sample(self) -> None:
        while not self._halt.wait(self.sample_s):
            self.samples.append(against(self.lab, self.server,
                                        [v for v in self.names if v != self.server]))

    def stop(self) -> None:
        """Stop the sampler and every chronyd (SIGTERM, then SIGKILL)."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        terminate(self.procs.values())

    def section(self) -> dict:
        """``sync.chrony`` of this run (``score``)."""
        return score(self.samples, self.start_ns or 0, self.spec, self.server)


def against(lab, server: str, vms: list[str]) -> tuple[int, dict[str, tuple[float, float]]]:
    """Now (true ns) and each of ``vms``' clock against ``server``'s, from the published
    clocks: {vm: (offset ns, frequency ppm)}."""
    t = time.time_ns()
    specs = lab.clocks.specs
    ref = specs[server]
    off0, y0 = ref.offset_at(t), ref.frequency_ppm(t)
    return t, {vm: (specs[vm].offset_at(t) - off0, specs[vm].frequency_ppm(t) - y0)
               for vm in vms}


def terminate(procs: Iterable[subprocess.Popen]) -> None:
    """SIGTERM each of ``procs`` still running, then SIGKILL any not gone 3 s later (each by
    its PID)."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=3)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def score(samples: list[tuple[int, dict[str, tuple[float, float]]]], start_ns: int,
          spec: ChronySpec, server: str) -> dict:
    """``sync.chrony``: |client - server| offset (us) and frequency difference (ppm) of every
    client over the ``samples`` (true ns, {vm: (offset ns, frequency ppm)} against the server)
    taken ``spec.warmup_s`` or more after ``start_ns``, as ``offset_error_us`` and
    ``drift_error_ppm`` (the fields of ``sync.baseline_ntp``), the offset's per client in
    ``by_vm``; ``converged_s``: s after
    ``start_ns`` from which every sample is within ``spec.converged_us`` (None: never)."""
    kept = [errs for t, errs in samples if t >= start_ns + spec.warmup_s * 1e9]
    converged = None
    for i, (t, _) in enumerate(samples):
        if all(max(abs(o) for o, _ in e.values()) <= spec.converged_us * 1e3
               for _, e in samples[i:]):
            converged = round((t - start_ns) / 1e9, 2)
            break
    vms = sorted({vm for e in kept for vm in e}, key=lambda v: (len(v), v))
    return {"server": server,
            "offset_error_us": _stats([o / 1e3 for e in kept for o, _ in e.values()], 3),
            "by_vm": {vm: _stats([e[vm][0] / 1e3 for e in kept if vm in e], 3) for vm in vms},
            "drift_error_ppm": _stats([y for e in kept for _, y in e.values()], 4),
            "converged_us": spec.converged_us, "converged_s": converged}
