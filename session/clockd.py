"""The clock-daemon matrix: the clock daemons a user runs on cloud VMs (chrony, ntpsec's ntpd,
linuxptp's ptp4l), unmodified, each in its own VM on its VM clock (the ``vmclock`` preload),
scored against the truth beside nslab's agents on the same lab.

One VM is the reference: it serves NTP from its own clock (chronyd, ``local stratum 1``) and
is the PTP grandmaster (ptp4l: software timestamps, UDPv4, unicast negotiation); every client
VM runs one daemon against it with the daemon's defaults, except the polling interval
(``poll``, NTP daemons) so that a run of minutes shows convergence. Each daemon's corrections
discipline its own VM clock, never the machine's. Scored per daemon from the truth (client
clock minus reference clock, sampled every ``sample_s``): offset p50/p99, frequency
difference, when it converged (every later sample within ``converged_us``), and when its own
log first said it was synchronized.

Documentation of the defaults: chrony.conf(5) (https://chrony-project.org/doc/4.3/),
ntp.conf(5) of ntpsec (https://docs.ntpsec.org/latest/), ptp4l(8) of linuxptp 3.1. The Debian
packages are unpacked into nslab's cache by ``make setup`` (never installed: no service
starts).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from agents.native import cache_dir
from lab.capabilities import Capability
from lab.errors import LabError
from lab.names import state_dir
from session import chrony

BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build")
"""A checkout's older place for unpacked packages (``make setup`` before the cache)."""


def unpacked_dir(package: str) -> str:
    """Where Debian's ``package`` is unpacked when its daemon is not installed (``make
    setup`` does it): ``<nslab's cache>/<package>`` (``agents.native.cache_dir``). Unpacked,
    not installed: no service starts, nothing steers the machine's clock."""
    return os.path.join(cache_dir(), package)


