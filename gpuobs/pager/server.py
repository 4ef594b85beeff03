"""The local pager: an Alertmanager webhook receiver that records every notification.

Routes:

* ``POST /hook/page`` and ``POST /hook/ticket``: Alertmanager webhook v4 payloads. With a token
  (``--token-file``) they need ``Authorization: Bearer <token>`` (401 otherwise, nothing read or
  stored); Alertmanager sends it from its webhook ``http_config.authorization.credentials_file``.
  Validated, stored in SQLite (committed) and only then answered 200 ``{"stored": id,
  "duplicate": false}``. A repeat of a notification already stored (same
  :func:`~gpuobs.pager.store.delivery_key` within the dedupe window: a webhook retry, a re-send after
  an Alertmanager restart) is answered 200 ``{"stored": id, "duplicate": true}`` and not stored, so
  Alertmanager stops retrying and the on-call sees one page. Malformed -> 400 naming the field,
  nothing stored. Over 4 MiB -> 413.
* ``GET /api/pages[?limit=N&alertname=X&status=firing|resolved]``: JSON, newest first.
* ``GET /``: HTML list with channel, status, labels, summary and runbook link (linked only when the
  ``runbook_url`` annotation lies under the configured runbook base; any other URL is shown as
  text, never as a link).
* ``GET /runbooks/<name>.md``: the runbooks directory, so runbook links work air-gapped.
* ``GET /health``: ``{"status": "ok", "notifications": N, "duplicates": D}`` (D: re-deliveries answered
  without storing, among the keys still in the dedupe window).
"""

from __future__ import annotations

import datetime as dt
import html
import re
import signal
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from gpuobs.core import httpd, log, tokens
from gpuobs.pager.store import CHANNELS, STATUSES, PageStore, PayloadError, validate

MAX_BODY_BYTES = 4 * 1024 * 1024
_log = log.get("pager")


class PagerServer(httpd.Server):
    """HTTP server owning a :class:`PageStore`."""

    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], store: PageStore, runbooks_dir: Path | None = None,
                 token: str | None = None, runbook_base: str | None = None):
        super().__init__(addr, PagerHandler)
        self.store = store
        self.runbooks_dir = runbooks_dir
        self.token = token
        host, port = self.server_address[:2]
        #: Where runbook links may point: ``<runbook base>/runbooks/``, the layout the rules use
        #: (:func:`gpuobs.mixin.runbooks.runbook_url`); the base defaults to this pager.
        self.runbook_prefix = (runbook_base or f"http://{host}:{port}").rstrip("/") + "/runbooks/"


def _safe_url(url: str, base: str) -> str | None:
    """``url`` if it is an http(s) URL under ``base`` (the configured runbook base), else None.

    "Under" is a prefix match on a base that ends in ``/`` (one is added), so
    ``http://127.0.0.1:9097/runbooks/`` admits ``.../runbooks/xid.md#gpuxid`` but neither
    ``http://127.0.0.1:9097/runbooksX`` nor ``http://127.0.0.1:90970/...``; ``..`` segments are refused.
    """
    if not base.endswith("/"):
        base += "/"
    if not url.startswith(("http://", "https://")) or not url.startswith(base):
        return None
    rest = url[len(base):].split("#", 1)[0].split("?", 1)[0]
    if ".." in rest.split("/") or "%2e" in rest.lower():
        return None
    return url


def render_html(pages: list[dict], runbook_prefix: str = "http://127.0.0.1:9097/runbooks/") -> str:
    """HTML page listing notifications (all values escaped; runbook links only under ``runbook_prefix``)."""
    rows = []
    for p in pages:
        when = dt.datetime.fromtimestamp(p["received_at"], dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        for a in p["alerts"]:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(a["labels"].items()))
            ann = a["annotations"]
            raw_rb = ann.get("runbook_url", "")
            rb = _safe_url(raw_rb, runbook_prefix)
            link = (f'<a href="{html.escape(rb)}">runbook</a>' if rb
                    else (f"<code>{html.escape(raw_rb[:200])}</code> (not under the runbook base)" if raw_rb else ""))
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
            self.send_json(200, {"status": "ok", "notifications": store.count(), "duplicates": store.duplicates()})
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
            path = rb / name if rb and len(name) <= 128 and re.fullmatch(r"[a-z0-9][a-z0-9-]*\.md", name) else None
            if path is None or not path.is_file():
                self.send_json(404, {"error": f"no runbook {name!r}"})
                return
            self.send_body(200, path.read_bytes(), "text/markdown; charset=utf-8")
        elif url.path == "/":
            self.send_body(200, render_html(store.list(200), self.server.runbook_prefix).encode("utf-8", "backslashreplace"), "text/html; charset=utf-8")
        else:
            self.send_json(404, {"error": f"no route {url.path}"})

    def _post(self) -> None:
        path = urlsplit(self.path).path
        channel = path.removeprefix("/hook/")
        if not path.startswith("/hook/") or channel not in CHANNELS:
            self.discard_body()
            self.send_json(404, {"error": f"no route {path}; POST to /hook/page or /hook/ticket"})
            return
        if not self._authorized():
            self.discard_body()
            self.send_json(401, {"error": "missing or wrong bearer token (Authorization: Bearer <token>)"},
                           headers={"WWW-Authenticate": 'Bearer realm="gpuobs-pager"'})
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
        nid, duplicate = self.server.store.deliver(channel, payload)
        _log.info("duplicate notification not stored" if duplicate else "notification stored", extra={"fields": {
            "id": nid, "channel": channel, "status": payload["status"], "duplicate": duplicate,
            "alerts": [a["labels"]["alertname"] for a in payload["alerts"]]}})
        self.send_json(200, {"stored": nid, "duplicate": duplicate})

    def _authorized(self) -> bool:
        """True when no token is configured or the request carries ``Authorization: Bearer <token>``."""
        return tokens.bearer_ok(self.headers.get("Authorization"), self.server.token)


def serve(host: str, port: int, db_path: Path, runbooks_dir: Path | None = None, token: str | None = None,
          runbook_base: str | None = None, dedupe_window_s: float | None = None) -> None:
    """Run the pager until SIGTERM/SIGINT (``token``: required bearer token of the webhooks)."""
    store = PageStore(db_path) if dedupe_window_s is None else PageStore(db_path, dedupe_window_s)
    srv = PagerServer((host, port), store, runbooks_dir, token, runbook_base)
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
