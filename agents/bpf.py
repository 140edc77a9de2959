"""The pacer's kernel datapath (``agents/native/pacer.bpf.c``), loaded with libbpf through ctypes:
its two tc programs attached to the VM's interface (tcx links where the kernel has them, Linux
6.6+; else the clsact qdisc's ingress and egress, direct action), its maps pinned in a bpffs
directory (one is mounted there if needed), and typed access to them for the daemon.

``object_path()`` is the one place that finds the compiled object (compiled at first use into
nslab's cache: ``agents.native.PACER_BPF``);
``Datapath`` loads, attaches, reads and writes, and removes everything it made at ``close``.

Why tcx first: grafting a qdisc (clsact too) deactivates the device while it is swapped
(``qdisc_graft`` -> ``dev_deactivate``, net/sched/sch_api.c): whatever the VM sends meanwhile
meets the noop qdisc and is dropped (the vNIC's ``tx_dropped``). A tcx link (BPF_LINK_CREATE
with ``BPF_TCX_INGRESS``/``BPF_TCX_EGRESS``) grafts nothing and goes when its file descriptor
is closed, with this process if need be.

Sources: libbpf (``bpf_object__open_file``, ``bpf_link_create``, ``bpf_tc_hook_create``,
``bpf_tc_attach``: tools/lib/bpf/libbpf.h, bpf.h), bpf(2), tc-bpf(8), include/uapi/linux/bpf.h
(Linux 6.6: the tcx attach types).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket
import struct

from agents.native import PACER_BPF, NativeError, build

__all__ = ["BUCKETS", "KINDS", "MAX_PEERS", "Act", "BpfError", "Cfg", "Datapath", "Dest", "Flow",
           "FlowKey",
           "mount_bpffs", "object_path", "probe", "unit_ns"]

MAX_PEERS, KINDS, BUCKETS = 256, 3, 192
"""As in ``pacer.bpf.c``: peers, histogram kinds (0: OWD echoed to this sender, 1: the echo's
own transit, 2: echo delay at the receiver), buckets per histogram (``bucket_ns``)."""
UNIT_SHIFT = 13
"""Stamps are in units of 2**13 ns (8.192 us), 16 bits: OWDs up to 400 ms are told apart."""
_BPF_TC_INGRESS, _BPF_TC_EGRESS = 1, 2
_BPF_TCX_INGRESS, _BPF_TCX_EGRESS = 46, 47  # enum bpf_attach_type, Linux 6.6
_HANDLE, _PRIORITY = 0x29, 0x29
_u64 = ctypes.c_uint64
_i64 = ctypes.c_int64


class BpfError(RuntimeError):
    """The kernel datapath cannot be used here: no compiled object, no libbpf, a kernel without
    BPF or cls_bpf, no permission, or no bpffs at the pin directory (the message says which
    and what to do)."""


class Cfg(ctypes.Structure):
    """``struct cfg``: the daemon's policy and clock anchor (``pacer.bpf.c``)."""

    _fields_ = [("k0", _u64), ("ref0", _i64), ("ppb", _i64), ("synced", _u64),
                ("pace", _u64), ("edt", _u64), ("threshold_ns", _u64), ("max_hold_ns", _u64),
                ("max_cont_ns", _u64), ("quantum_ns", _u64), ("max_transit_ns", _u64),
                ("ps_per_byte", _u64), ("burst_ns", _u64), ("spread", _u64),
                ("from_base", _u64), ("window", _u64), ("active_ns", _u64),
                ("full_bytes", _u64), ("min_window", _u64), ("queue_bytes", _u64),
                ("ack_class", _u64)]


class Peer(ctypes.Structure):
    _fields_ = [("idx", _u64), ("synced", _u64)]


