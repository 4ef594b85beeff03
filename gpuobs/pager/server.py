"""The local pager: an Alertmanager webhook receiver that records every notification.

Routes:

* ``POST /hook/page`` and ``POST /hook/ticket``: Alertmanager webhook v4 payloads; validated,
  stored in SQLite (committed) and only then answered 200. Malformed -> 400 naming the field,
  nothing stored. Over 4 MiB -> 413.
* ``GET /api/pages[?limit=N&alertname=X&status=firing|resolved]``: JSON, newest first.
* ``GET /``: HTML list with channel, status, labels, summary and runbook link.
* ``GET /runbooks/<name>.md``: the runbooks directory, so runbook links work air-gapped.
* ``GET /health``: ``{"status": "ok", "notifications": N}``.
"""

from __future__ import annotations

import datetime as dt
import html
import re
import signal
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from gpuobs.core import httpd, log
from gpuobs.pager.store import CHANNELS, STATUSES, PageStore, PayloadError, validate

MAX_BODY_BYTES = 4 * 1024 * 1024
_log = log.get("pager")


class PagerServer(httpd.Server):
    """HTTP server owning a :class:`PageStore`."""

    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], store: PageStore, runbooks_dir: Path | None = None):
        super().__init__(addr, PagerHandler)
        self.store = store
        self.runbooks_dir = runbooks_dir


def _safe_url(url: str) -> str | None:
    """Return ``url`` if it is http(s), else None (never render javascript: links)."""
    return url if url.startswith(("http://", "https://")) else None


def render_html(pages: list[dict]) -> str:
    """HTML page listing notifications (all values escaped)."""
    rows = []
    for p in pages:
        when = dt.datetime.fromtimestamp(p["received_at"], dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        for a in p["alerts"]:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(a["labels"].items()))
            ann = a["annotations"]
            rb = _safe_url(ann.get("runbook_url", ""))
            link = f'<a href="{html.escape(rb)}">runbook</a>' if rb else ""
            rows.append(
                f"<tr class=\"{html.escape(a['status'])}\"><td>{when}</td><td>{html.escape(p['channel'])}</td>"
                f"<td>{html.escape(a['status'])}</td><td>{html.escape(a['labels'].get('alertname', ''))}</td>"
                f"<td>{html.escape(ann.get('summary', ''))}</td><td><code>{html.escape(labels)}</code></td>"
                f"<td>{link}</td></tr>")
    body = "\n".join(rows) or '<tr><td colspan="7">No notifications yet.</td></tr>'
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>gpuobs pager</title>"
        "<meta http-equiv=\"refresh\" content=\"5\"><style>body{font-family:sans-serif}"
        "td,th{padding:4px 8px;border-bottom:1px solid #ddd;text-align:left}"
        "tr.firing td:nth-child(3){color:#b00;font-weight:bold}tr.resolved td:nth-child(3){color:#070}"
        "</style></head><body><h1>gpuobs pager</h1><table><tr><th>received (UTC)</th><th>channel</th>"
        "<th>status</th><th>alert</th><th>summary</th><th>labels</th><th>runbook</th></tr>"
        f"{body}</table></body></html>")


class PagerHandler(httpd.Handler):
    """Request handler; see the module docstring (HTTP plumbing: :mod:`gpuobs.core.httpd`)."""

    server: PagerServer
    server_version = "gpuobs-pager"
    max_body_bytes = MAX_BODY_BYTES
    methods = {"GET": "_get", "POST": "_post"}
    logger = _log

    def _get(self) -> None:
        url = urlsplit(self.path)
        qs = parse_qs(url.query)
        store = self.server.store
        if url.path == "/health":
            self.send_json(200, {"status": "ok", "notifications": store.count()})
        elif url.path == "/api/pages":
            try:
                limit = int(qs.get("limit", ["100"])[0])
                if not 1 <= limit <= 10000:
                    raise ValueError
            except ValueError:
                self.send_json(400, {"error": "limit must be an integer 1..10000", "field": "limit"})
                return
            status = qs.get("status", [None])[0]
            if status is not None and status not in STATUSES:
                self.send_json(400, {"error": f"status must be one of {', '.join(STATUSES)}", "field": "status"})
                return
            self.send_json(200, {"pages": store.list(limit, qs.get("alertname", [None])[0], status)})
        elif url.path.startswith("/runbooks/"):
            name = url.path.removeprefix("/runbooks/")
            rb = self.server.runbooks_dir
            path = rb / name if rb and re.fullmatch(r"[a-z0-9][a-z0-9-]*\.md", name) else None
            if path is None or not path.is_file():
                self.send_json(404, {"error": f"no runbook {name!r}"})
                return
            self.send_body(200, path.read_bytes(), "text/markdown; charset=utf-8")
        elif url.path == "/":
            self.send_body(200, render_html(store.list(200)).encode("utf-8", "backslashreplace"), "text/html; charset=utf-8")
        else:
            self.send_json(404, {"error": f"no route {url.path}"})

    def _post(self) -> None:
        path = urlsplit(self.path).path
        channel = path.removeprefix("/hook/")
        if not path.startswith("/hook/") or channel not in CHANNELS:
            self.discard_body()
            self.send_json(404, {"error": f"no route {path}; POST to /hook/page or /hook/ticket"})
            return
        doc = self.read_json()
        if doc is httpd.INVALID:
            return
        try:
            payload = validate(doc)
        except PayloadError as exc:
            _log.warning("rejected payload", extra={"fields": {"field": exc.field, "error": str(exc)}})
            self.send_json(400, {"error": str(exc), "field": exc.field})
            return
        nid = self.server.store.add(channel, payload)
        _log.info("notification stored", extra={"fields": {
            "id": nid, "channel": channel, "status": payload["status"],
            "alerts": [a["labels"]["alertname"] for a in payload["alerts"]]}})
        self.send_json(200, {"stored": nid})


def serve(host: str, port: int, db_path: Path, runbooks_dir: Path | None = None) -> None:
    """Run the pager until SIGTERM/SIGINT."""
    store = PageStore(db_path)
    srv = PagerServer((host, port), store, runbooks_dir)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    _log.info("pager listening", extra={"fields": {"addr": f"{host}:{port}", "db": str(db_path)}})
    done.wait()
    srv.shutdown()
    srv.server_close()
    store.close()
