"""The TCP mesh between the ranks of a collective job.

Every pair of ranks shares ``conns_per_peer`` TCP connections. The higher rank connects, the
lower rank accepts, so the mesh forms without deadlock whatever order the workers start in;
a connector retries refused connections until the connect timeout (peers start at different
times). Each new connection carries a 20-byte hello both ways (magic ``NSLB``, version, world
size, rank, connection index, 8-byte job key), so a worker never talks to another job's rank.

Transfers are byte copies between numpy buffers: ``Mesh.exchange`` progresses any set of sends
and receives to several peers at once on non-blocking sockets (``selectors``), so a ring step
that sends right while receiving left cannot deadlock on full socket buffers. A message's
bytes travel in frames of at most ``FRAME_BYTES`` (64 KiB), each with a 16-byte header
(``!IQI``: the message's sequence number between the two ranks, the offset, the length), so
the receiver places them whatever connection they came on. The mesh's balancer
(``workloads.lb.balancer``) chooses the connections: by default (``Even``) a message of n bytes
is cut into ``conns_per_peer`` contiguous parts (part c is bytes ``[c*n//k, (c+1)*n//k)``),
one per connection; ``Ethereal`` and ``RepsLb`` steer by path, read ``TCP_INFO`` while data
is in flight (acknowledged bytes, retransmissions, timeouts) and keep at most two frames
unsent in the kernel (``TCP_NOTSENT_LOWAT``) so a failed path's unsent frames can move. A
frame of a message the receiver has not posted yet waits in its socket. Messages between two
ranks are matched in the order they were posted. Every wait is bounded by the mesh's
deadline.

Path hints (both off by default), for load balancers that steer flows by their 5-tuple or DSCP:

* source port: the connection c from rank r to a lower rank p is bound to local port
  ``src_port_base + (r * world + p) * conns_per_peer + c`` (unique per job, so several ranks
  can share one address);
* DSCP: connection c is marked with ``dscp[c % len(dscp)]`` (``IP_TOS``/``IPV6_TCLASS`` =
  DSCP << 2) on both of its ends.

Sources: the hello/mesh design follows the bootstrap of NCCL and gloo (full TCP mesh, lower
rank listens); ``socket(7)``, ``tcp(7)`` and ``ip(7)`` (``IP_TOS``) man pages.
"""
from __future__ import annotations

import errno
import hashlib
import os
import selectors
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from workloads.errors import (
    ConfigError,
    JobTimeoutError,
    PeerLostError,
    PeerUnreachableError,
)
from workloads.lb import tcpinfo
from workloads.lb.balancer import FRAME_BYTES, Even, split_bytes

if TYPE_CHECKING:
    from typing import Self

__all__ = ["Mesh", "PathHints", "format_address", "job_key", "parse_address", "split_bytes"]

_HELLO = struct.Struct("!4sBBHHH8s")
_MAGIC = b"NSLB"
_VERSION = 1
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
_FRAME = struct.Struct("!IQI")  # message sequence number, offset, length
_RETRY_S = 0.05
_LOST_ERRNOS = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def parse_address(text: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6addr]:port"`` -> ``(host, port)``.

    Raises:
        ValueError: no port, or a port outside 0..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"address {text!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"address {text!r}: port {port!r} is not a number") from None
    if not 0 <= p <= 65535:
        raise ValueError(f"address {text!r}: port {p} is outside 0..65535")
    return host, p


