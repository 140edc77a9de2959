"""Physical hosts as cgroups: a CPU budget per host, one child cgroup per VM.

Layout: ``<root>/nslab-<lab>/<phys>/<vm>`` where ``<root>`` is each v1 controller's mount
(cpu, cpuacct, cpuset, freezer) or the cgroup2 mount. Only these directories are created,
written or removed; processes elsewhere are never moved. See the kernel's cgroup-v1/cpu,
cgroup-v1/cpusets, cgroup-v1/freezer-subsystem and cgroup-v2 documents.

Budgets: ``cpu_cores`` (float, e.g. 1.5) becomes CFS quota/period (v1 ``cpu.cfs_quota_us``,
v2 ``cpu.max``) over a 10 ms period (the kernel's default 100 ms lets a host of a quarter core
run 25 ms and then throttles it for 75 ms: a VM's compute of tens of ms then finishes or
stalls by chance; a hypervisor shares vCPUs at finer grain; under 0.1 core the period grows
so that the quota stays at the kernel's 1 ms minimum: ``cfs_budget``); ``cpuset`` ("0-1")
pins the host's VMs to cores. See the kernel's scheduler/sched-bwc document. ``reserve``
weighs the whole lab above the machine's other processes, so that a busy machine still gives
the hosts their budgets.
"""
from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import time

from lab.capabilities import cgroup_mode
from lab.errors import CapabilityError, LabError
from lab.names import lab_prefix
from lab.wait import wait_until

PERIOD_US = 10_000
MIN_QUOTA_US = 1_000
"""The kernel's smallest CFS quota (sched-bwc: 1 ms); budgets under 0.1 core get a longer
period (``cfs_budget``)."""
MAX_PERIOD_US = 1_000_000
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "freezer")
RESERVE_WEIGHT = 100
"""``Cgroups.reserve``: the lab's CPU weight, in default processes (100 of them)."""


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


