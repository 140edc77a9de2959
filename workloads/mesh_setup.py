"""The collective mesh's set-up and tear-down (``workloads.transport.Mesh`` adds the data
path): its typed per-peer state, listening, connecting with the hello handshake both ways, and
closing with TIME_WAIT kept on the accepting side.
"""
from __future__ import annotations

import errno
import os
import selectors
import socket
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from workloads.errors import (
    ConfigError,
    JobTimeoutError,
    PeerUnreachableError,
)
from workloads.lb.balancer import FRAME_BYTES, Even

if TYPE_CHECKING:
    from typing import Self
from workloads.links import (
    HELLO,
    MAGIC,
    RETRY_S,
    TCP_NOTSENT_LOWAT,
    VERSION,
    Frame,
    Link,
    Msg,
    PathHints,
    describe,
    format_address,
    job_key,
    parse_address,
    set_cc,
    set_tos,
)


class MeshSetup:
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
        self._links: dict[int, list[Link]] = {}
        self._listener: socket.socket | None = None
        self._sel = selectors.DefaultSelector()
        self._connected = False
        self.balancer = balancer or Even(conns_per_peer)
        peers = [p for p in range(self.world) if p != rank]
        self._tx_seq = dict.fromkeys(peers, 0)
        self._rx_seq = dict.fromkeys(peers, 0)
        self._posted: dict[int, dict[int, Msg]] = {p: {} for p in peers}
        self._pool: dict[int, deque[Frame]] = {p: deque() for p in peers}
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
        return HELLO.pack(MAGIC, VERSION, 0, self.world, self.rank, conn, self._key)

    def _check_hello(self, data: bytes) -> tuple[int, int] | str:
        """``(rank, conn)`` of a valid hello, else the reason it is not."""
        magic, version, _, world, rank, conn, key = HELLO.unpack(data)
        if magic != MAGIC or version != VERSION:
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
            st[0], st[1], st[2], st[3] = None, time.monotonic() + RETRY_S, why, b""

        def attempt(key: tuple[int, int]) -> None:
            peer, conn = key
            host, port = self.addresses[peer]
            try:
                info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            except OSError as e:
                out[key][1:3] = [time.monotonic() + RETRY_S, f"address lookup: {e}"]
                return
            sock = socket.socket(info[0], socket.SOCK_STREAM)
            try:
                set_tos(sock, self.hints.tos(conn))
                set_cc(sock, self.cc)
                sport = self.hints.src_port(self.rank, peer, conn, self.world, k)
                if sport is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind(("::" if info[0] == socket.AF_INET6 else "0.0.0.0", sport))
            except OSError as e:
                sock.close()
                out[key][1:3] = [time.monotonic() + RETRY_S, f"socket options (DSCP, "
                                                               f"congestion control, source "
                                                               f"port): {e}"]
                return
            sock.setblocking(False)
            err = sock.connect_ex(info[4])
            if err not in (0, errno.EINPROGRESS):
                sock.close()
                out[key][1:3] = [time.monotonic() + RETRY_S, os.strerror(err)]
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
                            data = sock.recv(HELLO.size - len(st[3]))
                        except OSError as e:
                            fail_out(key, str(e))
                            continue
                        if not data:
                            fail_out(key, f"rank {key[0]} closed the connection during the "
                                          "handshake (another job, or a world-size mismatch?)")
                            continue
                        st[3] += data
                        if len(st[3]) < HELLO.size:
                            continue
                        got = self._check_hello(st[3])
                        if got != key:
                            raise ConfigError(
                                f"rank {self.rank}: {self.addr(key[0])} should be rank {key[0]} "
                                f"(connection {key[1]}) of job {self.job_id!r} but answered as "
                                f"{describe(got)}",
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
            data = sock.recv(HELLO.size - len(pending_in[sock]))
        except OSError:
            drop(None)
            return
        if not data:
            drop(None)
            return
        pending_in[sock] += data
        if len(pending_in[sock]) < HELLO.size:
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
            set_tos(sock, self.hints.tos(got[1]))
            set_cc(sock, self.cc)
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
        links[conn] = Link(sock, peer, conn, initiator)

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
