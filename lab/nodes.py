"""Mininet node classes of the lab: VMs, routers (leaf/spine/super-spine) and bridges.

Every node runs in its own network namespace, named ``nslab-<lab>-<node>`` (``ip netns
list``), so ``ip netns exec`` and pyroute2 reach it, and a crashed lab is found by prefix.

A node of a lab split across servers (``topo.split``) runs on its server; every command that
configures it goes through that server's ``lab.servers.ServerShell`` (``on``): here for the
first server, over the shared SSH control connection for the others. On a remote server the
namespace is made with ``ip netns add`` (recorded first, ``lab.servers.Servers``), the node's
Mininet shell is ``ssh -tt SERVER ip netns exec NS bash`` (Mininet Cluster Edition's
``RemoteMixin``: a shell on a terminal there, its PID read back with ``echo $$``), and every
process it starts (``popen``) is a ``lab.servers.RemoteProcess``. No netlink socket reaches a
remote node (``ipr`` refuses), so nothing silently reads this machine's kernel instead.
"""
from __future__ import annotations

import itertools
import json
import os
import shlex
import subprocess
import threading
from typing import TYPE_CHECKING

from mininet.node import Host, Node

from agents.clock import ENV_VAR
from lab import fabric, tc, vmclock
from lab.errors import LabError
from lab.names import netns_name
from lab.netlink import attach_netns, ns_iproute, remove_netns
from lab.servers import RemoteProcess
from topo.routing import HOST_ROLE, ROUTER_ROLES

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab

# Quieter namespaces: no IPv6 (router solicitations, DAD) in counters and captures.
_COMMON_SYSCTL = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
_SEQ = itertools.count()


