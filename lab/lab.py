"""``Lab``: builds a Mininet topology into an emulated cloud cluster and tears it down.

    with Lab(LeafSpine(spines=2, leaves=2, vms_per_leaf=2), name="demo") as lab:
        lab.pingAll()
        print(lab["vm1"].cmd("ip route"))
        lab.faults.link_down("leaf1", "spine1")

The bring-up pipeline is ``Lab.start``; every kernel object it creates carries the prefix
``nslab-<name>`` and is removed by ``Lab.stop`` (also after an exception or Ctrl-C, through the
context manager).

Given ``servers`` (``topo.split``), the lab is split across them: each node is built on its
server through that server's ``lab.servers.ServerShell`` (``lab.nodes``), the links between
routers on different servers are shaped VXLAN tunnels (``lab.tunnel``), and teardown removes
what was made on every server (``lab.servers.Servers``).
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from mininet.net import Mininet
from mininet.topo import Topo

from contracts.events import Event, Fault, Source
from contracts.results.truth import ServerClock
from lab import tc
from lab.capabilities import probe, require_root
from lab.cgroups import Cgroups
from lab.clocks import ClockBook, ClockConfig
from lab.errors import CapabilityError, LabError
from lab.fabric import check_mode, require_fabric
from lab.faults import Faults
from lab.hostnic import HostLayer
from lab.links import LINK_KEYS, ShapedLink
from lab.names import check_lab_name, lab_prefix, state_dir
from lab.netlink import remove_netns
from lab.nodes import VM, Router, fabric_node
from lab.server_cgroups import RemoteCgroups, ServerCgroups
from lab.server_clock import ServerClocks
from lab.servers import Servers, ServerShell
from lab.tunnel import VxlanLink
from lab.vmclock import library
from lab.wait import wait_until
from topo.routing import lab_routes, path_slots
from topo.split import Server, Split, split, without_cut


def lab_netns(name: str) -> list[str]:
    """Named namespaces of lab ``name`` that exist now."""
    prefix = lab_prefix(name) + "-"
    try:
        return sorted(n for n in os.listdir("/run/netns") if n.startswith(prefix))
    except FileNotFoundError:
        return []


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def survivors(pids: list[int], timeout_s: float = 1.0) -> list[int]:
    """The processes of ``pids`` still alive after up to ``timeout_s`` s (signals are
    delivered at once, exits take a moment)."""
    left = wait_until(lambda: not [p for p in pids if alive(p)], timeout_s, 0.01)
    return [] if left else [p for p in pids if alive(p)]


def check_link_params(topo: Topo, netem: bool) -> None:
    """Validate every link's emulation parameters against the kernel before building.

    Raises:
        CapabilityError: a parameter needs a missing kernel feature (e.g. delay without netem).
        LabError: a value is out of range.
    """
    for a, b, info in topo.links(withInfo=True):
        for end in ("params1", "params2"):  # each end's options add to the link's
            opts = {k: v for k, v in {**info, **info.get(end, {})}.items() if k in LINK_KEYS}
            try:
                params = tc.LinkParams.from_opts(opts)
            except ValueError as e:
                raise LabError(f"link {a}-{b}: {e}") from e
            tc.require(params, netem, f"{a}-{b}")


class Lab:
    """An emulated cluster built from a Mininet ``Topo``.

    Args:
        topo: any Mininet topology; nodes with ``role`` leaf/spine/superspine become routers,
            other switches Linux bridges, hosts VMs. A host's ``phys`` names its physical host
            (default: one physical host per VM).
        name: lab name (the prefix of its kernel objects is ``nslab-<name>``).
        seed: seeds clocks and the ECMP hash.
        fabric: how routers choose among equal-cost paths: ``ecmp``, ``spray`` or ``entropy``
            (``lab.fabric``).
        clocks: how VM clocks are drawn.
        cpu_cores: CPU budget of every physical host (cores; None: unlimited).
        cpu_reserve: weigh the lab's cgroups above the machine's other processes
            (``Cgroups.reserve``), so that the hosts get their budgets on a busy machine.
        host_cpu: per physical host ``{"cpu_cores": float, "cpuset": "0-1"}`` overrides.
        progress: called with short messages during long steps.
        servers: the servers to split the lab across (``topo.split.Server``, the first the
            one this runs on; none or one: this machine alone).
        server_placement: router -> server name, overriding the dealt placement.
        ssh_options: extra ``ssh`` arguments for the remote servers (``-i KEY``, ...).

    Raises (from ``start``):
        NotRootError, CapabilityError (also for a fabric mode this kernel cannot provide),
        LabError (also: a remote server that does not answer or lacks nslab, a physical
        host whose VMs are on two servers).
    Raises (here): ValueError for an unknown fabric mode; ``topo.split.SplitError`` (a
    ValueError) for a placement that cannot be built.
    """

    def __init__(self, topo: Topo, name: str = "lab", seed: int = 1,
                 clocks: ClockConfig | None = None, cpu_cores: float | None = None,
                 cpu_reserve: bool = False, host_cpu: dict[str, dict] | None = None,
                 fabric: str = "ecmp",
                 progress: Callable[[str], None] | None = None,
                 servers: Sequence[Server] = (), server_placement: Mapping[str, str] | None = None,
                 ssh_options: Sequence[str] = ()):
        self.topo, self.name, self.seed = topo, check_lab_name(name), seed
        self.split: Split | None = (split(topo, servers, server_placement)
                                    if len(servers) > 1 else None)
        """Where each node runs (None: all here)."""
        self.servers: Servers | None = (Servers(self.name, servers, ssh_options)
                                        if self.split else None)
        self._here = ServerShell(Server("local", "127.0.0.1"), state_dir(self.name))
        self.tunnels: dict[frozenset[str], VxlanLink] = {}
        """The cut links' tunnels, by their two routers."""
        self.server_watch: ServerClocks | None = None
        """The servers' clocks, measured at bring-up and during the run (None: one
        server)."""
        self.fabric = check_mode(fabric)
        self.clock_config = clocks or ClockConfig()
        self.cpu_cores, self.host_cpu = cpu_cores, host_cpu or {}
        self.cpu_reserve = cpu_reserve
        self.progress = progress or (lambda msg: None)
        self.net: Mininet | None = None
        self.cgroups: ServerCgroups | None = None
        self.clocks: ClockBook | None = None
        self.routes: dict = {}
        self.healthy_routes: dict = {}
        """Routes of the fabric with every link up: they number the path slots."""
        self.created: list[tuple[str, str]] = []
        self.timeline: list[Event] = []
        self.listeners: list[Callable[[Event], None]] = []
        """Called with every event as it is stamped (from the stamping thread)."""
        self._timeline_lock = threading.Lock()
        self.phys: dict[str, str] = {}
        """VM -> physical host now: the one placement truth (migrations change it)."""
        self.down_links: set[frozenset[str]] = set()
        self.classes: tuple[tc.TrafficClass, ...] = ()
        """Traffic classes on the fabric links now (``lab.qos.set_classes``)."""
        self.bringup_s = self.teardown_s = None
        self.leftovers: list[str] = []
        self.t0_ns = 0
        self.faults = Faults(self)
        self.host_layer = HostLayer(self)
        """The hosts' NICs (``lab.hostnic``; none without a host layer in ``topo``)."""

    # -- servers ---------------------------------------------------------------------------
    def shell_of(self, node: str) -> ServerShell:
        """The ``ServerShell`` of the server ``node`` runs on."""
        if self.split is None:
            return self._here
        return self.servers[self.split.server_of[node]]

    def vm_clock_path(self, vm: str) -> str:
        """The file ``vm``'s processes read their clock from (``NSLAB_CLOCK``), on its
        server: a remote server's copy is under its lab directory there."""
        shell = self.shell_of(vm)
        if shell.local:
            return self.clocks.path(vm)
        return os.path.join(self.servers.remote_dir(shell), "clock", f"{vm}.clock")

    @property
    def server_clocks(self) -> list[ServerClock]:
        """Each server's clock against the first's at bring-up, with its series during the
        run (``lab.server_clock.ServerClocks.truth``; none: one server)."""
        return self.server_watch.truth(self.t0_ns) if self.server_watch else []

    @property
    def server_sync_us(self) -> float:
        """us: how far two servers' truths may disagree at any time of the run so far
        (``lab.server_clock.ServerClocks.sync_us``; 0 on one server)."""
        return self.server_watch.sync_us() if self.server_watch else 0.0

    def _remote_vms(self) -> list[str]:
        return [vm for vm in self.topo.hosts() if not self.shell_of(vm).local]

    def _start_servers(self) -> None:
        """Reach every server, measure its clock against this one's
        (``lab.server_clock``) and check nslab's VM clock preload is there at the same path.

        Raises:
            LabError: a server does not answer or lacks the preload.
        """
        self.servers.check()
        self.server_watch = ServerClocks(self.servers)
        self.server_watch.measure()
        lib = library()
        for shell in self.servers.shells.values():
            if not shell.local:
                try:
                    shell.run(["test", "-r", lib])
                except LabError as e:
                    raise LabError(f"server {shell.server.name} has no {lib}: install nslab "
                                   "at the same path on every server (docs/multi-server.md)"
                                   ) from e

    def _publish_clocks(self) -> None:
        """Copy the remote VMs' clock files to their servers.

        Raises:
            LabError: a server refused.
        """
        for vm in self._remote_vms():
            with open(self.clocks.path(vm), "rb") as f:
                self.servers.put(self.split.server_of[vm], self.vm_clock_path(vm), f.read())

    def _start_tunnels(self) -> None:
        """Bring up every cut link's tunnel (after the nodes, before the routes)."""
        for cut in self.split.cut:
            link = VxlanLink(self.name, cut, self.net.nameToNode)
            self.tunnels[frozenset((cut.node_a, cut.node_b))] = link
            link.up()

    # -- Mininet-like access ---------------------------------------------------------------
    def __getitem__(self, name: str):
        return self.net[name]

    @property
    def vms(self) -> list[VM]:
        return list(self.net.hosts)

    def pingAll(self, timeout: str = "1") -> float:
        """Ping between all VM pairs; returns the loss percentage (Mininet's ``pingAll``)."""
        return self.net.pingAll(timeout=timeout)

    def record(self, kind: str, name: str) -> None:
        """Note a kernel object the lab created (for the state record and teardown checks)."""
        self.created.append((kind, name))

    def now_s(self) -> float:
        """Seconds since the lab came up (true time)."""
        return (time.time_ns() - self.t0_ns) / 1e9

    def stamp(self, kind: str, target: str, **params) -> Event:
        """Record an event in the ground-truth timeline (thread-safe)."""
        ev = Event(t_s=round(self.now_s(), 6), true_ns=time.time_ns(), kind=kind,
                   target=target, params=params)
        with self._timeline_lock:
            self.timeline.append(ev)
        for listener in list(self.listeners):
            listener(ev)
        return ev

    def stamp_fault(self, fault: Fault, **extra) -> Event:
        """Stamp an applied ``fault``: its kind, target and parameters, plus ``extra`` facts
        only the lab knows (e.g. the host a migrated VM left)."""
        return self.stamp(fault.kind, fault.target, **fault.params(), **extra)

    def inject(self, fault: Fault, source: Source = "lab") -> Event:
        """Apply ``fault`` now (its ``at_s`` is not waited for); the event it stamped.

        Raises:
            LabError: the lab refused it (``lab.fault_rules.check``: not running, unknown
                node or link, a state that forbids it).
        """
        ev = self.faults.apply(fault)
        ev.source = source
        return ev

    # -- bring-up --------------------------------------------------------------------------
    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Bring the lab up: checks, cgroups and clocks, nodes and links, routes."""
        t = time.perf_counter()
        require_root()
        caps = probe()
        if not caps["mnexec"].ok:
            raise CapabilityError("mnexec is missing: install Debian's mininet package "
                                  "(make setup does)")
        if lab_netns(self.name):
            raise LabError(f"lab {self.name!r} is already up or crashed; "
                           f"'nslab clean {self.name}' removes a crashed one")
        check_link_params(self.topo, caps["netem"].ok)
        require_fabric(self.fabric, caps)
        try:
            if self.split:
                self._start_servers()
            self._physical_hosts()
            if self.split:
                self._publish_clocks()
            self.routes = self.healthy_routes = lab_routes(self.topo, self.phys)
            self.progress(f"building {len(self.topo.nodes())} nodes, "
                          f"{len(self.topo.links())} links"
                          + (f" on {len(self.split.servers)} servers, "
                             f"{len(self.split.cut)} links cut" if self.split else ""))
            topo = without_cut(self.topo, self.split) if self.split else self.topo
            self.net = Mininet(topo=topo, host=functools.partial(VM, lab=self),
                               switch=fabric_node(self), link=ShapedLink, controller=None,
                               autoSetMacs=True, build=False, waitConnected=False)
            self.net.build()
            if self.split:
                self._start_tunnels()
            for node in self.net.hosts + self.net.switches:
                node.flush()
            self.net.start()
            self.host_layer.start()
        except BaseException:
            self.stop()
            raise
        self.publish_state()
        self.t0_ns = time.time_ns()
        if self.server_watch is not None:
            self.server_watch.start()
        self.bringup_s = time.perf_counter() - t
        self.progress(f"lab {self.name} up in {self.bringup_s:.2f} s")

    def _physical_hosts(self) -> None:
        """Every VM's physical host, the hosts' and VMs' cgroups (each on its VMs' server)
        and the VMs' clocks.

        Raises:
            LabError: a host's VMs on two servers (its CPU is on one).
        """
        vms = self.topo.hosts()
        self.phys = {vm: self.topo.nodeInfo(vm).get("phys") or f"phys-{vm}" for vm in vms}
        host_server: dict[str, str] = {}
        for vm, host in self.phys.items():
            server = self.split.server_of[vm] if self.split else ""
            if host_server.setdefault(host, server) != server:
                raise LabError(f"physical host {host} has VMs on servers {host_server[host]} "
                               f"and {server}: a host's VMs share its CPU on one server; place "
                               "them under leaves of one server (server_placement)")
        remote = ({name: RemoteCgroups(shell, self.name)
                   for name, shell in self.servers.shells.items() if not shell.local}
                  if self.split else {})
        self.cgroups = ServerCgroups(Cgroups(self.name), remote, host_server)
        self.record("cgroup", lab_prefix(self.name))
        self.clocks = ClockBook(self.clock_config, self.seed,
                                os.path.join(state_dir(self.name), "clock"), time.time_ns())
        hosts = {}
        for host in sorted(set(self.phys.values())):
            spec = {"cpu_cores": self.cpu_cores, **self.host_cpu.get(host, {})}
            hosts[host] = (spec.get("cpu_cores"), spec.get("cpuset"))
        self.cgroups.build(hosts, self.phys, self.cpu_reserve)
        for vm, host in self.phys.items():
            self.clocks.add_vm(vm, host)

    def reroute(self) -> None:
        """Recompute ECMP routes without the links that are down, and the host layer's for the
        VMs' hosts now, and install them on every router (the lab plays the fabric's routing
        protocol, converged at once)."""
        self.routes = lab_routes(self.topo, self.phys, self.down_links)
        for node in self.net.switches:
            if isinstance(node, Router):
                node.install_routes(self.routes.get(node.name, []))

    def set_fabric(self, mode: str) -> Event:
        """Switch every router to fabric ``mode`` now (``lab.fabric``; the routes stay) and
        stamp ``fabric`` in the timeline.

        Raises:
            ValueError: an unknown mode; CapabilityError: this kernel cannot provide it;
            LabError: the lab is not running.
        """
        if self.net is None:
            raise LabError(f"lab {self.name} is not running")
        require_fabric(mode, probe())
        self.fabric = mode
        for node in self.net.switches:
            if isinstance(node, Router):
                node.apply_fabric()
        return self.stamp("fabric", "", mode=mode)

    def path_slots(self, router: str) -> list[tuple[str, list[tuple[int, str]]]]:
        """The alive path slots of ``router``'s multipath prefixes now
        (``topo.routing.path_slots``)."""
        return path_slots(self.healthy_routes.get(router, []), self.routes.get(router, []))

    def publish_state(self) -> None:
        """Write ``vms.json`` in the state directory: how ``nslab exec`` enters each VM (and
        which server runs it)."""
        doc = {vm.name: {"netns": vm.netns, "clock": vm.clock_path, "phys": vm.phys,
                         "server": vm.on.server.name, "remote": vm.remote,
                         "cgroup_procs": ([] if vm.remote else
                                          self.cgroups.join_paths(vm.phys, vm.name))}
               for vm in self.vms}
        path = os.path.join(state_dir(self.name), "vms.json")
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(path + ".tmp", path)

    # -- teardown --------------------------------------------------------------------------
    def stop(self) -> None:
        """Tear everything down; afterwards ``leftovers`` lists what survived (normally []):
        namespaces, cgroups, the state directory, node shells still alive, errors."""
        t = time.perf_counter()
        self.faults.stop_all()
        errors = []
        shells = ([n.shell.pid if n.remote else n.pid for n in self.net.hosts + self.net.switches]
                  if self.net else [])
        if self.net is not None:
            try:
                self.host_layer.freeze()
            except Exception as e:  # keep tearing down the rest
                errors.append(f"host NICs: {e}")
            try:
                self.net.stop()
            except Exception as e:  # keep tearing down the rest
                errors.append(f"mininet stop: {e}")
            self.net = None
        for kind, name in self.created:
            if kind == "netns":
                remove_netns(name)
        self.tunnels = {}
        if self.cgroups is not None:
            try:
                self.cgroups.destroy()
            except Exception as e:
                errors.append(f"cgroups: {e}")
        if self.server_watch is not None:
            self.server_watch.stop()
            if self.server_watch.error:
                errors.append(f"server clocks: {self.server_watch.error}")
        if self.servers is not None:
            try:
                errors += self.servers.teardown()
            except Exception as e:  # the record stays for nslab clean
                errors.append(f"servers: {e}")
        shutil.rmtree(state_dir(self.name), ignore_errors=True)
        self.leftovers = lab_netns(self.name) + (self.cgroups.exists() if self.cgroups else [])
        if os.path.exists(state_dir(self.name)):
            self.leftovers.append(f"state {state_dir(self.name)}")
        self.leftovers += [f"shell {pid}" for pid in survivors(shells)] + errors
        self.teardown_s = time.perf_counter() - t
