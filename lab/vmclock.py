"""What the lab does to every process it starts in a VM so that it lives on the VM clock and
cannot touch the machine's: preload ``vmclock`` (compiled at first use from ``vmclock/vmclock.c``
into nslab's cache, ``agents.native``), drop the
capabilities a VM has no use for, and tell which programs bypass the preload.

Capabilities dropped (from the bounding, effective, permitted, inheritable and ambient sets,
before exec, so no child of the process can regain them; capabilities(7)):

- ``CAP_SYS_TIME`` (settimeofday, clock_settime, adjtimex writes: the machine's clock, under
  every other VM; the VM's own clock is disciplined through the preload instead),
- ``CAP_SYS_MODULE`` (kernel modules are the machine's), ``CAP_SYS_BOOT`` (reboot, kexec),
  ``CAP_SYS_RAWIO`` (ioperm/iopl, raw device I/O), ``CAP_WAKE_ALARM`` (alarms on the
  machine's real-time clock).

Kept: ``CAP_SYS_ADMIN`` (Mininet's ``mnexec`` enters the VM's namespace with setns),
``CAP_NET_ADMIN``/``CAP_NET_RAW`` (the guest owns its NIC and qdisc; tcpdump, ping), the rest
of root's set (files of the lab's state directory, cgroup membership).
"""
from __future__ import annotations

import ctypes

from agents.native import Native, NativeError, build
from lab.errors import LabError

PRELOAD = Native("vmclock", "the VM clock preload", "every lab (the VMs' clocks)", "vmclock",
                 ("vmclock.c",), "libnslabclock.so", flags=(*Native.flags, "-Wno-nonnull-compare"),
                 libs=("-ldl", "-lm", "-lpthread"))
# linux/capability.h
DROPPED_CAPS = {"CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_BOOT": 22,
                "CAP_SYS_TIME": 25, "CAP_WAKE_ALARM": 35}
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_VERSION_3 = 0x20080522


def library() -> str:
    """The preload's path in nslab's cache, compiled at first use (``agents.native.build``).

    Raises:
        LabError: it cannot be built (the message names the missing compiler or header and its
            Debian package).
    """
    try:
        return build(PRELOAD)
    except NativeError as e:
        raise LabError(str(e)) from e


def preload_env(env: dict) -> dict:
    """``env`` with ``vmclock`` first in ``LD_PRELOAD``."""
    lib = library()
    others = [p for p in env.get("LD_PRELOAD", "").split() if p and p != lib]
    return {**env, "LD_PRELOAD": " ".join([lib, *others])}


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


_libc = ctypes.CDLL(None, use_errno=True)


def drop_capabilities() -> None:
    """Drop ``DROPPED_CAPS`` from this process for good (run in a child before exec).

    Raises:
        OSError: prctl or capset failed.
    """
    for cap in DROPPED_CAPS.values():
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    head, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if _libc.capget(ctypes.byref(head), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for cap in DROPPED_CAPS.values():
        mask = ~(1 << (cap % 32)) & 0xFFFFFFFF
        d = data[cap // 32]
        d.effective &= mask
        d.permitted &= mask
        d.inheritable &= mask
    if _libc.capset(ctypes.byref(head), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def bypass_reason(path: str) -> str | None:
    """Why the program at ``path`` (an ELF file) would not see the VM clock, or None: it is
    statically linked (no ELF interpreter: nothing is preloaded) or a Go program (the Go
    runtime reads the vDSO itself, not libc). Such programs see the machine's true time.
    Non-ELF files (scripts) are judged by their interpreter, so they give None here."""
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 22)
    except OSError:
        return None
    if data[:4] != b"\x7fELF":
        return None
    if b"Go build ID" in data or b".go.buildinfo" in data or b"\xff Go buildinf:" in data:
        return "a Go program (it reads the time from the vDSO, not from libc)"
    if not _has_interpreter(data):
        return "statically linked (nothing can be preloaded)"
    return None


def _has_interpreter(elf: bytes) -> bool:
    """True when the ELF image has a PT_INTERP program header (64-bit little-endian only;
    anything else is assumed dynamic)."""
    if elf[4] != 2 or elf[5] != 1:
        return True
    phoff = int.from_bytes(elf[32:40], "little")
    phentsize = int.from_bytes(elf[54:56], "little")
    phnum = int.from_bytes(elf[56:58], "little")
    for i in range(phnum):
        off = phoff + i * phentsize
        if off + 4 <= len(elf) and int.from_bytes(elf[off:off + 4], "little") == 3:  # PT_INTERP
            return True
    return False
