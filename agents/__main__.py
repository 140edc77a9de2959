"""``python -m agents``: the agent daemon (one per VM), the coordinator and the pacer.

Exit status: 0 after SIGTERM/SIGINT, 2 for bad arguments, 1 when a socket cannot be opened
or the agent's compiled datagram path cannot be built (``agents.native``).
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import sys
import threading
import zlib

from agents import pacer_defaults as PD
from agents.agent import AgentConfig as AC

__all__ = ["main"]

log = logging.getLogger("agents")


def _ip(text: str) -> str:
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IPv4 address: {text!r}") from None


def _peers(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, ip = item.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"peer {item!r} is not NAME=IP")
        if name in out:
            raise argparse.ArgumentTypeError(f"peer {name!r} listed twice")
        out[name] = _ip(ip)
    return out


def _hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, _port(port)


def _port(text: str) -> int:
    try:
        p = int(text)
    except ValueError:
        p = -1
    if not 0 < p < 65536:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    return p


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _positive(text: str) -> float:
    if not (x := _number(text)) > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return x


def _nonnegative(text: str) -> float:
    if not (x := _number(text)) >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return x


def _count(text: str) -> int:
    try:
        x = int(text)
    except ValueError:
        x = -1
    if x < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return x


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except for options without one."""

    def _get_help_string(self, action):
        if action.default is None or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    fmt = _Help
    p = argparse.ArgumentParser(
        prog="python -m agents", formatter_class=fmt,
        description="nslab daemons: 'agent' runs in every VM (coded UDP probes with kernel "
                    "timestamps to its peers, records reported to the coordinator); "
                    "'coordinator' fits the pairs (Huygens), solves the network for every "
                    "VM's clock offset and drift against a reference VM, OWD and collocation, "
                    "and serves them as JSON (GET /api/v1/state, see agents/API.md); 'pacer' "
                    "runs in every VM: TCP sensing and On-Ramp's OWD-gated hold at the edge.")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr log level")
    sub = p.add_subparsers(dest="command", required=True, metavar="{agent,coordinator,pacer}")

    a = sub.add_parser(
        "agent", formatter_class=fmt, help="the probe daemon of one VM",
        description="Probe peers with coded UDP pairs, timestamp them in the kernel "
                    "(SO_TIMESTAMPING, converted to the VM clock of NSLAB_CLOCK, else the "
                    "system clock) and report the records to the coordinator over TCP. "
                    "Probe format: agents/PROBE.md.",
        epilog="example: python -m agents agent --name vm1 --bind 10.1.1.2 "
               "--peers vm2=10.1.2.2,vm3=10.2.1.2 --coordinator 10.1.1.2:7700")
    a.add_argument("--name", required=True, help="this VM's name (as the peers know it)")
    a.add_argument("--bind", required=True, type=_ip, help="this VM's IPv4 address")
    a.add_argument("--peers", required=True, type=_peers,
                   help="the other VMs as NAME=IP,NAME=IP,... (all on the same --port)")
    a.add_argument("--coordinator", required=True, type=_hostport,
                   help="the coordinator's report listener HOST:PORT")
    a.add_argument("--port", type=_port, default=AC.port, help="UDP probe port of every agent")
    a.add_argument("--rate", type=_positive, default=AC.rate,
                   help="coded probe pairs per second per active peer")
    a.add_argument("--per-send", type=_count, default=AC.per_send,
                   help="the most pairs sent together (0: a pair to every active peer at "
                        "once): each 1/--rate s round is split into sends of this many pairs, "
                        "spread evenly over it, so this VM's own NIC queue holds at most "
                        "2 x --per-send of its probes (a whole round at once overflows a "
                        "shallow queue at a low line rate)")
    a.add_argument("--burst-rate", type=_positive, default=AC.burst_rate,
                   help="coded probe pairs per second per active peer during the start-up "
                        "burst (chrony's iburst): the pairs' round-trip floors are learnt "
                        "before a queue stands")
    a.add_argument("--burst", type=_nonnegative, default=AC.burst_s,
                   help="start-up burst length, s (0: none); it adds (--burst-rate - --rate) "
                        "x --burst pairs per active peer, once")
    a.add_argument("--key", default=None,
                   help="shared HMAC-SHA256 key in hex (>= 16 digits); every agent must "
                        "use the same one; probes without a valid tag are rejected")
    a.add_argument("--window", type=_positive, default=AC.window_s,
                   help="estimation window, s (peers that probed this VM in the last two "
                        "windows are probed back)")
    a.add_argument("--max-peers", type=int, default=AC.max_peers,
                   help="probe a random subset of this many peers (re-drawn every "
                        "--redraw s) when there are more")
    a.add_argument("--redraw", type=_positive, default=AC.redraw_s,
                   help="re-draw period of the random peer subset, s")
    a.add_argument("--size", type=int, default=AC.size,
                   help="probe UDP payload bytes (0: minimal, 56, or 72 with --key)")
    a.add_argument("--report", type=_positive, default=AC.report_s,
                   help="report period, s (each drawn in [0.5, 1.5] x it, so that agents "
                        "started together do not report together)")
    a.add_argument("--report-mbit", type=_nonnegative, default=AC.report_mbit,
                   help="the report connection's pacing rate, Mbit/s (SO_MAX_PACING_RATE: "
                        "TCP spreads a report's segments at it instead of sending a window "
                        "at once into the coordinator's link; 0: unpaced)")
    a.add_argument("--seed", type=int, default=None, help="seed of peer choice and jitter")

    c = sub.add_parser(
        "coordinator", formatter_class=fmt, help="the network-wide solver and JSON API",
        description="Accept agents' reports (JSON lines over TCP on --bind:--port), estimate "
                    "every VM's clock per window and serve GET /api/v1/state and "
                    "/api/v1/health on --http-port (schema nslab.coordinator/1, "
                    "agents/API.md).")
    c.add_argument("--bind", required=True, type=_ip, help="IPv4 address to listen on")
    c.add_argument("--port", type=_port, default=7700, help="TCP port for agents' reports")
    c.add_argument("--http-port", type=_port, default=7780, help="HTTP API port")
    c.add_argument("--http-bind", type=_ip, default=None,
                   help="address of the HTTP API (default: --bind)")
    c.add_argument("--window", type=_positive, default=2.0, help="estimation window, s")
    c.add_argument("--reference", default=None,
                   help="reference VM whose clock is the zero (default: the "
                        "lexicographically first VM name)")
    c.add_argument("--guard-us", type=float, default=20.0,
                   help="coded-pair guard band, us: a pair is pure when its receive gap is "
                        "within this of its send gap")
    c.add_argument("--drift-windows", type=int, default=5,
                   help="odd number of windows centred on a window whose offsets give its "
                        "drift (least squares) as they close; 1: each window's own slope")
    c.add_argument("--history", type=int, default=300, help="windows kept in the history")
    c.add_argument("--series", type=int, default=150,
                   help="windows of drift and offset series used for collocation")

    pc = sub.add_parser(
        "pacer", formatter_class=fmt, help="TCP sensing and OWD-gated pacing of one VM",
        description="Sense this VM's TCP connections (sock_diag: retransmissions, RTOs, "
                    "lost, RTT, delivery rate) and the one-way delay toward each destination "
                    "on the synchronized clocks (offsets from the coordinator's API); in "
                    "'pace' mode hold a destination's traffic on this VM's own egress for "
                    "OWD - T while its OWD exceeds T (On-Ramp, NSDI 2021). The gate stays open "
                    "until the clock sync has converged. Datapath 'bpf' (default): every TCP "
                    "data segment's OWD is measured in the kernel by tc programs on this VM's "
                    "interface and echoed to its sender in the ACKs, which hold its "
                    "destination in the kernel (agents/native/pacer.bpf.c, compiled at first "
                    "use); a kernel or machine without it gets the reason logged and datapath "
                    "'probe'. Datapath 'probe': UDP probes, the gate and HTB class switches "
                    "in a compiled user-space thread (agents/native/pacer.c), a hold also "
                    "lasting until a probe sent during it comes back below T (--no-fresh: "
                    "OWD - T only). Reports go to the coordinator (CoordinatorState.pacers).",
        epilog="example: python -m agents pacer --name vm1 --bind 10.1.1.2 --ifname vm1-eth0 "
               "--peers vm2=10.1.2.2 --coordinator 10.1.1.2:7700 --api 10.1.1.2:7780 "
               "--line-mbit 100 --threshold-us 500")
    pc.add_argument("--name", required=True, help="this VM's name (as the coordinator knows it)")
    pc.add_argument("--bind", required=True, type=_ip, help="this VM's IPv4 address")
    pc.add_argument("--ifname", required=True, help="this VM's interface (its egress qdisc "
                                                    "is replaced in pace mode)")
    pc.add_argument("--peers", required=True, type=_peers,
                    help="the other VMs as NAME=IP,... (their pacers use the same --port)")
    pc.add_argument("--coordinator", required=True, type=_hostport,
                    help="the coordinator's report listener HOST:PORT")
    pc.add_argument("--api", required=True, type=_hostport,
                    help="the coordinator's HTTP API HOST:PORT")
    pc.add_argument("--mode", choices=["sense", "pace"], default=PD.MODE,
                    help="sense: measure only; pace: also hold destinations above T")
    pc.add_argument("--datapath", choices=["bpf", "probe"], default=PD.DATAPATH,
                    help="bpf: sense and hold in the kernel; probe: UDP probes and HTB switches "
                         "from user space")
    pc.add_argument("--pin-dir", default=PD.PIN_DIR,
                    help="bpf: where the datapath's maps are pinned (a directory on a bpffs; "
                         "removed at exit)")
    pc.add_argument("--hold", choices=["auto", "edt", "refuse", "none"], default=PD.HOLD,
                    help="bpf: how a destination is held: edt (skb->tstamp with sch_fq as the "
                         "root qdisc), refuse (TCP keeps the segment unsent), auto: edt where "
                         "this kernel has sch_fq, none: no hold (the receivers' window clamp "
                         "alone, with --window-clamp)")
    pc.add_argument("--threshold-from", choices=["base", "zero"], default=PD.THRESHOLD_FROM,
                    help="bpf: T counts from each destination's base OWD (the smallest OWD of "
                         "its full-size data segments echoed here) or from 0 (On-Ramp as "
                         "published)")
    pc.add_argument("--window-clamp", action=argparse.BooleanOptionalAction,
                    default=PD.WINDOW_CLAMP,
                    help="bpf, pace mode: as a receiver, clamp the window advertised to each "
                         "sender so that the active senders' windows sum to the line's bytes "
                         "in the base RTT plus --window-queue packets, cut while the queueing "
                         "delay exceeds that queue's (ICTCP's idea, our rule from the measured "
                         "OWD; docs/how-it-works/pacer-datapath.md)")
    pc.add_argument("--window-queue", type=int, default=PD.WINDOW_QUEUE,
                    help="bpf, window clamp: packets (of this VM's MTU) of the bottleneck's "
                         "queue the clamped senders may fill together")
    pc.add_argument("--ack-pace", type=float, default=PD.ACK_PACE, metavar="FRACTION",
                    help="bpf, pace mode: as a receiver, send pure ACKs no faster than this "
                         "fraction of --line-mbit, each counted as one full segment (an HTB "
                         "class as the interface's root qdisc), so that its senders together "
                         "send no faster than that (NDP's receiver pacing with TCP's ACKs; "
                         "docs/how-it-works/pacer-datapath.md); 0: off")
    pc.add_argument("--quantum-us", type=float, default=PD.QUANTUM_US,
                    help="bpf: holds are rounded up to a multiple of this, us (0: not)")
    pc.add_argument("--port", type=_port, default=PD.PORT, help="UDP port of the OWD probes")
    pc.add_argument("--line-mbit", type=_positive, default=PD.LINE_MBIT,
                    help="the vNIC's rate, Mbit/s: released traffic leaves at it")
    pc.add_argument("--threshold-us", type=_positive, default=PD.THRESHOLD_US,
                    help="On-Ramp's T, us: above the sync error and the base OWD")
    pc.add_argument("--max-hold-us", type=_positive, default=PD.MAX_HOLD_US,
                    help="longest single hold, us; a hold lasts at most 10 x this in one piece "
                         "(extensions included), then the destination is open for this long; "
                         "samples whose echo took over 4 x this are ignored")
    pc.add_argument("--predict", action=argparse.BooleanOptionalAction, default=PD.PREDICT,
                    help="hold for the OWD extrapolated to now; --no-predict: On-Ramp's rule as "
                         "published, hold for the sample's OWD - T (agents/gate.py)")
    pc.add_argument("--fresh", action=argparse.BooleanOptionalAction, default=PD.FRESH,
                    help="a hold also lasts until a sample sent during it comes back below T, "
                         "and a missing echo holds; --no-fresh: On-Ramp's rule as published, "
                         "a hold ends after OWD - T (agents/gate.py)")
    pc.add_argument("--spread", action=argparse.BooleanOptionalAction, default=PD.SPREAD,
                    help="release a fresh hold a draw in [0, the hold's largest OWD - T) later, "
                         "not at once, so that senders held together release apart (the draws "
                         "are seeded by --name; agents/gate.py)")
    pc.add_argument("--probe-us", type=_positive, default=PD.PROBE_US,
                    help="OWD probe period per active destination, us (while at most 2 "
                         "probes to it are unanswered; then one per echo age limit)")
    pc.add_argument("--active-s", type=_positive, default=PD.ACTIVE_S,
                    help="a destination is probed this long after it last had TCP data in "
                         "flight or this VM sent it a SYN, s")
    return p


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum, _frame):
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run a daemon until SIGTERM/SIGINT; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.command == "agent":
        from agents.agent import Agent, AgentConfig
        from agents.probe import parse_key
        from agents.probeio import ProbeIOError
        if args.name in args.peers:
            parser.error(f"--peers lists this VM itself ({args.name})")
        if args.max_peers < 1:
            parser.error("--max-peers must be >= 1")
        try:
            key = parse_key(args.key)
            cfg = AgentConfig(name=args.name, bind=args.bind, peers=args.peers,
                              coordinator=args.coordinator, port=args.port, rate=args.rate,
                              burst_rate=args.burst_rate, burst_s=args.burst,
                              per_send=args.per_send, report_mbit=args.report_mbit, key=key,
                              window_s=args.window, max_peers=args.max_peers,
                              size=args.size, redraw_s=args.redraw, report_s=args.report,
                              seed=args.seed)
            if args.size and not 0 <= args.size <= 1472:
                raise ValueError(f"--size {args.size} is outside 0..1472")
            agent = Agent(cfg)
        except ValueError as e:
            parser.error(str(e))
        except OSError as e:
            log.error("cannot open the probe socket on %s:%d: %s", args.bind, args.port, e)
            return 1
        except ProbeIOError as e:
            log.error("%s", e)
            return 1
        stop = _stop_on_signals()
        log.info("agent %s on %s:%d, %d peers, %.3g pairs/s/peer%s", args.name, args.bind,
                 args.port, len(args.peers), args.rate, ", HMAC" if key else "")
        agent.run(stop)
        return 0
    if args.command == "pacer":
        return _pacer(parser, args)
    from agents.api import serve
    from agents.coordinator import Coordinator
    from agents.heap import settle
    if args.history < 1 or args.series < 3 or args.drift_windows < 1 or \
            args.drift_windows % 2 == 0:
        parser.error("--history must be >= 1, --series >= 3, --drift-windows odd")
    settle()  # every window allocates and frees the same large arrays
    coord = Coordinator(window_s=args.window, reference=args.reference,
                        guard_ns=args.guard_us * 1e3, history=args.history,
                        series_windows=args.series, drift_windows=args.drift_windows)
    stop = _stop_on_signals()
    try:
        serve(coord, args.bind, args.port, args.http_port, stop, http_bind=args.http_bind)
    except OSError as e:
        log.error("cannot listen on %s: %s", args.bind, e)
        return 1
    return 0