class LabNode(Node):
    """A Mininet node whose namespace carries the lab's name prefix."""

    def __init__(self, name: str, lab: Lab, **params):
        self.lab = lab
        self.on = lab.shell_of(name)
        """The ``ServerShell`` of the server this node runs on."""
        self.remote = not self.on.local
        self._iprs: dict[int, object] = {}  # thread id -> IPRoute
        self._ipr_lock = threading.Lock()
        self.batch: dict[str, list[str]] = {"ip": [], "tc": [], "nft": []}
        if self.remote:
            self.netns = lab.servers.add_netns(self.on.server.name, name)
            params["inNamespace"] = False  # ip netns exec enters it
            super().__init__(name, **params)
            self.pid = int(self.cmd("echo $$"))  # the shell's PID there (RemoteMixin)
        else:
            self.netns = netns_name(lab.name, name)
            params["inNamespace"] = True
            super().__init__(name, **params)
            attach_netns(self.netns, self.pid)
            self.lab.record("netns", self.netns)
        self.sysctl(*_COMMON_SYSCTL)

    @property
    def ipr(self):
        """pyroute2 ``IPRoute`` bound to this node's namespace, one per thread: pyroute2's
        synchronous API runs an event loop per thread, and a socket reopened on another thread
        would land in that thread's namespace.

        Raises:
            LabError: the node runs on a remote server (no netlink socket reaches it).
        """
        if self.remote:
            raise LabError(f"{self.name} runs on server {self.on.server.name}: no netlink "
                           "socket reaches it from here")
        tid = threading.get_ident()
        ipr = self._iprs.get(tid)
        if ipr is None:
            ipr = ns_iproute(self.netns)
            with self._ipr_lock:
                self._iprs[tid] = ipr
        return ipr

    def ifindex(self, ifname: str) -> int:
        """Index of interface ``ifname`` in this node's namespace.

        Raises:
            IndexError: no such interface; LabError: its server refused.
        """
        if not self.remote:
            return self.ipr.link_lookup(ifname=ifname)[0]
        return json.loads(self.on.run(["ip", "-n", self.netns, "-j", "link", "show", "dev",
                                       ifname]))[0]["ifindex"]

    def link_stats(self, ifname: str) -> dict[str, int]:
        """``tx_bytes``, ``tx_dropped`` and ``rx_dropped`` of interface ``ifname`` since it
        was made (netlink's ``IFLA_STATS64`` here; ``ip -s -j link show`` on a remote
        server).

        Raises:
            IndexError: no such interface; LabError: its server refused.
        """
        if not self.remote:
            st = self.ipr.get_links(self.ifindex(ifname))[0].get_attr("IFLA_STATS64") or {}
            return {k: st.get(k, 0) for k in ("tx_bytes", "tx_dropped", "rx_dropped")}
        st = json.loads(self.on.run(["ip", "-n", self.netns, "-s", "-j", "link", "show", "dev",
                                     ifname]))[0]["stats64"]
        return {"tx_bytes": st["tx"]["bytes"], "tx_dropped": st["tx"]["dropped"],
                "rx_dropped": st["rx"]["dropped"]}

    def qdisc_stats(self) -> dict[int, dict[str, int]]:
        """``lab.tc.root_qdisc_stats`` of this node's namespace: one netlink dump here, one
        ``ip -j``/``tc -j`` pair on a remote server (``lab.tc.parse_root_qdiscs``).

        Raises:
            LabError: its server refused.
        """
        if not self.remote:
            return tc.root_qdisc_stats(self.ipr)
        out = self.on.run(["sh", "-c", 'ip -n "$0" -j link show && echo && '
                           'tc -n "$0" -s -j qdisc show', self.netns])
        links, qdiscs = (json.loads(x) for x in out.splitlines() if x.strip())
        return tc.parse_root_qdiscs(links, qdiscs)

    def run_batch(self, tool: str, lines: list[str]) -> None:
        """Run ``ip``, ``tc`` or ``nft`` lines in this node's namespace, on its server.

        Raises:
            LabError: a line failed.
        """
        self.on.batch(self.netns, tool, lines)

    def flush(self) -> None:
        """Run the queued bring-up lines (addresses, qdiscs, nftables) in one process per
        tool.

        Raises:
            LabError: a line failed.
        """
        for tool in ("ip", "tc", "nft"):
            self.run_batch(tool, self.batch[tool])
            self.batch[tool] = []

    def sysctl(self, *assignments: str) -> None:
        """Set sysctls in this node's namespace (``key=value`` strings).

        Raises:
            LabError: a key is unknown or the write failed.
        """
        try:
            self.on.sysctl(self.netns, assignments)
        except LabError as e:
            raise LabError(f"{self.name}: {e}") from e

    def join_argv(self) -> list[str]:
        """What a process of this node runs under on a remote server before entering its
        namespace (nothing for a router)."""
        return []

    def enter_argv(self, env: dict) -> list[str]:
        """What a process of this node runs under on a remote server, inside its namespace,
        before its command (``env``: the variables it needs that the server's own
        environment lacks)."""
        return ["env", *(f"{k}={v}" for k, v in env.items())] if env else []

    def _popen(self, cmd, env_extra: dict | None = None, **params):
        """Start ``cmd`` in this node: here through Mininet (``mnexec``); on a remote server
        through its shell: the node's shell on a terminal (``ssh -tt``), any other command
        as a ``RemoteProcess`` (``cwd`` becomes ``env -C``)."""
        if not self.remote:
            return super()._popen(cmd, **params)
        params.pop("preexec_fn", None)
        params.pop("env", None)
        prefix = [*self.join_argv(), "ip", "netns", "exec", self.netns,
                  *self.enter_argv(env_extra or {})]
        if cmd[0] == "mnexec":  # Node.startShell: mnexec and its options, then the shell
            return subprocess.Popen(self.on.argv([*prefix, *cmd[2:]], tty=True),
                                    start_new_session=True, **params)
        cwd = params.pop("cwd", None)
        if cwd:
            prefix += ["env", "-C", cwd]
        return RemoteProcess(self.on, self._pidfile(), [*prefix, *cmd], **params)

    def _pidfile(self) -> str:
        """A new PID file for a process of this node on its remote server."""
        return os.path.join(self.lab.servers.remote_dir(self.on), "pids",
                            f"{self.name}-{next(_SEQ)}")

    def tap_popen(self, cmd: list[str], **params) -> subprocess.Popen:
        """Start ``cmd`` in this node's namespace on its server as the lab itself, as a
        hypervisor's tap runs (outside a VM's cgroups and clock, with the lab's
        capabilities): ``ip netns exec`` here, a ``RemoteProcess`` on a remote server (its
        stdout and stderr come back through ``ssh``). ``params``: ``subprocess.Popen``'s."""
        argv = ["ip", "netns", "exec", self.netns, *cmd]
        if not self.remote:
            return subprocess.Popen(argv, **params)
        return RemoteProcess(self.on, self._pidfile(), argv, **params)

    def popen(self, *args, **kwargs):
        """Mininet's ``popen``; on a remote server without ``mnexec -da`` (``_popen`` enters
        the namespace there). A string command is split as a shell would (``shlex``)."""
        if self.remote:
            if len(args) == 1 and isinstance(args[0], str) and not kwargs.get("shell"):
                args = (shlex.split(args[0]),)
            kwargs["mncmd"] = []
        return super().popen(*args, **kwargs)

    def terminate(self) -> None:
        with self._ipr_lock:
            for ipr in self._iprs.values():
                ipr.close()
            self._iprs.clear()
        if not self.remote:  # a remote server's namespaces go with lab.servers' teardown
            remove_netns(self.netns)
        super().terminate()


