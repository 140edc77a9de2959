"""Link emulation on one interface: rate, queue limit, delay, jitter, reorder and loss.

Mechanisms (a failing tool raises ``LabError`` with its message, never prints):
Bring-up writes ``tc``/``ip``/``nft`` batch lines, one process per namespace and tool;
run-time changes are batches too (``rate_change``, ``queue_change``), run in the node's
namespace on whichever server it is (``lab.nodes.LabNode.run_batch``).

    * rate: an HTB root ``1:`` with one class ``1:1`` (rate = ceil, burst = 1 ms of rate, at
      least 15 kB); see tc-htb(8).
    * queue limit (packets): the leaf ``10:`` is ``pfifo limit N`` (or netem's own ``limit``);
      GSO is turned off on such interfaces (``gso_max_segs 1``) so a "packet" in the queue is
      one MTU-sized packet, as in a switch buffer. Rate-only links keep GSO: without it one
      TCP flow tops out near 250 Mbit/s on a 2-core machine instead of ~945 at 1 Gbit/s.
    * delay / jitter / reorder: ``netem`` as the leaf ``10:`` (tc-netem(8)); needs ``sch_netem``.
    * traffic classes (optional, ``class_commands``): under ``1:1`` one HTB class per
      ``TrafficClass`` (``1:11``, ``1:12``, ...: guaranteed ``share`` of the rate, ceil the
      rate, HTB ``prio``: spare bandwidth goes to the lowest prio first), chosen by the
      packet's DSCP (``u32 match ip dsfield``), and the default class ``1:10`` (unmarked
      packets: the rest of the rate, prio 7); each class has the link's queue (its own
      ``pfifo``/``netem``, as a switch port's per-class queues). Sources: tc-htb(8), the HTB
      user guide (Devera, "HTB Linux queuing discipline manual"), tc-u32(8), RFC 2474 (DSCP).
    * loss (percent): nftables ``numgen random`` drop on the *ingress* of the receiving
      interface (table ``netdev nslab``), which works with and without netem; an egress-hook
      drop is counted but not enforced on some kernels, ingress is.

Units: ``bw`` Mbit/s, ``delay``/``jitter`` strings with a unit (``"500us"``, ``"2ms"``),
``loss``/``reorder`` percent, ``max_queue_size`` packets (Mininet's vocabulary).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields

from pyroute2 import IPRoute

from lab.errors import CapabilityError

_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|ms|s)\s*$")
_US = {"us": 1.0, "ms": 1e3, "s": 1e6}
MIN_BURST = 15000


def parse_time_us(text: str | float) -> float:
    """``"2ms"`` -> 2000.0 microseconds; a bare number means ms (Mininet passes it to tc as ms).

    Raises:
        ValueError: not a non-negative time.
    """
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"negative time {text}")
        return float(text) * 1e3
    m = _TIME.match(text)
    if not m:
        raise ValueError(f"time {text!r}: expected a number with a unit us, ms or s")
    return float(m.group(1)) * _US[m.group(2)]


@dataclass(frozen=True)
class LinkParams:
    """What one direction of a link emulates (None: not emulated)."""

    bw: float | None = None
    delay: str | None = None
    jitter: str | None = None
    loss: float | None = None
    reorder: float | None = None
    max_queue_size: int | None = None

    @classmethod
    def from_opts(cls, opts: dict) -> LinkParams:
        """Pick the link keys out of Mininet-style options.

        Raises:
            ValueError: a value out of range (negative rate, loss above 100 %, ...).
        """
        p = cls(**{f.name: opts.get(f.name) for f in fields(cls)})
        p.validate()
        return p

    def validate(self) -> None:
        """Raises ValueError naming the first bad value."""
        if self.bw is not None and not self.bw > 0:
            raise ValueError(f"bw must be > 0 Mbit/s, got {self.bw}")
        for name in ("loss", "reorder"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= 100:
                raise ValueError(f"{name} must be a percentage in [0, 100], got {v}")
        if self.max_queue_size is not None and self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1 packet, got {self.max_queue_size}")
        for name in ("delay", "jitter"):
            if getattr(self, name) is not None:
                parse_time_us(getattr(self, name))
        if self.reorder and not self.delay:
            raise ValueError("reorder needs a delay (netem reorders by sending some packets "
                             "without the delay)")

    def netem_fields(self) -> list[str]:
        """The requested parameters that only netem can emulate."""
        return [n for n in ("delay", "jitter", "reorder") if getattr(self, n)]


def require(params: LinkParams, netem: bool, where: str) -> None:
    """Fail before anything is built if ``params`` needs netem and the kernel lacks it.

    Raises:
        CapabilityError: naming the parameters, the link and the missing kernel feature.
    """
    missing = params.netem_fields()
    if missing and not netem:
        raise CapabilityError(
            f"link {where}: {', '.join(missing)} need the kernel qdisc sch_netem, which this "
            "kernel lacks ('tc qdisc add ... netem': unknown qdisc). Remove them or run on a "
            "kernel with netem (modprobe sch_netem); rate, queue limit and loss work without it.")


def _burst(bw_mbit: float) -> int:
    return max(MIN_BURST, int(bw_mbit * 1e6 / 8 * 1e-3))


def _htb_class(bw_mbit: float) -> dict:
    rate = int(bw_mbit * 1e6 / 8)  # bytes/s
    return dict(rate=f"{int(bw_mbit * 1e6)}bit", burst=_burst(bw_mbit), cburst=_burst(bw_mbit),
                quantum=max(1600, min(200000, rate // 10)))


def _netem(p: LinkParams) -> dict:
    kw: dict = {"limit": p.max_queue_size or 1000}
    if p.delay:
        kw["delay"] = parse_time_us(p.delay)
    if p.jitter:
        kw["jitter"] = parse_time_us(p.jitter)
    if p.reorder:
        kw["prob_reorder"] = p.reorder
    return kw


@dataclass(frozen=True)
class TrafficClass:
    """Packets marked ``dscp`` get their own HTB class (``class_commands``).

    Attributes:
        dscp: DSCP code point 0..63 (RFC 2474; the IP TOS byte is ``dscp << 2``).
        share: fraction of the link rate guaranteed to the class, in (0, 1).
        prio: HTB priority 0..7 (0 is offered spare bandwidth first).
    """

    dscp: int
    share: float
    prio: int

    def __post_init__(self) -> None:
        if not 0 <= self.dscp <= 63:
            raise ValueError(f"DSCP {self.dscp} is outside 0..63")
        if not 0 < self.share < 1:
            raise ValueError(f"share {self.share} is outside (0, 1)")
        if not 0 <= self.prio <= 7:
            raise ValueError(f"HTB prio {self.prio} is outside 0..7")


DEFAULT_MINOR = 0x10
"""Minor of the default class of a classed link (unmarked packets); DSCP class k is 0x11 + k."""


def htb_line(ifname: str, parent: str, classid: str, bw_mbit: float,
             ceil_mbit: float | None = None, prio: int | None = None, verb: str = "add") -> str:
    """A ``tc -batch`` line that adds (or with ``verb`` changes) HTB class ``classid`` of
    rate ``bw_mbit`` and ceil ``ceil_mbit`` (default: the rate), Mbit/s."""
    c, top = _htb_class(bw_mbit), _htb_class(ceil_mbit or bw_mbit)
    return (f"class {verb} dev {ifname} parent {parent} classid {classid} htb rate {c['rate']} "
            f"ceil {top['rate']} burst {c['burst']}b cburst {top['cburst']}b "
            f"quantum {c['quantum']}" + ("" if prio is None else f" prio {prio}"))


def leaf_line(ifname: str, parent: str, handle: str, p: LinkParams,
              verb: str = "add") -> list[str]:
    """``tc -batch`` lines that add (or with ``verb`` replace) the queue under ``parent``:
    netem when ``p`` needs it, a pfifo of ``p.max_queue_size`` packets, or none (HTB's
    default, txqueuelen packets)."""
    if p.netem_fields():
        n = _netem(p)
        opts = f"limit {n['limit']}"
        if p.delay:
            opts += f" delay {n['delay']}us" + (f" {n['jitter']}us" if p.jitter else "")
        if p.reorder:
            opts += f" reorder {p.reorder}%"
        return [f"qdisc {verb} dev {ifname} {parent} handle {handle} netem {opts}"]
    if p.max_queue_size is not None:
        return [f"qdisc {verb} dev {ifname} {parent} handle {handle} pfifo limit "
                f"{p.max_queue_size}"]
    return []


def shape_commands(ifname: str, p: LinkParams) -> list[str]:
    """``tc -batch`` lines that install ``p``'s egress emulation on ``ifname`` (bring-up runs
    them per namespace in one process)."""
    if p.bw is None and not p.netem_fields() and p.max_queue_size is None:
        return []
    lines, parent = [], "root"
    if p.bw is not None:
        lines += [f"qdisc add dev {ifname} root handle 1: htb default 1",
                  htb_line(ifname, "1:", "1:1", p.bw)]
        parent = "parent 1:1"
    return lines + leaf_line(ifname, parent, "10:", p)


def class_commands(ifname: str, p: LinkParams, classes: Sequence[TrafficClass]) -> list[str]:
    """``tc -batch`` lines that replace ``ifname``'s emulation by ``p``'s with ``classes``
    (the module docstring); no classes: ``p``'s plain emulation again.

    Raises:
        ValueError: classes on a link without a rate, a DSCP given twice, or shares that
            leave nothing for the default class (their sum must be below 1).
    """
    lines = [f"qdisc del dev {ifname} root"]
    if not classes:
        return lines + shape_commands(ifname, p)
    if p.bw is None:
        raise ValueError(f"{ifname}: traffic classes need a link rate (bw)")
    if len({c.dscp for c in classes}) != len(classes):
        raise ValueError(f"{ifname}: a DSCP names two traffic classes")
    rest = 1 - sum(c.share for c in classes)
    if rest <= 0:
        raise ValueError(f"{ifname}: class shares sum to {1 - rest:g}; keep them below 1")
    lines += [f"qdisc add dev {ifname} root handle 1: htb default {DEFAULT_MINOR:x}",
              htb_line(ifname, "1:", "1:1", p.bw),
              htb_line(ifname, "1:1", f"1:{DEFAULT_MINOR:x}", p.bw * rest, p.bw, prio=7),
              *leaf_line(ifname, f"parent 1:{DEFAULT_MINOR:x}", f"{DEFAULT_MINOR:x}:", p)]
    for k, c in enumerate(classes):
        minor = f"{DEFAULT_MINOR + 1 + k:x}"
        lines += [htb_line(ifname, "1:1", f"1:{minor}", p.bw * c.share, p.bw, prio=c.prio),
                  *leaf_line(ifname, f"parent 1:{minor}", f"{minor}:", p),
                  f"filter add dev {ifname} parent 1: protocol ip prio 1 u32 match ip dsfield "
                  f"{c.dscp << 2:#04x} 0xfc flowid 1:{minor}"]
    return lines


def rate_change(ifname: str, bw_mbit: float) -> list[str]:
    """``tc -batch`` lines that change the rate of ``ifname``'s HTB class ``1:1`` (a shaped
    interface, ``shape_commands``) to ``bw_mbit`` Mbit/s at run time; tc fails on an
    interface without it."""
    return [htb_line(ifname, "1:", "1:1", bw_mbit, verb="change")]


def queue_change(ifname: str, p: LinkParams) -> list[str]:
    """``tc -batch`` lines that replace ``ifname``'s leaf queue ``10:`` by ``p``'s (netem's
    limit when ``p`` has netem fields, else a pfifo of ``p.max_queue_size`` packets) at run
    time: under the HTB class when ``p`` has a rate, at the root otherwise."""
    return leaf_line(ifname, "parent 1:1" if p.bw is not None else "root", "10:", p,
                     verb="replace")


QDISC_COUNTERS = ("sent_bytes", "sent_packets", "drops", "overlimits", "backlog_packets")


def root_qdisc_stats(ipr: IPRoute, index: int | None = None) -> dict[int, dict[str, int]]:
    """Counters of the root qdiscs of a namespace's interfaces (one netlink dump; only
    interface ``index`` when given), by interface index: ``QDISC_COUNTERS`` (bytes and
    packets dequeued since the qdisc was created, packets dropped, times the rate throttled
    it, packets queued now; HTB counts its leaves' drops and backlog). Interfaces without a
    qdisc of their own are absent."""
    out = {}
    for q in ipr.get_qdiscs(**({} if index is None else {"index": index})):
        st = q.get_attr("TCA_STATS")
        if q["parent"] == 0xFFFFFFFF and st is not None:
            out[q["index"]] = dict(zip(QDISC_COUNTERS, (st["bytes"], st["packets"], st["drop"],
                                                        st["overlimits"], st["qlen"]), strict=True))
    return out


def parse_root_qdiscs(links: list[dict], qdiscs: list[dict]) -> dict[int, dict[str, int]]:
    """``root_qdisc_stats`` from the JSON of ``ip -j link show`` (``links``) and
    ``tc -s -j qdisc show`` (``qdiscs``) of one namespace: how a namespace on a remote
    server is read (ip(8), tc(8) ``-json``)."""
    index = {link["ifname"]: link["ifindex"] for link in links}
    return {index[q["dev"]]: dict(zip(QDISC_COUNTERS, (q["bytes"], q["packets"], q["drops"],
                                                       q["overlimits"], q["qlen"]), strict=True))
            for q in qdiscs if q.get("root") and q.get("dev") in index}


def qdisc_stats(ipr: IPRoute, index: int) -> dict[str, int]:
    """``root_qdisc_stats`` of one interface; all zero when it has no qdisc of its own."""
    return root_qdisc_stats(ipr, index).get(index, dict.fromkeys(QDISC_COUNTERS, 0))


def drop_commands(ifname: str, percent: float, tag: str = "loss") -> list[str]:
    """nftables lines that drop ``percent`` % of the packets arriving on ``ifname``
    (``numgen random``, chain ``<tag>_<ifname>`` of table ``netdev nslab``); 0 removes the
    chain. Tags keep independent causes apart (``loss`` of the link, ``pause`` of a VM)."""
    chain = f"{tag}_" + re.sub(r"[^A-Za-z0-9_]", "_", ifname)
    threshold = round(percent * 10_000)  # out of 1e6
    lines = ["add table netdev nslab",
             f'add chain netdev nslab {chain} {{ type filter hook ingress device "{ifname}" '
             "priority 0; }",
             f"flush chain netdev nslab {chain}"]
    if threshold >= 1_000_000:
        lines.append(f"add rule netdev nslab {chain} counter drop")
    elif threshold > 0:
        lines.append(f"add rule netdev nslab {chain} numgen random mod 1000000 < {threshold} "
                     "counter drop")
    else:
        lines.append(f"delete chain netdev nslab {chain}")
    return lines


def batch_argv(netns: str, tool: str) -> list[str]:
    """The command that reads ``tc``, ``ip`` or ``nft`` lines on stdin and runs them in
    namespace ``netns`` (on whichever server runs it)."""
    return {"tc": ["tc", "-n", netns, "-batch", "-"], "ip": ["ip", "-n", netns, "-batch", "-"],
            "nft": ["ip", "netns", "exec", netns, "nft", "-f", "-"]}[tool]

