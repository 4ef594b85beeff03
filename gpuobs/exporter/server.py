"""HTTP server of one simulated node: ``/metrics``, ``/health`` and the fault admin API.

Admin API (loopback clients only, ``Authorization: Bearer <token>``):

* ``GET /admin/faults`` -> 200 ``{"faults": [...]}``
* ``POST /admin/faults`` with ``{"kind": ..., "gpu": ..., <params>}`` -> 201 with the fault;
  400 ``{"error": ..., "field": ...}`` for bad JSON or parameters; 413 over 64 KiB
* ``DELETE /admin/faults/<id>`` -> 200 with the cleared fault, 404 if unknown
* ``GET /admin/kernel-log[?from=N]`` -> 200 text, the node's simulated dmesg lines (NVRM Xid lines in
  the driver's formats) from line N on, with ``X-Boot-Id`` and ``X-Kernel-Log-Lines`` headers
* ``GET /admin/deploy`` -> ``{"version": ...}``; ``POST /admin/deploy`` with ``{"version": "1.5.0"}``
  -> 200 ``{"version": ..., "previous": ...}``; unknown version -> 400 naming the known ones

The serving engine's port serves only ``/metrics`` and ``/health`` (``admin=False``).

Missing or wrong token -> 401; a non-loopback client -> 403. Handler errors are answered with 500
and logged; they never stop the server or the simulation.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

from gpuobs import log
from gpuobs.exporter import faults as faultmod
from gpuobs.exporter.exposition import CONTENT_TYPE, Family, label_string, render
from gpuobs.exporter.node import Node

MAX_BODY_BYTES = 64 * 1024
INVALID = object()  # _read_json's "already answered with an error" marker
_log = log.get("exporter")


class NodeServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer bound to one node, with its collector, token and scrape counters."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], node: Node, token: str, collector, admin: bool = True,
                 hostname_label: str = "Hostname"):
        super().__init__(addr, Handler)
        self.node = node
        self.token = token
        self.collector = collector
        self.admin = admin
        self.hostname_label = hostname_label
        self.stats_lock = threading.Lock()
        self.scrapes = 0
        self.last_collect_s = 0.0

    def metrics_page(self) -> bytes:
        """Render the node's page, including exporter self-metrics (design §4.5)."""
        start = time.perf_counter()
        fams = self.collector.collect()
        # The engine page has no host label of its own (vLLM's has none; its scrape target adds
        # Hostname), so its self-metrics carry none either, or Prometheus would rename it.
        host = [(self.hostname_label, self.node.hostname)] if self.admin else []
        with self.stats_lock:
            self.scrapes += 1
            fams.append(Family("gpuobs_exporter_scrapes_total", "counter",
                               "Scrapes of this node's /metrics since start.", True,
                               [(label_string(host), self.scrapes)]))
            fams.append(Family("gpuobs_exporter_collect_duration_seconds", "gauge",
                               "Duration of the previous collection, seconds.", False,
                               [(label_string(host), self.last_collect_s)]))
            body = render(fams).encode()
            self.last_collect_s = time.perf_counter() - start
        return body