class Dest(ctypes.Structure):
    """``struct dest``: one peer's state and counters, written by the kernel (times are
    CLOCK_MONOTONIC ns)."""

    _fields_ = [(n, _u64) for n in (
        "hold_until", "held_since", "open_until", "rx_owd", "rx_at", "rx_fresh", "rx_samples",
        "echoes", "fb_samples", "above", "holds", "held_ns", "refused", "leaked", "stamped",
        "next_ns", "paced", "rx_full", "rx_min", "fb_min", "clamped", "window", "acks")]


class FlowKey(ctypes.Structure):
    """``struct flow_key``: a TCP connection with a peer (its address in network order, the
    ports as numbers; ``lport`` this VM's)."""

    _fields_ = [("peer_ip", ctypes.c_uint32), ("lport", ctypes.c_uint16),
                ("pport", ctypes.c_uint16)]


class Flow(ctypes.Structure):
    """``struct flow``: its activity epoch, window scales, the right edge of the window last
    advertised, and the acknowledgement and window of the last segment sent (``pacer.bpf.c``)."""

    _fields_ = [("epoch", _u64)] + [(n, ctypes.c_uint32) for n in (
        "ws_ours", "peer_ws", "edge", "has_edge", "acked", "awnd", "has_ack", "pad")]


class Act(ctypes.Structure):
    """``struct act``: the activity epoch and the flows active in it and the one before."""

    _fields_ = [("epoch", _u64), ("cur", _u64), ("prev", _u64)]


def unit_ns() -> int:
    """One stamp unit, ns."""
    return 1 << UNIT_SHIFT


def object_path() -> str:
    """The compiled datapath, compiled first when it is not in nslab's cache.

    Raises:
        BpfError: it cannot be built (the message names the missing compiler or header and
            its Debian package).
    """
    try:
        return build(PACER_BPF)
    except NativeError as e:
        raise BpfError(str(e)) from e


class _TcHook(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("ifindex", ctypes.c_int),
                ("attach_point", ctypes.c_int), ("parent", ctypes.c_uint32)]


class _TcOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("prog_fd", ctypes.c_int), ("flags", ctypes.c_uint32),
                ("prog_id", ctypes.c_uint32), ("handle", ctypes.c_uint32),
                ("priority", ctypes.c_uint32)]


class _TestRunOpts(ctypes.Structure):  # struct bpf_test_run_opts (libbpf's bpf.h)
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p),
                ("data_out", ctypes.c_void_p), ("data_size_in", ctypes.c_uint32),
                ("data_size_out", ctypes.c_uint32), ("ctx_in", ctypes.c_void_p),
                ("ctx_out", ctypes.c_void_p), ("ctx_size_in", ctypes.c_uint32),
                ("ctx_size_out", ctypes.c_uint32), ("retval", ctypes.c_uint32),
                ("repeat", ctypes.c_int), ("duration", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32),
                ("batch_size", ctypes.c_uint32)]


class _OpenOpts(ctypes.Structure):  # the fields up to pin_root_path (libbpf takes a prefix)
    _fields_ = [("sz", ctypes.c_size_t), ("object_name", ctypes.c_char_p),
                ("relaxed_maps", ctypes.c_bool), ("pin_root_path", ctypes.c_char_p)]


_lib: ctypes.CDLL | None = None


def _libbpf() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("bpf") or "libbpf.so.1"
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError as e:
            raise BpfError(f"libbpf not found ({e}): install Debian's libbpf1 (make setup)") \
                from e
        p, i = ctypes.c_void_p, ctypes.c_int
        sigs = {"bpf_object__open_file": (p, [ctypes.c_char_p, p]),
                "bpf_object__load": (i, [p]), "bpf_object__close": (None, [p]),
                "bpf_object__find_program_by_name": (p, [p, ctypes.c_char_p]),
                "bpf_object__find_map_by_name": (p, [p, ctypes.c_char_p]),
                "bpf_object__unpin_maps": (i, [p, ctypes.c_char_p]),
                "bpf_program__fd": (i, [p]), "bpf_map__fd": (i, [p]),
                "bpf_tc_hook_create": (i, [p]), "bpf_tc_hook_destroy": (i, [p]),
                "bpf_tc_attach": (i, [p, p]), "bpf_tc_detach": (i, [p, p]),
                "bpf_link_create": (i, [i, i, i, p]),
                "bpf_map_update_elem": (i, [i, p, p, _u64]),
                "bpf_map_lookup_elem": (i, [i, p, p]),
                "bpf_prog_test_run_opts": (i, [i, p]),
                "libbpf_get_error": (ctypes.c_long, [p])}
        for fn, (res, args) in sigs.items():
            f = getattr(lib, fn)
            f.restype, f.argtypes = res, args
        _lib = lib
    return _lib


