"""``nslab tui [SCENARIO]``: the Textual cockpit of a lab (``tui/``).

``--replay PATH`` runs it on a recording without root; ``--record PATH`` saves what a live run
showed as such a recording (``--headless S`` records without the UI until the scenario is
over); ``--serve PORT`` serves the same app to web browsers with textual-serve.
"""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from lab.capabilities import require_root
from lab.errors import LabError
from session.scenario import DEFAULT, builtin_names


def add_parser(sub) -> None:
    p = sub.add_parser("tui", help="drive a scenario's lab from a terminal UI",
                       description="Build the scenario's lab and drive it from a Textual UI: "
                                   "fabric, VMs and clocks, one-way delays, collocation, jobs, "
                                   "faults on keys (press ? for help). Quitting tears the lab "
                                   f"down. SCENARIO: {', '.join(builtin_names())} or a YAML "
                                   "file.")
    p.add_argument("scenario", nargs="?", default=DEFAULT, help=f"default: {DEFAULT}")
    p.add_argument("--name", help="lab name (default: the scenario's name)")
    p.add_argument("--replay", metavar="PATH",
                   help="run on a recording (no root, no lab); e.g. "
                        "tui/recordings/tui_demo.json")
    p.add_argument("--frame", type=int, metavar="N",
                   help="with --replay: hold frame N of the recording (negative: from the "
                        "end; -1 the last) instead of playing it")
    p.add_argument("--record", metavar="PATH", help="save the snapshots of this run to PATH")
    p.add_argument("--headless", metavar="S", type=float,
                   help="with --record: record without the UI until the scenario is over "
                        "(timeline and jobs), S seconds at most, then tear down")
    p.add_argument("--screenshot", metavar="PATH",
                   help="save an SVG screenshot to PATH after --after seconds, then quit")
    p.add_argument("--after", type=float, default=10.0, metavar="S",
                   help="seconds before --screenshot (default 10)")
    p.add_argument("--no-jobs", action="store_true", help="do not run the scenario's jobs")
    p.add_argument("--serve", metavar="PORT", type=int, nargs="?", const=8000,
                   help="serve this app to web browsers (textual-serve) on PORT (default "
                        "8000) of --host: every browser tab runs its own copy (with --replay "
                        "a replay each, no root anywhere; live, its own lab: one tab at a "
                        "time, the server as root)")
    p.add_argument("--host", default="localhost",
                   help="with --serve: the address to listen on (default localhost)")
    p.set_defaults(func=main)


def app_command(args) -> str:
    """The shell command that runs the app ``args`` describe, without ``--serve`` (what
    textual-serve starts for each browser tab)."""
    cmd = [sys.executable, "-m", "cli.main", "tui"]
    if args.replay:
        cmd += ["--replay", str(Path(args.replay).resolve())]
        if args.frame is not None:
            cmd += ["--frame", str(args.frame)]
    else:
        cmd.append(args.scenario)
        if args.name:
            cmd += ["--name", args.name]
        if args.no_jobs:
            cmd.append("--no-jobs")
    return shlex.join(cmd)


def serve(args) -> int:
    """Serve the app to browsers until interrupted (ctrl+c).

    Raises:
        LabError: textual-serve is not installed.
    """
    try:
        from textual_serve.server import Server
    except ImportError as e:
        raise LabError(f"--serve needs textual-serve: pip install 'nslab[tui]' ({e})") from e
    if not args.replay:
        require_root()
    print(f"serving on http://{args.host}:{args.serve} (ctrl+c stops)", flush=True)
    Server(app_command(args), host=args.host, port=args.serve, title="nslab").serve()
    return 0


def record_headless(backend, seconds: float, interval_s: float = 1.0) -> None:
    """Start ``backend``, take a snapshot every ``interval_s`` until the scenario is over
    (state "done": timeline and jobs) or ``seconds`` passed, stop it."""
    try:
        backend.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(interval_s)
            snap = backend.snapshot()
            print(f"  .. {snap.time_s:6.1f} s {snap.state}, {len(snap.events)} events",
                  file=sys.stderr, flush=True)
            if snap.state in ("done", "error"):
                break
    finally:
        backend.stop()


def main(args) -> int:
    if args.serve is not None:
        if args.record or args.headless is not None or args.screenshot:
            raise LabError("--serve runs the app in browsers: no --record, --headless or "
                           "--screenshot with it")
        return serve(args)
    try:
        from tui.app import make_app, run_app
        from tui.recorded import RecordedBackend, Recorder
    except ImportError as e:
        raise LabError(f"the TUI needs Textual: pip install 'nslab[tui]' ({e})") from e
    if args.replay:
        try:
            backend = (RecordedBackend(args.replay) if args.frame is None else
                       RecordedBackend(args.replay, start_at=args.frame, advance=False))
        except (OSError, ValueError) as e:
            raise LabError(f"cannot replay {args.replay}: {e}") from e
        factory = None
    else:
        require_root()
        from session.scenario import load
        from tui.live import LiveBackend
        load(args.scenario)  # a bad scenario fails here, before the UI starts

        def factory(scenario: str):
            return LiveBackend(scenario, name=args.name, run_jobs=not args.no_jobs)
        backend = factory(args.scenario)
    if args.record:
        backend = Recorder(backend, args.record)
    if args.headless is not None:
        if not args.record:
            raise LabError("--headless records: give --record PATH")
        record_headless(backend, args.headless)
        print(f"recording: {args.record}")
        return 0
    shot = (args.screenshot, args.after) if args.screenshot else None
    app = make_app(backend, backend_factory=factory if not args.record else None,
                   screenshot=shot)
    if shot:  # no terminal needed: render off-screen at a README-friendly size
        return run_app(app, headless=True, size=(120, 34))
    return run_app(app)