ONLY = {"bpf": {"--hold": ("hold", PD.HOLD), "--quantum-us": ("quantum_us", PD.QUANTUM_US),
                "--threshold-from": ("threshold_from", PD.THRESHOLD_FROM),
                "--window-clamp": ("window_clamp", PD.WINDOW_CLAMP),
                "--window-queue": ("window_queue", PD.WINDOW_QUEUE),
                "--ack-pace": ("ack_pace", PD.ACK_PACE)},
        "probe": {"--probe-us": ("probe_us", PD.PROBE_US), "--predict": ("predict", PD.PREDICT),
                  "--fresh": ("fresh", PD.FRESH)}}
"""The pacer's options that one datapath has and the other has not: option -> (its
``args`` name, its default)."""


def _not_used(args, datapath: str) -> list[str]:
    """The other datapath's options given other than their defaults, as options: the pacer
    running on ``datapath`` has none of them."""
    return [f"{opt} {getattr(args, name)}" for dp, opts in ONLY.items() if dp != datapath
            for opt, (name, default) in opts.items() if getattr(args, name) != default]


def _pacer(parser: argparse.ArgumentParser, args) -> int:
    from pyroute2.netlink.exceptions import NetlinkError

    from agents.bpf import BpfError
    from agents.gate import GateConfig
    from agents.pacer import Pacer, PacerConfig
    from agents.pacerio import PacerIOError
    try:
        cfg = PacerConfig(
            name=args.name, bind=args.bind, ifname=args.ifname, peers=args.peers,
            coordinator=args.coordinator, api=args.api, mode=args.mode, port=args.port,
            line_mbit=args.line_mbit, probe_s=args.probe_us / 1e6, active_s=args.active_s,
            gate=GateConfig.for_hold(args.threshold_us * 1e3, args.max_hold_us * 1e3,
                                     predict=args.predict, fresh=args.fresh,
                                     spread=args.spread,
                                     seed=zlib.crc32(args.name.encode())),
            datapath=args.datapath, pin_dir=args.pin_dir, hold=args.hold,
            quantum_ns=args.quantum_us * 1e3, from_base=args.threshold_from == "base",
            window=args.window_clamp, window_queue=args.window_queue, ack_pace=args.ack_pace)
        pacer = None
        if cfg.datapath == "bpf":
            from agents.bpfpacer import BpfPacer
            try:
                pacer = BpfPacer(cfg)
            except BpfError as e:
                if cfg.hold == "edt":
                    raise
                log.error("the kernel datapath cannot run here: %s; datapath probe instead", e)
                pacer = Pacer(cfg)
                pacer.note = f"; datapath probe: the kernel datapath failed: {e}"
        else:
            pacer = Pacer(cfg)
        if unused := _not_used(args, pacer.datapath):
            log.warning("datapath %s: %s belong to the other datapath: not used",
                        pacer.datapath, ", ".join(unused))
            pacer.note += f"; not used on datapath {pacer.datapath}: {', '.join(unused)}"
    except BpfError as e:
        log.error("%s", e)
        return 1
    except ValueError as e:
        parser.error(str(e))
    except (OSError, NetlinkError) as e:
        log.error("cannot set up the pacer on %s (%s:%d): %s", args.ifname, args.bind,
                  args.port, e)
        return 1
    except PacerIOError as e:
        log.error("%s", e)
        return 1
    stop = _stop_on_signals()
    log.info("pacer %s (%s, datapath %s) on %s, T %.0f us, line %.0f Mbit/s", args.name,
             args.mode, pacer.datapath, args.ifname, args.threshold_us, args.line_mbit)
    pacer.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