class Cgroups:
    """The cgroups of one lab (v1 or v2, detected unless ``mode`` is given). ``root``: where
    the v1 controllers are mounted, or the cgroup2 mount (default: found in /proc/mounts).
    ``top``: the lab's top cgroup's name (default ``nslab-<lab>``; a remote server's,
    ``lab.server_cgroups``, adds the server's name).

    Raises:
        CapabilityError: no usable cpu controller; v2 without a cgroup2 mount.
    """

    def __init__(self, lab: str, mode: str | None = None, root: str | None = None,
                 top: str | None = None):
        detected, ctls = cgroup_mode()
        self.mode = mode or detected
        if self.mode is None:
            raise CapabilityError("no cgroup cpu controller is mounted: physical-host CPU "
                                  "budgets need cgroup v1 'cpu' or cgroup v2 with 'cpu'")
        self.top = top or lab_prefix(lab)
        if self.mode == "v1":
            root = root or "/sys/fs/cgroup"
            self.roots = [os.path.join(root, c) for c in V1_CONTROLLERS
                          if c in ctls and os.path.isdir(os.path.join(root, c))]
        else:
            self.roots = [root or _v2_root()]

    # -- paths ---------------------------------------------------------------------------
    def _paths(self, *parts: str) -> list[str]:
        return [os.path.join(r, self.top, *parts) for r in self.roots]

    def _ctl(self, controller: str, *parts: str) -> str | None:
        """Path in the hierarchy of ``controller`` (v1) or the unified one (v2)."""
        for r in self.roots:
            if self.mode == "v2" or os.path.basename(r) == controller:
                return os.path.join(r, self.top, *parts)
        return None

    # -- lifecycle -----------------------------------------------------------------------
    def create_host(self, phys: str, cpu_cores: float | None = None,
                    cpuset: str | None = None) -> None:
        """Create the lab's and ``phys``'s cgroups with their CPU budget."""
        for p in self._paths():
            self._mkdir(p)
        for p in self._paths(phys):
            self._mkdir(p)
        if cpu_cores is not None:
            quota, period = cfs_budget(cpu_cores)
            if self.mode == "v1":
                _write(os.path.join(self._ctl("cpu", phys), "cpu.cfs_period_us"), str(period))
                _write(os.path.join(self._ctl("cpu", phys), "cpu.cfs_quota_us"), str(quota))
            else:
                _write(os.path.join(self._ctl("cpu", phys), "cpu.max"), f"{quota} {period}")
        if cpuset is not None:
            path = self._ctl("cpuset", phys)
            if path is None:
                raise CapabilityError(f"cpuset {cpuset!r} for {phys}: no cpuset controller")
            _write(os.path.join(path, "cpuset.cpus"), cpuset)

    def reserve(self, weight: float = RESERVE_WEIGHT) -> None:
        """Weigh the lab's top cgroup ``weight`` times a default process against the machine's
        other processes (v1 ``cpu.shares`` over 1024, v2 ``cpu.weight`` over 100, capped at the
        kernel's maximum), so that its hosts get their budgets while others load the machine;
        their quotas still cap them. Call after ``create_host``. Source: the kernel's
        scheduler/sched-design-CFS (group scheduling) and cgroup-v1/cpus or cgroup-v2 (cpu)."""
        path = self._ctl("cpu")
        if self.mode == "v1":
            _write(os.path.join(path, "cpu.shares"), str(min(262_144, round(1024 * weight))))
        else:
            _write(os.path.join(path, "cpu.weight"), str(min(10_000, round(100 * weight))))

    def create_vm(self, phys: str, vm: str) -> None:
        """Create ``vm``'s cgroup under ``phys`` (which must exist)."""
        for p in self._paths(phys, vm):
            self._mkdir(p)

    def _mkdir(self, path: str) -> None:
        try:
            os.mkdir(path)
        except FileExistsError:
            return
        if self.mode == "v1" and "/cpuset/" in path:  # v1 cpusets start empty
            parent = os.path.dirname(path)
            for f in ("cpuset.cpus", "cpuset.mems"):
                _write(os.path.join(path, f), _read(os.path.join(parent, f)))
        if self.mode == "v2":
            self._enable_v2(path)

    def _enable_v2(self, path: str) -> None:
        """Delegate cpu (and cpuset) from a new lab cgroup to its children; the lab's top needs
        them already enabled by its parent (systemd does so; nslab never writes outside).

        Raises:
            CapabilityError: the cpu controller is not delegated to the lab's top cgroup.
        """
        have = _read(os.path.join(path, "cgroup.controllers")).split()
        if "cpu" not in have:
            raise CapabilityError(f"cgroup v2: 'cpu' is not enabled for {path}; enable it in "
                                  "the parent's cgroup.subtree_control")
        if self.top in (os.path.basename(os.path.dirname(path)), os.path.basename(path)):
            want = " ".join(f"+{c}" for c in ("cpu", "cpuset") if c in have)
            _write(os.path.join(path, "cgroup.subtree_control"), want)

    def join_paths(self, phys: str, vm: str) -> list[str]:
        """The ``cgroup.procs`` files a process writes itself into to join ``vm``."""
        return [os.path.join(p, "cgroup.procs") for p in self._paths(phys, vm)]

    def attach(self, phys: str, vm: str, pid: int) -> None:
        """Move process ``pid`` into ``vm``'s cgroups."""
        for f in self.join_paths(phys, vm):
            _write(f, str(pid))

    def pids(self, phys: str, vm: str) -> list[int]:
        """PIDs in ``vm``'s cgroup."""
        return [int(x) for x in _read(self.join_paths(phys, vm)[0]).split()]

    def cpu_usage_ns(self, phys: str, vm: str | None = None) -> int:
        """CPU time consumed by ``vm`` (or the whole host ``phys``), ns."""
        parts = (phys, vm) if vm else (phys,)
        if self.mode == "v1":
            path = self._ctl("cpuacct", *parts) or self._ctl("cpu", *parts)
            return int(_read(os.path.join(path, "cpuacct.usage")))
        stat = dict(line.split() for line in
                    _read(os.path.join(self._ctl("cpu", *parts), "cpu.stat")).splitlines())
        return int(stat["usage_usec"]) * 1000

    def throttling(self, phys: str) -> tuple[int, int, int]:
        """The CFS bandwidth counters of host ``phys`` now: ``(periods, throttled,
        throttled_ns)``: enforcement periods in which it had runnable tasks, periods in which
        it ran out of quota, and the total time its tasks waited for quota (ns). Source: v1
        ``cpu.stat`` (nr_periods, nr_throttled, throttled_time ns), v2 ``cpu.stat``
        (throttled_usec); the kernel's scheduler/sched-bwc document."""
        stat = dict(line.split() for line in
                    _read(os.path.join(self._ctl("cpu", phys), "cpu.stat")).splitlines())
        waited = (int(stat["throttled_time"]) if self.mode == "v1"
                  else int(stat["throttled_usec"]) * 1000)
        return int(stat["nr_periods"]), int(stat["nr_throttled"]), waited

    def freeze(self, phys: str, vm: str, frozen: bool) -> None:
        """Pause (``frozen=True``) or resume every process of ``vm``.

        Raises:
            CapabilityError: no freezer (v1 without the freezer controller).
        """
        if self.mode == "v2":
            path = os.path.join(self._ctl("cpu", phys, vm), "cgroup.freeze")
            _write(path, "1" if frozen else "0")
            return
        path = self._ctl("freezer", phys, vm)
        if path is None:
            raise CapabilityError("VM pause needs the cgroup v1 freezer controller")
        _write(os.path.join(path, "freezer.state"), "FROZEN" if frozen else "THAWED")

    def move_vm(self, vm: str, old_phys: str, new_phys: str) -> None:
        """Live migration: move all of ``vm``'s processes under ``new_phys`` (which exists)."""
        self.create_vm(new_phys, vm)
        for pid in self.pids(old_phys, vm):
            try:
                self.attach(new_phys, vm, pid)
            except ProcessLookupError:
                continue
        for p in reversed(self._paths(old_phys, vm)):
            os.rmdir(p)

    def kill_all(self, timeout_s: float = 2.0) -> None:
        """SIGKILL every process in the lab's cgroups (all of them were started by the lab)."""
        def gone() -> bool:
            for pid in self._all_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return not self._all_pids()

        if not wait_until(gone, timeout_s, 0.02):
            raise LabError(f"processes {sorted(self._all_pids())} survive in the lab's cgroups")

    def _all_pids(self) -> set[int]:
        pids: set[int] = set()
        for root in self._paths():
            for d, _, files in os.walk(root):
                if "cgroup.procs" in files:
                    pids.update(int(x) for x in _read(os.path.join(d, "cgroup.procs")).split())
        return pids

    def destroy(self) -> None:
        """Thaw, kill and remove every cgroup of the lab (deepest first)."""
        for root in self._paths():
            if not os.path.isdir(root):
                continue
            for d, _, files in os.walk(root):
                if self.mode == "v1" and "freezer.state" in files:
                    _write(os.path.join(d, "freezer.state"), "THAWED")
                elif self.mode == "v2" and "cgroup.freeze" in files:
                    _write(os.path.join(d, "cgroup.freeze"), "0")
        self.kill_all()
        for root in self._paths():
            if not os.path.isdir(root):
                continue
            for d, _, _ in sorted(os.walk(root), key=lambda w: -w[0].count("/")):
                _rmdir(d)

    def exists(self) -> list[str]:
        """The lab's top cgroup directories that still exist."""
        return [p for p in self._paths() if os.path.isdir(p)]