def _check(rc: int, what: str) -> None:
    if rc < 0:
        e = -rc
        hint = {errno.EPERM: "needs root (CAP_BPF, CAP_NET_ADMIN)",
                errno.EINVAL: "the kernel refused it (no BPF, no cls_bpf, or the verifier)",
                errno.ENOENT: "no such object"}.get(e, os.strerror(e))
        raise BpfError(f"{what} failed: {os.strerror(e)} ({hint})")


_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MNT_DETACH = 2, 4, 8, 2
_BPF_FS_MAGIC = 0xCAFE4A11


def _on_bpffs(path: str) -> bool:
    st = (ctypes.c_long * 32)()   # struct statfs (120 bytes on 64-bit Linux): f_type first
    return _libc.statfs(path.encode(), st) == 0 and st[0] & 0xFFFFFFFF == _BPF_FS_MAGIC


_libc = ctypes.CDLL(None, use_errno=True)


def mount_bpffs(path: str) -> bool:
    """Make ``path`` a directory on a bpffs: mount a new instance there unless it is on one
    already (mount(2); in this mount namespace only: a lab VM's is its own). True when this
    mounted it (``Datapath.close`` unmounts it then).

    Raises:
        BpfError: the directory cannot be made, or mount failed (no CAP_SYS_ADMIN, or a
            kernel without bpffs).
    """
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise BpfError(f"cannot mount a bpffs at {path}: {e.strerror}") from e
    if _on_bpffs(path):
        return False
    if _libc.mount(b"nslab-pacer", path.encode(), b"bpf", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                   None) != 0:
        e = ctypes.get_errno()
        raise BpfError(f"cannot mount a bpffs at {path}: {os.strerror(e)} (CAP_SYS_ADMIN and "
                       "a kernel with CONFIG_BPF_SYSCALL)")
    return True