class VM(LabNode, Host):
    """An emulated cloud VM: its processes run in its physical host's cgroup and live on the VM
    clock (``vmclock`` preloaded, ``NSLAB_CLOCK``), without the capabilities that reach the
    machine (``lab.vmclock.DROPPED_CAPS``). ``phys``: its physical host now (``Lab.phys``, the
    one placement truth). ``owns_nic``: the VM's interface and its qdisc are the guest's; the
    lab emulates the vNIC's outgoing direction at the switch end (``lab.links``)."""

    owns_nic = True

    def __init__(self, name: str, lab: Lab, **params):
        self.clock_path = lab.vm_clock_path(name)
        super().__init__(name, lab=lab, **params)

    @property
    def phys(self) -> str:
        return self.lab.phys[self.name]

    def join_argv(self) -> list[str]:
        """On a remote server: join the VM's cgroups there (``sh`` writes its PID, then
        execs; before ``ip netns exec``, which mounts a sysfs of its own over /sys)."""
        join = " ".join(shlex.quote(p) for p in self.lab.cgroups.join_paths(self.phys,
                                                                             self.name))
        return ["sh", "-c", f'for f in {join}; do echo $$ > "$f"; done; exec "$@"', "sh"]

    def enter_argv(self, env: dict) -> list[str]:
        """On a remote server: the VM clock's variables, then ``setpriv`` dropping
        ``DROPPED_CAPS`` from the bounding set (root's permitted and effective sets follow
        at exec; capabilities(7))."""
        drop = ",".join("-" + c.removeprefix("CAP_").lower() for c in vmclock.DROPPED_CAPS)
        return [*super().enter_argv(env), "setpriv", "--bounding-set", drop]

    def _popen(self, cmd, **params):
        """Every process of the VM (its shell, ``popen``) joins the VM's cgroups and drops the
        machine's capabilities before exec, and runs with ``vmclock`` preloaded on the VM's
        ``NSLAB_CLOCK``. On a remote server the variables that differ from this process's
        environment go on the command line (ssh passes none), and the process joins the VM's
        cgroups there before exec (``enter_argv``)."""
        env = vmclock.preload_env(dict(params.pop("env", None) or os.environ))
        env[ENV_VAR] = self.clock_path
        if self.remote:
            extra = {k: v for k, v in env.items() if os.environ.get(k) != v}
            return super()._popen(cmd, env_extra=extra, **params)
        join = self.lab.cgroups.join_paths(self.phys, self.name)

        def enter_vm():
            for path in join:
                with open(path, "w") as f:
                    f.write("0")
            vmclock.drop_capabilities()
        return super()._popen(cmd, env=env, preexec_fn=enter_vm, **params)


