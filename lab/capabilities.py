"""What this kernel and machine support, probed for real (``nslab doctor``).

Kernel features are probed in a throw-away namespace ``nslab-probe-<pid>`` (a veth pair, a
netem qdisc, an nftables netdev table), so the probe touches nothing outside the lab prefix.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass

from pyroute2.netlink.exceptions import NetlinkError

from lab.errors import NotRootError
from lab.names import PREFIX
from lab.netlink import ns_iproute, remove_netns


@dataclass(frozen=True)
class Capability:
    """One probed feature: ``ok``, what was seen, and what a missing one disables."""

    name: str
    ok: bool
    detail: str
    disables: str


def require_root() -> None:
    """Raises NotRootError unless running as root."""
    if os.geteuid() != 0:
        raise NotRootError("nslab needs root (network namespaces, tc, cgroups): run it with sudo")


def cgroup_mode() -> tuple[str | None, list[str]]:
    """``("v2", controllers)`` when a cgroup2 hierarchy offers the cpu controller, else
    ``("v1", controllers)`` for mounted v1 controllers, else ``(None, [])``."""
    mounts = [line.split() for line in open("/proc/mounts")]
    for m in mounts:
        if m[2] == "cgroup2":
            ctl = os.path.join(m[1], "cgroup.controllers")
            have = open(ctl).read().split() if os.path.exists(ctl) else []
            if "cpu" in have:
                return "v2", have
    v1 = sorted({opt for m in mounts if m[2] == "cgroup" for opt in m[3].split(",")}
                & {"cpu", "cpuacct", "cpuset", "freezer"})
    return ("v1", v1) if "cpu" in v1 else (None, [])


def _nft(ns: str, lines: str, ok_detail: str) -> tuple[bool, str]:
    """Load an nftables batch in namespace ``ns``: (ok, what was seen)."""
    r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], capture_output=True,
                       text=True, input=lines)
    return r.returncode == 0, ok_detail if r.returncode == 0 else r.stderr.strip()


def _probe_kernel() -> dict[str, tuple[bool, str]]:
    """``{feature: (ok, detail)}`` for netem, nftables (netdev ingress + numgen), nft_mark
    (packet marks from numgen in prerouting) and policy_routing (fwmark rules),
    probed in a throw-away namespace."""
    ns = f"{PREFIX}-probe-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    out = {}
    try:
        ipr = ns_iproute(ns)
        try:
            ipr.link("add", ifname="p0", kind="veth", peer="p1")
            idx = ipr.link_lookup(ifname="p0")[0]
            try:
                ipr.tc("add", "netem", idx, 0x10000, delay=1000)
                out["netem"] = (True, "sch_netem loads")
            except NetlinkError as e:
                out["netem"] = (False, f"'tc qdisc add ... netem' fails: {e.args[1]}")
            try:
                ipr.rule("add", table=101, priority=1001, fwmark=1)
                out["policy_routing"] = (True, "ip rule fwmark ... lookup")
            except NetlinkError as e:
                out["policy_routing"] = (False, f"'ip rule add' fails: {e.args[1]}")
        finally:
            ipr.close()
        if shutil.which("nft") is None:
            out["nftables"] = out["nft_mark"] = (False, "nft not installed")
        else:
            out["nftables"] = _nft(
                ns, 'add table netdev nslab\nadd chain netdev nslab c { type filter hook '
                    'ingress device "p1" priority 0; }\n'
                    "add rule netdev nslab c numgen random mod 100 < 10 drop\n",
                "netdev ingress + numgen work")
            out["nft_mark"] = _nft(
                ns, "add table ip nslab\nadd chain ip nslab c { type filter hook prerouting "
                    "priority mangle; }\nadd rule ip nslab c meta mark set numgen random mod 2 "
                    "map { 0 : 1, 1 : 2 }\n", "meta mark set numgen ... map works")
    finally:
        remove_netns(ns)
    return out


def probe() -> dict[str, Capability]:
    """Probe everything (once per process; later calls return the first result).

    Raises:
        NotRootError: not root (the kernel probes need it).
    """
    require_root()
    return _probe()


@functools.lru_cache(maxsize=1)
def _probe() -> dict[str, Capability]:
    kernel = _probe_kernel()
    mode, ctls = cgroup_mode()
    caps = [
        Capability("root", True, f"euid {os.geteuid()}", "everything"),
        Capability("netem", *kernel["netem"], "link delay, jitter and reorder"),
        Capability("nftables", *kernel["nftables"], "link loss injection"),
        Capability("nft_mark", *kernel["nft_mark"], "fabric modes spray and entropy"),
        Capability("policy_routing", *kernel["policy_routing"],
                   "fabric modes spray and entropy"),
        Capability("cgroups", mode is not None and "cpu" in ctls,
                   f"{mode or 'none'}: {', '.join(ctls) or 'no cpu controller'}",
                   "physical-host CPU budgets and noisy neighbours"),
        Capability("cpuset", "cpuset" in ctls, "cpuset controller" if "cpuset" in ctls
                   else "no cpuset controller", "pinning physical hosts to cores"),
        Capability("freezer", mode == "v2" or "freezer" in ctls,
                   "cgroup.freeze (v2)" if mode == "v2" else "freezer controller (v1)"
                   if "freezer" in ctls else "no freezer", "VM pause/resume"),
        Capability("multipath_hash_seed",
                   os.path.exists("/proc/sys/net/ipv4/fib_multipath_hash_seed"),
                   "net.ipv4.fib_multipath_hash_seed", "reproducible ECMP path choice"),
    ]
    for tool, what in (("mnexec", "building any lab (Debian package mininet)"),
                       ("iperf3", "iperf3 background load"), ("tcpdump", "packet captures")):
        path = shutil.which(tool)
        caps.append(Capability(tool, path is not None, path or "not in PATH", what))
    return {c.name: c for c in caps}


def as_json(caps: dict[str, Capability]) -> dict[str, dict]:
    """Capabilities as plain dicts (for results and ``doctor --json``)."""
    return {k: asdict(v) for k, v in caps.items()}
