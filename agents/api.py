"""The coordinator's servers: the agents' report listener (TCP, JSON lines of
``nslab.report/2``) and the HTTP API (``GET /api/v1/state``, ``/api/v1/health``), each in a
daemon thread beside the window processing (``Service``, ``serve``). Formats: ``API.md``,
``contracts.messages``.
"""
from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from pydantic import BaseModel

from agents.coordinator import Coordinator
from contracts.messages import CoordinatorState, parse_message

__all__ = ["Service", "serve"]

log = logging.getLogger("agents.api")

PARTS = ("vms", "owd_us", "asymmetry_us", "collocation", "drift_series", "drift_series_t_ns",
         "history", "pacers", "counters")
"""The state's parts ``fields=`` can select (its scalars always come)."""

MAX_LINE = 16 << 20
"""Bytes per report line; a longer one drops the connection (the agent reconnects)."""


class _ReportHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        coord: Coordinator = self.server.coordinator  # type: ignore[attr-defined]
        name = None
        while True:
            try:
                line = self.rfile.readline(MAX_LINE)
            except OSError:
                break
            if not line:
                break
            if not line.endswith(b"\n"):
                coord.count("bad_messages")
                break  # over-long line: drop the connection, the agent reconnects
            try:
                name = coord.ingest(parse_message(line))
            except ValueError as e:  # pydantic's ValidationError is one
                coord.count("bad_messages")
                log.debug("bad message from %s: %s", self.client_address, e)
        if name:
            log.info("agent %s disconnected", name)


class _ReportServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.conns: set = set()
        self.conns_lock = threading.Lock()

    def process_request_thread(self, request, client_address):
        with self.conns_lock:
            self.conns.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.conns_lock:
                self.conns.discard(request)

    def close_connections(self) -> None:
        with self.conns_lock:
            for c in list(self.conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class _ApiHandler(BaseHTTPRequestHandler):
    server_version = "nslab-coordinator/1"

    def log_message(self, fmt, *args) -> None:  # quiet
        log.debug("http %s " + fmt, self.client_address[0], *args)

    def _send(self, code: int, doc: BaseModel | dict) -> None:
        body = (doc.model_dump_json() if isinstance(doc, BaseModel)
                else json.dumps(doc, separators=(",", ":"))).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        coord: Coordinator = self.server.coordinator  # type: ignore[attr-defined]
        url = urlparse(self.path)
        if url.path == "/api/v1/state":
            q = parse_qs(url.query)
            try:
                hist = int(q["history"][0]) if "history" in q else None
            except ValueError:
                self._send(400, {"error": "history must be an integer"})
                return
            want = [f for f in ",".join(q.get("fields", [])).split(",") if f]
            if bad := sorted(set(want) - set(PARTS)):
                self._send(400, {"error": f"no such field {', '.join(bad)}", "fields": PARTS})
                return
            doc = coord.state(0 if want and "history" not in want else hist)
            if want:  # the parts not asked for come back empty: the schema holds
                fields = CoordinatorState.model_fields
                doc = doc.model_copy(update={f: fields[f].get_default(call_default_factory=True)
                                             for f in PARTS if f not in want})
            self._send(200, doc)
        elif url.path == "/api/v1/health":
            self._send(200, coord.health())
        else:
            self._send(404, {"error": f"no such path {url.path}",
                             "paths": ["/api/v1/state", "/api/v1/health"]})


class _ApiServer(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


class Service:
    """The coordinator's servers: report listener (TCP), HTTP API and window processing, each
    in a daemon thread. Port 0 picks a free port (``report_port``/``http_port`` tell which).

    Raises (``start``):
        OSError: a port cannot be bound.
    """

    def __init__(self, coord: Coordinator, bind: str, port: int, http_port: int,
                 http_bind: str | None = None, period_s: float = 0.2):
        self.coord, self.period_s = coord, period_s
        self.addr = (bind, port)
        self.http_addr = (http_bind or bind, http_port)
        self.stop_event = threading.Event()
        self.servers: list = []
        self.threads: list[threading.Thread] = []
        self.report_port = port
        self.http_port = http_port

    def start(self) -> Service:
        reports = _ReportServer(self.addr, _ReportHandler)
        reports.coordinator = self.coord  # type: ignore[attr-defined]
        try:
            api = _ApiServer(self.http_addr, _ApiHandler)
        except OSError:
            reports.server_close()
            raise
        api.coordinator = self.coord  # type: ignore[attr-defined]
        self.servers = [reports, api]
        self.report_port = reports.server_address[1]
        self.http_port = api.server_address[1]
        self.threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.2},
                                         daemon=True, name=n)
                        for s, n in ((reports, "nslab-reports"), (api, "nslab-api"))]
        self.threads.append(threading.Thread(target=self._process, daemon=True,
                                             name="nslab-windows"))
        for t in self.threads:
            t.start()
        log.info("coordinator: reports on %s:%d, API on http://%s:%d/api/v1/state",
                 self.addr[0], self.report_port, self.http_addr[0], self.http_port)
        return self

    def _process(self) -> None:
        while not self.stop_event.wait(self.period_s):
            try:
                self.coord.step()
            except Exception:  # noqa: BLE001 - one bad window must not stop the service
                log.exception("window processing failed")
                self.coord.count("step_errors")

    def stop(self) -> None:
        """Stop the threads and close the listening sockets (open report connections end
        when their agents notice)."""
        self.stop_event.set()
        for s in self.servers:
            s.shutdown()
            s.server_close()
            if isinstance(s, _ReportServer):
                s.close_connections()
        for t in self.threads:
            t.join(timeout=2.0)


def serve(coord: Coordinator, bind: str, port: int, http_port: int,
          stop: threading.Event, http_bind: str | None = None) -> None:
    """Run ``Service`` until ``stop`` is set.

    Raises:
        OSError: a port cannot be bound.
    """
    svc = Service(coord, bind, port, http_port, http_bind).start()
    try:
        while not stop.is_set():  # sleep, not stop.wait(): see agents.agent.Agent.run
            time.sleep(0.2)
    finally:
        svc.stop()