class Router(LabNode):
    """A leaf, spine or super-spine: a Linux router with ECMP (L4 hash, fixed per-lab seed),
    or another fabric mode of the lab (``lab.fabric``); or a physical host of the host layer
    (role ``host``, ``topo.hosts``): its virtual switch routes between its VMs and its NIC
    (a hop in traceroute). It answers TTL-expired packets at once (``icmp_ratelimit=0``), as
    traceroute-style path discovery needs."""

    def __init__(self, name: str, lab: Lab, role: str, **params):
        self.role = role
        super().__init__(name, lab=lab, **params)
        self.sysctl("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0", "net.ipv4.icmp_ratelimit=0",
                    "net.ipv4.fib_multipath_hash_policy=1",
                    f"net.ipv4.fib_multipath_hash_seed={lab.seed & 0xFFFFFFFF}")
        self.slots = max((len(h) for _, h in lab.healthy_routes.get(name, [])), default=0)
        """Path slots of the fabric mode: the most next hops of any healthy route."""
        self._slot_rules = False
        self._routes: set[str] = set()
        """Prefixes of the static routes installed."""

    def start(self, controllers) -> None:
        self.install_routes(self.lab.routes.get(self.name, []))

    def install_routes(self, routes: list[tuple[str, list[str]]]) -> None:
        """Make the static routes of this router exactly ``routes`` (prefix, next hops), in
        one ``ip -batch`` on its server: the lab plays the fabric's routing protocol,
        converged at once. Other fabric modes than ``ecmp`` also get their path-slot tables
        (and marking rules) for these routes.

        Raises:
            LabError: ``ip`` refused a route.
        """
        lines = []
        for prefix, hops in routes:
            via = " ".join(f"nexthop via {h}" for h in hops) if len(hops) > 1 else \
                f"via {hops[0]}"
            lines.append(f"route replace {prefix} proto static {via}")
        keep = {p for p, _ in routes}
        # a prefix no longer routed; the kernel may have removed it with its interface
        lines += [f"route flush {p} proto static" for p in sorted(self._routes - keep)]
        self._routes = keep
        self.run_batch("ip", lines)
        self.apply_fabric()

    def apply_fabric(self) -> None:
        """Install the lab's fabric mode for the routes now: the slot rules once, the slot
        tables and the marking rules (``ecmp`` after another mode: the marking rules
        removed, so every packet takes the main table's multipath route again)."""
        if self.slots < 2 or (self.lab.fabric == "ecmp" and not self._slot_rules):
            return
        if not self._slot_rules:
            self.run_batch("ip", fabric.rule_commands(self.slots))
            self._slot_rules = True
        slot_routes = self.lab.path_slots(self.name)
        self.run_batch("ip", fabric.table_commands(slot_routes, self.slots))
        self.run_batch("nft", fabric.mark_commands(self.lab.fabric, slot_routes, self.slots))

    def stop(self, deleteIntfs: bool = False) -> None:
        """Nothing to stop: the namespace and its links go with ``terminate``."""


class Bridge(LabNode):
    """A switch of a plain Mininet topology: a Linux bridge inside its own namespace (there is
    no Open vSwitch here, and nothing is bridged in the root namespace)."""

    def start(self, controllers) -> None:
        self.ipr.link("add", ifname="br0", kind="bridge")
        br = self.ipr.link_lookup(ifname="br0")[0]
        for intf in self.intfList():
            if intf.name != "lo":
                idx = self.ipr.link_lookup(ifname=intf.name)[0]
                self.ipr.link("set", index=idx, master=br, state="up")
        self.ipr.link("set", index=br, state="up")

    def stop(self, deleteIntfs: bool = False) -> None:
        """Nothing to stop: the namespace and its links go with ``terminate``."""


def fabric_node(lab: Lab):
    """Mininet ``switch=`` factory: routers for router roles and hosts, bridges otherwise."""
    def make(name: str, role: str | None = None, **params):
        params.pop("listenPort", None)
        if role in ROUTER_ROLES or role == HOST_ROLE:
            return Router(name, lab=lab, role=role, **params)
        return Bridge(name, lab=lab, **params)
    return make