class Datapath:
    """The datapath on interface ``ifname`` of this network namespace, maps pinned in
    ``pin_dir`` (made if missing; a bpffs is mounted there unless it is on one:
    ``mount_bpffs``); ``attach`` says how its programs are attached: ``tcx`` or ``clsact``
    (module doc).

    Raises:
        BpfError: see the class; nothing stays attached or pinned after it.
    """

    def __init__(self, ifname: str, pin_dir: str):
        lib = _libbpf()
        path = object_path()
        try:
            self.ifindex = socket.if_nametoindex(ifname)
        except OSError as e:
            raise BpfError(f"no interface {ifname!r} in this namespace") from e
        self.lib, self.obj, self.attached, self.pin_dir = lib, None, [], pin_dir.encode()
        self.links: list[int] = []
        self.mounted = mount_bpffs(pin_dir)
        try:
            opts = _OpenOpts(ctypes.sizeof(_OpenOpts), None, False, self.pin_dir)
            obj = lib.bpf_object__open_file(path.encode(), ctypes.byref(opts))
            if not obj or lib.libbpf_get_error(obj):
                raise BpfError(f"libbpf cannot open {path}")
            self.obj = obj
            _check(lib.bpf_object__load(obj), f"loading {os.path.basename(path)} (maps "
                                              f"pinned in {pin_dir}: it must be on a bpffs)")
            self.fds = {m: lib.bpf_map__fd(lib.bpf_object__find_map_by_name(obj, m.encode()))
                        for m in ("cfg", "peers", "dests", "hist", "flows", "act")}
            fds = {prog: lib.bpf_program__fd(lib.bpf_object__find_program_by_name(
                obj, prog.encode())) for prog in ("ingress", "egress")}
            self.attach = "tcx" if self._attach_tcx(fds) else "clsact"
            if self.attach == "clsact":
                self._attach_clsact(fds, ifname)
        except BpfError:
            self.close()
            raise

    def _attach_tcx(self, fds: dict[str, int]) -> bool:
        """Both programs as tcx links (``self.links``); False, with nothing attached, where
        the kernel has no tcx (EINVAL: an attach type it does not know).

        Raises:
            BpfError: the kernel has tcx and refused a link."""
        for prog, at in (("ingress", _BPF_TCX_INGRESS), ("egress", _BPF_TCX_EGRESS)):
            fd = self.lib.bpf_link_create(fds[prog], self.ifindex, at, None)
            if fd < 0 and not self.links and fd in (-errno.EINVAL, -errno.EOPNOTSUPP):
                return False
            _check(fd, f"attaching the {prog} program (tcx)")
            self.links.append(fd)
        return True

    def _attach_clsact(self, fds: dict[str, int], ifname: str) -> None:
        """Both programs on the clsact qdisc (made if missing: ``self.made_hook``).

        Raises:
            BpfError: tc refused."""
        lib = self.lib
        self.hook = _TcHook(ctypes.sizeof(_TcHook), self.ifindex,
                            _BPF_TC_INGRESS | _BPF_TC_EGRESS, 0)
        rc = lib.bpf_tc_hook_create(ctypes.byref(self.hook))
        if rc < 0 and rc != -errno.EEXIST:
            _check(rc, f"creating the clsact qdisc on {ifname}")
        self.made_hook = rc == 0
        for prog, point in (("ingress", _BPF_TC_INGRESS), ("egress", _BPF_TC_EGRESS)):
            hook = _TcHook(ctypes.sizeof(_TcHook), self.ifindex, point, 0)
            o = _TcOpts(ctypes.sizeof(_TcOpts), fds[prog], 0, 0, _HANDLE, _PRIORITY)
            _check(lib.bpf_tc_attach(ctypes.byref(hook), ctypes.byref(o)),
                   f"attaching the {prog} program to {ifname}")
            self.attached.append(hook)

    # -- maps ----------------------------------------------------------------------------
    def lookup(self, m: str, key: ctypes._CData, value: ctypes.Structure) -> ctypes.Structure:
        """Read map ``m`` at ``key`` into ``value`` and return it.

        Raises:
            BpfError: no such entry."""
        _check(self.lib.bpf_map_lookup_elem(self.fds[m], ctypes.byref(key), ctypes.byref(value)),
               f"reading map {m}")
        return value

    def update(self, m: str, key: ctypes._CData, value: ctypes.Structure) -> None:
        """Write ``value`` at ``key`` of map ``m`` (``cfg``, ``peers``, ``dests``, ``flows``,
        ``act``), as the C structures above."""
        _check(self.lib.bpf_map_update_elem(self.fds[m], ctypes.byref(key), ctypes.byref(value),
                                            0), f"updating map {m}")

    def set_cfg(self, cfg: Cfg) -> None:
        """Write the policy and clock anchor (one map update)."""
        self.update("cfg", ctypes.c_uint32(0), cfg)

    def set_peer(self, ip: str, idx: int, synced: bool) -> None:
        """Peer ``ip`` (IPv4) is destination ``idx`` (< ``MAX_PEERS``); ``synced``: its and this
        VM's clocks are good enough to act on its echoes."""
        if not 0 <= idx < MAX_PEERS:
            raise ValueError(f"peer index {idx} outside 0..{MAX_PEERS - 1}")
        key = ctypes.c_uint32(struct.unpack("=I", socket.inet_aton(ip))[0])
        self.update("peers", key, Peer(idx, int(synced)))

    def dest(self, idx: int) -> Dest:
        """Destination ``idx``'s state and counters now."""
        d = Dest()
        _check(self.lib.bpf_map_lookup_elem(self.fds["dests"], ctypes.byref(ctypes.c_uint32(idx)),
                                            ctypes.byref(d)), "reading map dests")
        return d

    def histogram(self, idx: int, kind: int) -> list[int]:
        """Destination ``idx``'s counts per bucket of histogram ``kind`` (``BUCKETS`` long)."""
        v = (_u64 * BUCKETS)()
        _check(self.lib.bpf_map_lookup_elem(self.fds["hist"],
                                            ctypes.byref(ctypes.c_uint32(idx * KINDS + kind)),
                                            ctypes.byref(v)), "reading map hist")
        return list(v)

    def test_run(self, prog: str, frame: bytes) -> tuple[int, bytes]:
        """Run program ``prog`` (``ingress`` or ``egress``) once on Ethernet frame ``frame``
        with the maps as they are (BPF_PROG_TEST_RUN, bpf(2)): its verdict (TC_ACT_*) and the
        frame as it left.

        Raises:
            BpfError: the kernel refused the run.
        """
        fd = self.lib.bpf_program__fd(self.lib.bpf_object__find_program_by_name(
            self.obj, prog.encode()))
        buf_in = ctypes.create_string_buffer(frame, len(frame))
        buf_out = ctypes.create_string_buffer(len(frame) + 256)
        o = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts),
                         data_in=ctypes.cast(buf_in, ctypes.c_void_p),
                         data_out=ctypes.cast(buf_out, ctypes.c_void_p),
                         data_size_in=len(frame), data_size_out=len(buf_out), repeat=1)
        _check(self.lib.bpf_prog_test_run_opts(fd, ctypes.byref(o)), f"test run of {prog}")
        return o.retval, buf_out.raw[:o.data_size_out]

    def close(self) -> None:
        """Detach both programs (close their tcx links, or detach them from clsact and remove
        the qdisc if this made it), unpin the maps and free the object. Safe to call twice."""
        lib = self.lib
        for fd in self.links:
            os.close(fd)
        self.links = []
        for hook in self.attached:
            o = _TcOpts(ctypes.sizeof(_TcOpts), 0, 0, 0, _HANDLE, _PRIORITY)
            lib.bpf_tc_detach(ctypes.byref(hook), ctypes.byref(o))
        self.attached = []
        if getattr(self, "made_hook", False):
            lib.bpf_tc_hook_destroy(ctypes.byref(self.hook))
            self.made_hook = False
        if self.obj:
            lib.bpf_object__unpin_maps(self.obj, self.pin_dir)
            lib.bpf_object__close(self.obj)
            self.obj = None
        if self.mounted:
            _libc.umount2(self.pin_dir, _MNT_DETACH)
            self.mounted = False


def probe() -> tuple[bool, str]:
    """Whether the datapath loads on this kernel (the object through the verifier, its maps
    pinned in a throw-away bpffs mounted under /tmp and removed), for ``nslab doctor``: (ok,
    what was seen)."""
    import tempfile
    try:
        lib = _libbpf()
        path = object_path()
    except BpfError as e:
        return False, str(e)
    with tempfile.TemporaryDirectory(prefix="nslab-bpf-") as pins:
        mounted = False
        obj = None
        try:
            mounted = mount_bpffs(pins)
            opts = _OpenOpts(ctypes.sizeof(_OpenOpts), None, False, pins.encode())
            obj = lib.bpf_object__open_file(path.encode(), ctypes.byref(opts))
            if not obj or lib.libbpf_get_error(obj):
                return False, f"libbpf cannot open {path}"
            _check(lib.bpf_object__load(obj), "loading the pacer's BPF object")
            return True, "the pacer's tc programs load (libbpf, cls_bpf)"
        except BpfError as e:
            return False, str(e)
        finally:
            if obj:
                lib.bpf_object__unpin_maps(obj, pins.encode())
                lib.bpf_object__close(obj)
            if mounted:
                _libc.umount2(pins.encode(), _MNT_DETACH)