@dataclass(frozen=True)
class Daemon:
    """One clock daemon: its executable (in PATH, or in Debian's ``package`` unpacked) and the
    log line (regex) that says it synchronized."""

    name: str
    exe: str
    package: str
    synced: str

    def find(self) -> str | None:
        """Its executable: in PATH (also ``/usr/sbin``), in nslab's cache, in a checkout's
        ``build/<package>``; None when none is."""
        found = shutil.which(self.exe, path=os.pathsep.join(
            [os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
        for p in (found, os.path.join(unpacked_dir(self.package), "usr", "sbin", self.exe),
                  os.path.join(BUILD, self.package, "usr", "sbin", self.exe)):
            if p and os.path.isabs(p) and os.access(p, os.X_OK):
                return p
        return None

    def path(self) -> str:
        """Its executable.

        Raises:
            LabError: not installed nor unpacked (``make setup`` unpacks it).
        """
        found = self.find()
        if found is None:
            raise LabError(f"{self.exe} ({self.name}) not found (in PATH nor in "
                           f"{unpacked_dir(self.package)}): run `make setup` (it unpacks "
                           f"Debian's {self.package} there)")
        return found


DAEMONS = {
    "chrony": Daemon("chrony", "chronyd", "chrony", r"Selected source"),
    "ntpsec": Daemon("ntpsec", "ntpd", "ntpsec", r"clock_sync"),
    "ptp4l": Daemon("ptp4l", "ptp4l", "linuxptp", r"to SLAVE on"),
}


def missing() -> list[str]:
    """The Debian packages of the daemons not found (``Daemon.find``) but chrony's (``make
    chrony``): what ``make clockd`` unpacks."""
    return sorted({d.package for d in DAEMONS.values()
                   if d.name != "chrony" and d.find() is None})


def capabilities() -> dict[str, Capability]:
    """ptp4l and ntpd as ``nslab doctor`` reports them (chronyd: ``session.chrony``)."""
    out = {}
    for d in (DAEMONS["ntpsec"], DAEMONS["ptp4l"]):
        found = d.find()
        out[d.exe] = (Capability(d.exe, True, found, "the clock_daemons scenario") if found else
                      Capability(d.exe, False, f"not in PATH nor in {unpacked_dir(d.package)}",
                                 "the clock_daemons scenario", f"make setup (it unpacks "
                                 f"Debian's {d.package} there; installing it would start a "
                                 "service that steers this machine's clock)"))
    return out


class ClockDaemonsSpec(BaseModel):
    """The scenario's ``clock_daemons:`` section."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="run the clock-daemon matrix")
    server: str | None = Field(None, description="the reference VM (NTP server and PTP "
                                                 "grandmaster; default: the first VM)")
    clients: dict[str, str] = Field(default_factory=dict, description="VM -> daemon (chrony, "
                                    "ntpsec, ptp4l); default: the other VMs in that order")
    poll: int = Field(2, ge=0, le=10, description="NTP daemons' minpoll = maxpoll, log2 s")
    converged_us: float = Field(100.0, gt=0, description="offset bound of convergence, us")
    warmup_s: float = Field(40.0, ge=0, description="s after start left out of the error "
                                                    "statistics")


def ptp4l_config(intf: str, master_ip: str | None) -> str:
    """ptp4l.conf (ptp4l(8)): the grandmaster (``master_ip`` None) or a unicast slave of
    ``master_ip``; software timestamps over UDPv4, everything else the defaults."""
    common = ("time_stamping software\nnetwork_transport UDPv4\nsummary_interval 0\n")
    if master_ip is None:
        return f"[global]\n{common}unicast_listen 1\npriority1 1\n[{intf}]\n"
    return (f"[unicast_master_table]\ntable_id 1\nlogQueryInterval 2\nUDPv4 {master_ip}\n"
            f"[global]\n{common}slaveOnly 1\n[{intf}]\nunicast_master_table 1\n")


def ntpsec_config(directory: str, server_ip: str, poll: int) -> str:
    """ntp.conf (ntpsec): one server, ``iburst``, polling every 2^poll s; the kernel
    discipline (the PLL, ADJ_OFFSET) as by default."""
    return (f"server {server_ip} iburst minpoll {poll} maxpoll {poll}\n"
            f"driftfile {directory}/ntp.drift\nlogconfig =all\n")


def argv(daemon: str, directory: str, intf: str, server_ip: str | None, poll: int) -> list[str]:
    """The command line of ``daemon`` in a VM (its files written into ``directory``): the
    reference's (``server_ip`` None) or a client's."""
    exe = chrony.chronyd() if daemon == "chrony" else DAEMONS[daemon].path()
    conf = os.path.join(directory, f"{daemon}.conf")
    if daemon == "chrony":
        text, cmd = chrony.config(directory, server_ip, poll), [exe, "-d", "-u", "root", "-f",
                                                                conf]
    elif daemon == "ntpsec":
        text, cmd = ntpsec_config(directory, server_ip, poll), [exe, "-n", "-g", "-c", conf]
    else:
        text, cmd = ptp4l_config(intf, server_ip), [exe, "-f", conf, "-m", "-q"]
    with open(conf, "w") as f:
        f.write(text)
    return cmd


class DaemonMatrix:
    """The reference's servers and one daemon in every client VM of ``lab``; ``samples`` of
    the truth while they run."""

    def __init__(self, lab, spec: ClockDaemonsSpec, sample_s: float = 0.5):
        self.lab, self.spec, self.sample_s = lab, spec, sample_s
        names = sorted((vm.name for vm in lab.vms), key=lambda v: (len(v), v))
        self.server = spec.server or names[0]
        order = list(DAEMONS)
        others = [v for v in names if v != self.server]
        self.clients = dict(spec.clients) or {v: order[i % len(order)]
                                              for i, v in enumerate(others)}
        bad = {v: d for v, d in self.clients.items() if d not in DAEMONS}
        if bad:
            raise LabError(f"clock_daemons.clients: unknown daemons {bad} (known: {order})")
        self.procs: dict[tuple[str, str], subprocess.Popen] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.samples: list[tuple[int, dict[str, tuple[float, float]]]] = []
        self.synced: dict[tuple[str, str], str | None] = {}
        """Each client's first log line saying it synchronized (read at ``stop``)."""
        self.start_ns = 0
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def _spawn(self, vm: str, daemon: str, server_ip: str | None) -> None:
        d = os.path.join(state_dir(self.lab.name), "clockd", vm, daemon)
        os.makedirs(d, exist_ok=True)
        node = self.lab[vm]
        cmd = argv(daemon, d, node.intfNames()[0], server_ip, self.spec.poll)
        self.logs[vm, daemon] = os.path.join(d, f"{daemon}.log")
        with open(self.logs[vm, daemon], "w") as log:
            self.procs[vm, daemon] = node.popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def start(self) -> None:
        """Start the reference's chronyd and ptp4l, then every client's daemon, and the truth
        sampler.

        Raises:
            LabError: a daemon missing, or one exited at once (its log says why).
        """
        kinds = set(self.clients.values())
        for daemon in ("chrony", "ptp4l"):
            if daemon in kinds or (daemon == "chrony" and "ntpsec" in kinds):
                self._spawn(self.server, daemon, None)
        server_ip = self.lab[self.server].IP()
        for vm, daemon in self.clients.items():
            self._spawn(vm, daemon, server_ip)
        self.start_ns = time.time_ns()
        time.sleep(0.5)
        for (vm, daemon), p in self.procs.items():
            if p.poll() is not None:
                raise LabError(f"{daemon} in {vm} exited ({p.returncode}): "
                               f"{open(self.logs[vm, daemon]).read()[-500:]}")
        self._thread = threading.Thread(target=self._sample, daemon=True, name="nslab-clockd")
        self._thread.start()

    def _sample(self) -> None:
        while not self._halt.wait(self.sample_s):
            self.samples.append(chrony.against(self.lab, self.server, list(self.clients)))

    def stop(self) -> None:
        """Stop the sampler and every daemon (SIGTERM, then SIGKILL), by PID, then read
        their logs (``synced``)."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        chrony.terminate(self.procs.values())
        self.synced = {(vm, d): synced_line(log, DAEMONS[d].synced)
                       for (vm, d), log in self.logs.items() if vm != self.server}

    def section(self) -> dict:
        """``sync.clock_daemons``: the server and one row per client (``rows``)."""
        return {"server": self.server, "converged_us": self.spec.converged_us,
                "rows": rows(self.samples, self.start_ns, self.spec, self.clients, self.synced)}


def synced_line(log: str, pattern: str) -> str | None:
    """The first line of the file ``log`` matching ``pattern``, or None."""
    try:
        with open(log, errors="replace") as f:
            return next((line.strip() for line in f if re.search(pattern, line)), None)
    except FileNotFoundError:
        return None


def rows(samples: list[tuple[int, dict[str, tuple[float, float]]]], start_ns: int,
         spec: ClockDaemonsSpec, clients: dict[str, str],
         synced: dict[tuple[str, str], str | None]) -> list[dict]:
    """One row per client VM: its daemon, |offset| (us) and frequency difference (ppm)
    against the reference over the ``samples`` taken ``spec.warmup_s`` or more after
    ``start_ns``, ``converged_s`` (s after ``start_ns`` from which every sample is within
    ``spec.converged_us``; None: never) and ``synced_log``, its log's first line saying so."""
    out = []
    for vm, daemon in clients.items():
        one = [(t, {vm: e[vm]}) for t, e in samples if vm in e]
        s = chrony.score(one, start_ns, chrony.ChronySpec(warmup_s=spec.warmup_s,
                                                          converged_us=spec.converged_us), vm)
        out.append({"vm": vm, "daemon": daemon, "offset_error_us": s["offset_error_us"],
                    "drift_error_ppm": s["drift_error_ppm"], "converged_s": s["converged_s"],
                    "synced_log": synced.get((vm, daemon))})
    return out

