"""nslab's compiled parts, compiled at first use from the C sources shipped inside the package
into a cache directory, and the one place that says how each is compiled.

Why at first use and not by the build backend (a platform wheel): the VM clock preload
interposes glibc's own symbols and picks the calls to wrap by the glibc it is compiled
against (``vmclock.c``: the clock-naming waits exist from glibc 2.30), the datagram path links
the machine's libcrypto, and a BPF object (the pacer's datapath) is compiled for the kernel it
will be loaded into. A wheel built on one machine fits none of those on another; compiled on
the machine that runs the lab, they fit it. So ``pip install`` never needs a compiler (the
parts without root, ``nslab schema``, ``run --check``, ``report`` and a TUI replay, work
anywhere), and wheel, sdist, ``git+`` and an editable checkout take one path. The first lab
pays for it once (one to two seconds per part on a 2-core machine); ``nslab doctor`` builds
them and says where they came from.

Where: ``$NSLAB_CACHE`` when set; as root ``/var/cache/nslab`` (``sudo -E`` would otherwise
leave root's files in a user's ``~/.cache``); else ``$XDG_CACHE_HOME/nslab`` or
``~/.cache/nslab``. Each part lives in ``<cache>/<name>-<key>/``, ``key`` a hash of its
sources, compiler and flags: an edited source gets a new build, and several installed versions
share one cache. Processes that build the same part at once (pytest-xdist workers, a lab's
agents) take a lock per part; the library is written under a temporary name and renamed.

A part that cannot be built raises ``NativeError`` naming what is missing: the compiler, a
header or a library, and the Debian package that brings it.

Adding a part: one more ``Native`` in ``NATIVES`` (or beside the code that loads it, as
``lab.vmclock.PRELOAD``), its sources in this directory (``pyproject.toml`` ships ``*.c`` and
``*.h`` here and in ``vmclock/``), and its loader calls ``build(PART)`` for the path; a BPF
object is compiled with clang and not linked (``PACER_BPF``, loaded by ``agents.bpf``).

``lab.native.PARTS`` lists every part (``nslab doctor``, ``make setup``).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["NATIVES", "PACER", "PACER_BPF", "PROBEIO", "Native", "NativeError", "build", "built",
           "cache_dir"]

# header (or its directory, ending in /), library (-lNAME) or compiler -> Debian package;
# a part's own ``packages`` come first
PACKAGES = {"gcc": "gcc", "clang": "clang", "cc": "gcc", "openssl/": "libssl-dev",
            "-lcrypto": "libssl-dev", "-lssl": "libssl-dev", "linux/": "linux-libc-dev",
            "asm/": "linux-libc-dev", "bpf/": "libbpf-dev", "-lbpf": "libbpf-dev"}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""Where nslab's top-level packages lie (site-packages, or the checkout)."""
LIBC_DEV = "libc6-dev"  # every other system header (stdio.h, sys/socket.h, ...)
_done: dict[tuple[str, str], str] = {}  # (name, cache) -> path: no hashing per VM process