def format_address(host: str, port: int) -> str:
    """Inverse of ``parse_address`` (brackets IPv6 literals)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def job_key(job_id: str) -> bytes:
    """The 8-byte key of a job name carried in the hello (SHA-256 prefix)."""
    return hashlib.sha256(job_id.encode()).digest()[:8]


@dataclass(frozen=True)
class PathHints:
    """Per-connection hints that make flows steerable (see the module docstring).

    Attributes:
        src_port_base: first local port of the connector side, or None for ephemeral ports.
        dscp: DSCP code points (0..63) cycled over connection indices; empty for no marking.
    """

    src_port_base: int | None = None
    dscp: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for d in self.dscp:
            if not 0 <= d <= 63:
                raise ValueError(f"DSCP {d} is outside 0..63")
        if self.src_port_base is not None and not 1 <= self.src_port_base <= 65535:
            raise ValueError(f"source port base {self.src_port_base} is outside 1..65535")

    def src_port(self, rank: int, peer: int, conn: int, world: int, conns: int) -> int | None:
        """Local port of connection ``conn`` from ``rank`` to ``peer`` (None: ephemeral).

        Raises:
            ValueError: the port would exceed 65535.
        """
        if self.src_port_base is None:
            return None
        port = self.src_port_base + (rank * world + peer) * conns + conn
        if port > 65535:
            raise ValueError(f"source port base {self.src_port_base} too high: rank {rank} "
                             f"-> {peer} connection {conn} would need port {port} > 65535")
        return port

    def tos(self, conn: int) -> int | None:
        """The ``IP_TOS`` byte of connection ``conn`` (DSCP << 2), or None."""
        return self.dscp[conn % len(self.dscp)] << 2 if self.dscp else None


class _Frame:
    """A piece of one message on one connection: its 16-byte header (sequence number of the
    message between the two ranks, offset in it, length) and its bytes."""

    __slots__ = ("data", "hdr", "sent", "total")

    def __init__(self, seq: int, offset: int, data: memoryview):
        self.hdr = _FRAME.pack(seq, offset, len(data))
        self.data = data
        self.sent = 0
        self.total = _FRAME.size + len(data)


class _Msg:
    """A posted receive: where its bytes go and how many are still missing."""

    __slots__ = ("left", "view")

    def __init__(self, view: memoryview):
        self.view = view
        self.left = len(view)


class _Link:
    """One established TCP connection: frames queued to send, the frame being received, and
    what the balancer tracks (stream position written, frames not yet acknowledged)."""

    __slots__ = ("conn", "eof", "in_rto", "initiator", "mask", "parked", "peer", "retrans",
                 "rx_hdr", "rx_hlen", "rx_msg", "rx_view", "sendq", "sock", "unacked",
                 "written")

    def __init__(self, sock: socket.socket, peer: int, conn: int, initiator: bool):
        self.sock = sock
        self.peer = peer
        self.conn = conn
        self.initiator = initiator
        self.sendq: deque[_Frame] = deque()
        self.mask = 0
        self.rx_hdr = bytearray(_FRAME.size)
        self.rx_hlen = 0
        self.rx_view: memoryview | None = None
        self.rx_msg: _Msg | None = None
        self.parked = False  # holding the header of a message not posted yet
        self.eof = False  # the peer closed its side (after whole frames)
        self.written = _HELLO.size  # stream bytes written: the hello, then frames
        self.unacked: deque[tuple[int, int]] = deque()  # (stream end, retransmits then)
        self.retrans = 0
        self.in_rto = False


def _set_cc(sock: socket.socket, cc: str | None) -> None:
    if cc is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())


def _set_tos(sock: socket.socket, tos: int | None) -> None:
    if tos is None:
        return
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
    else:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)


def _frames(seq: int, view: memoryview, start: int, stop: int) -> list[_Frame]:
    """Bytes [start, stop) of message ``seq`` as frames of at most ``FRAME_BYTES``."""
    return [_Frame(seq, a, view[a:min(a + FRAME_BYTES, stop)])
            for a in range(start, stop, FRAME_BYTES)]


def _byte_view(arr: np.ndarray) -> memoryview:
    if not arr.flags.c_contiguous:
        raise ValueError("transfer buffers must be C-contiguous")
    return memoryview(arr.reshape(-1).view(np.uint8))


class Mesh:
    """TCP connections from one rank to every other rank of a job.

    Args:
        rank: this worker's rank, 0..world-1.
        addresses: ``(host, port)`` or ``"host:port"`` of every rank, in rank order
            (world = len(addresses)); this rank listens on ``addresses[rank]`` (port 0: any
            free port, see ``listen``).
        conns_per_peer: TCP connections between each pair of ranks (>= 1).
        hints: path hints (source ports, DSCP); none by default.
        cc: TCP congestion control of every connection (``TCP_CONGESTION``, tcp(7)); None:
            the system's default. One the kernel does not offer fails ``connect``.
        job_id: job name; ranks of different jobs refuse each other.
        connect_timeout: seconds ``connect`` may take (s).
        deadline: ``time.monotonic()`` value after which every wait fails with
            ``JobTimeoutError`` (None: no overall limit).
        balancer: which bytes of a message go on which connection to the peer
            (``workloads.lb.balancer``: ``Even``, the default, ``Ethereal``, ``RepsLb``).

    Raises:
        ValueError: bad rank, world, address or hint.

    Use as a context manager, or call ``close``. Not thread-safe: one thread per Mesh.
    """

    def __init__(self, rank: int, addresses: Sequence[str | tuple[str, int]], *,
                 conns_per_peer: int = 1, hints: PathHints | None = None, job_id: str = "",
                 connect_timeout: float = 10.0, deadline: float | None = None,
                 cc: str | None = None, balancer=None):
        self.addresses = [parse_address(a) if isinstance(a, str) else (a[0], int(a[1]))
                          for a in addresses]
        self.world = len(self.addresses)
        if self.world < 1:
            raise ValueError("a job needs at least one rank")
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside 0..{self.world - 1}")
        if conns_per_peer < 1:
            raise ValueError(f"conns_per_peer must be >= 1, not {conns_per_peer}")
        self.rank = rank
        self.conns_per_peer = conns_per_peer
        self.hints = hints or PathHints()
        self.cc = cc
        for p in range(rank):
            self.hints.src_port(rank, p, conns_per_peer - 1, self.world, conns_per_peer)
        self.job_id = job_id
        self.connect_timeout = connect_timeout
        self.deadline = deadline
        self._key = job_key(job_id)
        self._links: dict[int, list[_Link]] = {}
        self._listener: socket.socket | None = None
        self._sel = selectors.DefaultSelector()
        self._connected = False
        self.balancer = balancer or Even(conns_per_peer)
        peers = [p for p in range(self.world) if p != rank]
        self._tx_seq = dict.fromkeys(peers, 0)
        self._rx_seq = dict.fromkeys(peers, 0)
        self._posted: dict[int, dict[int, _Msg]] = {p: {} for p in peers}
        self._pool: dict[int, deque[_Frame]] = {p: deque() for p in peers}
        self._inflight = dict.fromkeys(peers, 0)
        self._rx_left = 0

    # -- set-up ---------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(graceful=exc_type is None)

    def addr(self, peer: int) -> str:
        """``host:port`` of rank ``peer`` (for messages)."""
        return format_address(*self.addresses[peer])

    def listen(self) -> tuple[str, int]:
        """Bind and listen on this rank's address; returns the bound ``(host, port)``.

        Raises:
            OSError: the address cannot be bound (in use, not local).
        """
        if self._listener is None:
            host, port = self.addresses[self.rank]
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                      flags=socket.AI_PASSIVE)[0]
            sock = socket.socket(info[0], socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(info[4])
                sock.listen(max(128, self.world * self.conns_per_peer))
                sock.setblocking(False)
            except OSError:
                sock.close()
                raise
            self._listener = sock
            self.addresses[self.rank] = (host, sock.getsockname()[1])
        return self.addresses[self.rank]

    def _hello(self, conn: int) -> bytes:
        return _HELLO.pack(_MAGIC, _VERSION, 0, self.world, self.rank, conn, self._key)

    def _check_hello(self, data: bytes) -> tuple[int, int] | str:
        """``(rank, conn)`` of a valid hello, else the reason it is not."""
        magic, version, _, world, rank, conn, key = _HELLO.unpack(data)
        if magic != _MAGIC or version != _VERSION:
            return f"not an nslab worker (magic {magic!r}, version {version})"
        if key != self._key:
            return "a rank of another job"
        if world != self.world:
            return f"a rank of a {world}-rank job, this one has {self.world}"
        if not 0 <= rank < self.world or not 0 <= conn < self.conns_per_peer:
            return f"rank {rank} connection {conn}, out of range"
        return rank, conn

    def connect(self, addresses: Sequence[str | tuple[str, int]] | None = None) -> None:
        """Establish all connections (listening first if ``listen`` was not called).

        Args:
            addresses: replace the peer addresses first (e.g. after every rank of an
                in-process test listened on port 0); this rank's own entry is ignored.

        Raises:
            PeerUnreachableError: some connections were not established within
                ``connect_timeout`` (``peers`` lists the ranks missing).
            JobTimeoutError: the job deadline passed first.
            ConfigError: a peer answered as another rank, or a source port is unusable.
        """
        if addresses is not None:
            own = self.addresses[self.rank]
            self.addresses = [parse_address(a) if isinstance(a, str) else (a[0], int(a[1]))
                              for a in addresses]
            if len(self.addresses) != self.world:
                raise ValueError(f"{len(addresses)} addresses for a {self.world}-rank job")
            self.addresses[self.rank] = own
        self.listen()
        try:
            self._connect()
        except BaseException:
            self.close(graceful=False)
            raise
        self._connected = True

    def _connect(self) -> None:
        k = self.conns_per_peer
        start = time.monotonic()
        limit = start + self.connect_timeout
        if self.deadline is not None:
            limit = min(limit, self.deadline)
        # outgoing: (peer, conn) -> [socket or None, next attempt time, last error, buffer]
        out: dict[tuple[int, int], list] = {(p, c): [None, start, "not tried", b""]
                                            for p in range(self.rank) for c in range(k)}
        incoming = {(p, c) for p in range(self.rank + 1, self.world) for c in range(k)}
        pending_in: dict[socket.socket, bytes] = {}
        rejected: list[str] = []
        sel = self._sel
        assert self._listener is not None
        sel.register(self._listener, selectors.EVENT_READ, ("listen", None))

        def fail_out(key: tuple[int, int], why: str) -> None:
            st = out[key]
            if st[0] is not None:
                sel.unregister(st[0])
                st[0].close()
            st[0], st[1], st[2], st[3] = None, time.monotonic() + _RETRY_S, why, b""

        def attempt(key: tuple[int, int]) -> None:
            peer, conn = key
            host, port = self.addresses[peer]
            try:
                info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            except OSError as e:
                out[key][1:3] = [time.monotonic() + _RETRY_S, f"address lookup: {e}"]
                return
            sock = socket.socket(info[0], socket.SOCK_STREAM)
            try:
                _set_tos(sock, self.hints.tos(conn))
                _set_cc(sock, self.cc)
                sport = self.hints.src_port(self.rank, peer, conn, self.world, k)
                if sport is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind(("::" if info[0] == socket.AF_INET6 else "0.0.0.0", sport))
            except OSError as e:
                sock.close()
                out[key][1:3] = [time.monotonic() + _RETRY_S, f"socket options (DSCP, "
                                                               f"congestion control, source "
                                                               f"port): {e}"]
                return
            sock.setblocking(False)
            err = sock.connect_ex(info[4])
            if err not in (0, errno.EINPROGRESS):
                sock.close()
                out[key][1:3] = [time.monotonic() + _RETRY_S, os.strerror(err)]
                return
            out[key][0] = sock
            if out[key][2] == "not tried":
                out[key][2] = "no answer"
            sel.register(sock, selectors.EVENT_WRITE, ("out", key))

        try:
            while any(st is not True for st in out.values()) or incoming:
                now = time.monotonic()
                if now >= limit:
                    self._connect_failed(out, incoming, rejected, now - start)
                wake = limit
                for key, st in out.items():
                    if st is not True and st[0] is None:
                        if st[1] <= now:
                            attempt(key)
                        if st[0] is None:
                            wake = min(wake, st[1])
                for skey, ev in sel.select(max(0.0, wake - time.monotonic())):
                    kind, key = skey.data
                    sock = skey.fileobj
                    if kind == "listen":
                        self._accept_all(pending_in)
                    elif kind == "in":
                        self._read_hello_in(sock, pending_in, incoming, rejected)
                    elif ev & selectors.EVENT_WRITE:
                        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                        if err:
                            fail_out(key, os.strerror(err))
                            continue
                        try:
                            sock.sendall(self._hello(key[1]))
                        except OSError as e:
                            fail_out(key, str(e))
                            continue
                        sel.modify(sock, selectors.EVENT_READ, ("out", key))
                    else:
                        st = out[key]
                        try:
                            data = sock.recv(_HELLO.size - len(st[3]))
                        except OSError as e:
                            fail_out(key, str(e))
                            continue
                        if not data:
                            fail_out(key, f"rank {key[0]} closed the connection during the "
                                          "handshake (another job, or a world-size mismatch?)")
                            continue
                        st[3] += data
                        if len(st[3]) < _HELLO.size:
                            continue
                        got = self._check_hello(st[3])
                        if got != key:
                            raise ConfigError(
                                f"rank {self.rank}: {self.addr(key[0])} should be rank {key[0]} "
                                f"(connection {key[1]}) of job {self.job_id!r} but answered as "
                                f"{_describe(got)}",
                                peers=[key[0]])
                        sel.unregister(sock)
                        self._add_link(sock, key[0], key[1], initiator=True)
                        out[key] = True
        finally:
            for skey in list(sel.get_map().values()):
                sel.unregister(skey.fileobj)
            for sock in pending_in:
                sock.close()
            for st in out.values():
                if st is not True and st[0] is not None:
                    st[0].close()
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    def _accept_all(self, pending_in: dict[socket.socket, bytes]) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError:
                return
            sock.setblocking(False)
            pending_in[sock] = b""
            self._sel.register(sock, selectors.EVENT_READ, ("in", None))

    def _read_hello_in(self, sock: socket.socket, pending_in: dict[socket.socket, bytes],
                       incoming: set[tuple[int, int]], rejected: list[str]) -> None:
        def drop(why: str | None) -> None:
            self._sel.unregister(sock)
            del pending_in[sock]
            sock.close()
            if why:
                rejected.append(why)

        try:
            data = sock.recv(_HELLO.size - len(pending_in[sock]))
        except OSError:
            drop(None)
            return
        if not data:
            drop(None)
            return
        pending_in[sock] += data
        if len(pending_in[sock]) < _HELLO.size:
            return
        got = self._check_hello(pending_in[sock])
        try:
            remote = format_address(*sock.getpeername()[:2])
        except OSError:
            remote = "?"
        if isinstance(got, str):
            drop(f"refused {remote}: {got}")
            return
        if got not in incoming:
            drop(f"refused {remote}: unexpected rank {got[0]} connection {got[1]}")
            return
        try:
            _set_tos(sock, self.hints.tos(got[1]))
            _set_cc(sock, self.cc)
            sock.sendall(self._hello(got[1]))
        except OSError:
            drop(None)
            return
        self._sel.unregister(sock)
        del pending_in[sock]
        incoming.discard(got)
        self._add_link(sock, got[0], got[1], initiator=False)

    def _add_link(self, sock: socket.socket, peer: int, conn: int, initiator: bool) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.balancer.poll_s is not None:  # unsent bytes stay here, movable
            sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, 2 * FRAME_BYTES)
        links = self._links.setdefault(peer, [None] * self.conns_per_peer)  # type: ignore[list-item]
        links[conn] = _Link(sock, peer, conn, initiator)

    def _connect_failed(self, out: dict, incoming: set, rejected: list[str],
                        elapsed: float) -> None:
        problems = []
        peers = set()
        for (peer, conn), st in sorted(out.items()):
            if st is not True:
                peers.add(peer)
                problems.append(f"cannot connect to rank {peer} at {self.addr(peer)} "
                                f"(connection {conn}: {st[2]})")
        for peer in sorted({p for p, _ in incoming}):
            peers.add(peer)
            n = sum(1 for p, _ in incoming if p == peer)
            problems.append(f"rank {peer} ({self.addr(peer)}) did not connect "
                            f"({n} of {self.conns_per_peer} connections missing)")
        if rejected:
            problems.append("refused: " + "; ".join(rejected[:3]))
        msg = (f"rank {self.rank}: mesh incomplete after {elapsed:.1f} s: "
               + "; ".join(problems))
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise JobTimeoutError(msg + " (job timeout)", peers)
        raise PeerUnreachableError(msg, peers)

    # -- transfers ------------------------------------------------------------------------

    def flows(self) -> list[dict]:
        """The established connections: ``peer``, ``conn``, ``local``/``remote``
        (``host:port``), ``initiator`` (this end connected) and ``dscp`` (or None)."""
        rows = []
        for peer in sorted(self._links):
            for ln in self._links[peer]:
                try:
                    local = format_address(*ln.sock.getsockname()[:2])
                    remote = format_address(*ln.sock.getpeername()[:2])
                except OSError:
                    local = remote = "?"
                tos = self.hints.tos(ln.conn)
                rows.append({"peer": peer, "conn": ln.conn, "local": local, "remote": remote,
                             "initiator": ln.initiator,
                             "dscp": None if tos is None else tos >> 2})
        return rows

    def sockets(self, peer: int) -> list[socket.socket]:
        """The connections to ``peer``, by connection index (for inspection in tests)."""
        return [ln.sock for ln in self._links[peer]]

    def exchange(self, sends: Iterable[tuple[int, np.ndarray]] = (),
                 recvs: Iterable[tuple[int, np.ndarray]] = (), label: str = "transfer") -> None:
        """Send and receive concurrently; return when every transfer is complete.

        Args:
            sends: ``(peer, array)`` pairs; the array's bytes are sent to ``peer``, cut over
                the peer's connections by the mesh's balancer.
            recvs: ``(peer, array)`` pairs; ``array.nbytes`` bytes from ``peer`` are written
                into ``array`` (C-contiguous, writable).
            label: what the transfer is, for error messages (e.g. "all_reduce step 2").

        Several messages to or from one peer are matched in list order; the receiver must
        post the same sizes in the same order. Empty arrays are skipped.

        Raises:
            PeerLostError: a connection closed or reset (``peers``: that rank).
            JobTimeoutError: the deadline passed (``peers``: ranks with transfers pending).
            ValueError: a peer is this rank or out of range, or a buffer is not contiguous.
        """
        if not self._connected:
            raise RuntimeError("Mesh.connect() has not completed")
        out: list[tuple[int, memoryview]] = []
        for items, is_send in ((sends, True), (recvs, False)):
            for peer, arr in items:
                if peer == self.rank or not 0 <= peer < self.world:
                    raise ValueError(f"rank {self.rank} cannot transfer with rank {peer}")
                if arr.nbytes == 0:
                    continue
                view = _byte_view(arr)
                if is_send:
                    out.append((peer, view))
                    continue
                seq = self._rx_seq[peer]
                self._rx_seq[peer] += 1
                self._posted[peer][seq] = _Msg(view)
                self._rx_left += 1
                for ln in self._links[peer]:
                    ln.parked = False
        segments = (None if self.balancer.dynamic else
                    self.balancer.split([(p, len(v)) for p, v in out], time.monotonic()))
        for i, (peer, view) in enumerate(out):
            seq = self._tx_seq[peer]
            self._tx_seq[peer] += 1
            if segments is None:
                self._pool[peer].extend(_frames(seq, view, 0, len(view)))
            else:
                for conn, a, b in segments[i]:
                    self._links[peer][conn].sendq.extend(_frames(seq, view, a, b))
        if out or self._rx_left:
            self._progress(label)

    def _progress(self, label: str) -> None:
        sel = self._sel
        poll_s = self.balancer.poll_s
        next_poll = time.monotonic()
        links = [ln for lns in self._links.values() for ln in lns]
        try:
            while True:
                if poll_s is not None and time.monotonic() >= next_poll:
                    self._poll(links)
                    next_poll = time.monotonic() + poll_s
                if self.balancer.dynamic:
                    self._dispatch()
                sending = any(ln.sendq for ln in links) or any(self._pool.values())
                if not sending and not self._rx_left:
                    return
                for ln in links:
                    mask = ((selectors.EVENT_READ if self._posted[ln.peer] and not ln.parked
                             and not ln.eof else 0) | (selectors.EVENT_WRITE if ln.sendq else 0))
                    if mask != ln.mask:
                        if not mask:
                            sel.unregister(ln.sock)
                        elif ln.mask:
                            sel.modify(ln.sock, mask, ln)
                        else:
                            sel.register(ln.sock, mask, ln)
                        ln.mask = mask
                timeout = None
                if self.deadline is not None:
                    timeout = self.deadline - time.monotonic()
                    if timeout <= 0:
                        self._timed_out(links, label)
                if poll_s is not None and (sending or any(ln.unacked for ln in links)):
                    wait = max(0.0, next_poll - time.monotonic())
                    timeout = wait if timeout is None else min(timeout, wait)
                for skey, ev in sel.select(timeout):
                    self._pump(skey.data, bool(ev & selectors.EVENT_READ),
                               bool(ev & selectors.EVENT_WRITE), label)
        finally:
            for ln in links:
                if ln.mask:
                    sel.unregister(ln.sock)
                    ln.mask = 0

    def _dispatch(self) -> None:
        """Dynamic balancers: place pooled frames, each on the connection the balancer picks,
        while the peer has fewer than ``balancer.inflight`` frames unacknowledged."""
        bal = self.balancer
        for peer, pool in self._pool.items():
            while pool and self._inflight[peer] < bal.inflight:
                self._links[peer][bal.pick(peer)].sendq.append(pool.popleft())
                self._inflight[peer] += 1

    def _poll(self, links: list[_Link]) -> None:
        """Read ``TCP_INFO`` of the connections carrying data: acknowledged frames to the
        balancer, a retransmission timeout to it (and the unsent frames where it says); the
        unsent frames of a connection the balancer no longer uses dealt where it says."""
        now = time.monotonic()
        for ln in links:
            targets = self.balancer.reroute(ln.peer, ln.conn, now) if ln.sendq else None
            if targets:
                self._move(ln, targets)
            if not (ln.sendq or ln.unacked or ln.in_rto):
                continue
            try:
                info = tcpinfo.read(ln.sock)
            except OSError:
                continue
            while ln.unacked and info.bytes_acked is not None \
                    and info.bytes_acked >= ln.unacked[0][0]:
                _, retrans = ln.unacked.popleft()
                self._inflight[ln.peer] -= 1
                self.balancer.acked(ln.peer, ln.conn, info.total_retrans != retrans,
                                    info.rtt_us, info.min_rtt_us)
            ln.retrans = info.total_retrans
            if info.in_timeout and not ln.in_rto:
                target = self.balancer.timeout(ln.peer, ln.conn, now)
                if target is not None:
                    self._move(ln, [target])
            ln.in_rto = info.in_timeout

    def _move(self, ln: _Link, targets: list[int]) -> None:
        """Move ``ln``'s frames not started yet to the connections ``targets`` of the same
        peer, dealt in turn (``[-1]``: back to the peer's pool)."""
        keep = deque([ln.sendq.popleft()]) if ln.sendq and ln.sendq[0].sent else deque()
        moved, ln.sendq = ln.sendq, keep
        if targets == [-1]:
            self._pool[ln.peer].extendleft(reversed(moved))
            self._inflight[ln.peer] -= len(moved)
            return
        for i, fr in enumerate(moved):
            self._links[ln.peer][targets[i % len(targets)]].sendq.append(fr)

    def _pump(self, ln: _Link, readable: bool, writable: bool, label: str) -> None:
        sock = ln.sock
        try:
            while writable and ln.sendq:
                fr = ln.sendq[0]
                if fr.sent < _FRAME.size:
                    n = sock.sendmsg([memoryview(fr.hdr)[fr.sent:], fr.data])
                else:
                    n = sock.send(fr.data[fr.sent - _FRAME.size:])
                fr.sent += n
                if fr.sent < fr.total:
                    break
                ln.sendq.popleft()
                ln.written += fr.total
                if self.balancer.dynamic:
                    ln.unacked.append((ln.written, ln.retrans))
            while readable and not ln.parked and not ln.eof and self._posted[ln.peer]:
                if ln.rx_view is None:
                    if ln.rx_hlen < _FRAME.size:
                        n = sock.recv_into(memoryview(ln.rx_hdr)[ln.rx_hlen:])
                        if n == 0 and ln.rx_hlen == 0:  # done: the rest is on others
                            ln.eof = True
                            if all(x.eof for x in self._links[ln.peer]):
                                self._lost(ln, label, "closed by the peer")
                            break
                        if n == 0:
                            self._lost(ln, label, "closed by the peer")
                        ln.rx_hlen += n
                        if ln.rx_hlen < _FRAME.size:
                            break
                    seq, offset, length = _FRAME.unpack(ln.rx_hdr)
                    msg = self._posted[ln.peer].get(seq)
                    if msg is None:  # a later message's frame: wait until it is posted
                        ln.parked = True
                        break
                    if offset + length > len(msg.view):
                        raise ConfigError(f"rank {self.rank}: rank {ln.peer} sent bytes "
                                          f"{offset}..{offset + length} of a {len(msg.view)}"
                                          f"-byte message during {label} (sizes differ)",
                                          peers=[ln.peer])
                    ln.rx_view, ln.rx_msg = msg.view[offset:offset + length], msg
                n = sock.recv_into(ln.rx_view)
                if n == 0:
                    self._lost(ln, label, "closed by the peer")
                ln.rx_view = ln.rx_view[n:]
                ln.rx_msg.left -= n
                if len(ln.rx_view):
                    break
                if not ln.rx_msg.left:
                    del self._posted[ln.peer][_FRAME.unpack(ln.rx_hdr)[0]]
                    self._rx_left -= 1
                ln.rx_view = ln.rx_msg = None
                ln.rx_hlen = 0
        except (BlockingIOError, InterruptedError):
            return
        except _LOST_ERRNOS as e:
            self._lost(ln, label, e.strerror or type(e).__name__)
        except OSError as e:
            self._lost(ln, label, e.strerror or str(e))

    def _lost(self, ln: _Link, label: str, why: str) -> None:
        raise PeerLostError(f"rank {self.rank}: connection {ln.conn} to rank {ln.peer} "
                            f"({self.addr(ln.peer)}) {why} during {label}", [ln.peer])

    def _timed_out(self, links: list[_Link], label: str) -> None:
        pending: dict[int, list[int]] = {}
        for ln in links:
            tot = pending.setdefault(ln.peer, [0, 0])
            tot[0] += sum(fr.total - fr.sent for fr in ln.sendq)
        for peer, pool in self._pool.items():
            pending[peer][0] += sum(fr.total for fr in pool)
        for peer, msgs in self._posted.items():
            pending[peer][1] += sum(m.left for m in msgs.values())
        what = ", ".join(f"rank {p} ({s} B to send, {r} B to receive)"
                         for p, (s, r) in sorted(pending.items()) if s or r)
        raise JobTimeoutError(f"rank {self.rank}: job timeout during {label}, waiting on {what}",
                              {p: v for p, v in pending.items() if any(v)})

    def tcp_totals(self) -> dict:
        """Over every connection now (``TCP_INFO``): ``retransmits`` (segments), ``rtos``
        (retransmission timeouts; None before Linux 6.7) and ``reordering`` (reordering
        events the senders detected, ``tcpi_reord_seen``: segments that arrived out of order
        and were not lost, unlike the receiver's out-of-order count, which every loss's hole
        also raises; None before 4.19)."""
        infos = []
        for lns in self._links.values():
            for ln in lns:
                try:
                    infos.append(tcpinfo.read(ln.sock))
                except OSError:
                    pass

        def total(name: str) -> int | None:
            vals = [getattr(i, name) for i in infos]
            return None if None in vals else sum(vals)
        return {"retransmits": total("total_retrans"), "rtos": total("total_rto"),
                "reordering": total("reord_seen")}

    # -- tear-down ------------------------------------------------------------------------

    def close(self, graceful: bool = True, linger_s: float = 2.0) -> None:
        """Close every connection. Idempotent.

        With ``graceful``, accepted connections close at once and connected ones wait up to
        ``linger_s`` (and never past the deadline) for the peer's close, so TCP's TIME_WAIT
        stays on the accepting side and a fixed source port (path hint) is free for the next
        job at once.
        """
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        links = [ln for lns in self._links.values() for ln in lns if ln is not None]
        self._links = {}
        self._connected = False
        for ln in links:
            if ln.mask:
                self._sel.unregister(ln.sock)
                ln.mask = 0
        waiting = []
        for ln in links:
            if graceful and ln.initiator:
                waiting.append(ln.sock)
            else:
                ln.sock.close()
        if waiting:
            limit = time.monotonic() + linger_s
            if self.deadline is not None:
                limit = min(limit, self.deadline)
            for sock in waiting:
                self._sel.register(sock, selectors.EVENT_READ)
            while waiting:
                timeout = limit - time.monotonic()
                if timeout <= 0:
                    break
                for skey, _ in self._sel.select(timeout):
                    sock = skey.fileobj
                    try:
                        data = sock.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        self._sel.unregister(sock)
                        sock.close()
                        waiting.remove(sock)
            for sock in waiting:
                self._sel.unregister(sock)
                sock.close()
        self._sel.close()
        self._sel = selectors.DefaultSelector()


def _describe(hello) -> str:
    """A peer's hello for an error message: a reason string or (rank, connection)."""
    return hello if isinstance(hello, str) else f"rank {hello[0]} connection {hello[1]}"