class Handler(BaseHTTPRequestHandler):
    """Request handler; see the module docstring for the routes."""

    server: NodeServer
    protocol_version = "HTTP/1.1"
    server_version = "gpuobs-exporter"
    # TCP_NODELAY: headers and body go out as two writes; with Nagle a small body (/health, admin
    # JSON) waits for the client's delayed ACK, ~40 ms per response on keep-alive connections.
    disable_nagle_algorithm = True

    def log_message(self, fmt: str, *args) -> None:  # route access logs to debug JSON logs
        _log.debug(fmt % args, extra={"fields": {"client": self.client_address[0]}})

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if _log.isEnabledFor(logging.DEBUG):  # skip formatting the access line on every scrape
            super().log_request(code, size)

    # ---- helpers ----------------------------------------------------------------------------
    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, doc: dict) -> None:
        self._send(code, (json.dumps(doc) + "\n").encode())

    def _error(self, code: int, msg: str, field: str | None = None) -> None:
        doc = {"error": msg}
        if field:
            doc["field"] = field
        self._json(code, doc)

    def _authorized(self) -> bool:
        try:
            loopback = ipaddress.ip_address(self.client_address[0]).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            self._error(403, "admin API accepts loopback clients only")
            return False
        header = self.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else ""
        if not given or not hmac.compare_digest(given.encode(), self.server.token.encode()):
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Bearer realm="gpuobs-admin"')
            body = b'{"error": "missing or wrong bearer token"}\n'
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":  # a HEAD answer carries no body, or keep-alive breaks
                self.wfile.write(body)
            return False
        return True

    def _read_json(self) -> object:
        """Read and decode the JSON body; answers the error itself and returns INVALID on failure
        (a JSON ``null`` body is a value like any other and is rejected by the route's validation)."""
        raw_len = self.headers.get("Content-Length")
        try:
            length = int(raw_len) if raw_len is not None else -1
        except ValueError:
            length = -1
        if length < 0:
            self._error(411, "Content-Length header required")
            self.close_connection = True
            return INVALID
        if length > MAX_BODY_BYTES:
            self._error(413, f"body is {length} bytes; the limit is {MAX_BODY_BYTES}")
            self.close_connection = True
            return INVALID
        raw = self.rfile.read(length)
        try:
            return json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # bad UTF-8/JSON, huge integers, absurd nesting
            self._error(400, f"body is not valid JSON: {str(exc)[:200]}", "body")
            return INVALID

    # ---- routes -------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._guard(self._get)

    def do_HEAD(self) -> None:
        self._guard(self._get)

    def do_POST(self) -> None:
        self._guard(self._post)

    def do_DELETE(self) -> None:
        self._guard(self._delete)

    def _guard(self, fn) -> None:
        try:
            fn()
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception:  # one bad request must never take the server down
            _log.exception("request failed", extra={"fields": {"path": self.path}})
            try:
                self._error(500, "internal error; see exporter log")
            except OSError:
                pass

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        node = self.server.node
        if path == "/metrics":
            if node.down or (not self.server.admin and node.engine_down):  # the node / its engine is gone
                self.close_connection = True
                return
            self._send(200, self.server.metrics_page(), CONTENT_TYPE)
        elif path == "/health":
            self._json(200, {"status": "ok", "hostname": node.hostname, "down": node.down})
        elif not self.server.admin:
            self._error(404, f"no route {path}")
        elif path == "/admin/deploy":
            if self._authorized():
                self._json(200, {"hostname": node.hostname, "version": node.version})
        elif path == "/admin/faults":
            if self._authorized():
                self._json(200, {"hostname": node.hostname, "faults": node.list_faults()})
        elif path == "/admin/kernel-log":
            if self._authorized():
                self._kernel_log(node)
        else:
            self._error(404, f"no route {path}")

    def _kernel_log(self, node: Node) -> None:
        """``?from=N``: lines N.. (0-based; default 0). Headers ``X-Boot-Id`` (new per node start) and
        ``X-Kernel-Log-Lines`` (lines in the log) let a follower resume without loss or duplicates."""
        query = parse_qs(self.path.split("?", 1)[1]) if "?" in self.path else {}
        raw = query.get("from", ["0"])[-1]
        if not raw.isdigit():
            self._error(400, f"query parameter 'from' must be a line number >= 0, got {raw!r}", "from")
            return
        with node.lock:
            lines, total, boot = node.kernel_log[int(raw):], len(node.kernel_log), node.boot_id
        body = "".join(line + "\n" for line in lines).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Boot-Id", boot)
        self.send_header("X-Kernel-Log-Lines", str(total))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _post(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/admin/faults", "/admin/deploy") or not self.server.admin:
            self._error(404, f"no route {path}")
            return
        if not self._authorized():
            return
        body = self._read_json()
        if body is INVALID:
            return
        node = self.server.node
        if path == "/admin/deploy":
            self._deploy(body)
            return
        try:
            req = faultmod.validate(body, len(node.gpus))
        except faultmod.FaultError as exc:
            self._error(400, str(exc), exc.field)
            return
        fault = node.inject(req)
        _log.info("fault injected", extra={"fields": {"hostname": node.hostname, **fault.to_json()}})
        self._json(201, fault.to_json())

    def _deploy(self, body: object) -> None:
        node = self.server.node
        known = ", ".join(node.releases.releases)
        if not isinstance(body, dict) or set(body) != {"version"} or not isinstance(body["version"], str):
            self._error(400, f'body must be {{"version": "<one of {known}>"}}', "version")
            return
        try:
            previous = node.deploy(body["version"])
        except KeyError:
            self._error(400, f"field 'version' must be one of {known}; got {body['version']!r}", "version")
            return
        _log.info("deployed", extra={"fields": {"hostname": node.hostname, "version": body["version"],
                                                "previous": previous}})
        self._json(200, {"hostname": node.hostname, "version": body["version"], "previous": previous})

    def _delete(self) -> None:
        path = self.path.split("?", 1)[0]
        prefix = "/admin/faults/"
        if not self.server.admin or not path.startswith(prefix) or len(path) == len(prefix):
            self._error(404, f"no route {path}")
            return
        if not self._authorized():
            return
        node = self.server.node
        fault = node.clear(path[len(prefix):])
        if fault is None:
            self._error(404, f"no active fault with id {path[len(prefix):]!r}", "id")
            return
        _log.info("fault cleared", extra={"fields": {"hostname": node.hostname, "id": fault.id}})
        self._json(200, fault.to_json())