def cfs_budget(cpu_cores: float) -> tuple[int, int]:
    """CFS ``(quota_us, period_us)`` for a budget of ``cpu_cores``: ``PERIOD_US`` (10 ms), or
    the shortest period whose quota is the kernel's minimum (1 ms) for budgets under 0.1 core.

    Raises:
        LabError: ``cpu_cores`` is not positive or needs a period over the kernel's 1 s.
    """
    if not cpu_cores > 0:
        raise LabError(f"cpu_cores must be > 0, got {cpu_cores}")
    period = max(PERIOD_US, math.ceil(MIN_QUOTA_US / cpu_cores))
    if period > MAX_PERIOD_US:
        raise LabError(f"cpu_cores {cpu_cores} is below what CFS can limit to (quota >= 1 ms "
                       f"per period <= 1 s: at least {MIN_QUOTA_US / MAX_PERIOD_US} core)")
    return max(MIN_QUOTA_US, round(cpu_cores * period)), period


def _rmdir(path: str) -> None:
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            time.sleep(0.02)
    raise LabError(f"cgroup {path} stays busy")


def _v2_root() -> str:
    for line in open("/proc/mounts"):
        f = line.split()
        if f[2] == "cgroup2":
            return f[1]
    raise CapabilityError("no cgroup2 mount")
