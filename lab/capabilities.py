"""What this kernel and machine support, probed for real (``nslab doctor``), and for each
missing piece what brings it (``lab.remedies``).

Kernel features are probed in a throw-away namespace ``nslab-probe-<pid>`` (``probe_plan()``
says what is made in it), removed at the end with everything in it, so the probe touches
nothing outside the lab prefix.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass

from pyroute2 import netns
from pyroute2.netlink.exceptions import NetlinkError

from lab import remedies
from lab.errors import NotRootError
from lab.names import PREFIX
from lab.netlink import ns_iproute, remove_netns

QDISCS = {  # probed qdisc -> (tc arguments, kernel module, Kconfig option, what it enables)
    "netem": ("delay 1ms", "sch_netem", "CONFIG_NET_SCH_NETEM",
              "link delay, jitter and reorder"),
    "fq": ("", "sch_fq", "CONFIG_NET_SCH_FQ", "nothing of nslab; a guest's own pacing with fq "
           "(SO_MAX_PACING_RATE, maxrate)"),
    "fq_codel": ("", "sch_fq_codel", "CONFIG_NET_SCH_FQ_CODEL", "nothing of nslab; a guest's "
                 "own AQM with fq_codel"),
    "red": ("limit 400000 min 30000 max 90000 avpkt 1000 burst 55 bandwidth 100mbit "
            "probability 0.02", "sch_red", "CONFIG_NET_SCH_RED", "nothing of nslab; RED and "
            "ECN-marking queues (tc-red)"),
}


@dataclass(frozen=True)
class Capability:
    """One probed feature: ``ok``, what was seen, what a missing one disables, and ``fix``:
    the command or package that brings it (``""`` when ok)."""

    name: str
    ok: bool
    detail: str
    disables: str
    fix: str = ""


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


def probe_namespace() -> str:
    """The throw-away namespace of this process's probe: ``nslab-probe-<pid>``."""
    return f"{PREFIX}-probe-{os.getpid()}"


def probe_plan() -> str:
    """What the probe creates (and removes), in words, with the objects' names."""
    return (f"creates network namespace {probe_namespace()} with a veth pair p0/p1 in it, and "
            f"tries there: the qdiscs {', '.join(QDISCS)} on p0 (each removed after), an ip "
            "rule (fwmark 1 lookup table 101), nftables tables 'netdev nslab' and 'ip nslab'; "
            "then it removes the namespace and everything in it")


def probe_left() -> bool:
    """True when this process's probe namespace still exists (it should not, after a probe)."""
    return probe_namespace() in netns.listnetns()


def _nft(ns: str, lines: str, ok_detail: str) -> tuple[bool, str]:
    """Load an nftables batch in namespace ``ns``: (ok, what was seen)."""
    r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], capture_output=True,
                       text=True, input=lines)
    return r.returncode == 0, ok_detail if r.returncode == 0 else r.stderr.strip()


def _qdisc(ns: str, kind: str, args: str) -> tuple[bool, str]:
    """Add qdisc ``kind`` as p0's root in ``ns`` and remove it: (ok, what was seen)."""
    tc = ["ip", "netns", "exec", ns, "tc", "qdisc"]
    r = subprocess.run([*tc, "add", "dev", "p0", "root", "handle", "1:", kind, *args.split()],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"'tc qdisc add ... {kind}' fails: {r.stderr.strip()}"
    subprocess.run([*tc, "del", "dev", "p0", "root"], capture_output=True)
    return True, f"tc qdisc {kind} works"


def _probe_kernel() -> dict[str, tuple[bool, str]]:
    """``{feature: (ok, detail)}`` for the qdiscs of QDISCS, nftables (netdev ingress +
    numgen), nft_mark (packet marks from numgen in prerouting) and policy_routing (fwmark
    rules), probed in the throw-away namespace of ``probe_plan``."""
    ns = probe_namespace()
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    out = {}
    try:
        ipr = ns_iproute(ns)
        try:
            ipr.link("add", ifname="p0", kind="veth", peer="p1")
            try:
                ipr.rule("add", table=101, priority=1001, fwmark=1)
                out["policy_routing"] = (True, "ip rule fwmark ... lookup")
            except NetlinkError as e:
                out["policy_routing"] = (False, f"'ip rule add' fails: {e.args[1]}")
        finally:
            ipr.close()
        for kind, (args, *_) in QDISCS.items():
            out[kind] = _qdisc(ns, kind, args)
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
    caps = [Capability("root", True, f"euid {os.geteuid()}", "everything")]
    for kind, (_, module, config, what) in QDISCS.items():
        caps.append(_cap(kind, *kernel[kind], what, remedies.kernel_module(module, config)))
    nft = shutil.which("nft") is not None
    caps += [
        _cap("nftables", *kernel["nftables"], "link loss injection",
             remedies.kernel_module("nf_tables", "CONFIG_NF_TABLES_NETDEV") if nft
             else remedies.package("nftables")),
        _cap("nft_mark", *kernel["nft_mark"], "fabric modes spray and entropy",
             remedies.kernel_module("nft_numgen", "CONFIG_NFT_NUMGEN") if nft
             else remedies.package("nftables")),
        _cap("policy_routing", *kernel["policy_routing"], "fabric modes spray and entropy",
             "a kernel built with CONFIG_IP_MULTIPLE_TABLES=y (distribution kernels have it)"),
        _cap("cgroups", mode is not None and "cpu" in ctls,
             f"{mode or 'none'}: {', '.join(ctls) or 'no cpu controller'}",
             "physical-host CPU budgets and noisy neighbours",
             remedies.cgroup_controller("cpu", mode)),
        _cap("cpuset", "cpuset" in ctls, "cpuset controller" if "cpuset" in ctls
             else "no cpuset controller", "pinning physical hosts to cores",
             remedies.cgroup_controller("cpuset", mode)),
        _cap("freezer", mode == "v2" or "freezer" in ctls,
             "cgroup.freeze (v2)" if mode == "v2" else "freezer controller (v1)"
             if "freezer" in ctls else "no freezer", "VM pause/resume",
             remedies.cgroup_controller("freezer", mode)),
        _cap("multipath_hash_seed", os.path.exists("/proc/sys/net/ipv4/fib_multipath_hash_seed"),
             "net.ipv4.fib_multipath_hash_seed", "reproducible ECMP path choice",
             "a kernel >= 6.11 (it added net.ipv4.fib_multipath_hash_seed)"),
    ]
    for tool, what, fix in (
            ("mnexec", "building any lab", remedies.package("mininet",
                                                            "--no-install-recommends")),
            ("iperf3", "iperf3 background load", remedies.package("iperf3")),
            ("tcpdump", "packet captures", remedies.package("tcpdump"))):
        path = shutil.which(tool)
        caps.append(_cap(tool, path is not None, path or "not in PATH", what, fix))
    return {c.name: c for c in caps}


def _cap(name: str, ok: bool, detail: str, disables: str, fix: str) -> Capability:
    return Capability(name, ok, detail, disables, "" if ok else fix)


def as_json(caps: dict[str, Capability]) -> dict[str, dict]:
    """Capabilities as plain dicts (for results and ``doctor --json``)."""
    return {k: asdict(v) for k, v in caps.items()}