class NativeError(RuntimeError):
    """A compiled part could not be built; the message names what is missing and the Debian
    package that brings it, ``fix`` the command alone (``""`` when not known)."""

    def __init__(self, message: str, fix: str = ""):
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class Native:
    """One compiled part: ``compiler flags sources -o output libs``, run in its sources'
    directory.

    Attributes:
        name: short name (cache directory, ``nslab doctor``'s row: ``vmclock``, ``probeio``).
        what: what it is, for messages ("the VM clock preload").
        needed_by: what cannot run without it (``nslab doctor``).
        directory: the directory of the sources, relative to where nslab's packages are
            installed (``ROOT``: site-packages, or the checkout), or absolute.
        sources: files compiled, relative to that directory.
        output: file name of the result (``libnslabclock.so``).
        depends: files included by the sources (they change the cache key, not the command).
        compiler: the compiler command.
        flags: options before the sources.
        libs: options after them (``-lcrypto``).
        packages: header, header directory (``openssl/``), ``-lNAME`` or compiler -> the
            Debian package that brings it, for the error message.
    """

    name: str
    what: str
    needed_by: str
    directory: str
    sources: tuple[str, ...]
    output: str
    depends: tuple[str, ...] = ()
    compiler: str = "gcc"
    flags: tuple[str, ...] = ("-O2", "-Wall", "-Wextra", "-shared", "-fPIC")
    libs: tuple[str, ...] = ()
    packages: Mapping[str, str] = field(default_factory=dict)

    def source_dir(self) -> str:
        """The directory of the sources (inside the installed packages or the checkout)."""
        return os.path.join(ROOT, self.directory)

    def command(self, output: str) -> list[str]:
        """The compiler's argv that writes ``output``."""
        return [self.compiler, *self.flags, *self.sources, "-o", output, *self.libs]

    def key(self) -> str:
        """16 hex digits of a hash of the sources, the command and the machine's architecture
        (not its glibc: a cache built on one machine may be carried to another, with
        ``NSLAB_CACHE``, as an offline bundle does)."""
        h = hashlib.sha256(" ".join([*self.command("OUT"), platform.machine()]).encode())
        for name in (*self.sources, *self.depends):
            with open(os.path.join(self.source_dir(), name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
        return h.hexdigest()[:16]

    def path(self) -> str:
        """Where the built part lies in the cache (whether built or not)."""
        return os.path.join(cache_dir(), f"{self.name}-{self.key()}", self.output)


PROBEIO = Native("probeio", "the agent's compiled datagram path", "the agents",
                 "agents/native", ("probeio.c",), "libnslabprobeio.so", depends=("stamp.h",),
                 libs=("-lcrypto",))
PACER = Native("pacer", "the pacer's compiled control loop", "the pacers", "agents/native",
               ("pacer.c",), "libnslabpacer.so", depends=("stamp.h",),
               flags=(*Native.flags, "-pthread"), libs=("-lm",))
PACER_BPF = Native("pacer_bpf", "the pacer's BPF datapath", "the pacers' kernel datapath (they "
                   "run datapath probe without it)", "agents/native", ("pacer.bpf.c",),
                   "pacer.bpf.o", compiler="clang",
                   flags=("-O2", "-g", "-target", "bpf", "-Wall", "-Werror",
                          f"-I/usr/include/{platform.machine()}-linux-gnu", "-c"),
                   packages={"clang": "clang", "bpf/": "libbpf-dev"})
"""Compiled for the BPF target (not linked) against libbpf's headers (``agents.bpf`` loads
it); the multiarch include directory brings ``asm/types.h``."""
NATIVES = (PROBEIO, PACER, PACER_BPF)
"""The agents' compiled parts (the VM clock preload is the lab's: ``lab.vmclock.PRELOAD``)."""


def cache_dir() -> str:
    """The cache directory (module doc: ``NSLAB_CACHE``, ``/var/cache/nslab`` as root,
    ``$XDG_CACHE_HOME/nslab`` or ``~/.cache/nslab``); not created here."""
    if os.environ.get("NSLAB_CACHE"):
        return os.environ["NSLAB_CACHE"]
    if os.geteuid() == 0:
        return "/var/cache/nslab"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nslab")


def built(part: Native) -> str | None:
    """The part's path when it is built already, else None."""
    path = part.path()
    return path if os.path.exists(path) else None


def build(part: Native) -> str:
    """The part's path in the cache, compiled first when it is not there.

    Returns:
        The absolute path of the built file.

    Raises:
        NativeError: the compiler, a header or a library is missing (the message names it and
            its Debian package), the compile failed otherwise (its output), or the cache
            directory cannot be written.
    """
    done = _done.get((part.name, cache_dir()))
    if done and os.path.exists(done):
        return done
    path = part.path()
    if not os.path.exists(path):
        _compile(part, path)
    _done[(part.name, cache_dir())] = path
    return path


def _compile(part: Native, path: str) -> None:
    if shutil.which(part.compiler) is None:
        fix = f"apt-get install {_package(part, part.compiler)}"
        raise NativeError(f"building {part.what} needs the compiler {part.compiler}, which is "
                          f"not in PATH: {fix} (`make setup` installs it)", fix)
    out_dir = os.path.dirname(path)
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = open(os.path.join(out_dir, ".lock"), "w")
    except OSError as e:
        raise NativeError(f"cannot write the cache directory {out_dir} for {part.what} ({e}); "
                          "set NSLAB_CACHE to a writable directory") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path):        # built by another process while this one waited
            return
        fd, tmp = tempfile.mkstemp(prefix=f".{part.output}.", dir=out_dir)
        os.close(fd)
        try:
            r = subprocess.run(part.command(tmp), cwd=part.source_dir(), capture_output=True,
                               text=True)
            if r.returncode != 0:
                raise NativeError(*_explain(part, r.stderr))
            os.chmod(tmp, 0o755)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _package(part: Native, needed: str) -> str:
    """The Debian package of a compiler, header or ``-lNAME``."""
    for table in (part.packages, PACKAGES):
        if needed in table:
            return table[needed]
        for prefix, pkg in table.items():
            if prefix.endswith("/") and needed.startswith(prefix):
                return pkg
    return LIBC_DEV if needed.endswith(".h") else f"the package with {needed}"


def _explain(part: Native, stderr: str) -> tuple[str, str]:
    """The error message for a failed compile, what is missing and its package, else the
    compiler's own first lines; and the fix (the install command, or ``""``)."""
    cmd = " ".join(part.command(part.output))
    header = re.search(r"fatal error: ([\w./+-]+\.h): No such file", stderr)
    lib = re.search(r"cannot find (-l[\w+.-]+)", stderr)
    missing = header.group(1) if header else lib.group(1) if lib else None
    if missing:
        kind = "the header" if header else "the library"
        fix = f"apt-get install {_package(part, missing)}"
        return (f"building {part.what} failed: {kind} {missing} is missing: {fix} (`make "
                f"setup` installs it); command: {cmd} in {part.source_dir()}"), fix
    detail = "\n".join(stderr.strip().splitlines()[:12])
    return f"building {part.what} failed ({cmd} in {part.source_dir()}):\n{detail}", ""
