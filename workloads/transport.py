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

import selectors
import socket
import time
from collections import deque
from collections.abc import Iterable

import numpy as np

from workloads.errors import (
    ConfigError,
    JobTimeoutError,
    PeerLostError,
)
from workloads.lb import tcpinfo
from workloads.lb.balancer import split_bytes
from workloads.links import (
    FRAME,
    LOST_ERRNOS,
    Link,
    Msg,
    PathHints,
    byte_view,
    format_address,
    frames,
    job_key,
    parse_address,
)
from workloads.mesh_setup import MeshSetup

__all__ = ["Mesh", "PathHints", "format_address", "job_key", "parse_address", "split_bytes"]


class Mesh(MeshSetup):
    """TCP connections from one rank to every other rank of a job, and the data path
    (``exchange``); arguments and set-up in ``MeshSetup``. Not thread-safe: one thread per Mesh.
    """

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
                view = byte_view(arr)
                if is_send:
                    out.append((peer, view))
                    continue
                seq = self._rx_seq[peer]
                self._rx_seq[peer] += 1
                self._posted[peer][seq] = Msg(view)
                self._rx_left += 1
                for ln in self._links[peer]:
                    ln.parked = False
        segments = (None if self.balancer.dynamic else
                    self.balancer.split([(p, len(v)) for p, v in out], time.monotonic()))
        for i, (peer, view) in enumerate(out):
            seq = self._tx_seq[peer]
            self._tx_seq[peer] += 1
            if segments is None:
                self._pool[peer].extend(frames(seq, view, 0, len(view)))
            else:
                for conn, a, b in segments[i]:
                    self._links[peer][conn].sendq.extend(frames(seq, view, a, b))
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

    def _poll(self, links: list[Link]) -> None:
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

    def _move(self, ln: Link, targets: list[int]) -> None:
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

    def _pump(self, ln: Link, readable: bool, writable: bool, label: str) -> None:
        sock = ln.sock
        try:
            while writable and ln.sendq:
                fr = ln.sendq[0]
                if fr.sent < FRAME.size:
                    n = sock.sendmsg([memoryview(fr.hdr)[fr.sent:], fr.data])
                else:
                    n = sock.send(fr.data[fr.sent - FRAME.size:])
                fr.sent += n
                if fr.sent < fr.total:
                    break
                ln.sendq.popleft()
                ln.written += fr.total
                if self.balancer.dynamic:
                    ln.unacked.append((ln.written, ln.retrans))
            while readable and not ln.parked and not ln.eof and self._posted[ln.peer]:
                if ln.rx_view is None:
                    if ln.rx_hlen < FRAME.size:
                        n = sock.recv_into(memoryview(ln.rx_hdr)[ln.rx_hlen:])
                        if n == 0 and ln.rx_hlen == 0:  # done: the rest is on others
                            ln.eof = True
                            if all(x.eof for x in self._links[ln.peer]):
                                self._lost(ln, label, "closed by the peer")
                            break
                        if n == 0:
                            self._lost(ln, label, "closed by the peer")
                        ln.rx_hlen += n
                        if ln.rx_hlen < FRAME.size:
                            break
                    seq, offset, length = FRAME.unpack(ln.rx_hdr)
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
                    del self._posted[ln.peer][FRAME.unpack(ln.rx_hdr)[0]]
                    self._rx_left -= 1
                ln.rx_view = ln.rx_msg = None
                ln.rx_hlen = 0
        except (BlockingIOError, InterruptedError):
            return
        except LOST_ERRNOS as e:
            self._lost(ln, label, e.strerror or type(e).__name__)
        except OSError as e:
            self._lost(ln, label, e.strerror or str(e))

    def _lost(self, ln: Link, label: str, why: str) -> None:
        raise PeerLostError(f"rank {self.rank}: connection {ln.conn} to rank {ln.peer} "
                            f"({self.addr(ln.peer)}) {why} during {label}", [ln.peer])

    def _timed_out(self, links: list[Link], label: str) -> None:
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
